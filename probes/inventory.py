"""The device inventory: what `list-gpus`, the check's JSON and the TUI show.

Starts from the PCI facts (no library needed) and merges what the vendor collectors learnt
(names, VRAM, runtime indices). Vendor modules contribute *enrichers*: functions from the
collected facts to ``{pci_address: {field: value}}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hwtui.probes.devices import Device, build_devices
from hwtui.probes.framework import Facts, collect
from hwtui.probes.host import Host

Enricher = Callable[[Facts], Mapping[str, Mapping[str, Any]]]



def _vendor_enrichers() -> list[Enricher]:
    # Imported here, not at the top: the vendor modules import this package's siblings.
    from hwtui.probes.amd import amd_enricher
    from hwtui.probes.intel import intel_enricher
    from hwtui.probes.nvidia import nvml_enricher

    return [nvml_enricher, amd_enricher, intel_enricher]


# Collectors the inventory needs (list-gpus runs just these, not every check): NVML for NVIDIA
# names, VRAM and live figures; amd for amdsmi/sysfs names, VRAM and gfx targets. torch is not
# among them (a cold list-gpus must not import it); intel_enricher uses torch facts when a check
# already gathered them.
INVENTORY_COLLECTORS: list[str] = ["pci", "nvml", "amd"]
ENRICHERS: list[Enricher] = _vendor_enrichers()


def devices_from_facts(facts: Facts) -> list[Device]:
    if "pci" not in facts:
        return []
    merged: dict[str, dict[str, Any]] = {}
    for enricher in ENRICHERS:
        for address, fields in enricher(facts).items():
            merged.setdefault(address, {}).update({k: v for k, v in fields.items() if v is not None})
    return build_devices(facts["pci"], merged)


def detect_devices(host: Host, timeout_scale: float = 1.0) -> tuple[list[Device], Facts]:
    from hwtui.probes.catalog import catalog

    collectors, _ = catalog()
    wanted = [c for c in collectors if c.name in INVENTORY_COLLECTORS]
    facts, _problems = collect(host, wanted, timeout_scale)
    return devices_from_facts(facts), facts
