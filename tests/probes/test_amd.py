"""AMD: amdsmi absent, present without ROCm (prints + KeyError), faked; sysfs and KFD fallback."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from hwtui.core.finding import Status
from hwtui.probes.amd import collect_amd, gfx_name, kfd_targets
from hwtui.probes.catalog import catalog
from hwtui.probes.child import run_in_child
from hwtui.probes.framework import run_checks
from tests.probes import recorded
from tests.probes.livehost import LiveTreeHost

FAKE_AMDSMI = textwrap.dedent('''
    """A stand-in with amdsmi's API, answering like a ROCm 6.3 box with an RX 7800 XT."""
    import enum
    print("fake amdsmi loaded")  # the real one prints too: must not reach hwtui's stdout
    class AmdSmiTemperatureType(enum.IntEnum):
        EDGE = 0
    class AmdSmiTemperatureMetric(enum.IntEnum):
        CURRENT = 0
    class AmdSmiLibraryException(Exception):
        pass
    def amdsmi_init(): pass
    def amdsmi_shut_down(): pass
    def amdsmi_get_rocm_version(): return (True, "6.3.1")
    def amdsmi_get_processor_handles(): return ["h0"]
    def amdsmi_get_gpu_device_bdf(h): return "0000:05:00.0"
    def amdsmi_get_gpu_asic_info(h): return {"market_name": "AMD Radeon RX 7800 XT", "target_graphics_version": "gfx1101"}
    def amdsmi_get_gpu_vram_usage(h): return {"vram_total": 16368, "vram_used": 1024}
    def amdsmi_get_gpu_activity(h): return {"gfx_activity": 14, "umc_activity": 3, "mm_activity": "N/A"}
    def amdsmi_get_power_info(h): return {"current_socket_power": "N/A", "average_socket_power": 41, "power_limit": 263000000}
    def amdsmi_get_temp_metric(h, t, m): return 44
    def amdsmi_get_gpu_driver_info(h): raise AmdSmiLibraryException("AMDSMI_STATUS_NOT_SUPPORTED")
''')


@pytest.fixture(scope="module")
def fake_amdsmi_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fakesmi")
    (d / "fake_amdsmi.py").write_text(FAKE_AMDSMI)
    return d


def test_amdsmi_without_rocm_is_contained_in_the_child():
    """The installed amdsmi wrapper has no libamd_smi.so here: it prints and raises KeyError."""
    out = run_in_child("hwtui.probes.runtime_child:amdsmi_facts", {}, timeout=60)
    assert out["available"] is False and "libamd_smi.so" in out["reason"]
    assert "libamd_smi.so" in out["printed"]  # what it printed was captured, not leaked


def test_amdsmi_absent():
    out = run_in_child("hwtui.probes.runtime_child:amdsmi_facts", {"module": "no_such_amdsmi_module"}, timeout=60)
    assert out["available"] is False and "ModuleNotFoundError" in out["reason"]


def test_amdsmi_faked_through_the_real_child(fake_amdsmi_dir, capfd):
    env = {**os.environ, "PYTHONPATH": str(fake_amdsmi_dir)}
    out = run_in_child("hwtui.probes.runtime_child:amdsmi_facts", {"module": "fake_amdsmi"}, timeout=60, env=env)
    assert "fake amdsmi loaded" not in capfd.readouterr().out
    assert out["available"] and out["rocm_version"] == "6.3.1"
    dev = out["devices"][0]
    assert dev["pci"] == "0000:05:00.0" and dev["gfx"] == "gfx1101" and dev["name"] == "AMD Radeon RX 7800 XT"
    assert dev["vram_total"] == 16368 * 2**20 and dev["util"] == 14 and dev["temp_c"] == 44
    assert dev["power_w"] == 41 and dev["power_limit_w"] == 263.0  # "N/A" current -> average; uW limit -> W
    assert dev["driver_version"] is None and "driver" in dev["unsupported"]
    assert json.loads(json.dumps(out)) == out


def test_collect_amd_merges_amdsmi_over_sysfs(tmp_path, monkeypatch):
    """The fake stands in for the library itself: a module named ``amdsmi`` first on the path the
    probe child inherits, so collect_amd runs its own child exactly as on a ROCm box."""
    fs = recorded.mixed3(tmp_path)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "amdsmi.py").write_text(FAKE_AMDSMI)
    monkeypatch.syspath_prepend(str(shadow))
    got = collect_amd(LiveTreeHost(fs.root, {}))
    dev = got["devices"][0]
    assert dev["source"] == "amdsmi" and dev["name"] == "AMD Radeon RX 7800 XT" and dev["vram_used"] == 2**30
    assert got["amdsmi"]["available"] and got["rocm_version"] == "6.3.1"


def test_sysfs_fallback_and_kfd_targets(tmp_path):
    fs = recorded.rx7900xtx(tmp_path)
    host = fs.host()
    assert kfd_targets(host) == {"0000:03:00.0": "gfx1100"}
    assert [gfx_name(v) for v in (110000, 90010, 90402, 100302)] == ["gfx1100", "gfx90a", "gfx942", "gfx1032"]
    got = collect_amd(host)
    dev = got["devices"][0]
    assert dev["source"] == "sysfs" and dev["vram_total"] == 24 * 2**30 and dev["temp_c"] == 44.0 and dev["gfx"] == "gfx1100"
    assert got["kfd"] == {"exists": True, "access": True}


def test_kfd_access_and_groups(tmp_path):
    fs = recorded.rx7900xtx(tmp_path, groups=(1000,))
    collectors, rules = catalog()
    got = {f.id: f for f in run_checks(fs.host(), collectors, rules, only={"gpu"}).findings}
    f = got["amd.kfd"]
    assert f.status == Status.FAIL and f.remedy.startswith("sudo usermod -aG render,video alice")
    assert "render" in f.detail and "video" in f.detail
    fs.path("/dev/kfd").unlink()
    got = {f.id: f for f in run_checks(fs.host(), collectors, rules, only={"gpu"}).findings}
    assert got["amd.kfd"].status == Status.FAIL and "--device=/dev/kfd" in got["amd.kfd"].remedy
