"""The training loss: mean over workers per step, as a chart with step along x; now / first / min in the title."""

from __future__ import annotations

from typing import Any

from textual_plotext.plot import Plot

from hwtui.engine.training.views import TrainingView
from hwtui.widgets.plot_chart import PlotChart


class LossChart(PlotChart):
    DEFAULT_CSS = "LossChart { height: 9; width: 1fr; }"
    X_LABEL = "step"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.points: list[tuple[int, float]] = []

    def show(self, train: TrainingView) -> None:
        self.points = list(train.loss)
        self.data_changed()

    def summary(self) -> str:
        if not self.points:
            return "loss: waiting for the first step"
        losses = [v for _, v in self.points]
        return f"loss step {self.points[-1][0]}  now {losses[-1]:.4f}  first {losses[0]:.4f}  min {min(losses):.4f}"

    def draw(self, plt: Plot) -> None:
        if self.points:
            steps, losses = [s for s, _ in self.points], [v for _, v in self.points]
            plt.plot(steps, losses, marker="braille", color="magenta")
            self.set_ticks(plt, "x", min(steps), max(max(steps), min(steps) + 1), integer=True)
            self.set_ticks(plt, "y", min(losses), max(losses))
