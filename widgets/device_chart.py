"""One device's history as a chart with axes: utilisation and temperature (left axis), power (right axis).

Time runs along x in seconds before now (labelled "seconds ago", ticks at round values). A sensor
the device does not have is not plotted and not named. The latest figures are the title, so they
read as text too. Each series has its own marker, keyed in the x label, so they are told apart
without colour (NO_COLOR once drew three identical grey dots).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual_plotext.plot import Plot

from hwtui.widgets.plot_chart import PlotChart
from hwtui.widgets.sparkline_panel import metric_value

if TYPE_CHECKING:  # the probes' types only; a widget module imports no probe code
    from hwtui.probes.sampling import DeviceHistoryView

WINDOW = 60  # points the time axis spans at least

# name, attribute, unit, colour, y side, marker (told apart without colour)
SERIES = (("util", "util", "%", "cyan", "left", "•"), ("temp", "temp_c", "C", "yellow", "left", "+"),
          ("pwr", "power_w", "W", "magenta", "right", "x"))


class DeviceChart(PlotChart):
    DEFAULT_CSS = "DeviceChart { height: 1fr; min-height: 8; width: 1fr; }"
    X_LABEL = "seconds ago"
    BUILD_IN_THREAD = True  # redrawn on every monitor tick: built off the UI thread

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.key: str | None = None
        self.series: dict[str, list[float | None]] = {}
        self.interval = 1.0
        self.power_limit: float | None = None

    def show(self, history: DeviceHistoryView, key: str | None, interval: float) -> None:
        """Plot ``key``'s series from ``history`` (a DeviceHistory), one point per ``interval`` seconds."""
        self.key, self.interval = key, interval
        self.series = {attr: list(history.series[key][attr]) for _, attr, *_ in SERIES} if key is not None and key in history.series else {}
        sample = history.latest.get(key) if key else None
        self.power_limit = getattr(sample, "power_limit_w", None)
        self.data_changed()

    def summary(self) -> str:
        if not self.key or not self.series:
            return "device history: waiting for the first sample"
        parts = [self.key]
        for name, attr, unit, *_ in SERIES:
            values = self.series.get(attr) or []
            if any(v is not None for v in values):
                parts.append(f"{name} {metric_value(values[-1], unit)}")
        if self.power_limit and any(v is not None for v in self.series.get("power_w") or []):
            parts[-1] += f"/{self.power_limit:.0f}W"
        return "  ".join(parts)

    def _plotted(self) -> list[tuple[str, str, str, str, str, str]]:
        return [row for row in SERIES if any(v is not None for v in self.series.get(row[1]) or [])]

    def x_label(self) -> str:
        key = "  ".join(f"{marker} {name}" for name, *_, marker in self._plotted())
        return f"{self.X_LABEL}   {key}" if key else self.X_LABEL

    def draw(self, plt: Plot) -> None:
        plotted_right = False
        for _name, attr, _unit, colour, side, marker in self._plotted():
            values = self.series.get(attr) or []
            points = [(-(len(values) - 1 - i) * self.interval, v) for i, v in enumerate(values) if v is not None]
            plt.plot([x for x, _ in points], [v for _, v in points], marker=marker, color=colour, yside=side)
            plotted_right = plotted_right or side == "right"
        # The whole window of history from the start, so the time axis does not stretch as points arrive.
        n = max((len(self.series.get(attr) or []) for _, attr, *_ in SERIES), default=0)
        self.set_ticks(plt, "x", 0, (max(n, WINDOW) - 1) * self.interval, mirrored=True)
        self.set_ticks(plt, "y", 0, 100, yside="left")
        if plotted_right:
            peak = max((v for v in self.series.get("power_w") or [] if v is not None), default=0.0)
            self.set_ticks(plt, "y", 0, max(peak, 1.0), yside="right", top=self.power_limit)
