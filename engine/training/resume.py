"""Resuming a run, and replaying the chunk assignment that made it what it was.

Which worker trained which chunk decides what the merged model becomes (each copy's path through
its own chunks differs), and with ``--balance dynamic`` or ``static`` that assignment follows the
devices' measured speed, i.e. timing. So the coordinator records it: after every committed round
the assignment (round -> rank -> chunk ids) is written atomically to ``assignments.json`` in
``--checkpoint-dir`` and is part of the ``--report``. ``--resume`` replays the recorded rounds that
come after the checkpoint it resumes from (a run stopped after round 5 with its last checkpoint at
round 4 trains round 5 again with the same chunks on the same ranks), and ``--replay-assignment FILE`` makes
a fresh run train exactly the assignment a previous run recorded: with the same seed it is then
bit-for-bit the same run whatever the balance mode.

``--resume`` also refuses to continue with different hyper-parameters (``config.HYPERPARAMETERS``)
than the checkpoint was trained with, unless ``--override`` names each one that changes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwtui.core.atomic import atomic_write_text
from hwtui.engine.training import checkpoint
from hwtui.engine.training.config import HYPERPARAMETERS, TrainConfig, TrainingError
from hwtui.engine.training.queue import Unit, unit_name, unit_parse

ASSIGNMENTS = "assignments.json"
# /2: an entry may be a piece of a chunk, "chunk:part/parts" (the finer tail); /1 files (whole
# chunks only) read the same. An older hwtui refuses a /2 file in one line (not an assignment record).
ASSIGNMENTS_SCHEMA = "hwtui.train-assignments/2"
MAX_ASSIGNMENTS_BYTES = 64 << 20

Assignment = dict[int, dict[int, tuple[Unit, ...]]]  # round -> rank -> the units it trained, in order


@dataclass(frozen=True)
class ResumePoint:
    path: str
    step: int
    round: int
    next_chunk: int
    samples: int
    fingerprint: str | None
    replay: Assignment = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "step": self.step, "round": self.round, "fingerprint": self.fingerprint}


def _int(doc: dict[str, Any], key: str, path: Path) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TrainingError(f"--resume: {path} has no usable {key!r} in its manifest")
    return value


def hyperparameter_changes(recorded: dict[str, Any], cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    now = cfg.hyperparameters()
    return {k: (recorded[k], now[k]) for k in HYPERPARAMETERS if k in recorded and recorded[k] != now[k]}


def load(cfg: TrainConfig) -> ResumePoint:
    if not cfg.checkpoint_dir:
        raise TrainingError("--resume needs --checkpoint-dir (where the previous run wrote its checkpoints)")
    found = checkpoint.latest(cfg.checkpoint_dir)
    if found is None:
        raise TrainingError(f"--resume: no complete checkpoint in {cfg.checkpoint_dir}")
    path, doc = found
    if doc.get("model") != cfg.model.to_dict():
        raise TrainingError(f"--resume: {path} holds a model {doc.get('model')}, this run builds {cfg.model.to_dict()}")
    source = doc.get("model_source", "char")
    if source != cfg.model_source:
        raise TrainingError(f"--resume: {path} holds --model {source}, this run trains --model {cfg.model_source}")
    step = _int(doc, "step", path)
    if step >= cfg.steps:
        raise TrainingError(f"--resume: {path} is already at step {step}; raise --steps above it to train on")
    recorded = doc.get("hyperparameters")
    if not isinstance(recorded, dict):  # a manifest from before hyper-parameters were recorded
        recorded = {k: doc[k] for k in ("batch_size", "lr", "seed", "balance", "optimizer_state") if k in doc}
    changed = hyperparameter_changes(recorded, cfg)
    refused = {k: v for k, v in changed.items() if k not in cfg.overrides}
    if refused:
        what = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in sorted(refused.items()))
        names = ",".join(f"{k.replace('_', '-')}" for k in sorted(refused))
        raise TrainingError(f"--resume: {path} was trained with different hyper-parameters ({what}); "
                            f"pass --override {names} to continue with the new values")
    rnd = _int(doc, "round", path)
    return ResumePoint(path=str(path), step=step, round=rnd, next_chunk=_int(doc, "next_chunk", path),
                       samples=_int(doc, "samples", path) if "samples" in doc else 0,
                       fingerprint=doc.get("fingerprint") if isinstance(doc.get("fingerprint"), str) else None,
                       replay={r: a for r, a in read_assignments(Path(cfg.checkpoint_dir) / ASSIGNMENTS).items() if r > rnd})


def read_assignments(path: str | os.PathLike[str]) -> Assignment:
    """The recorded assignment from an ``assignments.json`` or a ``--report`` file; {} if none.

    Raises TrainingError for a file that exists but is not one of those."""
    p = Path(path)
    if not p.exists():
        return {}
    try:
        if not p.is_file() or p.stat().st_size > MAX_ASSIGNMENTS_BYTES:
            raise ValueError("not a regular file of sensible size")
        doc = json.loads(p.read_text(encoding="utf-8"))
        rounds = doc["rounds"]
        if isinstance(rounds, list):  # a --report: each round record carries its assignment
            rounds = {r["round"]: r["assignment"] for r in rounds if "assignment" in r}
        out: Assignment = {}
        for rnd, by_rank in rounds.items():
            out[int(rnd)] = {int(rank): tuple(unit_parse(c) for c in chunks) for rank, chunks in by_rank.items()}
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise TrainingError(f"{p}: not a chunk assignment record ({type(exc).__name__}: {exc})"[:300]) from None


def write_assignments(root: str | os.PathLike[str], seed: int, rounds: Assignment) -> None:
    doc = {"schema": ASSIGNMENTS_SCHEMA, "seed": seed,
           "rounds": {str(r): {str(k): [unit_name(u) for u in v] for k, v in sorted(a.items())}
                      for r, a in sorted(rounds.items())}}
    atomic_write_text(Path(root) / ASSIGNMENTS, json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n")
