"""One device list across vendors, with one global id.

Backends come from the PCI vendor and the bound driver, never from guessing names: an AMD card is
``hip`` even though ROCm's torch calls it ``cuda``. Per-backend indices follow PCI bus order,
which is the order NVML, amdsmi and Level Zero enumerate in (set CUDA_DEVICE_ORDER=PCI_BUS_ID so
torch agrees; hwtui's engine does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from hwtui.probes.pci import BACKEND_OF_VENDOR, COMPUTE_DRIVERS, PciFact

# Global id order: the order of the mixed-vendor design's detect_all_gpus (CUDA, XPU, HIP), then
# the single-vendor accelerators.
BACKEND_ORDER = ("cuda", "xpu", "hip", "hpu", "tpu")


@dataclass
class Device:
    id: int | None  # global id; None when the device is not usable (passthrough, wrong driver)
    vendor: str
    backend: str
    device: str | None  # per-backend id such as "xpu:0"
    index: int | None
    name: str
    pci: str
    driver: str | None
    vram_total: int | None = None
    vram_used: int | None = None
    numa_node: int | None = None
    usable: bool = True
    reason: str = ""  # why not usable
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def unusable_reason(vendor: str, driver: str | None) -> str:
    if driver is None:
        return "no kernel driver bound"
    if driver == "vfio-pci" and vendor != "Google":
        return "bound to vfio-pci (passed through to a VM)"
    if driver not in COMPUTE_DRIVERS.get(vendor, set()):
        want = " or ".join(sorted(COMPUTE_DRIVERS.get(vendor, {"?"})))
        return f"bound to {driver}, compute needs {want}"
    return ""


def build_devices(pci: PciFact, enrich: Mapping[str, Mapping[str, Any]] | None = None) -> list[Device]:
    """Devices from the PCI facts, merged with what vendor probes learnt (keyed by PCI address).

    ``enrich[address]`` may carry ``name``, ``vram_total``, ``vram_used`` and anything else, which
    lands in ``extra``.
    """
    enrich = enrich or {}
    devices: list[Device] = []
    for raw in pci.get("devices", []):
        vendor = raw["vendor"]
        reason = unusable_reason(vendor, raw.get("driver"))
        more = dict(enrich.get(raw["address"], {}))
        devices.append(Device(
            id=None, vendor=vendor, backend=BACKEND_OF_VENDOR[vendor], device=None, index=None,
            name=more.pop("name", None) or raw["name"], pci=raw["address"], driver=raw.get("driver"),
            vram_total=more.pop("vram_total", None) or raw.get("vram_total"),
            vram_used=more.pop("vram_used", None) or raw.get("vram_used"),
            numa_node=raw.get("numa_node"), usable=not reason, reason=reason, extra=more,
        ))
    devices.sort(key=lambda d: (BACKEND_ORDER.index(d.backend), d.pci))
    per_backend: dict[str, int] = {}
    next_id = 0
    for dev in devices:
        if not dev.usable:
            continue
        dev.index = per_backend.get(dev.backend, 0)
        per_backend[dev.backend] = dev.index + 1
        dev.device = f"{dev.backend}:{dev.index}"
        dev.id = next_id
        next_id += 1
    # Usable devices first (by global id), then the reported-but-unusable ones.
    devices.sort(key=lambda d: (d.id is None, d.id if d.id is not None else 0, d.pci))
    return devices
