"""One device's memory: a bar plus used / total, sized to whatever width it is given.

Drawn with the line API (one Strip of a few Segments) rather than a Rich renderable: eight of
these repaint every second, and skipping the Text -> Visual conversion is most of their cost.
"""

from __future__ import annotations

from typing import Any

from hwtui.widgets._draw import bar, gib
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

_LEVEL = {"ok": Style(color="green"), "high": Style(color="yellow"), "full": Style(color="red"), "none": Style(dim=True)}


class MemoryBar(Widget):
    DEFAULT_CSS = "MemoryBar { height: 1; width: 1fr; min-width: 16; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.used: int | None = None
        self.total: int | None = None

    def set_memory(self, used: int | None, total: int | None) -> None:
        if (used, total) != (self.used, self.total):
            self.used, self.total = used, total
            self.refresh()

    def text(self, width: int) -> tuple[str, str, str]:
        """``(bar, label, level)`` for ``width`` cells; also what tests read."""
        label = f" {gib(self.used)}/{gib(self.total)}" if self.total else " mem ?"
        bar_w = max(width - len(label), 1)
        if not self.total or self.used is None:
            return "·" * bar_w, label, "none"
        frac = self.used / self.total
        return bar(frac, bar_w), label, "full" if frac > 0.9 else "high" if frac > 0.75 else "ok"

    def render_line(self, y: int) -> Strip:
        if y:
            return Strip.blank(self.size.width, self.rich_style)
        base = self.rich_style
        drawn, label, level = self.text(self.size.width)
        strip = Strip([Segment(drawn, base + _LEVEL[level]), Segment(label, base)])
        return strip.adjust_cell_length(self.size.width, base)
