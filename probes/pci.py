"""PCI probe: accelerators straight from /sys/bus/pci/devices, no vendor library needed.

Why sysfs first: it answers even when the driver is broken, torch is missing or NVML cannot
load, which is exactly when a user needs hwtui most.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

from hwtui.core.bounded_read import HOST_FILE_CAP, decode_text, read_bounded
from hwtui.probes.host import FactUnavailable, Host

if TYPE_CHECKING:  # framework imports the collectors' modules; the name is for mypy only
    from hwtui.probes.framework import Facts

PCI_ROOT = "/sys/bus/pci/devices"

# class >> 8: VGA, 3D controller, other display controller, processing accelerator.
GPU_CLASSES = {0x0300, 0x0302, 0x0380, 0x1200}
VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x1DA3: "Habana", 0x1AE0: "Google"}
BACKEND_OF_VENDOR = {"NVIDIA": "cuda", "AMD": "hip", "Intel": "xpu", "Habana": "hpu", "Google": "tpu"}
# The driver a vendor's device must be bound to for its compute stack to use it.
COMPUTE_DRIVERS = {
    "NVIDIA": {"nvidia"},
    "AMD": {"amdgpu"},
    "Intel": {"i915", "xe"},
    "Habana": {"habanalabs"},
    # TPU v4 and later are driven through VFIO by libtpu; v2/v3 hosts use the accel driver.
    "Google": {"vfio-pci", "asic-accel", "asic_accel", "accel"},
}
_GEN_OF_SPEED = {"2.5": 1, "5.0": 2, "5": 2, "8.0": 3, "8": 3, "16.0": 4, "16": 4, "32.0": 5, "32": 5, "64.0": 6, "64": 6}
_PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids", "/usr/share/misc/pci.ids.gz")

# A readable fallback when pci.ids is absent (minimal containers): the devices people ask about.
_KNOWN_NAMES = {
    (0x10DE, 0x2204): "GeForce RTX 3090", (0x10DE, 0x2684): "GeForce RTX 4090", (0x10DE, 0x1E07): "GeForce RTX 2080 Ti",
    (0x10DE, 0x2B85): "GeForce RTX 5090", (0x10DE, 0x2330): "H100 SXM5 80GB", (0x10DE, 0x2331): "H100 PCIe",
    (0x10DE, 0x2335): "H200 SXM 141GB", (0x10DE, 0x20B0): "A100 SXM4 40GB", (0x10DE, 0x20B2): "A100 SXM4 80GB",
    (0x10DE, 0x20B5): "A100 PCIe 80GB", (0x10DE, 0x2901): "B200", (0x10DE, 0x1DB4): "Tesla V100 PCIe 16GB",
    (0x1002, 0x744C): "Radeon RX 7900 XTX", (0x1002, 0x747E): "Radeon RX 7800 XT", (0x1002, 0x73FF): "Radeon RX 6600",
    (0x1002, 0x74A1): "Instinct MI300X", (0x1002, 0x740C): "Instinct MI250X/MI250",
    (0x8086, 0x56A0): "Arc A770", (0x8086, 0x56A1): "Arc A750", (0x8086, 0x56A5): "Arc A380",
    (0x8086, 0x0BD5): "Data Center GPU Max 1550", (0x8086, 0x56C0): "Data Center GPU Flex 170",
    (0x1DA3, 0x1020): "Gaudi2", (0x1DA3, 0x1060): "Gaudi3", (0x1DA3, 0x1000): "Gaudi",
    (0x1AE0, 0x0027): "TPU v2/v3", (0x1AE0, 0x005E): "TPU v4", (0x1AE0, 0x0062): "TPU v5p",
    (0x1AE0, 0x0063): "TPU v5e", (0x1AE0, 0x006F): "TPU v6e",
}


class PciLink(TypedDict):
    """A function's PCIe link now and at best, and its slot's best (None: the kernel does not say)."""

    cur_speed: str | None  # "16.0 GT/s PCIe"
    max_speed: str | None
    cur_gen: int | None
    max_gen: int | None
    cur_width: int | None
    max_width: int | None
    slot_max_gen: int | None
    slot_max_width: int | None


# One accelerator function on the bus, as the ``pci`` fact records it. The functional form: one
# field is called "class", a keyword.
PciDevice = TypedDict("PciDevice", {
    "address": str,  # "0000:01:00.0"
    "vendor_id": str,  # "0x10de"
    "device_id": str,
    "class": str,  # "0x030200"
    "vendor": str,  # a VENDORS name
    "name": str,
    "driver": str | None,
    "numa_node": int | None,
    "iommu_group": str | None,
    "link": PciLink,
    "drm_nodes": list[str],
    "boot_vga": bool,
    "vram_total": NotRequired[int | None],  # AMD only (sysfs mem_info_vram_*)
    "vram_used": NotRequired[int | None],
})


class PciFact(TypedDict):
    """The ``pci`` fact (``collect_pci``): what the inventory and the hardware rules read."""

    devices: list[PciDevice]


def pci_fact(facts: Facts) -> PciFact:
    """The collected ``pci`` fact; no devices when the collector failed or did not run. Only
    ``collect_pci`` makes it (a recorded tree or a replay records the sysfs files, not the fact)."""
    return cast(PciFact, facts.get("pci") or {"devices": []})


def link_gen(speed: str | None) -> int | None:
    """'16.0 GT/s PCIe' -> 4. Unknown or 'Unknown' -> None."""
    if not speed:
        return None
    m = re.match(r"\s*([0-9.]+)\s*GT/s", speed)
    return _GEN_OF_SPEED.get(m.group(1)) if m else None


def _int_or_none(text: str | None, base: int = 10) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


def _parse_pci_ids(text: str, wanted: set[tuple[int, int]]) -> dict[str, str]:
    """Names for the wanted (vendor, device) pairs, reading only their vendors' sections."""
    vendors = {v for v, _ in wanted}
    names: dict[str, str] = {}
    current: int | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("C "):
            break  # device classes follow the vendor list
        if not line.startswith("\t"):
            current = _int_or_none(line[:4], 16)
            if current in vendors:
                names[f"{current:04x}"] = line[4:].strip()
            continue
        if current in vendors and not line.startswith("\t\t"):
            dev = _int_or_none(line[1:5], 16)
            if dev is not None and (current, dev) in wanted:
                names[f"{current:04x}:{dev:04x}"] = line[5:].strip()
    return names


def _read_pci_ids_text(reader: Callable[[str], str | None]) -> str | None:
    for path in PCI_IDS_PATHS:
        if path.endswith(".gz"):
            continue
        text = reader(path)
        if text:
            return text
    return None


def _live_pci_ids_text(path: str) -> str | None:
    try:
        data, _cut = read_bounded(path, HOST_FILE_CAP)
    except (OSError, ValueError):
        return None
    return decode_text(data)


def pci_names(host: Host, wanted: set[tuple[int, int]]) -> dict[str, str]:
    if not wanted:
        return {}
    try:
        # On a live machine the 1.3 MB file is parsed here and only the answer is recorded.
        return host.fact("pci_names", lambda: _parse_pci_ids(_read_pci_ids_text(_live_pci_ids_text) or "", wanted))
    except FactUnavailable:
        text = _read_pci_ids_text(host.read_text)
        return _parse_pci_ids(text, wanted) if text else {}


def display_name(vendor_id: int, device_id: int, names: dict[str, str]) -> str:
    """'GA102 [GeForce RTX 3090]' -> 'GeForce RTX 3090'; unknown ids get a readable fallback."""
    raw = names.get(f"{vendor_id:04x}:{device_id:04x}")
    if raw:
        m = re.search(r"\[([^\]]+)\]\s*$", raw)
        return m.group(1) if m else raw
    if (vendor_id, device_id) in _KNOWN_NAMES:
        return _KNOWN_NAMES[(vendor_id, device_id)]
    vendor = VENDORS.get(vendor_id, f"vendor {vendor_id:04x}")
    return f"{vendor} device {device_id:04x}"


def _resolve(base: str, target: str) -> str:
    return posixpath.normpath(posixpath.join(posixpath.dirname(base), target))


def _link_info(host: Host, sysdir: str) -> PciLink:
    cur_speed = (host.read_text(f"{sysdir}/current_link_speed") or "").strip() or None
    max_speed = (host.read_text(f"{sysdir}/max_link_speed") or "").strip() or None
    info: PciLink = {
        "cur_speed": cur_speed,
        "max_speed": max_speed,
        "cur_gen": link_gen(cur_speed),
        "max_gen": link_gen(max_speed),
        "cur_width": _int_or_none(host.read_text(f"{sysdir}/current_link_width")),
        "max_width": _int_or_none(host.read_text(f"{sysdir}/max_link_width")),
        "slot_max_gen": None,
        "slot_max_width": None,
    }
    # The upstream port says what the slot can do: a Gen4 card in a Gen3 slot is a slot limit,
    # not an idle downshift.
    target = host.readlink(sysdir)
    if target:
        parent = posixpath.dirname(_resolve(sysdir, target))
        if _PCI_ADDR.match(posixpath.basename(parent)):
            info["slot_max_gen"] = link_gen((host.read_text(f"{parent}/max_link_speed") or "").strip())
            info["slot_max_width"] = _int_or_none(host.read_text(f"{parent}/max_link_width"))
    return info


def _drm_nodes(host: Host, sysdir: str) -> list[str]:
    return [f"/dev/dri/{n}" for n in host.listdir(f"{sysdir}/drm") if n.startswith(("renderD", "card"))]


def collect_pci(host: Host) -> PciFact:
    """All accelerator functions on the PCI bus, with driver, NUMA node and link state."""
    raw: list[tuple[str, int, int, int]] = []
    for addr in host.listdir(PCI_ROOT):
        sysdir = f"{PCI_ROOT}/{addr}"
        vendor = _int_or_none(host.read_text(f"{sysdir}/vendor"), 16)
        cls = _int_or_none(host.read_text(f"{sysdir}/class"), 16)
        if vendor not in VENDORS or cls is None or (cls >> 8) not in GPU_CLASSES:
            continue  # host bridges, audio functions (0x0403), NICs...
        device = _int_or_none(host.read_text(f"{sysdir}/device"), 16) or 0
        raw.append((addr, vendor, device, cls))

    names = pci_names(host, {(v, d) for _, v, d, _ in raw})
    devices: list[PciDevice] = []
    for addr, vendor_id, device_id, cls in raw:
        sysdir = f"{PCI_ROOT}/{addr}"
        vendor_name = VENDORS[vendor_id]
        driver = host.link_name(f"{sysdir}/driver")
        numa = _int_or_none(host.read_text(f"{sysdir}/numa_node"))
        dev: PciDevice = {
            "address": addr,
            "vendor_id": f"0x{vendor_id:04x}",
            "device_id": f"0x{device_id:04x}",
            "class": f"0x{cls:06x}",
            "vendor": vendor_name,
            "name": display_name(vendor_id, device_id, names),
            "driver": driver,
            "numa_node": numa if numa is not None and numa >= 0 else None,
            "iommu_group": host.link_name(f"{sysdir}/iommu_group"),
            "link": _link_info(host, sysdir),
            "drm_nodes": _drm_nodes(host, sysdir),
            "boot_vga": (host.read_text(f"{sysdir}/boot_vga") or "").strip() == "1",
        }
        if vendor_name == "AMD":
            dev["vram_total"] = _int_or_none(host.read_text(f"{sysdir}/mem_info_vram_total"))
            dev["vram_used"] = _int_or_none(host.read_text(f"{sysdir}/mem_info_vram_used"))
        devices.append(dev)
    return {"devices": devices}


# -- device nodes and kernel modules ----------------------------------------------------------

MODULES = ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia_peermem", "nouveau", "amdgpu", "i915",
           "xe", "habanalabs", "vfio_pci", "ib_core", "mlx5_core")


def collect_device_nodes(host: Host) -> dict[str, Any]:
    paths: list[str] = []
    for name in host.listdir("/dev"):
        if re.fullmatch(r"nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)", name) or name in ("kfd", "dxg"):
            paths.append(f"/dev/{name}")
    paths += [f"/dev/dri/{n}" for n in host.listdir("/dev/dri") if n.startswith(("renderD", "card"))]
    paths += [f"/dev/accel/{n}" for n in host.listdir("/dev/accel") if n.startswith("accel")]
    paths += [f"/dev/vfio/{n}" for n in host.listdir("/dev/vfio")]
    nodes = []
    for path in paths:
        st = host.stat(path)
        group = host.group_name(st.gid) if st else None
        nodes.append({"path": path, "access": host.can_access(path), "group": group,
                      "mode": oct(st.mode & 0o777) if st else None})
    return {"nodes": nodes}


def collect_modules(host: Host) -> dict[str, Any]:
    """Kernel modules of interest: loaded (listed in /proc/modules or /sys/module) and init state."""
    proc = {line.split()[0]: line.split()[4] if len(line.split()) > 4 else "" for line in
            (host.read_text("/proc/modules") or "").splitlines() if line.strip()}
    out: dict[str, Any] = {}
    for name in MODULES:
        in_sys = host.exists(f"/sys/module/{name}")
        if name not in proc and not in_sys:
            continue
        state = (host.read_text(f"/sys/module/{name}/initstate") or "").strip() or proc.get(name, "").lower() or "builtin"
        version = (host.read_text(f"/sys/module/{name}/version") or "").strip() or None
        out[name] = {"state": state, "version": version}
    return {"modules": out}
