"""One device's memory: a bar plus used / total, sized to whatever width it is given."""

from __future__ import annotations

from typing import Any

from hwtui.widgets._draw import bar, gib
from rich.text import Text
from textual.widget import Widget


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

    def render(self) -> Text:
        label = f" {gib(self.used)}/{gib(self.total)}" if self.total else " mem ?"
        width = max(self.size.width - len(label), 1)
        if not self.total or self.used is None:
            return Text("·" * width + label, style="dim")
        frac = self.used / self.total
        style = "red" if frac > 0.9 else "yellow" if frac > 0.75 else "green"
        return Text.assemble((bar(frac, width), style), label)
