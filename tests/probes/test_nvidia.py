"""NVML probe against a FakeNVML that raises nvidia-ml-py's real NVMLError subclasses."""

from __future__ import annotations

import copy

import pynvml
import pytest

from hwtui.core.finding import Status
from hwtui.probes.catalog import catalog
from hwtui.probes.framework import run_checks
from hwtui.probes.inventory import devices_from_facts
from hwtui.probes.nvidia import NvmlCollector, collect_driver, normalize_bus_id, parse_proc_version, read_nvml
from tests import machines
from tests.fakesys import FakeSys
from tests.probes.fakenvml import FakeNVML
from tests.probes.livehost import LiveTreeHost
from tests.probes.recorded import load, record


def _by_id(result):
    return {f.id: f for f in result.findings}


def test_fake_raises_the_real_subclasses():
    fake = FakeNVML(load("nvml_rtx3090"))
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetMigMode(0)


def test_h100_every_field():
    data = load("nvml_h100x8")
    facts = read_nvml(FakeNVML(data))
    assert facts["ok"] and facts["driver_version"] == "570.124.06" and facts["cuda_driver_version"] == "12.8"
    assert len(facts["devices"]) == 8
    for raw, dev in zip(data["devices"], facts["devices"], strict=True):
        assert dev["name"] == raw["name"] and dev["uuid"] == raw["uuid"]
        assert dev["pci"] == normalize_bus_id(raw["pci_bus_id"])
        assert dev["memory"] == {**raw["memory"], "version": 1}, "a recording without v2 answers as an old driver"
        assert dev["utilization"]["gpu"] == raw["utilization"]["gpu"]
        assert dev["temperature_c"] == raw["temperature"]
        assert dev["power_w"] == raw["power_mw"] / 1000 and dev["power_limit_w"] == raw["power_limit_mw"] / 1000
        assert dev["pcie"]["tx_kbps"] == raw["pcie"]["tx_kbps"] and dev["pcie"]["cur_gen"] == 5
        assert dev["nvlink_up"] == 18 and dev["compute_capability"] == [9, 0]
        assert dev["mig"] == {"current": 0, "pending": 0}
        assert dev["processes"][0]["pid"] == raw["processes"][0]["pid"]
        assert dev["unsupported"] == {}


def test_not_supported_leaves_field_empty_with_reason(tmp_path):
    """What the check says about a GeForce that answers NotSupported for NVLink, MIG and PCIe
    throughput: the device still passes with every other figure, and the detail names what was
    not reported and why."""
    fs = machines.rtx4090_rx7800xt_arc_a750(tmp_path)
    data = load("nvml_rtx4090")
    record(fs, nvml="nvml_rtx4090")
    collectors, rules = catalog()
    result = run_checks(fs.host(), collectors, rules, only={"gpu"})
    [f] = [f for f in result.findings if f.id.startswith("nvidia.device[")]
    assert f.status == Status.PASS and "RTX 4090" in f.title
    assert f.detail == ("not reported: mig_mode (NotSupported), nvlink (NotSupported), pcie.rx (NotSupported), "
                        "pcie.tx (NotSupported)")
    assert f.data["nvlink_up"] is None and f.data["mig"] is None
    assert f.data["pcie"]["tx_kbps"] is None and f.data["pcie"]["cur_gen"] == 4  # the rest of pcie still read
    assert f.data["memory"]["total"] == data["devices"][0]["memory"]["total"]
    assert not [g for g in result.findings if g.id.startswith("nvidia.mig[")], "no MIG answer is no MIG warning"


def test_gpu_lost_mid_read_fails_that_device_only():
    data = load("nvml_h100x8")
    data["devices"][3]["errors"] = {"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_GPU_IS_LOST}
    facts = read_nvml(FakeNVML(data))
    assert facts["ok"]
    assert facts["devices"][3]["lost"] and facts["devices"][3]["error"]["kind"] == "GpuIsLost"
    assert not facts["devices"][2]["lost"] and facts["devices"][4]["power_w"] is not None


def test_shutdown_balances_init():
    fake = FakeNVML(load("nvml_rtx3090"))
    read_nvml(fake)
    assert fake.initialised == 0


@pytest.fixture()
def rtx3090_tree(tmp_path):
    fs = FakeSys(tmp_path)
    machines._base(fs)
    machines.nvidia_gpu(fs, "0000:01:00.0", 0x2204, 0, driver_version="570.124.04")
    fs.file("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.575.57.08", "")  # upgraded library, old module
    return fs


ERROR_CASES = [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, Status.FAIL, "library not found", "nvidia-container-toolkit"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, Status.FAIL, "not loaded", "sudo modprobe nvidia"),
    (pynvml.NVML_ERROR_NO_PERMISSION, Status.FAIL, "no permission", "usermod -aG video alice"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, Status.FAIL, "reboot needed", "sudo reboot"),
    (pynvml.NVML_ERROR_GPU_IS_LOST, Status.FAIL, "fell off the bus", "nvidia-smi -r"),
    (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, Status.WARN, "older than", "nvidia-driver"),
    (pynvml.NVML_ERROR_UNKNOWN, Status.ERROR, "Unknown", "nvidia-smi -q"),
]


@pytest.mark.parametrize("code, status, title, remedy", ERROR_CASES)
def test_each_nvml_error_kind_is_a_finding_with_remedy(rtx3090_tree, code, status, title, remedy):
    data = copy.deepcopy(load("nvml_rtx3090"))
    data["init_error"] = code
    collectors, rules = catalog()
    host = LiveTreeHost(rtx3090_tree.root, {})
    facts_nvml = NvmlCollector(nvml=FakeNVML(data))(host)
    assert facts_nvml["ok"] is False and facts_nvml["error"]["code"] == code
    rtx3090_tree.facts(nvml=facts_nvml)
    result = run_checks(rtx3090_tree.host(), collectors, [r for r in rules if r.name in ("nvml", "nvidia_driver")])
    f = _by_id(result)["nvidia.nvml"]
    assert f.status == status and title in f.title and remedy in f.remedy
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        assert "570.124.04" in f.detail and "575.57.08" in f.detail
    # Without NVML the kernel driver version still comes from /proc.
    assert _by_id(result)["nvidia.driver"].data["driver_version"] == "570.124.04"


def test_no_nvidia_gpu_no_library_is_not_a_failure(tmp_path):
    fs = machines.arc_a380_rx6600(tmp_path)
    record(fs)
    collectors, rules = catalog()
    result = run_checks(fs.host(), collectors, [r for r in rules if r.name == "nvml"])
    assert not [f for f in result.findings if f.id.startswith("nvidia.")]


def test_proc_version_fallback(rtx3090_tree):
    assert parse_proc_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.07  Release Build") == "570.133.07"
    drv = collect_driver(rtx3090_tree.host())
    assert drv["kernel_version"] == "570.124.04" and drv["library_versions"] == ["575.57.08"]


def test_gpu_invisible_to_nvml_and_inventory_enrichment(tmp_path):
    fs = machines.h100_x8(tmp_path)
    data = load("nvml_h100x8")
    data["devices"] = data["devices"][:7]  # one GPU failed to initialise
    record(fs, nvml=data)
    collectors, rules = catalog()
    result = run_checks(fs.host(), collectors, rules, only={"gpu"})
    f = _by_id(result)["nvidia.nvml.count"]
    assert f.status == Status.FAIL and f.data["missing"] == ["0000:db:00.0"]
    devices = devices_from_facts(result.facts)
    first = next(d for d in devices if d.pci == "0000:18:00.0")
    assert first.name == "NVIDIA H100 80GB HBM3" and first.vram_total == 85520809984
    assert first.extra["nvml_index"] == 0 and first.extra["compute_capability"] == [9, 0]


def test_mig_pending_is_a_warning(tmp_path):
    fs = machines.h100_x8(tmp_path)
    data = load("nvml_h100x8")
    data["devices"][0]["mig"] = [0, 1]
    record(fs, nvml=data)
    collectors, rules = catalog()
    f = _by_id(run_checks(fs.host(), collectors, rules, only={"gpu"}))["nvidia.mig[0000:18:00.0]"]
    assert f.status == Status.WARN and "nvidia-smi -r -i 0" in f.remedy


@pytest.mark.parametrize("name", sorted(machines.MACHINES))
def test_trees_without_runtime_facts_degrade_quietly(tmp_path, name):
    """A bare recorded tree (no NVML/torch/amdsmi answers) gives skips, never probe errors."""
    fs = machines.MACHINES[name](tmp_path)
    collectors, rules = catalog()
    result = run_checks(fs.host(), collectors, rules, only={"gpu"})
    mine = ("hwtui.probe.nvml", "hwtui.probe.amd", "hwtui.probe.intel", "hwtui.probe.tpu", "hwtui.probe.gaudi",
            "hwtui.probe.torch_build", "hwtui.probe.torch_runtime", "hwtui.probe.nvidia_driver")
    assert not [f for f in result.findings if f.id in mine]
    got = _by_id(result)
    if any(d.vendor == "NVIDIA" and d.usable for d in devices_from_facts(result.facts)):
        assert got["nvidia.nvml"].status == Status.SKIP
        assert got["nvidia.driver"].data["driver_version"] == "570.124.04"  # from /proc
