"""Intel (IPEX, Level Zero on the linker path), Gaudi (HCCL env, hl-smi) and TPU (PJRT, no libtpu init)."""

from __future__ import annotations

import copy

import pytest

from hwtui.core.finding import Status
from hwtui.probes.catalog import catalog
from hwtui.probes.framework import run_checks
from hwtui.probes.libpaths import find_library, linker_dirs
from tests import machines
from tests.probes import recorded


def check(fs, env=None):
    collectors, rules = catalog()
    return {f.id: f for f in run_checks(fs.host(env), collectors, rules, only={"gpu"}).findings}


def test_level_zero_found_through_ld_so_conf(tmp_path):
    fs = recorded.arc_a770(tmp_path, lz=False)
    fs.file("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    fs.file("/etc/ld.so.conf.d/intel.conf", "# oneAPI\n/opt/intel/lib\n")
    fs.file("/opt/intel/lib/libze_loader.so.1.19.2", "")
    fs.file("/opt/intel/lib/libze_intel_gpu.so.1", "")
    host = fs.host({"LD_LIBRARY_PATH": "/custom/lib"})
    assert linker_dirs(host)[:2] == ["/custom/lib", "/opt/intel/lib"]
    assert find_library(host, "libze_loader.so*") == ["/opt/intel/lib/libze_loader.so.1.19.2"]
    assert check(fs)["torch.wheel.level_zero"].status == Status.PASS


def test_level_zero_loader_without_gpu_driver(tmp_path):
    fs = recorded.arc_a770(tmp_path, lz=False)
    recorded.level_zero(fs, gpu_driver=False)
    got = check(fs)
    assert got["torch.wheel.level_zero"].status == Status.FAIL and "libze_intel_gpu" in got["torch.wheel.level_zero"].title


@pytest.mark.parametrize("ipex, torch, status, needle", [
    ("2.8.10+xpu", "torch_xpu_arc", Status.WARN, "discontinued"),
    ("2.7.10+xpu", "torch_xpu_arc", Status.FAIL, "does not match"),
])
def test_ipex_must_match_and_is_discontinued(tmp_path, ipex, torch, status, needle):
    fs = recorded.arc_a770(tmp_path, wheel=torch, ipex_version=ipex)
    f = check(fs)["intel.ipex"]
    assert f.status == status and needle in f.title
    assert f.remedy.endswith("-m pip install torch --index-url https://download.pytorch.org/whl/xpu")


def test_ipex_for_torch_after_28_does_not_exist(tmp_path):
    runtime = recorded.torch_runtime_fact("torch_xpu_arc")
    fs = recorded.arc_a770(tmp_path, ipex_version="2.8.10+xpu", runtime=runtime)
    build = recorded.torch_build_fact("torch_xpu_arc")
    build["version"] = "2.9.0+xpu"
    fs.facts(torch_build=build)
    f = check(fs)["intel.ipex"]
    assert f.status == Status.FAIL and "discontinued" in f.detail


def test_xpu_unavailable_in_torch(tmp_path):
    runtime = copy.deepcopy(recorded.torch_runtime_fact("torch_xpu_arc"))
    runtime["xpu"] = {"available": False, "device_count": 0, "devices": [], "error": None}
    got = check(recorded.arc_a770(tmp_path, runtime=runtime))
    assert got["torch.runtime.xpu"].status == Status.FAIL


def _gaudi(tmp_path, **kw):
    fs = machines.gaudi2_node(tmp_path)
    rt = recorded.torch_runtime_fact("torch_cpu")
    rt["hpu"] = {"available": True, "device_count": 8, "names": ["GAUDI2"] * 8, "error": None}
    rt["backends"]["hccl"] = True
    fs.file("/usr/bin/hl-smi", "")
    return recorded.record(fs, torch="torch_cpu", runtime=rt,
                           hl_smi={"ok": True, "rows": [[str(i), "HL-225", f"0000:{0x19 + i * 16:02x}:00.0", "98304 MiB",
                                                         "512 MiB", "1.20.0"] for i in range(8)]}, **kw)


@pytest.mark.parametrize("env, status, needle", [
    ({}, Status.PASS, "fine for one process"),
    ({"WORLD_SIZE": "8", "RANK": "0"}, Status.FAIL, "LOCAL_RANK"),
    ({"WORLD_SIZE": "8", "RANK": "3", "LOCAL_RANK": "3"}, Status.PASS, "RANK=3"),
])
def test_gaudi_hccl_env(tmp_path, env, status, needle):
    got = check(_gaudi(tmp_path), {"PATH": "/usr/bin", **env})
    f = got["gaudi.hccl_env"]
    assert f.status == status and needle in (f.title + f.remedy)
    if status == Status.FAIL:
        assert "initialize_distributed_hpu(world_size, rank, local_rank)" in f.remedy
    assert got["gaudi.runtime"].status == Status.PASS and got["gaudi.hl_smi"].status == Status.PASS


def test_gaudi_missing_devices_and_hl_smi(tmp_path):
    fs = _gaudi(tmp_path)
    rt = recorded.torch_runtime_fact("torch_cpu")
    rt["hpu"] = {"available": True, "device_count": 6, "names": ["GAUDI2"] * 6, "error": None}
    fs.facts(torch_runtime=rt)
    got = check(fs, {"PATH": "/nowhere"})
    assert got["gaudi.runtime"].status == Status.WARN and "6 of 8" in got["gaudi.runtime"].title
    assert got["gaudi.hl_smi"].status == Status.WARN


@pytest.mark.parametrize("pjrt, status", [("TPU", Status.PASS), (None, Status.WARN), ("CPU", Status.WARN)])
def test_tpu_pjrt(tmp_path, pjrt, status):
    fs = machines.tpu_vm(tmp_path)
    recorded.record(fs, tpu_packages={"libtpu": True, "torch_xla": True, "jax": False})
    got = check(fs, {"PJRT_DEVICE": pjrt} if pjrt else {})
    assert got["tpu.pjrt"].status == status
    assert got["tpu.chips"].data["count"] == 4 and "v4" in got["tpu.chips"].title
    if status == Status.WARN:
        assert got["tpu.pjrt"].remedy.startswith("export PJRT_DEVICE=TPU")


def test_tpu_without_runtime_and_lock(tmp_path):
    fs = machines.tpu_vm(tmp_path)
    recorded.record(fs)
    fs.file("/tmp/libtpu_lockfile", "")
    got = check(fs)
    assert got["tpu.runtime"].status == Status.FAIL and "torch_xla[tpu]" in got["tpu.runtime"].remedy
    assert got["tpu.lock"].status == Status.WARN


def test_tpu_probe_never_imports_libtpu():
    import sys

    from hwtui.probes.tpu import _python_packages

    before = set(sys.modules)
    _python_packages()
    assert not {m for m in set(sys.modules) - before if m.split(".")[0] in ("libtpu", "torch_xla", "jax")}
