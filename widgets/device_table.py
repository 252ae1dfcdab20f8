"""The Detect step's device list: the columns ``hwtui list-gpus`` prints, plus why a device is unusable.

Unusable devices (passthrough, wrong driver) are listed too, last, with the reason: a GPU that is
"missing" is the first thing a person wants explained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widgets import DataTable

if TYPE_CHECKING:  # the probes' types only; a widget module imports no probe code
    from hwtui.probes.devices import Device

COLUMNS = ("ID", "Vendor", "Model", "VRAM", "Backend", "Device", "PCI", "Driver", "Status")


def _vram(n: int | None) -> str:
    return "-" if not n else f"{n / 1024**3:.0f} GB"


class DeviceTable(DataTable):
    DEFAULT_CSS = "DeviceTable { height: auto; max-height: 14; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def show(self, devices: list[Device]) -> None:
        self.clear()
        for d in devices:
            status = Text("ok") if d.usable else Text(f"unusable: {d.reason}", style="bold")
            # Text, never str: a str cell is markup, and a PCI address like 0000:ab:00.0 holds
            # the emoji code ":ab:".
            cells = ("-" if d.id is None else str(d.id), d.vendor, d.name, _vram(d.vram_total), d.backend,
                     d.device or "-", d.pci, d.driver or "-")
            self.add_row(*(Text(c) for c in cells), status, key=d.pci)
