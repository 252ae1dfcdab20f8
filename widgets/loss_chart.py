"""The training loss: mean over workers per step, as a column chart with first / last / min."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from hwtui.widgets._draw import columns


class LossChart(Widget):
    DEFAULT_CSS = "LossChart { height: 5; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.points: list[tuple[int, float]] = []

    def show(self, train: Any) -> None:
        self.points = list(train.loss)
        self.refresh()

    def render(self) -> Text:
        if not self.points:
            return Text("loss: waiting for the first step", style="dim")
        losses = [v for _, v in self.points]
        head = Text.assemble(("loss ", "bold"), f"step {self.points[-1][0]}  now {losses[-1]:.4f}  "
                                                f"first {losses[0]:.4f}  min {min(losses):.4f}")
        height = max(self.size.height - 1, 1)
        width = max(self.size.width - 8, 1)
        top = max(losses)
        floor = min(losses)
        # Columns show loss above the minimum so a converging run visibly falls.
        rows = columns([v - floor + (top - floor) * 0.05 for v in losses], width, height)
        for i, row in enumerate(rows):
            axis = f"{top:6.3f}|" if i == 0 else (f"{floor:6.3f}|" if i == height - 1 else "      |")
            head.append("\n" + axis + " ")
            head.append(row, style="magenta")
        return head
