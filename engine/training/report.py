"""The ``--report FILE`` document: what each worker did, every merge round, every checkpoint.

Written atomically, redacted (device names and paths can carry user names), JSON only.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

from hwtui.core.atomic import atomic_write_text
from hwtui.core.redact import redact

SCHEMA = "hwtui.train-report/1"


class TrainWorkerRow(TypedDict):
    """One worker of the run as the report tells it (samples it trained, its losses, why it left)."""

    rank: int
    device: str
    vendor: str
    name: str
    samples: int
    samples_discarded: int
    samples_per_s: float | None
    busy_samples_per_s: float | None
    chunks_claimed: int
    chunks_done: int
    chunks_requeued: int
    loss_first: float | None
    loss_last: float | None
    loss_curve: list[float]
    calibration_samples_per_s: float | None
    precision: str | None
    alive: bool
    lost_reason: str | None


class _TrainReportBody(TypedDict):
    schema: str
    config: dict[str, Any]  # the run's hyper-parameters, model and data as given
    resumed_from: dict[str, Any] | None  # the checkpoint a --resume started from
    corpus_fingerprint: str | None
    step: int
    samples: int
    samples_discarded: int
    train_seconds: float
    samples_per_s: float | None
    final_loss: float | None
    failure: str | None  # why the run ended as failed (a worker diverged ...)
    workers: list[TrainWorkerRow]
    rounds: list[dict[str, Any]]
    checkpoints: list[dict[str, Any]]
    save_hf: dict[str, Any] | None  # --save-hf: path, ok, error as the last round's writer reported


class TrainReport(_TrainReportBody, total=False):
    """``--report FILE`` and ``train.done.report``. ``ok`` is set by the launcher when the run ends;
    ``pushes`` by ``train --push-to`` once its last push has ended (app/push/training.py)."""

    ok: bool
    pushes: list[dict[str, Any]]


def build_report(coord: Any) -> TrainReport:
    cfg = coord.cfg
    t_train = coord.t_train
    end = coord.t_done if coord.t_done else None
    import time

    wall = ((end or time.monotonic()) - t_train) if t_train else 0.0
    workers: list[TrainWorkerRow] = []
    for w in coord.workers:
        losses = w.losses
        workers.append({
            "rank": w.rank, "device": w.device, "vendor": w.ref.vendor, "name": w.ref.name,
            "samples": w.samples, "samples_discarded": w.samples_discarded,
            "samples_per_s": round(w.samples / wall, 3) if wall > 0 else None,
            "busy_samples_per_s": round(w.busy_samples / w.busy_seconds, 3) if w.busy_seconds else None,
            "chunks_claimed": w.chunks_claimed, "chunks_done": w.chunks_done, "chunks_requeued": w.requeued,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 50)]],
            "calibration_samples_per_s": (w.hello or {}).get("calibration"),
            "precision": (w.hello or {}).get("precision"),
            "alive": w.alive, "lost_reason": w.lost_reason,
        })
    return {
        "schema": SCHEMA,
        "config": {"steps": cfg.steps, "batch_size": cfg.batch_size, "lr": cfg.lr, "merge_every": cfg.merge_every,
                   "eval_every": cfg.eval_every,
                   "balance": cfg.balance, "optimizer_state": cfg.optimizer_state, "seed": cfg.seed,
                   "model": cfg.model.to_dict(), "model_source": cfg.model_source, "data": cfg.data,
                   "params": coord.params, "checkpoint_dir": cfg.checkpoint_dir},
        "resumed_from": coord.resumed_from,
        "corpus_fingerprint": coord.fingerprint,
        "step": coord.step,
        "samples": coord.samples_committed,
        "samples_discarded": coord.samples_discarded,
        "train_seconds": round(wall, 3),
        "samples_per_s": round(sum(w["samples"] for w in workers) / wall, 3) if wall > 0 else None,
        "final_loss": coord.final_loss,
        "failure": coord.failure,
        "workers": workers,
        "rounds": coord.rounds,
        "checkpoints": coord.checkpoints,
        "save_hf": coord.saved_hf,
    }


def write_report(path: str, report: TrainReport) -> None:
    atomic_write_text(path, json.dumps(redact(report), indent=1, default=str, allow_nan=False) + "\n")
