"""`hwtui train` forks its CPU workers from the launcher (one `import torch`, engine/training/worker_fork.py).

A real run over gloo on loopback: the workers are the launcher's forks (its command line, its
children), a forked worker killed mid-round is lost with its exit reason, and the launcher's death
ends the other; a mixed run (CUDA + CPU) forks only its CPU worker. That forked and exec'd
workers (HWTUI_FORK_RANKS=0, said under -v) train the same bytes is test_outer_resume's replay
test; the stdin protocol's EOF is tests/core/test_forking.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import cli_proc
from tests.procfs import alive, ppid, wait_gone

REPO = Path(__file__).resolve().parents[3]
# A small model and short rounds: what is compared is how the workers start, not what they learn.
SMALL = ["--batch-size", "5", "--merge-every", "5", "--eval-every", "100", "--context", "32", "--d-model", "32",
         "--heartbeat-timeout", "20", "--group-timeout", "60"]


def _train(*args: str, env: dict[str, str] | None = None, err: Path | None = None) -> subprocess.Popen:
    """The run, its events on stdout; its human text (-v) on stderr, into ``err`` when the test
    reads stdout as it goes (an undrained stderr pipe could fill and block the launcher)."""
    with contextlib.ExitStack() as stack:
        stderr = stack.enter_context(err.open("w")) if err is not None else subprocess.PIPE
        return cli_proc.Popen([sys.executable, "-m", "hwtui.app", "train", "--gpu-ids", "cpu:0,cpu:1", *SMALL, "-v",
                               "--events", "-", *args], cwd=REPO, env={**os.environ, **(env or {})},
                              stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)


def _started(events: list[dict]) -> dict[int, dict]:
    """rank -> {"mode": "forked" | "exec'd", "pid": N, "text": the debug line}."""
    out = {}
    for e in events:
        msg = e.get("message", "")
        if e["kind"] == "log" and e.get("source") == "train.launch" and msg.startswith("worker "):
            rank = int(msg.split()[1])
            out[rank] = {"mode": "forked" if " forked from the launcher" in msg else "exec'd",
                         "pid": int(msg.split("(pid ")[1].split(")")[0]), "text": msg}
    return out


def _watch(proc: subprocess.Popen, on_event, timeout: float) -> list[dict]:
    """Events from --events - until the run ends; ``on_event`` sees each (a True return stops reading)."""
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        assert time.monotonic() < deadline, "the run did not end in time"
        if line.startswith("{"):
            events.append(json.loads(line))
            if on_event(events[-1], events):
                break
    return events


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_forked_worker_killed_mid_round_is_lost_by_signal_and_the_launchers_death_ends_the_other(tmp_path: Path) -> None:
    # Worker 1 SIGKILLs itself on its 2nd chunk; once that is reported, the launcher is SIGKILLed:
    # worker 0 (blocked on its next command, or in training) must not outlive it.
    seen: dict[int, tuple[bytes, int]] = {}

    def look(ev: dict, events: list[dict]) -> bool:
        # As each worker is announced: its command line and parent, as /proc has them.
        for rank, w in _started(events).items():
            if rank not in seen:
                seen[rank] = (Path(f"/proc/{w['pid']}/cmdline").read_bytes(), ppid(w["pid"]))
        return ev["kind"] in ("train.worker_lost", "train.done")

    p = _train("--steps", "50", env={"HWTUI_TEST_FAULT": "1:kill:chunk=2"}, err=tmp_path / "err")
    try:
        events = _watch(p, look, 200)
        started = _started(events)
        assert {r: w["mode"] for r, w in started.items()} == {0: "forked", 1: "forked"}, started
        launcher = Path(f"/proc/{p.pid}/cmdline").read_bytes()
        for rank, (cmdline, parent) in seen.items():
            # A forked worker keeps the launcher's command line (an exec'd one is
            # `python -m hwtui.engine.training.worker`) and is the launcher's own child.
            assert cmdline == launcher and parent == p.pid, (rank, cmdline, parent)
        lost = events[-1]
        assert lost["kind"] == "train.worker_lost" and lost["rank"] == 1, events[-3:]
        assert lost["reason"] == "was killed by SIGKILL", lost
        survivor = started[0]["pid"]
        assert alive(survivor)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
        wait_gone([survivor], "worker 0 outlived its launcher", limit=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)


def _ref(backend: str, index: int = 0) -> SimpleNamespace:
    return SimpleNamespace(backend=backend, index=index, spec=f"{backend}:{index}")


def test_accelerator_workers_and_another_python_exec_and_say_why() -> None:
    from hwtui.engine.training.worker_fork import exec_reason

    assert exec_reason(_ref("cpu"), sys.executable, None) is None
    assert exec_reason(_ref("cpu"), sys.executable, "HWTUI_FORK_RANKS=0") == "HWTUI_FORK_RANKS=0"
    for backend in ("cuda", "hip", "xpu", "hpu", "tpu"):
        why = exec_reason(_ref(backend, 1), sys.executable, None)
        assert why is not None and f"{backend}:1 workers are exec'd" in why
    # A venv's python (HWTUI_PYTHON_CPU, `hwtui setup`) links to the same base interpreter: still another.
    other = str(Path(sys.prefix).parent / "other-venv" / "bin" / "python")
    why = exec_reason(_ref("cpu"), other, None)
    assert why is not None and other in why


def test_a_cpu_workers_environment_names_no_cuda_variable_the_launcher_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    # CUDA_* is read at torch's import: a CPU worker given one the launcher lacks would always exec.
    from hwtui.engine.training.workers import worker_env

    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert "CUDA_DEVICE_ORDER" not in worker_env(_ref("cpu"), 2) and worker_env(_ref("cpu"), 2)["OMP_NUM_THREADS"] == "2"
    assert worker_env(_ref("cuda"), 2)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_a_mixed_run_forks_only_its_cpu_workers(tmp_path: Path) -> None:
    # A CUDA device from a fake sysfs beside a CPU worker: the CUDA worker is exec'd (and, torch here
    # being a CPU build, refuses at start), the CPU one forked; -v says which and why.
    from tests import machines

    machines.rtx3090_arc_a770(tmp_path / "sys")
    p = cli_proc.run([sys.executable, "-m", "hwtui.app", "train", "--sysroot", str(tmp_path / "sys"), "--gpu-ids", "0,cpu",
                      *SMALL, "--steps", "5", "-v", "--events", str(tmp_path / "ev.jsonl")],
                     cwd=REPO, capture_output=True, text=True, timeout=150, check=False)
    events = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    started = _started(events)
    assert {r: w["mode"] for r, w in started.items()} == {0: "exec'd", 1: "forked"}, (started, p.stderr)
    assert started[0]["text"].endswith("cuda:0 workers are exec'd (no device runtime near a fork)")
    assert f"worker 1 (cpu:0) forked from the launcher (pid {started[1]['pid']})" in p.stdout


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_run_on_the_users_text_still_forks_its_cpu_workers(tmp_path: Path) -> None:
    """Reading --data made the launcher split a tensor big enough to start torch's thread pool,
    so every worker of a --data run was exec'd (and imported torch again); the corpus is now
    built without the pool."""
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 1200)  # > 32 KiB: torch would split it
    proc = _train("--data", str(text), "--steps", "5")
    events = _watch(proc, lambda e, _: False, 200)
    assert proc.wait(timeout=60) == 0
    started = _started(events)
    assert {r: s["mode"] for r, s in started.items()} == {0: "forked", 1: "forked"}, started
