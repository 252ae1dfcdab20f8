"""Merge rounds of the training run: step, merged loss against the workers' mean, and shares."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from hwtui.engine.training.events import TrainMerge
from hwtui.engine.training.views import TrainingView


class MergeRounds(Widget):
    DEFAULT_CSS = "MergeRounds { height: auto; max-height: 6; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.merges: list[TrainMerge] = []
        self.checkpoints = 0

    def show(self, train: TrainingView) -> None:
        self.merges = list(train.merges)
        self.checkpoints = len(train.checkpoints)
        self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 1 + min(len(self.merges), 5)

    def render(self) -> Text:
        text = Text.assemble(("merge rounds ", "bold"), f"{len(self.merges)}   checkpoints {self.checkpoints}")
        for m in reversed(self.merges[-5:]):  # newest first: a short panel keeps the latest round
            share_txt = " ".join(f"{s * 100:.0f}%" for s in m.shares)
            merged, mean = m.loss_merged, m.loss_workers_mean
            text.append(f"\n#{m.round:<3} step {m.step:<5} merged "
                        f"{'-' if merged is None else f'{float(merged):.4f}'} vs mean "
                        f"{'-' if mean is None else f'{float(mean):.4f}'}  shares {share_txt}")
        return text
