"""AMD GPUs: amdsmi in a child process where ROCm's library exists, sysfs everywhere else.

amdsmi is never imported here: without ROCm's libamd_smi.so, ``import amdsmi`` prints to stdout
and raises KeyError (not ImportError), and it may load a large C library; the child contains
both. sysfs (amdgpu's mem_info_vram_*, gpu_busy_percent, hwmon) and the KFD topology (the gfx
target of each GPU) answer without any library, so the gfx-vs-wheel verdict works on a machine
where only the kernel driver is installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from hwtui.core.finding import Finding, fail, passed
from hwtui.probes.child import ChildError, run_in_child
from hwtui.probes.devices import build_devices
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import FactUnavailable, Host
from hwtui.probes.pci import GPU_CLASSES, PCI_ROOT, pci_fact
from hwtui.probes.sysfs_gpu import hwmon_dir, read_sysfs_gpu

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


def vendor_functions(host: Host, vendor_id: int) -> list[str]:
    """PCI addresses of one vendor's GPU-class functions (audio functions and bridges excluded)."""
    out = []
    for addr in host.listdir(PCI_ROOT):
        vendor = host.read_int(f"{PCI_ROOT}/{addr}/vendor", 16)
        cls = host.read_int(f"{PCI_ROOT}/{addr}/class", 16)
        if vendor == vendor_id and cls is not None and (cls >> 8) in GPU_CLASSES:
            out.append(addr)
    return out


def gfx_name(target_version: int) -> str | None:
    """KFD's gfx_target_version 110000 -> 'gfx1100', 90010 -> 'gfx90a', 90402 -> 'gfx942'."""
    if not target_version:
        return None
    major, minor, step = target_version // 10000, target_version // 100 % 100, target_version % 100
    return f"gfx{major}{minor}{step:x}"


def kfd_targets(host: Host) -> dict[str, str]:
    """PCI address -> gfx target, from the KFD topology (CPU nodes have gfx_target_version 0)."""
    out: dict[str, str] = {}
    for node in host.listdir(KFD_NODES):
        props: dict[str, int] = {}
        for line in (host.read_text(f"{KFD_NODES}/{node}/properties") or "").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                props[parts[0]] = int(parts[1])
        gfx = gfx_name(props.get("gfx_target_version", 0))
        loc = props.get("location_id")
        if gfx and loc is not None:
            bus, dev, fn = loc >> 8, (loc >> 3) & 0x1F, loc & 0x7
            out[f"{props.get('domain', 0):04x}:{bus:02x}:{dev:02x}.{fn}"] = gfx
    return out


def _amdsmi_live() -> dict[str, Any]:
    try:
        return cast("dict[str, Any]", run_in_child("hwtui.probes.runtime_child:amdsmi_facts", {}, timeout=20.0))
    except ChildError as exc:
        return {"available": False, "reason": f"amdsmi child {exc.kind}: {exc}"}


def collect_amd(host: Host) -> dict[str, Any]:
    addrs = vendor_functions(host, 0x1002)
    if not addrs:
        return {"devices": [], "amdsmi": None}
    try:
        smi = host.fact("amdsmi", _amdsmi_live)
    except FactUnavailable:
        smi = {"available": False, "reason": "amdsmi answers were not recorded with this machine"}
    smi_by_pci = {d["pci"]: d for d in (smi or {}).get("devices") or [] if d.get("pci")}
    targets = kfd_targets(host)
    devices = []
    for addr in addrs:
        raw = read_sysfs_gpu(host, addr, hwmon_dir(host, addr))
        dev: dict[str, Any] = {"pci": addr, "name": None, "gfx": targets.get(addr), "source": "sysfs",
                               "vram_total": raw["mem_total"], "vram_used": raw["mem_used"], "util": raw["util"],
                               "temp_c": raw["temp_c"], "power_w": raw["power_w"], "power_limit_w": raw["power_limit_w"]}
        got = smi_by_pci.get(addr)
        if got:
            dev["source"] = "amdsmi"
            for key in ("name", "gfx", "vram_total", "vram_used", "util", "temp_c", "power_w", "power_limit_w",
                        "driver_version"):
                if got.get(key) is not None:
                    dev[key] = got[key]
        devices.append(dev)
    rocm = (host.read_text("/opt/rocm/.info/version") or "").strip() or (smi or {}).get("rocm_version")
    user = host.user()
    groups = {name: (gid is not None and (gid in user.groups or gid == user.gid))
              for name in ("render", "video") for gid in [host.group_id(name)]}
    return {
        "devices": devices,
        "amdsmi": {"available": bool((smi or {}).get("available")), "reason": (smi or {}).get("reason")},
        "rocm_version": rocm or None,
        "kfd": {"exists": host.exists("/dev/kfd"), "access": host.can_access("/dev/kfd")},
        "groups": groups,
        "user": user.name,
    }


def amd_rules(facts: Facts) -> Iterator[Finding]:
    amd = facts["amd"]
    usable = [d for d in build_devices(pci_fact(facts)) if d.usable and d.vendor == "AMD"]
    if not amd.get("devices") or not usable:
        return
    smi = amd.get("amdsmi") or {}
    yield passed("amd.smi", "AMD figures from amdsmi" if smi.get("available") else "AMD figures from sysfs (amdsmi unavailable)",
                 smi.get("reason") or "")
    yield _kfd_finding(amd)
    rocm = amd.get("rocm_version")
    yield passed("amd.rocm", f"ROCm {rocm}" if rocm else "no system ROCm (torch ROCm wheels bundle their runtime)")
    for dev in amd["devices"]:
        name = dev.get("name") or next((d.name for d in usable if d.pci == dev["pci"]), "AMD GPU")
        yield passed(f"amd.device[{dev['pci']}]", f"{name}: " + (", ".join(_figures(dev)) or "no figures"),
                     f"source: {dev.get('source')}", **dev)


def _kfd_finding(amd: dict[str, Any]) -> Finding:
    """/dev/kfd, ROCm's compute interface: present, and open to this user?"""
    kfd = amd.get("kfd") or {}
    user = amd.get("user") or "$USER"
    missing_groups = [g for g, ok in (amd.get("groups") or {}).items() if not ok]
    if not kfd.get("exists"):
        return fail("amd.kfd", "/dev/kfd is missing: ROCm cannot reach the GPUs",
                    "amdgpu is bound but the compute interface (KFD) is absent: in a container it was not passed in.",
                    "sudo modprobe amdgpu; in a container: docker run --device=/dev/kfd --device=/dev/dri --group-add video "
                    "--group-add render ...")
    if not kfd.get("access"):
        return fail("amd.kfd", f"no access to /dev/kfd for {user}",
                    "not in group(s): " + ", ".join(missing_groups) if missing_groups else "",
                    f"sudo usermod -aG render,video {user} && log out and back in")
    return passed("amd.kfd", "/dev/kfd is accessible", "groups: " + ", ".join(
        f"{g} {'yes' if ok else 'no'}" for g, ok in (amd.get("groups") or {}).items()))


def _figures(dev: dict[str, Any]) -> list[str]:
    """A device's figures that are known: gfx target, VRAM, utilisation, temperature, power."""
    parts = [dev.get("gfx"),
             f"{(dev.get('vram_used') or 0) / 2**30:.1f} / {(dev.get('vram_total') or 0) / 2**30:.1f} GiB"
             if dev.get("vram_total") else None,
             f"{dev['util']}% busy" if dev.get("util") is not None else None,
             f"{dev['temp_c']:.0f} C" if dev.get("temp_c") is not None else None,
             f"{dev['power_w']:.0f} W" if dev.get("power_w") is not None else None]
    return [p for p in parts if p]


def amd_enricher(facts: Facts) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for dev in (facts.get("amd") or {}).get("devices") or []:
        out[dev["pci"]] = {"name": dev.get("name"), "vram_total": dev.get("vram_total"), "vram_used": dev.get("vram_used"),
                           "gfx": dev.get("gfx"), "utilization": dev.get("util"), "temperature_c": dev.get("temp_c"),
                           "power_w": dev.get("power_w")}
    return out


COLLECTORS = [Collector("amd", collect_amd, "gpu", timeout=25.0)]
RULES = [Rule("amd", amd_rules, "gpu", needs=("amd", "pci"))]
