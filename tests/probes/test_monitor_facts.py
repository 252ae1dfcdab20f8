"""The monitor's host counters and device processes, read from a sysroot tree (no live /proc)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from hwtui.probes.host import FsHost
from hwtui.probes.host_counters import HostCounters, parse_cpu_times, parse_meminfo, parse_net_dev
from hwtui.probes.processes import drm_processes, nvml_processes, parse_drm_fdinfo

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: {lo} 10 0 0 0 0 0 0 {lo} 10 0 0 0 0 0 0
  eth0: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0
"""


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_parsers():
    assert parse_cpu_times("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n") == (150, 1000)
    assert parse_meminfo("MemTotal: 1000 kB\nMemAvailable: 250 kB\n") == (750 * 1024, 1000 * 1024)
    assert parse_meminfo("MemTotal: 1000 kB\nMemAvailable: 5000 kB\n") == (None, 1000 * 1024), "never a negative used"
    assert parse_meminfo("MemTotal: 1000 kB\n") == (None, 1000 * 1024)
    assert parse_net_dev(NET_DEV.format(lo=999, rx=10, tx=20)) == (10, 20), "loopback is left out"


def test_rates_come_from_two_readings(tmp_path):
    clock = iter([10.0, 12.0])
    host = FsHost(tmp_path, {})
    _write(tmp_path, "/proc/stat", "cpu  100 0 0 900 0 0 0 0\n")
    _write(tmp_path, "/proc/meminfo", "MemTotal: 1000 kB\nMemAvailable: 400 kB\n")
    _write(tmp_path, "/proc/net/dev", NET_DEV.format(lo=0, rx=1000, tx=0))
    counters = HostCounters(host, clock=lambda: next(clock))
    first = counters.sample()
    assert first.cpu_percent is None and first.rx_bytes_per_s is None, "one reading is no rate"
    assert first.mem_used == 600 * 1024
    _write(tmp_path, "/proc/stat", "cpu  400 0 0 1600 0 0 0 0\n")  # 300 busy of 1000
    _write(tmp_path, "/proc/net/dev", NET_DEV.format(lo=5000, rx=5000, tx=2000))
    second = counters.sample()
    assert second.cpu_percent == 30.0
    assert second.rx_bytes_per_s == 2000.0 and second.tx_bytes_per_s == 1000.0


def test_drm_fdinfo_gives_processes_per_device(tmp_path):
    me = os.getpid()  # a real pid, so user and command resolve through psutil
    _write(tmp_path, f"/proc/{me}/fdinfo/5", "pos: 0\ndrm-driver: amdgpu\ndrm-pdev: 0000:03:00.0\ndrm-memory-vram: 2048 KiB\n")
    _write(tmp_path, f"/proc/{me}/fdinfo/6", "pos: 0\ndrm-driver: amdgpu\ndrm-pdev: 0000:03:00.0\ndrm-memory-vram: 4096 KiB\n")
    _write(tmp_path, f"/proc/{me}/fdinfo/7", "pos: 0\nflags: 02\n")
    _write(tmp_path, f"/proc/{me}/fdinfo/8", "drm-pdev: 0000:99:00.0\ndrm-memory-vram: 1 KiB\n")  # not a device we show
    assert parse_drm_fdinfo("flags: 0\n") is None
    (row,) = drm_processes(FsHost(tmp_path, {}), {"0000:03:00.0": "hip:0"}, pids=[me])
    assert (row.device, row.pid, row.mem_bytes) == ("hip:0", me, 4096 * 1024), "one client: the largest fd, not the sum"
    assert row.user != "?" and "python" in row.command


def test_nvml_processes():
    class FakeNvml:
        def nvmlDeviceGetComputeRunningProcesses(self, handle):
            return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 * 2**30)] if handle == "h0" else []

        def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    (row,) = nvml_processes(FakeNvml(), {"cuda:0": "h0", "cuda:1": "h1"})
    assert row.device == "cuda:0" and row.mem_bytes == 3 * 2**30 and row.pid == os.getpid()


def test_host_strip_and_cpu_row_agree_on_a_replay_whose_meminfo_lacks_memavailable():
    """The 8x H100 example: /proc/meminfo holds MemTotal only. The strip once said `mem ?/62.5G`
    beside a cpu row of 584.4G/2015.0G; both now read one source (issue 25)."""
    import json
    from pathlib import Path

    from hwtui.probes.host import ReplayHost
    from hwtui.probes.sampling import Sampler

    snap = json.loads((Path(__file__).resolve().parents[2] / "docs/examples/h100x8.snapshot.json").read_text())
    host = ReplayHost(snap)
    strip = HostCounters(host).sample()
    cpu_row = next(s for s in Sampler(host).sample() if s.key == "cpu")
    assert strip.mem_used is not None and (strip.mem_used, strip.mem_total) == (cpu_row.mem_used, cpu_row.mem_total)
