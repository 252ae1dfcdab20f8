"""Per-process figures the monitor shows, each checked against its source (issue 25).

GPU % from NVML's sample buffer (FakeNVML, the recorded H100 data) and from DRM fdinfo engine
counters (a tree in tmp_path, a clock the test moves); CPU %, RSS, elapsed time and the parent
from psutil on a real child process; a pid that vanished is shown as unknown, never raised.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hwtui.probes.host import FsHost
from hwtui.probes.processes import (
    DrmUtil,
    NvmlProcessUtil,
    ProcessStats,
    drm_processes,
    nvml_processes,
    parse_drm_client,
    send_signal,
)
from tests.probes.fakenvml import FakeNVML

DATA = Path(__file__).resolve().parents[1] / "data" / "vendor"


@pytest.fixture
def child():
    """A real, idle child process (its figures are psutil's to check against), once it runs: Popen
    returns as soon as the exec began, when /proc/<pid>/cmdline can still be empty (a loaded box
    once showed its command as "python" and 4 KiB of RSS)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def _fake(pid: int) -> FakeNVML:
    data = json.loads((DATA / "nvml_h100x8.json").read_text())
    for p in data["devices"][0]["processes"]:
        p["pid"] = pid
    for s in data["devices"][0]["process_utilization"]:
        s["pid"] = pid
    nvml = FakeNVML(data)
    nvml.nvmlInit()
    return nvml


def test_nvml_process_gpu_util_memory_and_host_figures(child):
    nvml = _fake(child.pid)
    stats, util = ProcessStats(), NvmlProcessUtil()
    recorded = nvml.data["devices"][0]
    (row,) = nvml_processes(nvml, {"cuda:0": 0}, stats, util)
    assert row.pid == child.pid and row.device == "cuda:0"
    assert row.mem_bytes == recorded["processes"][0]["used_memory"]
    assert row.gpu_util == recorded["process_utilization"][-1]["smUtil"] == 93, "the newest sample of the pid"
    ps = psutil.Process(child.pid)
    assert row.ppid == os.getpid() and row.started == ps.create_time()
    assert row.elapsed_s == pytest.approx(time.time() - ps.create_time(), abs=5)
    assert abs(row.host_mem - ps.memory_info().rss) < 8 * 2**20, "RSS as psutil reads it"
    assert row.cpu_percent is None, "one reading is no CPU rate"
    assert row.user == ps.username() and "sys.stdin.read()" in row.command
    (again,) = nvml_processes(nvml, {"cuda:0": 0}, stats, util)
    assert again.gpu_util == 0.0, "no sample newer than the last tick: the process ran no kernel"
    assert again.cpu_percent is not None and 0.0 <= again.cpu_percent <= 100.0 * (os.cpu_count() or 1)


def test_nvml_without_process_samples_shows_unknown_gpu_util(child):
    nvml = _fake(child.pid)
    del nvml.data["devices"][0]["process_utilization"]  # a driver that answers NotSupported
    (row,) = nvml_processes(nvml, {"cuda:0": 0}, ProcessStats(), NvmlProcessUtil())
    assert row.gpu_util is None


def test_a_vanished_pid_is_unknown_not_a_crash():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    nvml = _fake(gone.pid)
    (row,) = nvml_processes(nvml, {"cuda:0": 0}, ProcessStats(), NvmlProcessUtil())
    assert (row.user, row.command, row.host_mem, row.cpu_percent, row.elapsed_s) == ("?", "?", None, None, None)
    assert row.mem_bytes == nvml.data["devices"][0]["processes"][0]["used_memory"], "NVML's figure still shows"


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


AMD = "drm-driver: amdgpu\ndrm-pdev: 0000:03:00.0\ndrm-client-id: {cid}\ndrm-memory-vram: 2048 KiB\n" \
      "drm-engine-gfx: {gfx} ns\ndrm-engine-compute: {compute} ns\n"


def test_drm_engine_time_between_two_ticks_is_the_gpu_util(tmp_path, child):
    pid, now = child.pid, [100.0]
    util, stats = DrmUtil(clock=lambda: now[0]), ProcessStats()
    host = FsHost(tmp_path, {})
    _write(tmp_path, f"/proc/{pid}/fdinfo/5", AMD.format(cid=7, gfx=1_000_000_000, compute=0))
    _write(tmp_path, f"/proc/{pid}/fdinfo/6", AMD.format(cid=7, gfx=1_000_000_000, compute=0))  # same client, dup'd fd
    (first,) = drm_processes(host, {"0000:03:00.0": "hip:0"}, [pid], stats, util)
    assert first.gpu_util is None, "one reading is no rate"
    now[0] = 102.0  # two seconds later: 0.5 s of gfx, 1.5 s of compute
    _write(tmp_path, f"/proc/{pid}/fdinfo/5", AMD.format(cid=7, gfx=1_500_000_000, compute=1_500_000_000))
    _write(tmp_path, f"/proc/{pid}/fdinfo/6", AMD.format(cid=7, gfx=1_500_000_000, compute=1_500_000_000))
    (second,) = drm_processes(host, {"0000:03:00.0": "hip:0"}, [pid], stats, util)
    assert second.gpu_util == pytest.approx(75.0), "the busiest engine (compute 1.5 s of 2 s), the client counted once"
    assert second.mem_bytes == 2048 * 1024 and second.host_mem and second.elapsed_s is not None


def test_drm_i915_capacity_and_xe_cycles(tmp_path):
    util = DrmUtil()
    i915 = "drm-pdev: 0000:00:02.0\ndrm-client-id: 3\ndrm-engine-video: {n} ns\ndrm-engine-capacity-video: 2\n"
    c0, c1 = parse_drm_client(i915.format(n=0)), parse_drm_client(i915.format(n=1_000_000_000))
    assert util.update(1, "xpu:0", {"3": c0}, 10.0) is None
    assert util.update(1, "xpu:0", {"3": c1}, 11.0) == pytest.approx(50.0), "1 s busy of two video engines"
    xe = "drm-pdev: 0000:03:00.0\ndrm-client-id: 9\ndrm-cycles-rcs: {b}\ndrm-total-cycles-rcs: {t}\n"
    util.update(2, "xpu:1", {"9": parse_drm_client(xe.format(b=100, t=1000))}, 0.0)
    assert util.update(2, "xpu:1", {"9": parse_drm_client(xe.format(b=350, t=2000))}, 0.0) == pytest.approx(25.0)
    hostile = parse_drm_client("drm-pdev: x\ndrm-engine-gfx: -5 ns\ndrm-engine-capacity-gfx: 0\ndrm-cycles-rcs: z\n")
    assert hostile is not None and hostile.engines_ns == {} and hostile.cycles == {}
    util.update(3, "k", {"1": parse_drm_client("drm-pdev: x\ndrm-engine-gfx: 900 ns\n")}, 1.0)
    assert util.update(3, "k", {"1": parse_drm_client("drm-pdev: x\ndrm-engine-gfx: 100 ns\n")}, 2.0) is None, \
        "a counter that went backwards (a new client) is no rate"


def test_signals_reach_only_the_process_that_was_shown(child):
    started = psutil.Process(child.pid).create_time()
    assert "no longer the process shown" in send_signal(child.pid, started + 100, signal.SIGTERM), "a reused pid"
    assert child.poll() is None
    assert send_signal(child.pid, started, signal.SIGTERM) == f"SIGTERM sent to pid {child.pid}"
    assert child.wait(timeout=30) == -signal.SIGTERM
    assert "not sent" in send_signal(child.pid, started, signal.SIGKILL)


def test_a_command_line_cannot_drive_the_terminal():
    """Any user names their processes: escape sequences and bidi overrides in argv are removed."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "\x1b]0;PWNED\x07evil\u202e"],
                            stdin=subprocess.PIPE)
    try:
        # Until the child has exec'd, its command line is the parent's: wait for its own (bounded).
        deadline = time.monotonic() + 30
        while "-c" not in psutil.Process(proc.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.01)
        command = ProcessStats().describe(proc.pid)["command"]
        assert "evil" in command and "\x1b" not in command and "PWNED" not in command and "\u202e" not in command
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_an_unreadable_command_line_keeps_the_other_figures(child, monkeypatch):
    """hidepid, or another user's process: psutil denies the command line, not the figures."""
    def denied(self):
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "cmdline", denied)
    stats = ProcessStats()
    stats.describe(child.pid)
    info = stats.describe(child.pid)
    assert info["command"] == "?" and info["user"] == "?"
    assert info["host_mem"] and info["cpu_percent"] is not None, "the second tick is a CPU rate: the process was kept"
