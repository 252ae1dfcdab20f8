"""Utilization, temperature and power history as labelled sparklines: pure functions, no widget.

Scales are fixed where the quantity has a natural range (0-100 %, 20-100 °C, 0-power limit) so
a flat line means "steady", not "rescaled noise". The latest value is printed after each line,
so the figure is there as a number too, and the shape reads without colour (NO_COLOR).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style

from hwtui.widgets._draw import sparkline

NAME_STYLE, LINE_STYLE = Style(dim=True), Style(color="cyan")
NOT_YET = "·"  # a place the history has not reached yet (drawn dim): the line's extent shows from the first tick


@dataclass(frozen=True)
class Metric:
    name: str  # what the panel prints before the line
    attr: str  # the DeviceSample attribute / DeviceHistory series
    unit: str
    lo: float | None
    hi: float | None  # None: the device's limit when known (power), else the highest value seen


METRICS = (Metric("util", "util", "%", 0.0, 100.0), Metric("temp", "temp_c", "C", 20.0, 100.0),
           Metric("pwr", "power_w", "W", 0.0, None))


def metric_value(value: float | None, unit: str) -> str:
    """``"45%"``, ``"700W"``; ``"-%"`` when a device that reports it missed this one reading."""
    return "-" + unit if value is None else f"{value:.0f}{unit}"


def metric_segments(metric: Metric, values: Sequence[float | None], spark_width: int, value_width: int, base: Style,
                    hi: float | None = None, dots: bool = False) -> list[Segment]:
    """``"  util ▂▄▆█  45%"``: two spaces, name, sparkline, latest value right-aligned in ``value_width``."""
    latest = values[-1] if values else None
    if all(v is None for v in values):
        # A sensor the device does not have: leave the column empty rather than print "-C".
        return [Segment(" " * (metric_fixed_width(metric, value_width) + spark_width), base)]
    line = sparkline(values, spark_width, metric.lo, metric.hi if metric.hi is not None else hi)
    # Before the first reading the line has no history: a dim dotted baseline, not blank cells
    # (a wide line with three readings looked like a 3-cell chart after 20 empty columns).
    waiting = max(spark_width - len(values), 0) if dots else 0
    return [Segment("  " + metric.name + " ", base + NAME_STYLE),
            *([Segment(NOT_YET * waiting, base + NAME_STYLE)] if waiting else []),
            Segment(line[waiting:], base + LINE_STYLE),
            Segment(" " + metric_value(latest, metric.unit).rjust(value_width), base)]


def metric_fixed_width(metric: Metric, value_width: int) -> int:
    """Cells :func:`metric_segments` uses besides the sparkline itself."""
    return 2 + len(metric.name) + 1 + 1 + value_width
