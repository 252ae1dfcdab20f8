"""Training events: the contract between the engine, the CLI printer and the TUI.

Errors use the shared :class:`hwtui.core.events.ErrorEvent`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from hwtui.core.events import Event, event

if TYPE_CHECKING:  # the report's shape, for the type checker only
    from hwtui.engine.training.report import TrainReport


class TrainWorkerInfo(TypedDict):
    """One worker as ``train.start`` announces it."""

    rank: int
    device: str  # "cuda:0"
    vendor: str
    name: str  # the device's model name


@event("train.start")
class TrainStart(Event):
    workers: list[TrainWorkerInfo]
    steps: int
    batch_size: int
    balance: str
    merge_every: int
    params: int
    start_step: int = 0  # the merged model's step when training starts (a resume's checkpoint step)


@event("train.worker")
class TrainWorker(Event):
    rank: int
    device: str
    step: int  # optimizer steps this worker has taken (one per chunk)
    samples: int
    samples_per_s: float
    loss: float | None
    mem_used: int | None
    mem_total: int | None
    chunks_claimed: int


@event("train.merge")
class TrainMerge(Event):
    round: int
    step: int
    shares: list[float]  # per rank: fraction of the round's samples (0 for a lost rank)
    loss_merged: float | None  # held-out loss of the merged model
    loss_workers_mean: float | None  # mean held-out loss of the workers' own models before the merge


@event("train.checkpoint")
class TrainCheckpoint(Event):
    path: str
    step: int
    round: int


@event("train.export")
class TrainExport(Event):
    """The merged model of a round written as a Hugging Face directory (--save-hf, or an export
    for --push-to): ``path`` on success, ``error`` (one line) otherwise."""

    round: int
    step: int
    path: str | None
    error: str | None = None
    final: bool = False  # the last round's export (the one --save-hf names, when given)


@event("train.worker_lost")
class TrainWorkerLost(Event):
    rank: int
    device: str
    reason: str
    chunks_requeued: int


@event("train.done")
class TrainDone(Event):
    ok: bool
    seconds: float
    samples: int
    final_loss: float | None
    report: TrainReport | None
