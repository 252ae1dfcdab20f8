"""Live sampling: recorded values on replay, NVML handles kept open and sysfs reads when live."""

from __future__ import annotations

import json
import time

from hwtui.probes.host import RecordingHost, ReplayHost
from hwtui.probes.inventory import detect_devices
from hwtui.probes.sampling import Sampler
from tests.probes.fakenvml import FakeNVML
from tests.probes.livehost import LiveTreeHost
from tests.probes.recorded import h100x8, load, mixed3


def _by_key(samples):
    return {s.key: s for s in samples}


def test_recorded_tree_returns_recorded_values(tmp_path):
    fs = mixed3(tmp_path)
    with Sampler(fs.host()) as sampler:
        got = _by_key(sampler.sample())
    assert set(got) == {"cuda:0", "xpu:0", "hip:0", "cpu"}
    nv = load("nvml_rtx4090")["devices"][0]
    assert got["cuda:0"].mem_used == nv["memory"]["used"] and got["cuda:0"].mem_total == nv["memory"]["total"]
    assert got["cuda:0"].util == nv["utilization"]["gpu"] and got["cuda:0"].temp_c == nv["temperature"]
    assert got["cuda:0"].power_w == nv["power_mw"] / 1000 and got["cuda:0"].power_limit_w == 450.0
    amd = got["hip:0"]  # sysfs: mem_info_vram_*, gpu_busy_percent, hwmon (milli-C, micro-W)
    assert amd.mem_total == 16 * 2**30 and amd.mem_used == 16 * 2**30 // 20
    assert amd.util == 14.0 and amd.temp_c == 44.0 and amd.power_w == 41.0 and amd.power_limit_w == 263.0
    assert got["xpu:0"].power_limit_w == 190.0
    # The tree's /proc/meminfo has MemTotal only: used and total both come from the recorded runtime fact.
    rt = json.loads((fs.root / ".hwtui-facts.json").read_text())["host_runtime"]
    assert (got["cpu"].mem_used, got["cpu"].mem_total) == (rt["mem_total"] - rt["mem_available"], rt["mem_total"])
    assert got["cpu"].name == "Test CPU @ 3.0GHz"


def test_snapshot_replay_reproduces_samples(tmp_path):
    fs = h100x8(tmp_path / "tree")
    rec = RecordingHost(fs.host())
    devices, _ = detect_devices(rec)
    first = Sampler(rec, devices).sample()
    snap = json.loads(json.dumps(rec.snapshot()))
    replayed = Sampler(ReplayHost(snap)).sample()
    assert [s.to_dict() for s in replayed] == [s.to_dict() for s in first]
    assert len(replayed) == 9 and replayed[7].key == "cuda:7" and replayed[7].util == 96.0


def test_live_keeps_nvml_open_and_is_fast(tmp_path):
    fs = h100x8(tmp_path)
    data = load("nvml_h100x8")
    host = LiveTreeHost(fs.root, {})
    devices, _ = detect_devices(fs.host())
    fake = FakeNVML(data)
    sampler = Sampler(host, devices, nvml=fake)
    assert fake.initialised == 1
    sampler.sample()
    fake.data["devices"][2]["utilization"]["gpu"] = 3  # the next tick sees new figures
    fake.calls.clear()
    n = 200
    started = time.perf_counter()
    for _ in range(n):
        samples = sampler.sample()
    per_device_ms = (time.perf_counter() - started) / n / 8 * 1000
    got = _by_key(samples)
    assert got["cuda:2"].util == 3.0 and got["cuda:0"].mem_total == data["devices"][0]["memory"]["total"]
    assert got["cpu"].mem_total and got["cpu"].util is not None  # psutil on the live path
    # Power limit is read once, not per tick; no handle is re-opened per tick.
    assert "nvmlDeviceGetEnforcedPowerLimit" not in fake.calls
    assert fake.calls.count("nvmlDeviceGetMemoryInfo") == n * 8
    assert per_device_ms < 1.0, per_device_ms
    sampler.close()
    assert fake.initialised == 0


def test_live_nvml_failure_leaves_cells_empty(tmp_path):
    fs = h100x8(tmp_path)
    data = load("nvml_h100x8")
    data["init_error"] = 9  # driver not loaded
    devices, _ = detect_devices(fs.host())
    got = _by_key(Sampler(LiveTreeHost(fs.root, {}), devices, nvml=FakeNVML(data)).sample())
    assert got["cuda:0"].util is None and got["cuda:0"].name


def test_intel_power_from_energy_counter(tmp_path):
    fs = mixed3(tmp_path)
    energy = fs.path("/sys/bus/pci/devices/0000:09:00.0/hwmon/hwmon2/energy1_input")
    devices, _ = detect_devices(fs.host())
    sampler = Sampler(LiveTreeHost(fs.root, {}), [d for d in devices if d.backend == "xpu"])
    assert _by_key(sampler.sample())["xpu:0"].power_w is None  # one reading is not a rate yet
    time.sleep(0.05)
    energy.write_text(str(123456789 + 5_000_000) + "\n")  # 5 J later
    watts = _by_key(sampler.sample())["xpu:0"].power_w
    assert watts is not None and 5 / 0.5 < watts < 5 / 0.04


def _cpu_sample(tmp_path, meminfo: str | None, runtime: dict | None):
    from hwtui.probes.host import FACTS_FILE, FsHost

    (tmp_path / "proc").mkdir(parents=True, exist_ok=True)
    if meminfo is not None:
        (tmp_path / "proc" / "meminfo").write_text(meminfo)
    (tmp_path / FACTS_FILE).write_text(json.dumps({"host_runtime": runtime} if runtime is not None else {}))
    return _by_key(Sampler(FsHost(tmp_path), []).sample())["cpu"]


def test_host_memory_comes_from_one_source(tmp_path):
    """A snapshot with MemTotal but no MemAvailable: used and total both come from the recorded
    runtime fact, never this tree's total minus the recorder's own available memory."""
    cpu = _cpu_sample(tmp_path, "MemTotal: 1000 kB\n", {"mem_total": 64 * 2**30, "mem_available": 48 * 2**30})
    assert (cpu.mem_used, cpu.mem_total) == (16 * 2**30, 64 * 2**30)
    cpu = _cpu_sample(tmp_path, "MemTotal: 1000 kB\nMemAvailable: 400 kB\n", {"mem_total": 1, "mem_available": 1})
    assert (cpu.mem_used, cpu.mem_total) == (600 * 1024, 1000 * 1024), "the tree's own pair wins"


def test_hostile_meminfo_is_unknown_not_a_crash(tmp_path):
    cpu = _cpu_sample(tmp_path, "MemTotal: lots kB\nMemAvailable: -5 kB\n", None)
    assert (cpu.mem_used, cpu.mem_total) == (None, None)
    cpu = _cpu_sample(tmp_path, "MemTotal: 1000 kB\n", {"mem_total": "x", "mem_available": 2})
    assert (cpu.mem_used, cpu.mem_total) == (None, 1000 * 1024), "the total alone is still known"
