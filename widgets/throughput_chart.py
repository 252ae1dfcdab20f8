"""Broadcast throughput over the run's own time as a plotext chart with axes, and now / peak / average.

Drawn by textual-plotext (axes, ticks, the time in seconds along x), not by hand. The summary
figures are the chart's title, so they read as text too (NO_COLOR, screen readers, tests).
"""

from __future__ import annotations

from typing import Any

from textual.app import RenderResult
from textual_plotext import PlotextPlot


class ThroughputChart(PlotextPlot):
    DEFAULT_CSS = "ThroughputChart { height: 9; width: 1fr; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.times: list[float] = []
        self.points: list[float] = []
        self.current = self.peak = self.average = 0.0

    def show(self, repl: Any) -> None:
        self.times = [t for t, _ in repl.throughput]
        self.points = [g for _, g in repl.throughput]
        self.current, self.peak, self.average = repl.current_gbps, repl.peak_gbps, repl.average_gbps
        self.refresh()

    def summary(self) -> str:
        return f"GB/s now {self.current:.2f}  peak {self.peak:.2f}  avg {self.average:.2f}"

    def render(self) -> RenderResult:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.summary())
        plt.xlabel("s")
        if self.points:
            plt.plot(self.times, self.points, marker="braille", color="cyan")
            plt.ylim(0, max(self.peak, 1e-9) * 1.05)
        return super().render()
