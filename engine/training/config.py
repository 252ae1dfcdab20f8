"""Typed, frozen configuration for a training run and for each worker process.

``TrainConfig`` is what the CLI asks for (validated here too, so a caller that skips the CLI gets
the same refusals); ``WorkerConfig`` is what one worker needs. A worker's config crosses the
process boundary exactly once, as the first message on its command pipe, serialised by
:meth:`WorkerConfig.to_message` and checked by :meth:`WorkerConfig.from_message` (the version must
match: a worker from another hwtui refuses rather than guessing what a field means).

This module imports no torch: the coordinator's decisions and the CLI's checks stay light.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

CONFIG_VERSION = 4  # 3: chunk pieces ("part"), evaluation after the commit ("evaluated"); 4: --model, --data
MERGES = ("outer-nesterov", "average")
BALANCES = ("dynamic", "equal", "static")
OPTIMIZER_STATES = ("average", "reset", "keep")
VOCAB = 256


class ConfigError(ValueError):
    """A setting that cannot work; the message is one line naming it."""


class TrainingError(RuntimeError):
    """The run cannot start (bad device, memory refusal, checkpoint mismatch): one line for the user."""


@dataclass(frozen=True)
class ModelConfig:
    context: int = 64
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    vocab: int = VOCAB

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def param_count(self) -> int:
        """Exact parameter count without building the model (the memory check runs before torch work)."""
        d, v, c = self.d_model, self.vocab, self.context
        per_layer = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
        return v * d + c * d + self.layers * per_layer + 2 * d + d * v + v


def _finite(name: str, value: float, positive: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number (got {value!r})")
    if positive and not value > 0:
        raise ConfigError(f"{name} must be positive (got {value!r})")


# Settings that change what a resumed run computes: --resume refuses a change to any of them
# unless --override names it (engine/training/resume.py). Timeouts, devices, checkpoint cadence
# and evaluation settings change only how it runs, never what it learns.
HYPERPARAMETERS = ("batch_size", "lr", "merge_every", "seed", "optimizer_state", "merge", "outer_lr",
                   "outer_momentum", "balance", "precision")


@dataclass(frozen=True)
class TrainConfig:
    devices: tuple[Any, ...]  # DeviceRef
    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    merge_every: int = 20
    merge: str = "outer-nesterov"  # measured to beat "average" at equal samples (docs/training.md)
    outer_lr: float = 0.7
    outer_momentum: float = 0.5
    balance: str = "dynamic"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1  # rounds
    keep_checkpoints: int = 3
    resume: bool = False
    overrides: frozenset[str] = frozenset()  # hyper-parameters a resume may change
    # A recorded chunk assignment to train again exactly: round -> rank -> chunk ids (in order).
    replay: Mapping[int, Mapping[int, tuple[int | tuple[int, int, int], ...]]] = field(default_factory=dict)
    seed: int = 0
    precision: str = "auto"
    activation_checkpointing: bool = False
    optimizer_state: str = "average"
    model: ModelConfig = field(default_factory=ModelConfig)
    eval_windows: int = 256
    eval_every: int = 5  # rounds between held-out evaluations (the last round is always evaluated)
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 30.0
    stall_timeout: float = 300.0
    group_timeout: float = 120.0
    startup_timeout: float = 300.0
    stop_grace: float = 15.0
    telemetry_interval: float = 0.5
    cpu_threads: int = 1
    prefetch: bool = True  # workers claim their next chunk while training the current one
    model_source: str = "char"  # --model: char, a model directory (absolute), or package.module:function
    data: str | None = None  # --data: a text file, a directory of .txt, a .jsonl (None: the standard library)
    save_hf: str | None = None  # --save-hf: where the last round's writer exports the merged model
    # --push-to: the merged model is also exported (as --save-hf writes it) into export_dir/round-N
    # every export_every rounds (0: only at the end) and at the last round when there is no
    # --save-hf; each export is announced by a train.export event (the app pushes it).
    export_dir: str | None = None
    export_every: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.export_every, bool) or not isinstance(self.export_every, int) or self.export_every < 0:
            raise ConfigError(f"export_every must be an integer of at least 0 (got {self.export_every!r})")
        for name in ("steps", "batch_size", "merge_every", "checkpoint_every", "eval_every", "eval_windows", "cpu_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer of at least 1 (got {value!r})")
        for name in ("lr", "outer_lr", "heartbeat_interval", "heartbeat_timeout", "stall_timeout", "group_timeout",
                     "startup_timeout", "stop_grace", "telemetry_interval"):
            _finite(name, getattr(self, name))
        _finite("outer_momentum", self.outer_momentum, positive=False)
        if not 0 <= self.outer_momentum < 1:
            raise ConfigError(f"outer_momentum must be in [0, 1) (got {self.outer_momentum!r})")
        for name, allowed in (("merge", MERGES), ("balance", BALANCES), ("optimizer_state", OPTIMIZER_STATES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} {getattr(self, name)!r}: use one of {', '.join(allowed)}")
        unknown = set(self.overrides) - set(HYPERPARAMETERS)
        if unknown:
            raise ConfigError(f"--override {','.join(sorted(unknown))}: not a hyper-parameter "
                              f"(one of {', '.join(HYPERPARAMETERS)})")

    def hyperparameters(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in HYPERPARAMETERS}


@dataclass(frozen=True)
class WorkerConfig:
    rank: int
    backend: str
    index: int
    store_host: str
    store_port: int
    model: ModelConfig
    batch_size: int
    lr: float
    seed: int
    precision: str
    activation_checkpointing: bool
    optimizer_state: str
    merge: str
    outer_lr: float
    outer_momentum: float
    balance: str
    eval_windows: int
    heartbeat_interval: float
    group_timeout: float
    reply_timeout: float
    cpu_workers: int
    cpu_threads: int
    init_from: str | None
    prefetch: bool
    model_source: str = "char"
    data: str | None = None
    version: int = CONFIG_VERSION

    @classmethod
    def for_rank(cls, cfg: TrainConfig, rank: int, ref: Any, store_port: int, init_from: str | None) -> WorkerConfig:
        return cls(
            rank=rank, backend=ref.backend, index=ref.index, store_host="127.0.0.1", store_port=store_port,
            model=cfg.model, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed, precision=cfg.precision,
            activation_checkpointing=cfg.activation_checkpointing, optimizer_state=cfg.optimizer_state,
            merge=cfg.merge, outer_lr=cfg.outer_lr, outer_momentum=cfg.outer_momentum, balance=cfg.balance,
            eval_windows=cfg.eval_windows, heartbeat_interval=cfg.heartbeat_interval, group_timeout=cfg.group_timeout,
            reply_timeout=cfg.group_timeout + cfg.stall_timeout + cfg.startup_timeout,
            cpu_workers=sum(1 for r in cfg.devices if r.backend == "cpu"), cpu_threads=cfg.cpu_threads,
            init_from=init_from, prefetch=cfg.prefetch, model_source=cfg.model_source, data=cfg.data)

    def to_message(self) -> dict[str, Any]:
        return {"kind": "config", "version": self.version, "config": asdict(self)}

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> WorkerConfig:
        if msg.get("kind") != "config":
            raise ConfigError(f"expected the config message first, got kind {msg.get('kind')!r}")
        if msg.get("version") != CONFIG_VERSION:
            raise ConfigError(f"worker config version {msg.get('version')!r}, this worker reads {CONFIG_VERSION}: "
                              f"the coordinator and the worker come from different hwtui versions")
        raw = dict(msg.get("config") or {})
        names = {f.name for f in dataclasses.fields(cls)}
        if set(raw) != names:
            raise ConfigError(f"worker config fields differ: missing {sorted(names - set(raw))}, "
                              f"unknown {sorted(set(raw) - names)}")
        raw["model"] = ModelConfig(**raw["model"])
        return cls(**raw)
