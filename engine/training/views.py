"""What a display reads of a training run: Protocols over the state folded from the engine's events.

The TUI folds ``train.*`` events into its run state (``app/tui/run_state.Training``); the widgets
that draw it sit below the app and may not import it. These Protocols, beside the events they are
made of, are the contract between the two: the widgets are typed by them, and mypy checks at every
call site that the app's state still has every figure a widget reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sized
from typing import Protocol

from hwtui.engine.training.events import TrainMerge


class WorkerView(Protocol):
    """One worker's row, from its ``train.worker`` reports."""

    @property
    def device(self) -> str: ...

    @property
    def step(self) -> int: ...

    @property
    def samples_per_s(self) -> float: ...

    @property
    def loss(self) -> float | None: ...

    @property
    def mem_used(self) -> int | None: ...

    @property
    def mem_total(self) -> int | None: ...

    @property
    def lost(self) -> str:
        """Why the worker was lost; "" while it works."""


class TrainingView(Protocol):
    @property
    def workers(self) -> Mapping[int, WorkerView]: ...

    @property
    def loss(self) -> Iterable[tuple[int, float]]:
        """(step, mean loss) points, oldest first."""

    @property
    def merges(self) -> Iterable[TrainMerge]: ...

    @property
    def checkpoints(self) -> Sized: ...

    def shares(self) -> dict[int, float]: ...
