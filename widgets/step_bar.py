"""The wizard's breadcrumb: every step by number, the current one bracketed (legible without colour).

A click on a step posts :class:`StepBar.Chosen`; the app decides whether to go there.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events
from textual.message import Message
from textual.widget import Widget

STEP_TITLES = {"detect": "Detect", "drivers": "Drivers & wheels", "environment": "Environment", "engine": "Engine",
               "run": "Run"}


class StepBar(Widget):
    DEFAULT_CSS = "StepBar { height: 1; background: $panel; }"

    class Chosen(Message):
        def __init__(self, step: str) -> None:
            super().__init__()
            self.step = step

    def __init__(self, current: str, subtitle: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.current = current
        self.subtitle = subtitle

    def _labels(self) -> list[tuple[str, str]]:
        """``(step, drawn label)`` in order; narrow terminals keep only the current step's title."""
        out = []
        for n, (key, title) in enumerate(STEP_TITLES.items(), 1):
            compact = self.size.width < 100 and key != self.current
            label = f"{n}" if compact else f"{n} {title}"
            out.append((key, f"[{label}]" if key == self.current else f" {label} "))
        return out

    def step_at(self, x: int) -> str | None:
        pos = len(" hwtui ")
        for key, drawn in self._labels():
            pos += 1
            if pos <= x < pos + len(drawn):
                return key
            pos += len(drawn)
        return None

    def on_click(self, event: events.Click) -> None:
        step = self.step_at(event.x)
        if step is not None and step != self.current:
            self.post_message(self.Chosen(step))

    def render(self) -> Text:
        text = Text(" hwtui ", style="bold reverse")
        for key, drawn in self._labels():
            text.append(" ")
            text.append(drawn, style="bold reverse" if key == self.current else "dim")
        if self.subtitle:
            text.append("  " + self.subtitle, style="italic")
        return text
