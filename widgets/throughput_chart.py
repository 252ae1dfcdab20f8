"""Broadcast throughput over the run's own time (seconds along x), with now / peak / average in the title."""

from __future__ import annotations

from typing import Any

from hwtui.widgets.plot_chart import PlotChart


class ThroughputChart(PlotChart):
    DEFAULT_CSS = "ThroughputChart { height: 9; width: 1fr; }"
    X_LABEL = "s"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.times: list[float] = []
        self.points: list[float] = []
        self.current = self.peak = self.average = 0.0

    def show(self, repl: Any) -> None:
        self.times = [t for t, _ in repl.throughput]
        self.points = [g for _, g in repl.throughput]
        self.current, self.peak, self.average = repl.current_gbps, repl.peak_gbps, repl.average_gbps
        self.data_changed()

    def summary(self) -> str:
        return f"GB/s now {self.current:.2f}  peak {self.peak:.2f}  avg {self.average:.2f}"

    def draw(self, plt: Any) -> None:
        if self.points:
            plt.plot(self.times, self.points, marker="braille", color="cyan")
            plt.ylim(0, max(self.peak, 1e-9) * 1.05)
