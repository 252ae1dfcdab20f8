"""Fully featured recorded machines: a FakeSys tree plus the runtime answers hwtui records with it.

The runtime facts are produced by hwtui's real readers from recorded vendor answers: NVML facts
are ``read_nvml(FakeNVML(tests/data/vendor/nvml_*.json))``, the torch build is parsed by the real
``parse_version_py`` from a version.py written out of the recorded constants. Other test areas
(TUI, snapshots, list-gpus) use :func:`build` to get machines with names, VRAM, utilisation,
temperatures, power, wheels and findings, e.g.::

    from tests.probes.recorded import build
    fs = build("h100x8", tmp_path)          # FakeSys; fs.host() is an FsHost over the tree
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwtui.probes.nvidia import read_nvml
from hwtui.probes.torchwheel import describe_build, parse_version_py
from tests import machines
from tests.fakesys import FakeSys
from tests.probes.fakenvml import FakeNVML

DATA = Path(__file__).resolve().parents[1] / "data" / "vendor"
GIB = 1024**3
PYTHON = "/home/alice/venv/bin/python"


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def nvml_fact(data: str | dict[str, Any]) -> dict[str, Any]:
    return read_nvml(FakeNVML(load(data) if isinstance(data, str) else data))


def version_py_text(consts: dict[str, Any]) -> str:
    """A torch/version.py as the wheels ship it (annotated assignments included)."""
    lines = ["from typing import Optional", "", "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']",
             f"__version__ = {consts['__version__']!r}", "debug = False"]
    for key in ("cuda", "hip", "rocm", "xpu"):
        lines.append(f"{key}: Optional[str] = {consts.get(key)!r}")
    lines.append("git_version = '" + "0" * 40 + "'")
    return "\n".join(lines) + "\n"


def torch_build_fact(name: str) -> dict[str, Any]:
    consts = parse_version_py(version_py_text(load(name)["version_py"]))
    return {**describe_build(consts), "path": "/home/alice/venv/lib/python3.11/site-packages/torch", "dist_info": None}


def torch_runtime_fact(name: str) -> dict[str, Any]:
    return {"installed": True, **load(name)["runtime"], "cached": False}


def host_runtime(mem_total: int = 64 * GIB, cpus: int = 16, python: str = "3.11.9") -> dict[str, Any]:
    return {"cpu_logical": cpus, "cpu_physical": cpus // 2, "mem_total": mem_total, "mem_available": int(mem_total * 0.71),
            "python": python, "python_executable": PYTHON, "kernel": "6.8.0-52-generic", "machine": "x86_64",
            "hostname": "recorded", "shm_total": mem_total // 2, "shm_free": mem_total // 2 - 2**28}


def record(fs: FakeSys, *, nvml: str | dict[str, Any] | None = None, torch: str | None = None,
           amdsmi: str | dict[str, Any] | None = None, runtime: dict[str, Any] | None = None,
           mem_total: int = 64 * GIB, cpus: int = 16, groups: tuple[int, ...] = (1000, 44, 109), **extra: Any) -> FakeSys:
    """Write the runtime facts of a recorded machine into ``fs`` (.hwtui-facts.json).

    ``groups`` are the user's groups: video (44) and render (109) by default, like a configured
    workstation; pass ``(1000,)`` for a user who was never added.
    """
    facts: dict[str, Any] = {"host_runtime": host_runtime(mem_total, cpus), "ipex_version": None,
                             "user": {"uid": 1000, "gid": 1000, "groups": list(groups), "name": "alice"},
                             "tpu_packages": {"libtpu": False, "torch_xla": False, "jax": False}}
    if nvml is not None:
        facts["nvml"] = nvml_fact(nvml)
        driver = facts["nvml"].get("driver_version")
        if driver:
            # The kernel module the tree says is loaded is the one NVML answered with.
            fs.file(f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{driver}", "")
            if fs.path("/proc/driver/nvidia/version").exists():
                fs.file("/proc/driver/nvidia/version", f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  "
                        "Release Build  (dvs-builder@U16)\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
                fs.file("/sys/module/nvidia/version", driver + "\n")
    else:
        facts["nvml"] = {"ok": False, "error": {"kind": "LibraryNotFound", "code": 12, "message": "NVML Shared Library Not Found"}}
    if torch is not None:
        facts["torch_build"] = torch_build_fact(torch)
        facts["torch_runtime"] = runtime if runtime is not None else torch_runtime_fact(torch)
    else:
        facts["torch_build"], facts["torch_runtime"] = {"installed": False}, {"installed": False}
    if amdsmi is not None:
        facts["amdsmi"] = load(amdsmi) if isinstance(amdsmi, str) else amdsmi
    else:
        facts["amdsmi"] = {"available": False, "reason": "ROCm's libamd_smi.so is not installed (KeyError: 'libamd_smi.so')"}
    facts.update(extra)
    fs.facts(**facts)
    return fs


def amd_sysfs(fs: FakeSys, addr: str, gfx_target_version: int, node: int, *, temp_mc: int = 44000, power_uw: int = 41_000_000,
              cap_uw: int = 263_000_000, busy: int = 14) -> None:
    """hwmon figures and the KFD topology node of an AMD GPU already added with machines.amd_gpu."""
    fs.file(f"/sys/bus/pci/devices/{addr}/hwmon/hwmon{node}/temp1_input", f"{temp_mc}\n")
    fs.file(f"/sys/bus/pci/devices/{addr}/hwmon/hwmon{node}/power1_average", f"{power_uw}\n")
    fs.file(f"/sys/bus/pci/devices/{addr}/hwmon/hwmon{node}/power1_cap", f"{cap_uw}\n")
    fs.file(f"/sys/bus/pci/devices/{addr}/gpu_busy_percent", f"{busy}\n")
    domain, rest = addr.split(":", 1)
    bus, devfn = rest.split(":")
    dev, fn = devfn.split(".")
    loc = (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn)
    fs.file("/sys/class/kfd/kfd/topology/nodes/0/properties", "cpu_cores_count 16\ngfx_target_version 0\n")
    fs.file(f"/sys/class/kfd/kfd/topology/nodes/{node}/properties",
            f"simd_count 120\ngfx_target_version {gfx_target_version}\nlocation_id {loc}\ndomain {int(domain, 16)}\n")


def level_zero(fs: FakeSys, loader: bool = True, gpu_driver: bool = True) -> None:
    if loader:
        fs.file("/usr/lib/x86_64-linux-gnu/libze_loader.so.1", "")
    if gpu_driver:
        fs.file("/usr/lib/x86_64-linux-gnu/libze_intel_gpu.so.1", "")


def cuda_runtime_like(template: str, nvml: str) -> dict[str, Any]:
    """A torch runtime answer for the GPUs of a recorded NVML answer (index, name, capability, pci)."""
    rt = torch_runtime_fact(template)
    rt = copy.deepcopy(rt)
    devs = nvml_fact(nvml)["devices"]
    rt["cuda"]["devices"] = [{"index": i, "name": d["name"], "capability": d["compute_capability"],
                              "total_memory": d["memory"]["total"] - 2**29, "multi_processor_count": None, "gcn_arch": None,
                              "pci": d["pci"]} for i, d in enumerate(devs)]
    rt["cuda"]["device_count"] = len(devs)
    return rt


# -- named machines -------------------------------------------------------------------------

def h100x8(root: Path) -> FakeSys:
    fs = machines.h100_x8(root)
    return record(fs, nvml="nvml_h100x8", torch="torch_cu128_h100x8", mem_total=2015 * GIB, cpus=224)


def mixed3(root: Path) -> FakeSys:
    """RTX 4090 + RX 7800 XT + Arc A750 (the mixed-vendor design's three-vendor box)."""
    fs = machines.rtx4090_rx7800xt_arc_a750(root)
    amd_sysfs(fs, "0000:05:00.0", 110001, 1)
    level_zero(fs)
    fs.file("/sys/bus/pci/devices/0000:09:00.0/hwmon/hwmon2/energy1_input", "123456789\n")
    fs.file("/sys/bus/pci/devices/0000:09:00.0/hwmon/hwmon2/power1_max", "190000000\n")
    return record(fs, nvml="nvml_rtx4090", torch="torch_cu128_rtx3090", amdsmi="amdsmi_rx7800xt",
                  runtime=cuda_runtime_like("torch_cu128_rtx3090", "nvml_rtx4090"), mem_total=128 * GIB, cpus=32)


def rtx5090(root: Path, wheel: str) -> FakeSys:
    fs = FakeSys(root)
    machines._base(fs)
    machines.nvidia_gpu(fs, "0000:01:00.0", 0x2B85, 0, driver_version="570.133.07", gen=(5, 5))
    return record(fs, nvml="nvml_rtx5090", torch=wheel)


def rtx3090(root: Path, wheel: str | None = "torch_cu128_rtx3090", **kw: Any) -> FakeSys:
    fs = FakeSys(root)
    machines._base(fs)
    machines.nvidia_gpu(fs, "0000:01:00.0", 0x2204, 0)
    return record(fs, nvml=kw.pop("nvml", "nvml_rtx3090"), torch=wheel, **kw)


def rx7900xtx(root: Path, wheel: str | None = "torch_rocm63_7900xtx", **kw: Any) -> FakeSys:
    fs = FakeSys(root)
    machines._base(fs)
    machines.amd_gpu(fs, "0000:03:00.0", 0x744C, 0, 24 * GIB)
    amd_sysfs(fs, "0000:03:00.0", 110000, 1)
    return record(fs, torch=wheel, **kw)


def arc_a770(root: Path, wheel: str | None = "torch_xpu_arc", lz: bool = True, **kw: Any) -> FakeSys:
    fs = FakeSys(root)
    machines._base(fs)
    machines.intel_gpu(fs, "0000:03:00.0", 0x56A0, 0)
    if lz:
        level_zero(fs)
    return record(fs, torch=wheel, **kw)


BUILDERS: dict[str, Callable[[Path], FakeSys]] = {
    "h100x8": h100x8,
    "mixed3": mixed3,
    "rtx5090_cu126": lambda root: rtx5090(root, "torch_cu126_rtx5090"),
    "rtx5090_cu128": lambda root: rtx5090(root, "torch_cu128_rtx5090"),
    "rtx3090_cu128": rtx3090,
    "rtx3090_cpu_wheel": lambda root: rtx3090(root, "torch_cpu"),
    "rx7900xtx_rocm": rx7900xtx,
    "arc_a770_xpu": arc_a770,
}


def build(name: str, root: Path) -> FakeSys:
    return BUILDERS[name](root)
