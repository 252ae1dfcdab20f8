"""The Detect step's device list: one row per device, the columns ``hwtui list-gpus`` prints."""

from __future__ import annotations

from typing import Any

from hwtui.widgets._draw import gib
from rich.text import Text
from textual.widgets import DataTable

COLUMNS = ("ID", "DEVICE", "VENDOR", "NAME", "PCI", "DRIVER", "VRAM", "STATUS")


class DeviceTable(DataTable):
    DEFAULT_CSS = "DeviceTable { height: auto; max-height: 14; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def show(self, devices: list[Any]) -> None:
        self.clear()
        for d in devices:
            status = Text("ok") if d.usable else Text(f"unusable: {d.reason}", style="bold")
            # Text, never str: a str cell is markup, and a PCI address like 0000:ab:00.0 holds
            # the emoji code ":ab:".
            cells = ("-" if d.id is None else str(d.id), d.device or "-", d.vendor, d.name, d.pci, d.driver or "-",
                     gib(d.vram_total) if d.vram_total else "-")
            self.add_row(*(Text(c) for c in cells), status, key=d.pci)
