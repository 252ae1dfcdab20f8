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


def _dpm_current(text: str | None) -> int | None:
    """amdgpu's pp_dpm_sclk / pp_dpm_mclk: the level marked ``*`` ("1: 2100Mhz *") in MHz."""
    for line in (text or "").splitlines():
        if line.rstrip().endswith("*"):
            value = line.partition(":")[2].strip().split(" ", 1)[0].lower().removesuffix("mhz")
            return _num(value)
    return None


# PCIe transfer rate per lane -> generation (the kernel's current_link_speed: "16.0 GT/s PCIe").
_GT_TO_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}


def pcie_link(host: Host, pci: str) -> tuple[int | None, int | None]:
    """``(generation, lanes)`` of the link as it runs now, from the PCI core's sysfs (any vendor)."""
    speed = (host.read_text(f"{PCI_ROOT}/{pci}/current_link_speed") or "").split(" ", 1)[0]
    return _GT_TO_GEN.get(speed), _num(host.read_text(f"{PCI_ROOT}/{pci}/current_link_width"))


def _ras_counts(text: str | None) -> tuple[int | None, int | None]:
    """amdgpu's ras/umc_err_count ("ue: 0\nce: 2"): (uncorrected, corrected) memory errors."""
    counts = dict(line.split(":", 1) for line in (text or "").splitlines() if ":" in line)
    return _num(counts.get("ue")), _num(counts.get("ce"))


def intel_gt_clock(host: Host, pci: str) -> int | None:
    """Intel's actual GT clock, MHz: i915's drm/cardN/gt_act_freq_mhz, or xe's tile0/gt0/freq0/act_freq."""
    base = f"{PCI_ROOT}/{pci}"
    for card in sorted(n for n in host.listdir(f"{base}/drm") if n.startswith("card")):
        mhz = _num(host.read_text(f"{base}/drm/{card}/gt_act_freq_mhz"))
        if mhz is not None:
            return mhz
    return _num(host.read_text(f"{base}/tile0/gt0/freq0/act_freq"))


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
        "sclk_mhz": _dpm_current(host.read_text(f"{base}/pp_dpm_sclk")),
        "mclk_mhz": _dpm_current(host.read_text(f"{base}/pp_dpm_mclk")),
        "fan_pct": None,
    }
    if out["sclk_mhz"] is None:
        out["sclk_mhz"] = intel_gt_clock(host, pci)
    out["pcie_gen"], out["pcie_width"] = pcie_link(host, pci)
    out["ecc_uncorrected"], out["ecc_corrected"] = _ras_counts(host.read_text(f"{base}/ras/umc_err_count"))
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
        pwm, pwm_max = _num(host.read_text(f"{hwmon}/pwm1")), _num(host.read_text(f"{hwmon}/pwm1_max"))
        if pwm is not None and 0 <= pwm <= (pwm_max or 255):
            out["fan_pct"] = round(pwm * 100 / (pwm_max or 255))
    return out
