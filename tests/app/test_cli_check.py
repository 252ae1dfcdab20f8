"""`hwtui --check`, `list-gpus` and `snapshot` as a user runs them: exit codes, formats, no tracebacks."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests import cli_proc, machines


def hwtui(*args, env_extra=None, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "MASTER_", "WORLD_", "RANK", "LOCAL_"))}
    env.pop("NO_COLOR", None)
    env.update(env_extra or {})
    return cli_proc.run([sys.executable, "-m", "hwtui.app", *args], capture_output=True, text=True, env=env,
                        timeout=timeout)


@pytest.fixture
def mixed(tmp_path):
    fs = machines.rtx4090_rx7800xt_arc_a750(tmp_path / "mixed")
    fs.facts(user={"uid": 1000, "gid": 1000, "groups": [1000, 44, 109], "name": "alice"})
    return fs


def test_json_document_schema(mixed):
    r = hwtui("--check", "--json", "--only", "hardware", "--sysroot", str(mixed.root))
    doc = json.loads(r.stdout)
    assert set(doc) == {"schema", "host", "devices", "findings", "summary", "duration_s"}
    assert doc["schema"] == "hwtui.check/1"
    assert [(d["id"], d["vendor"], d["backend"], d["device"]) for d in doc["devices"]] == [
        (0, "NVIDIA", "cuda", "cuda:0"), (1, "Intel", "xpu", "xpu:0"), (2, "AMD", "hip", "hip:0")]
    for f in doc["findings"]:
        assert set(f) >= {"id", "status", "title", "detail", "remedy", "area"}
    assert doc["summary"]["total"] == len(doc["findings"])
    assert r.returncode == (1 if doc["summary"]["fail"] + doc["summary"]["error"] else 0)
    assert "Traceback" not in r.stderr


def test_exit_1_on_failure_and_junit(tmp_path):
    fs = machines.FakeSys(tmp_path / "t")
    machines._base(fs)
    machines.nvidia_gpu(fs, "0000:01:00.0", 0x2204, 0, driver="nouveau")
    junit = tmp_path / "out" / "report.xml"
    r = hwtui("--check", "--only", "hardware", "--sysroot", str(fs.root), "--junit", str(junit))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[FAIL]" in r.stdout and "blacklist nouveau" in r.stdout
    root = ET.parse(junit).getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == int(root.get("tests")) > 0
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert "pci.driver[0000:01:00.0]" in failed


def test_strict_turns_warnings_into_failures(tmp_path):
    fs = machines.vfio_passthrough(tmp_path / "v")
    fs.facts(host_runtime={"shm_total": 32 * 2**30, "python": "3.11.7"})
    args = ("--check", "--only", "hardware", "--sysroot", str(fs.root))
    plain, strict = hwtui(*args), hwtui(*args, "--strict")
    assert "[WARN]" in plain.stdout
    assert plain.returncode == 0, plain.stdout
    assert strict.returncode == 1


@pytest.mark.parametrize("args", [
    ("--check", "--only", "nonsense"),
    ("--check", "--replay", "/nonexistent/host.json"),
    ("--check", "--sysroot", "/nonexistent/dir"),
    ("--json",),
    ("list-gpus", "--replay", "/nonexistent/host.json"),
])
def test_usage_errors_are_one_line_exit_2(args):
    r = hwtui(*args)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("hwtui: error:")
    assert "Traceback" not in r.stderr


def test_no_color_and_force_color(mixed):
    args = ("--check", "--only", "hardware", "--sysroot", str(mixed.root))
    assert "\x1b[" in hwtui(*args, env_extra={"FORCE_COLOR": "1"}).stdout
    assert "\x1b[" not in hwtui(*args, env_extra={"FORCE_COLOR": "1", "NO_COLOR": "1"}).stdout
    assert "\x1b[" not in hwtui(*args).stdout  # a pipe is never coloured


def test_list_gpus_table_and_json(mixed):
    table = hwtui("list-gpus", "--sysroot", str(mixed.root))
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:5] == ["ID", "Vendor", "Model", "VRAM", "Backend"]
    assert "GeForce RTX 4090" in lines[1] and "cuda" in lines[1]
    assert "Radeon RX 7800 XT" in lines[3] and "16 GB" in lines[3] and "hip" in lines[3]
    doc = json.loads(hwtui("list-gpus", "--json", "--sysroot", str(mixed.root)).stdout)
    assert set(doc) == {"schema", "devices"} and doc["schema"] == "hwtui.gpus/1"
    rows = doc["devices"]
    for row in rows:
        assert {"id", "vendor", "backend", "device", "name", "pci", "driver", "vram_total"} <= set(row)
    assert [r["vendor"] for r in rows] == ["NVIDIA", "Intel", "AMD"]
    amd = rows[2]
    assert amd["vram_total"] == 16 * 2**30 and amd["pci"] == "0000:05:00.0" and amd["driver"] == "amdgpu"


def test_list_gpus_no_gpu_is_normal(tmp_path):
    fs = machines.laptop_no_gpu(tmp_path / "l")
    r = hwtui("list-gpus", "--json", "--sysroot", str(fs.root))
    assert r.returncode == 0 and json.loads(r.stdout) == {"schema": "hwtui.gpus/1", "devices": []}
    r = hwtui("list-gpus", "--sysroot", str(fs.root))
    assert r.returncode == 0 and "No accelerator found" in r.stdout


def test_list_gpus_passthrough_only_with_all(tmp_path):
    fs = machines.vfio_passthrough(tmp_path / "v")
    plain = hwtui("list-gpus", "--sysroot", str(fs.root))
    assert "GeForce RTX 3090" not in plain.stdout and "--all" in plain.stderr
    full = hwtui("list-gpus", "--all", "--sysroot", str(fs.root))
    assert "GeForce RTX 3090" in full.stdout and "vfio-pci" in full.stdout


def test_snapshot_cli_then_replay_matches_sysroot(mixed, tmp_path):
    out = tmp_path / "snap" / "host.json"
    secret_env = {"HF_TOKEN": "hf_" + "s" * 30, "PIP_INDEX_URL": "https://bob:hunter2@pypi.corp/simple"}
    r = hwtui("snapshot", "-o", str(out), "--sysroot", str(mixed.root), env_extra=secret_env)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "hunter2" not in text and "sssssssss" not in text
    live = json.loads(hwtui("--check", "--json", "--sysroot", str(mixed.root), env_extra=secret_env).stdout)
    replay = json.loads(hwtui("--check", "--json", "--replay", str(out)).stdout)

    def key(doc):
        return sorted((f["id"], f["status"], f["title"]) for f in doc["findings"])

    assert key(replay) == key(live)
    assert replay["devices"] == live["devices"]
    for doc in (live, replay):
        assert "hunter2" not in json.dumps(doc)


def test_version_and_help_are_fast_and_lazy():
    probe = ("import sys, time; t=time.perf_counter(); from hwtui.app.cli import build_parser; build_parser(); "
             "print(sorted(m for m in ('textual','torch','psutil','rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    r = hwtui("--version")
    assert r.returncode == 0 and r.stdout.startswith("hwtui ")


@pytest.mark.parametrize("args", [("--interval", "0"), ("--interval", "abc"), ("--sysroot", "/a", "--replay", "/b")])
def test_tui_usage_errors_exit_2_before_starting(args):
    r = hwtui(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
