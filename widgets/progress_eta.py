"""Progress of the run: a bar, what is done, and the time left.

The ETA comes from the engine's own elapsed time (event timestamps), not the wall clock of the
TUI, so a replayed stream shows the same figures every time.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from hwtui.widgets._draw import bar


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class ProgressEta(Widget):
    DEFAULT_CSS = "ProgressEta { height: 1; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fraction, self.label, self.status = 0.0, "waiting for the engine", "starting"
        self.eta: float | None = None

    def show(self, fraction: float, eta: float | None, label: str, status: str) -> None:
        self.fraction, self.eta, self.label, self.status = fraction, eta, label, status
        self.refresh()

    def render(self) -> Text:
        # No ETA before there is a rate: the room goes to what is happening (start-up).
        eta = f"  ETA {format_eta(self.eta)}" if self.eta is not None or self.fraction > 0 else ""
        tail = f" {self.fraction * 100:5.1f}%{eta}  {self.label}"
        head = f"{self.status:<8} "
        # The bar gives way to the words when both do not fit (start-up says what is happening).
        width = max(self.size.width - len(tail) - len(head), 1)
        style = "red" if self.status in ("FAILED", "error") else "green"
        return Text.assemble((head, "bold"), (bar(self.fraction, width), style), tail)
