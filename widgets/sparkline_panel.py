"""Utilization, temperature and power of one device as three labelled sparklines.

Scales are fixed where the quantity has a natural range (0-100 %, 20-100 °C, 0-power limit) so
a flat line means "steady", not "rescaled noise".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hwtui.widgets._draw import sparkline
from rich.text import Text
from textual.widget import Widget


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

    def render(self) -> Text:
        parts = [("util", self.util, "%", 0.0, 100.0), ("temp", self.temp, "C", 20.0, 100.0),
                 ("pwr", self.power, "W", 0.0, self.power_limit)]
        # Each metric gets a third: "util▁▂▃▅ 45%": a label, the line, the latest value.
        slot = max(self.size.width // 3, 10)
        text = Text()
        for name, values, unit, lo, hi in parts:
            latest = values[-1] if values else None
            value = _fmt(latest, unit)
            spark_w = max(slot - len(name) - len(value) - 2, 1)
            text.append(name, style="dim")
            text.append(sparkline(values, spark_w, lo, hi), style="cyan")
            text.append(" " + value + " ")
        return text
