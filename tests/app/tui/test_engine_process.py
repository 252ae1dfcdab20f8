"""Engine command lines and the child process's lifecycle (real processes, real signals)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from hwtui.app.tui.config import TuiConfig
from hwtui.app.tui.defaults import engine_defaults
from hwtui.app.tui.engine_process import EngineProcess, build_stages
from tests.procfs import alive

DEFAULTS = {"device": "cpu", "nproc": 2, "bucket_mb": 64, "window": 2, "chunk_mb": 16, "gpu_ids": "cpu:0,cpu:1"}


def test_weights_are_planned_first_then_replicated(tmp_path):
    cfg = TuiConfig(mode="replicate", source="weights", weights="/m/model.safetensors", bucket_mb=32, window=3)
    plan, run = build_stages(cfg, DEFAULTS, tmp_path)
    assert plan.argv[1:] == ["-m", "hwtui.app", "plan", "--weights", "/m/model.safetensors", "--bucket-mb", "32",
                             "-o", str(tmp_path / "model.plan")]
    assert run.argv[1:] == ["-m", "hwtui.app", "replicate", "--plan", str(tmp_path / "model.plan"), "--device", "cpu",
                            "--nproc", "2", "--inflight", "3", "--chunk-mb", "16", "--events", "-"]
    assert plan.argv[0] == run.argv[0] == sys.executable


def test_plan_source_and_training(tmp_path):
    (only,) = build_stages(TuiConfig(source="plan", plan="p.json", device="cuda", nproc=8), DEFAULTS, tmp_path)
    assert only.argv[3:6] == ["replicate", "--plan", "p.json"] and "cuda" in only.argv and "8" in only.argv
    (train,) = build_stages(TuiConfig(mode="train", steps=5), DEFAULTS, tmp_path)
    assert train.argv[3:] == ["train", "--gpu-ids", "cpu:0,cpu:1", "--steps", "5", "--events", "-"]
    (mine,) = build_stages(TuiConfig(mode="train", steps=5, train_model="pkg.models:tiny", train_data="~/my text.txt"),
                           DEFAULTS, tmp_path)
    home = str(Path("~").expanduser())
    assert mine.argv[3:] == ["train", "--gpu-ids", "cpu:0,cpu:1", "--steps", "5", "--model", "pkg.models:tiny",
                             "--data", f"{home}/my text.txt", "--events", "-"], "one argv item per value, never a shell"


def test_defaults_follow_the_hardware(snapshots):
    from hwtui.probes.host import ReplayHost
    from hwtui.probes.inventory import detect_devices

    devices, _ = detect_devices(ReplayHost.load(snapshots["h100_x8"]))
    d = engine_defaults(devices)
    assert d["device"] == "cuda" and d["nproc"] == 8 and d["gpu_ids"].split(",")[7] == "cuda:7"
    mixed, _ = detect_devices(ReplayHost.load(snapshots["rtx4090_rx7800xt_arc_a750"]))
    m = engine_defaults(mixed)
    assert m["device"] == "cpu", "replication needs one backend; a mixed box replicates on CPU ranks"
    assert {x.split(":")[0] for x in m["gpu_ids"].split(",")} == {"cuda", "hip", "xpu"}
    assert engine_defaults([])["gpu_ids"] == "cpu:0,cpu:1"


def test_lines_and_stderr_and_exit_status():
    seen: list[str] = []
    p = EngineProcess([sys.executable, "-c", "import sys; print('a'); print('b'); sys.stderr.write('oops\\n'); sys.exit(4)"],
                      seen.append)
    p.start()
    assert [line.strip() for line in p.lines()] == ["a", "b"]
    assert p.wait(10) == 4
    assert seen == ["oops"]


@pytest.mark.timeout(30)
def test_stop_kills_the_whole_group_even_when_sigterm_is_ignored(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"g = subprocess.Popen([sys.executable, '-c', 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = EngineProcess([sys.executable, "-c", code], lambda _l: None)
    p.start()
    assert next(iter(p.lines())).strip() == "ready"
    grandchild = int(pidfile.read_text())
    started = time.monotonic()
    rc = p.stop(grace_s=0.5)
    assert rc == -9 and time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild), "a rank the engine spawned must not outlive it"


def test_stop_is_graceful_when_the_engine_honours_sigterm():
    p = EngineProcess([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], lambda _l: None)
    p.start()
    next(iter(p.lines()))
    started = time.monotonic()
    assert p.stop(grace_s=5) == -15 and time.monotonic() - started < 3


def test_the_engine_step_checks_the_same_modules_as_the_cli():
    from hwtui.app.cli import ENGINE_EXTRA_MODULES
    from hwtui.app.tui.engine_process import ENGINE_MODULES

    assert set(ENGINE_MODULES) == {m for m, extra in ENGINE_EXTRA_MODULES.items() if extra == "engine"}
