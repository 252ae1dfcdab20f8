"""Broadcast throughput over the run's own time (seconds along x), with now / peak / average in the title."""

from __future__ import annotations

from typing import Any

from textual_plotext.plot import Plot

from hwtui.engine.replication.views import ReplicationView
from hwtui.widgets.plot_chart import PlotChart


def _gbps(value: float | None) -> str:
    """A figure the engine has not given yet is "-", never a made-up 0.00."""
    return "-" if value is None else f"{value:.2f}"


class ThroughputChart(PlotChart):
    DEFAULT_CSS = "ThroughputChart { height: 9; width: 1fr; }"
    X_LABEL = "s"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.times: list[float] = []
        self.points: list[float] = []
        self.peak = 0.0
        self.current: float | None = None  # None until the engine's first throughput sample
        self.average: float | None = None

    def show(self, repl: ReplicationView) -> None:
        self.times = [t for t, _ in repl.throughput]
        self.points = [g for _, g in repl.throughput]
        self.current, self.peak, self.average = repl.current_gbps, repl.peak_gbps, repl.average_gbps
        self.data_changed()

    def summary(self) -> str:
        return f"GB/s now {_gbps(self.current)}  peak {self.peak:.2f}  avg {_gbps(self.average)}"

    def draw(self, plt: Plot) -> None:
        if self.points:
            plt.plot(self.times, self.points, marker="braille", color="cyan")
            self.set_ticks(plt, "x", 0, max(max(self.times), 1e-3))
            self.set_ticks(plt, "y", 0, max(self.peak, 1e-9))
