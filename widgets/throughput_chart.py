"""Broadcast throughput over time as a column chart, with current, peak and average GB/s."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from hwtui.widgets._draw import columns


class ThroughputChart(Widget):
    DEFAULT_CSS = "ThroughputChart { height: 5; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.points: list[float] = []
        self.current = self.peak = self.average = 0.0

    def show(self, repl: Any) -> None:
        self.points = [g for _, g in repl.throughput]
        self.current, self.peak, self.average = repl.current_gbps, repl.peak_gbps, repl.average_gbps
        self.refresh()

    def render(self) -> Text:
        head = Text.assemble(("GB/s ", "bold"), f"now {self.current:6.2f}  peak {self.peak:6.2f}  avg {self.average:6.2f}")
        height = max(self.size.height - 1, 1)
        width = max(self.size.width - 7, 1)
        rows = columns(self.points, width, height, hi=self.peak or None)
        for i, row in enumerate(rows):
            axis = f"{self.peak:5.1f}|" if i == 0 else "     |"
            head.append("\n" + axis + " ")
            head.append(row, style="cyan")
        return head
