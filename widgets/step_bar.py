"""The wizard's breadcrumb: every step by number, the current one bracketed (legible without colour)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

STEP_TITLES = {"detect": "Detect", "drivers": "Drivers & wheels", "environment": "Environment", "engine": "Engine",
               "run": "Run"}


class StepBar(Widget):
    DEFAULT_CSS = "StepBar { height: 1; background: $panel; }"

    def __init__(self, current: str, subtitle: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.current = current
        self.subtitle = subtitle


    def render(self) -> Text:
        text = Text(" hwtui ", style="bold reverse")
        for n, (key, title) in enumerate(STEP_TITLES.items(), 1):
            text.append(" ")
            # Narrow terminals: only the current step keeps its title, the others their number.
            compact = self.size.width < 100 and key != self.current
            label = f"{n}" if compact else f"{n} {title}"
            if key == self.current:
                text.append(f"[{label}]", style="bold reverse")
            else:
                text.append(f" {label} ", style="dim")
        if self.subtitle:
            text.append("  " + self.subtitle, style="italic")
        return text
