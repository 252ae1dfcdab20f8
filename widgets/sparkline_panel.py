"""Utilization, temperature and power of one device as three labelled sparklines.

Scales are fixed where the quantity has a natural range (0-100 %, 20-100 °C, 0-power limit) so
a flat line means "steady", not "rescaled noise". Drawn with the line API, like MemoryBar, to
keep a 1 Hz refresh of many devices cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hwtui.widgets._draw import sparkline
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

_DIM, _LINE = Style(dim=True), Style(color="cyan")


def _fmt(value: float | None, unit: str) -> str:
    return "  -" + unit if value is None else f"{value:3.0f}{unit}"


class SparklinePanel(Widget):
    DEFAULT_CSS = "SparklinePanel { height: 1; width: 2fr; min-width: 30; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.util: Sequence[float | None] = ()
        self.temp: Sequence[float | None] = ()
        self.power: Sequence[float | None] = ()
        self.power_limit: float | None = None

    def set_series(self, util: Sequence[float | None], temp: Sequence[float | None], power: Sequence[float | None],
                   power_limit: float | None = None) -> None:
        self.util, self.temp, self.power, self.power_limit = util, temp, power, power_limit
        self.refresh()

    def parts(self, width: int) -> list[tuple[str, str, str]]:
        """``(name, sparkline, latest value)`` per metric; each gets a third of ``width``."""
        slot = max(width // 3, 10)
        out = []
        for name, values, unit, lo, hi in (("util", self.util, "%", 0.0, 100.0), ("temp", self.temp, "C", 20.0, 100.0),
                                           ("pwr", self.power, "W", 0.0, self.power_limit)):
            value = _fmt(values[-1] if values else None, unit)
            out.append((name, sparkline(values, max(slot - len(name) - len(value) - 3, 1), lo, hi), value))
        return out

    def render_line(self, y: int) -> Strip:
        base = self.rich_style
        if y:
            return Strip.blank(self.size.width, base)
        segments = []
        for name, line, value in self.parts(self.size.width):
            segments += [Segment(" " + name, base + _DIM), Segment(line, base + _LINE), Segment(" " + value + " ", base)]
        return Strip(segments).adjust_cell_length(self.size.width, base)
