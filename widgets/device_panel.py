"""Every sampled device, one line each: name, memory bar, util / temp / power sparklines.

Rows are created once per device key and then only updated, so a 1 Hz refresh repaints a few
one-line widgets instead of rebuilding the panel.
"""

from __future__ import annotations

from typing import Any

from hwtui.widgets.memory_bar import MemoryBar
from hwtui.widgets.sparkline_panel import SparklinePanel
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Label


class _DeviceRow(Horizontal):
    DEFAULT_CSS = """
    _DeviceRow { height: 1; }
    _DeviceRow > Label { width: 8; }
    """


class DevicePanel(VerticalScroll):
    DEFAULT_CSS = "DevicePanel { height: auto; max-height: 9; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rows: dict[str, tuple[MemoryBar, SparklinePanel]] = {}

    def update_from(self, history: Any) -> None:
        for key in history.keys():
            if key not in self._rows:
                sample = history.latest[key]
                mem, sparks = MemoryBar(), SparklinePanel()
                label = Label(key, classes="device-key")
                label.tooltip = getattr(sample, "name", key)
                self.mount(_DeviceRow(label, mem, sparks))
                self._rows[key] = (mem, sparks)
            sample = history.latest[key]
            mem, sparks = self._rows[key]
            mem.set_memory(sample.mem_used, sample.mem_total)
            series = history.series[key]
            sparks.set_series(series["util"], series["temp_c"], series["power_w"], getattr(sample, "power_limit_w", None))
