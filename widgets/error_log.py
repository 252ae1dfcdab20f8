"""The engine's log: events, stderr and errors, newest last. Errors are labelled, not just red."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.events import Resize
from textual.widgets import RichLog

LEVEL_STYLE = {"error": "bold red", "critical": "bold red", "warn": "yellow", "warning": "yellow", "debug": "dim",
               "stderr": "", "info": ""}


class ErrorLog(RichLog):
    # A stable gutter: lines are wrapped to the width left of the scrollbar from the first line on,
    # so the scrollbar appearing later never covers their last characters.
    DEFAULT_CSS = "ErrorLog { height: 1fr; min-height: 3; scrollbar-gutter: stable; overflow-x: hidden; }"

    def __init__(self, **kwargs: Any) -> None:
        # min_width: RichLog renders at least 78 cells wide by default, which cut the ends of lines at
        # 80 columns (76 cells inside the padding and the scrollbar gutter).
        super().__init__(max_lines=1000, wrap=True, markup=False, highlight=False, min_width=20, **kwargs)
        self.seen = 0  # RunState.log_total already written

    def on_resize(self, event: Resize) -> None:
        super().on_resize(event)
        # RichLog follows its end only when it writes: a log that shrank after its last line (a
        # panel appearing as the run failed) kept its old scroll position, its last ERROR lines
        # below the view. Following the end on a resize keeps them in sight.
        if self.auto_scroll:
            self.scroll_end(animate=False, immediate=False, x_axis=False)

    def catch_up(self, entries: list[tuple[str, str]], total: int) -> None:
        """Write only the entries logged since the last call (``total`` counts every line ever)."""
        new = total - self.seen
        if new <= 0:
            return
        for level, text in entries[-min(new, len(entries)):]:
            prefix = {"error": "ERROR ", "critical": "ERROR ", "warn": "warn  ", "warning": "warn  ",
                      "stderr": "stderr "}.get(level, "")
            self.write(Text(prefix + text, style=LEVEL_STYLE.get(level, "")))
        self.seen = total

    def reset(self) -> None:
        self.clear()
        self.seen = 0
