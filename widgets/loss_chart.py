"""The training loss: mean over workers per step, as a plotext chart with step along x.

Drawn by textual-plotext (axes and ticks), with now / first / min in the title so the figures
read as text as well.
"""

from __future__ import annotations

from typing import Any

from textual.app import RenderResult
from textual_plotext import PlotextPlot


class LossChart(PlotextPlot):
    DEFAULT_CSS = "LossChart { height: 9; width: 1fr; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.points: list[tuple[int, float]] = []

    def show(self, train: Any) -> None:
        self.points = list(train.loss)
        self.refresh()

    def summary(self) -> str:
        if not self.points:
            return "loss: waiting for the first step"
        losses = [v for _, v in self.points]
        return f"loss step {self.points[-1][0]}  now {losses[-1]:.4f}  first {losses[0]:.4f}  min {min(losses):.4f}"

    def render(self) -> RenderResult:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.summary())
        plt.xlabel("step")
        if self.points:
            plt.plot([s for s, _ in self.points], [v for _, v in self.points], marker="braille", color="magenta")
        return super().render()
