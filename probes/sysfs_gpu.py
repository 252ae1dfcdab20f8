"""amdgpu / i915 / xe sysfs figures of one GPU: read by the AMD and Intel probes and by the sampler.

Its own module so the vendor probes and the live sampler share it without importing each other
(amd -> sampling -> inventory -> amd was an import cycle).
"""

from __future__ import annotations

from typing import Any

from hwtui.probes.host import Host
from hwtui.probes.pci import PCI_ROOT


def _num(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def hwmon_dir(host: Host, pci: str) -> str | None:
    """The device's hwmon directory (``.../hwmon/hwmon3``), if its driver registered one."""
    names = [n for n in host.listdir(f"{PCI_ROOT}/{pci}/hwmon") if n.startswith("hwmon")]
    return f"{PCI_ROOT}/{pci}/hwmon/{names[0]}" if names else None


def read_sysfs_gpu(host: Host, pci: str, hwmon: str | None) -> dict[str, Any]:
    """amdgpu / i915 / xe sysfs figures. Unknown files give None: no driver exposes all of them."""
    base = f"{PCI_ROOT}/{pci}"
    out: dict[str, Any] = {
        "mem_total": _num(host.read_text(f"{base}/mem_info_vram_total")),
        "mem_used": _num(host.read_text(f"{base}/mem_info_vram_used")),
        "util": _num(host.read_text(f"{base}/gpu_busy_percent")),
        "temp_c": None, "power_w": None, "power_limit_w": None, "energy_uj": None,
    }
    if hwmon:
        temp = _num(host.read_text(f"{hwmon}/temp1_input"))
        out["temp_c"] = None if temp is None else temp / 1000.0
        # amdgpu: power1_average (older) or power1_input (RDNA3+), microwatts.
        power = _num(host.read_text(f"{hwmon}/power1_average"))
        if power is None:
            power = _num(host.read_text(f"{hwmon}/power1_input"))
        out["power_w"] = None if power is None else power / 1e6
        cap = _num(host.read_text(f"{hwmon}/power1_cap"))
        if cap is None:
            cap = _num(host.read_text(f"{hwmon}/power1_max"))  # i915 / xe
        out["power_limit_w"] = None if not cap else cap / 1e6
        out["energy_uj"] = _num(host.read_text(f"{hwmon}/energy1_input"))
    return out
