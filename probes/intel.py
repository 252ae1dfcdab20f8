"""Intel GPUs (Arc, Flex, Max): i915/xe binding, Level Zero, torch.xpu and IPEX.

torch.xpu answers come from the shared torch child (torchwheel.py). Level Zero is looked up on
the dynamic linker's path through the host (no dlopen). IPEX is read from its package metadata,
never imported: it must match torch's major.minor, and it is discontinued after 2.8, so the
advice is always the upstream XPU wheel.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from hwtui.core.finding import Finding, fail, passed, warn
from hwtui.probes.amd import vendor_functions
from hwtui.probes.devices import build_devices
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import FactUnavailable, Host
from hwtui.probes.libpaths import find_library
from hwtui.probes.pci import pci_fact

XPU_INDEX = "https://download.pytorch.org/whl/xpu"
IPEX_LAST = (2, 8)
LEVEL_ZERO_REMEDY = "sudo apt install libze1 libze-intel-gpu1 intel-opencl-icd (Ubuntu 24.04+; older releases: Intel's " \
                    "client GPU driver repository at dgpu-docs.intel.com)"


def _ipex_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:
        return None
    try:
        return version("intel-extension-for-pytorch")
    except PackageNotFoundError:
        return None


def _recorded_or_none(host: Host, key: str, producer: Any) -> Any:
    try:
        return host.fact(key, producer)
    except FactUnavailable:
        return None


def collect_intel(host: Host) -> dict[str, Any]:
    addrs = vendor_functions(host, 0x8086)
    loader = find_library(host, "libze_loader.so*")
    gpu_driver = find_library(host, "libze_intel_gpu.so*")
    return {
        "devices": [{"pci": a, "driver": host.link_name(f"/sys/bus/pci/devices/{a}/driver")} for a in addrs],
        "level_zero": {"loader": loader, "gpu_driver": gpu_driver},
        "xpu_smi": host.which("xpu-smi"),
        "ipex": _recorded_or_none(host, "ipex_version", _ipex_version),
    }


def _major_minor(version: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def intel_rules(facts: Facts) -> Iterator[Finding]:
    intel = facts["intel"]
    usable = [d for d in build_devices(pci_fact(facts)) if d.usable and d.vendor == "Intel"]
    python = (facts.get("host") or {}).get("python_executable") or "python3"
    for dev in usable:
        note = "xe (kernel 6.8+; the driver for Lunar Lake / Battlemage and newer)" if dev.driver == "xe" else "i915"
        yield passed(f"intel.driver[{dev.pci}]", f"{dev.name} bound to {dev.driver}", note)
    lz = intel.get("level_zero") or {}
    if usable:
        if lz.get("loader") and lz.get("gpu_driver"):
            yield passed("intel.level_zero", "Level Zero loader and Intel GPU driver found",
                         ", ".join(lz["loader"] + lz["gpu_driver"]))
        else:
            what = "loader (libze_loader.so.1)" if not lz.get("loader") else "GPU driver (libze_intel_gpu.so.1)"
            yield fail("intel.level_zero", f"Level Zero {what} not found: torch.xpu cannot use the GPU", "",
                       LEVEL_ZERO_REMEDY)
    runtime = facts.get("torch_runtime") or {}
    xpu = runtime.get("xpu") or {}
    for dev in xpu.get("devices") or []:
        total, free = dev.get("total_memory"), dev.get("free_memory")
        mem = f"{(total or 0) / 2**30:.1f} GiB" + (f", {free / 2**30:.1f} GiB free" if free is not None else "")
        yield passed(f"intel.xpu[xpu:{dev['index']}]", f"xpu:{dev['index']} {dev.get('name')}: {mem}",
                     f"driver {dev.get('driver_version')}", **dev)
    yield from _ipex_findings(facts, intel.get("ipex"), python)


def _ipex_findings(facts: Facts, ipex: str | None, python: str) -> Iterator[Finding]:
    if not ipex:
        return
    torch_version = (facts.get("torch_build") or {}).get("version")
    ipex_mm, torch_mm = _major_minor(ipex), _major_minor(torch_version)
    upstream = (f"{python} -m pip uninstall -y intel-extension-for-pytorch torch && "
                f"{python} -m pip install torch --index-url {XPU_INDEX}")
    if torch_mm and ipex_mm and ipex_mm != torch_mm:
        yield fail("intel.ipex", f"IPEX {ipex} does not match torch {torch_version} (major.minor must be equal)",
                   "IPEX is built against one torch release; a mismatch fails at import with undefined symbols."
                   + (" No IPEX exists for torch after 2.8: it is discontinued." if torch_mm > IPEX_LAST else ""),
                   upstream, ipex=ipex, torch=torch_version)
    else:
        yield warn("intel.ipex", f"IPEX {ipex} matches torch {torch_version or '?'}, but IPEX is discontinued after 2.8",
                   "Upstream torch supports Intel GPUs natively (torch.xpu, the xccl backend); IPEX gets no new releases.",
                   upstream, ipex=ipex, torch=torch_version)


def intel_enricher(facts: Facts) -> dict[str, dict[str, Any]]:
    """XPU names and memory from torch, matched to PCI order when the counts agree."""
    runtime = facts.get("torch_runtime") or {}
    xpu_devs = (runtime.get("xpu") or {}).get("devices") or []
    intel = [d for d in build_devices(pci_fact(facts)) if d.usable and d.vendor == "Intel"]
    if not xpu_devs or len(xpu_devs) != len(intel) or (runtime.get("env") or {}).get("ZE_AFFINITY_MASK"):
        return {}
    return {dev.pci: {"name": x.get("name"), "vram_total": x.get("total_memory"),
                      "vram_used": None if x.get("free_memory") is None or not x.get("total_memory")
                      else x["total_memory"] - x["free_memory"], "driver_version": x.get("driver_version")}
            for dev, x in zip(intel, xpu_devs, strict=True)}


COLLECTORS = [Collector("intel", collect_intel, "gpu", timeout=5.0)]
RULES = [Rule("intel", intel_rules, "gpu", needs=("intel", "pci", "host"))]
