"""Wheel verification: the build from version.py, and each verdict on a recorded machine."""

from __future__ import annotations

import copy

import pytest

from hwtui.core.finding import Status
from hwtui.probes.catalog import catalog
from hwtui.probes.framework import run_checks
from hwtui.probes.torchwheel import (
    compare_driver,
    cuda_arch_support,
    describe_build,
    gfx_from_override,
    parse_version_py,
    pick_nvidia_tag,
)
from tests import machines
from tests.fakesys import FakeSys
from tests.probes import recorded
from tests.probes.recorded import PYTHON, load

URL = "https://download.pytorch.org/whl"


def check(fs, env=None):
    collectors, rules = catalog()
    result = run_checks(fs.host(env), collectors, rules, only={"gpu"})
    return {f.id: f for f in result.findings}


def reinstall(tag):
    return f"{PYTHON} -m pip uninstall -y torch && {PYTHON} -m pip install torch --index-url {URL}/{tag}"


# -- parsing --------------------------------------------------------------------------------

def test_parse_real_installed_version_py():
    import importlib.util
    import os

    spec = importlib.util.find_spec("torch")
    text = open(os.path.join(spec.submodule_search_locations[0], "version.py")).read()
    consts = parse_version_py(text)
    build = describe_build(consts)
    assert build["version"] == consts["__version__"] and build["variant"] in ("cpu", "cuda", "rocm", "xpu")


@pytest.mark.parametrize("consts, variant, tag", [
    ({"__version__": "2.8.0+cu128", "cuda": "12.8"}, "cuda", "cu128"),
    ({"__version__": "2.6.0", "cuda": "12.4"}, "cuda", "cu124"),  # PyPI's default Linux wheel: no suffix
    ({"__version__": "2.7.1+rocm6.3", "hip": "6.3.42131-fa1d09cbd", "rocm": "6.3.0"}, "rocm", "rocm6.3"),
    ({"__version__": "2.5.0a0", "hip": "6.2.41133"}, "rocm", "rocm6.2"),  # distro build
    ({"__version__": "2.8.0+xpu", "xpu": "20250101"}, "xpu", "xpu"),
    ({"__version__": "2.8.0+cpu"}, "cpu", "cpu"),
])
def test_describe_build(consts, variant, tag):
    text = recorded.version_py_text(consts)
    assert "Optional[str]" in text  # annotated assignments, as the wheels write them
    build = describe_build(parse_version_py(text))
    assert (build["variant"], build["tag"]) == (variant, tag)


def test_version_py_is_never_executed():
    assert parse_version_py("import os\nos.system('false')\n__version__ = '1.0'\ncuda = f'{x}'\n") == {"__version__": "1.0"}


# -- the tables -----------------------------------------------------------------------------

@pytest.mark.parametrize("cuda, driver, status", [
    ("12.8", "570.26", Status.PASS),
    ("12.8", "570.124.06", Status.PASS),
    ("12.8", "565.77", Status.WARN),  # minor-version compatibility (12.x >= 525.60.13)
    ("12.6", "535.183.01", Status.WARN),
    ("12.1", "525.60.13", Status.WARN),
    ("12.1", "520.61.05", Status.FAIL),
    ("11.8", "470.256.02", Status.WARN),  # 11.x runs on >= 450.80.02
    ("11.8", "450.51.06", Status.FAIL),
    ("13.0", "580.65.06", Status.PASS),
    ("13.0", "575.51.03", Status.FAIL),
    ("12.9", "575.51.03", Status.PASS),
])
def test_driver_table(cuda, driver, status):
    assert compare_driver(cuda, driver)[0] == status


@pytest.mark.parametrize("cc, arch, want", [
    ((12, 0), ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], None),
    ((12, 0), ["sm_80", "sm_90", "sm_100", "sm_120"], "sass"),
    ((8, 9), ["sm_80", "sm_86", "sm_90"], "sass"),  # same major, higher minor runs 8.6 SASS
    ((9, 0), ["sm_80", "sm_90a"], "sass"),
    ((9, 1), ["sm_80", "sm_90a"], None),  # arch-specific SASS is exact
    ((12, 0), ["sm_80", "sm_90", "compute_90"], "ptx"),
    ((6, 1), ["sm_75", "sm_80"], None),
])
def test_arch_support(cc, arch, want):
    assert cuda_arch_support(cc, arch) == want


def test_tag_choice():
    assert pick_nvidia_tag([(12, 0)], "570.133.07") == ("cu128", True)
    assert pick_nvidia_tag([(12, 0)], "560.35.03") == ("cu128", False)  # needs a driver upgrade first
    assert pick_nvidia_tag([(6, 1)], "570.133.07") == ("cu126", True)  # Pascal left cu128
    assert pick_nvidia_tag([(8, 6)], "560.35.03") == ("cu126", True)  # fits the driver as is
    assert gfx_from_override("10.3.0") == "gfx1030" and gfx_from_override("9.0.10") == "gfx90a"


# -- verdicts on recorded machines ----------------------------------------------------------

def test_sm120_on_cu126_fails_needs_cu128(tmp_path):
    got = check(recorded.rtx5090(tmp_path, "torch_cu126_rtx5090"))
    f = got["torch.wheel.arch[0000:01:00.0]"]
    assert f.status == Status.FAIL and "sm_120" in f.title and "cu128" in f.title
    assert f.remedy == reinstall("cu128")


def test_sm120_on_cu128_passes(tmp_path):
    got = check(recorded.rtx5090(tmp_path, "torch_cu128_rtx5090"))
    assert got["torch.wheel.arch[0000:01:00.0]"].status == Status.PASS
    assert got["nvidia.driver.cuda_compat"].status == Status.PASS


def test_arch_list_assumed_without_runtime_facts(tmp_path):
    fs = recorded.rtx5090(tmp_path, "torch_cu126_rtx5090")
    fs.facts(torch_runtime={"installed": True, "error": {"kind": "timeout", "message": "did not answer", "stderr": ""}})
    got = check(fs)
    f = got["torch.wheel.arch[0000:01:00.0]"]
    assert f.status == Status.FAIL and "assumed" in f.detail
    assert got["torch.runtime"].status == Status.ERROR


def test_driver_below_minimum_for_wheel(tmp_path):
    nvml = copy.deepcopy(load("nvml_rtx3090"))
    nvml["driver_version"] = "470.256.02"
    nvml["cuda_driver_version"] = 11040
    fs = recorded.rtx3090(tmp_path, "torch_cu121_old_driver", nvml=nvml)
    got = check(fs)
    f = got["nvidia.driver.cuda_compat"]
    assert f.status == Status.FAIL and "470.256.02" in f.title
    assert "530.30.02" in f.detail and "525.60.13" in f.detail
    # Upgrade the driver for cu128 (sm_86 is covered by both; cu126 needs 560 too).
    assert "nvidia-driver" in f.remedy and f.remedy.endswith(f"--index-url {URL}/cu128")
    rt = got["torch.runtime.cuda"]
    assert rt.status == Status.FAIL and "too old" in rt.detail


def test_minor_version_compat_warns_and_offers_matching_wheel(tmp_path):
    nvml = copy.deepcopy(load("nvml_rtx3090"))
    nvml["driver_version"] = "565.77"
    f = check(recorded.rtx3090(tmp_path, "torch_cu128_rtx3090", nvml=nvml))["nvidia.driver.cuda_compat"]
    assert f.status == Status.WARN and reinstall("cu126") in f.remedy


def test_driver_from_proc_when_nvml_missing(tmp_path):
    fs = recorded.rtx3090(tmp_path, "torch_cu128_rtx3090")
    fs.facts(nvml={"ok": False, "error": {"kind": "LibraryNotFound", "code": 12, "message": "x"}})
    fs.file("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Release Build\n")
    got = check(fs)
    assert got["nvidia.driver.cuda_compat"].data["driver"] == "550.54.14"
    assert got["nvidia.driver.cuda_compat"].status == Status.WARN
    assert got["torch.wheel.arch[0000:01:00.0]"].status == Status.PASS  # capability from torch's device list


def test_cpu_wheel_on_gpu_host(tmp_path):
    f = check(recorded.rtx3090(tmp_path, "torch_cpu"))["torch.wheel.variant"]
    assert f.status == Status.FAIL and "CPU-only" in f.title and f.remedy == reinstall("cu128")


def test_cpu_wheel_without_gpu_passes(tmp_path):
    fs = machines.laptop_no_gpu(tmp_path)
    recorded.record(fs, torch="torch_cpu")
    assert check(fs)["torch.wheel.variant"].status == Status.PASS


def test_cuda_wheel_on_amd_only_host(tmp_path):
    runtime = recorded.torch_runtime_fact("torch_cu128_rtx3090")
    runtime["cuda"] = {"available": False, "device_count": 0, "devices": [], "warnings": [],
                       "error": "RuntimeError: Found no NVIDIA driver on your system."}
    fs = recorded.rx7900xtx(tmp_path, "torch_cu128_rtx3090", runtime=runtime)
    f = check(fs)["torch.wheel.variant"]
    assert f.status == Status.FAIL and "AMD" in f.title and f.remedy == reinstall("rocm6.4")


def test_gfx_target_missing_from_rocm_arch_list(tmp_path):
    fs = FakeSys(tmp_path)
    machines._base(fs)
    machines.amd_gpu(fs, "0000:08:00.0", 0x73FF, 0, 8 * 2**30)  # RX 6600: gfx1032
    recorded.amd_sysfs(fs, "0000:08:00.0", 100302, 1)
    recorded.record(fs, torch="torch_rocm63_7900xtx")
    got = check(fs)
    f = got["torch.wheel.arch[0000:08:00.0]"]
    assert f.status == Status.FAIL and "gfx1032" in f.title
    assert f.remedy.startswith("export HSA_OVERRIDE_GFX_VERSION=10.3.0")
    assert "torch.wheel.hsa_override" not in got
    # With the override set, it runs as gfx1030: a warning, and the override is reported.
    got = check(fs, {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert got["torch.wheel.arch[0000:08:00.0]"].status == Status.WARN
    assert got["torch.wheel.hsa_override"].status == Status.WARN and got["torch.wheel.hsa_override"].data["forced"] == "gfx1030"


def test_hsa_override_on_a_supported_gpu_is_unnecessary(tmp_path):
    got = check(recorded.rx7900xtx(tmp_path), {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"})
    f = got["torch.wheel.hsa_override"]
    assert f.status == Status.WARN and f.remedy == "unset HSA_OVERRIDE_GFX_VERSION"
    assert got["torch.wheel.arch[0000:03:00.0]"].status == Status.PASS
    bad = check(recorded.rx7900xtx(tmp_path / "b"), {"HSA_OVERRIDE_GFX_VERSION": "eleven"})["torch.wheel.hsa_override"]
    assert bad.status == Status.FAIL


def test_xpu_wheel_without_level_zero(tmp_path):
    got = check(recorded.arc_a770(tmp_path, lz=False))
    f = got["torch.wheel.level_zero"]
    assert f.status == Status.FAIL and "libze1" in f.remedy
    assert got["intel.level_zero"].status == Status.FAIL


def test_xpu_wheel_with_level_zero(tmp_path):
    got = check(recorded.arc_a770(tmp_path))
    assert got["torch.wheel.level_zero"].status == Status.PASS
    assert got["intel.xpu[xpu:0]"].data["free_memory"] == 15837691904


def test_remedy_uses_this_hosts_python(tmp_path):
    fs = recorded.rtx3090(tmp_path, "torch_cpu")
    rt = recorded.host_runtime()
    rt["python_executable"] = "/opt/conda/envs/train/bin/python"
    fs.facts(host_runtime=rt)
    assert check(fs)["torch.wheel.variant"].remedy.startswith("/opt/conda/envs/train/bin/python -m pip uninstall -y torch")
    rt["python"], rt["python_executable"] = "3.8.18", "/usr/bin/python3.8"
    fs.facts(host_runtime=rt)
    assert "python3.12 -m venv" in check(fs)["torch.wheel.variant"].remedy


def test_rocm_wheel_on_nvidia_host_and_xpu_recommendation(tmp_path):
    got = check(recorded.rtx3090(tmp_path, "torch_rocm63_7900xtx"))
    assert got["torch.wheel.variant"].status == Status.FAIL and got["torch.wheel.variant"].remedy == reinstall("cu128")
    got = check(recorded.arc_a770(tmp_path / "b", wheel="torch_cpu"))
    assert got["torch.wheel.variant"].remedy == reinstall("xpu")


def test_torch_missing(tmp_path):
    got = check(recorded.rtx3090(tmp_path, None))
    assert got["torch.wheel.build"].status == Status.WARN and got["torch.wheel.build"].remedy == reinstall("cu128")
