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

# Collectors the inventory needs (list-gpus runs just these, not every check).
INVENTORY_COLLECTORS: list[str] = ["pci"]
ENRICHERS: list[Enricher] = []


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
