"""What one replication rank is told to do: a frozen, versioned dataclass, serialised once.

The launcher builds one :class:`WorkerConfig` per rank and hands it to the worker as one JSON
argument (local mode) or as the object itself (join mode, in-process). Nothing else crosses the
boundary: no loose dict, nothing written back into it, nothing pickled. ``version`` changes when a
field changes meaning; a worker handed a version it does not know refuses it in one clear line
(a launcher and a worker from different hwtui installs must never half-understand each other).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.transport import TransportChoice

CONFIG_VERSION = 1


@dataclass(frozen=True)
class Timeouts:
    init: float = 60.0  # forming the world and the start barrier
    bucket: float = 20.0  # any one bucket's collective
    commit: float = 20.0  # the vote and the decision


@dataclass(frozen=True)
class WorkerConfig:
    plan: str
    transport: TransportChoice
    world_size: int
    rank: int
    device: str = "cpu"
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    inflight: int = 4
    max_inflight_bytes: int | None = None
    adaptive: bool = False
    target_bucket_s: float = 0.05
    chunk_bytes: int = 64 << 20
    verify: bool = True
    same_host: bool = True  # receivers on the source's host copy from its page cache (see host_copy._copy_local)
    commit: bool = False
    out: str | None = None
    serve_group: str | None = None  # --serve-group: served files 0640 and group-owned (resolved on the rank's host)
    timeouts: Timeouts = field(default_factory=Timeouts)
    fault: str | None = None  # HWTUI_TEST_FAULT, test-only (see faults.py)
    parent_pid: int | None = None  # local mode: the launcher; a worker whose parent changed exits
    # The digest of the plan the coordinator (the launcher, or the agent of rank 0) validated. A rank
    # given one loads the plan without re-validating it and refuses a plan whose digest differs;
    # without one (a hand-written config) the rank validates the plan itself.
    plan_digest: str | None = None
    version: int = CONFIG_VERSION

    def for_rank(self, rank: int, local_rank: int | None = None, **changes: Any) -> WorkerConfig:
        return replace(self, rank=rank, local_rank=rank if local_rank is None else local_rank, **changes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise HwtuiError(f"worker configuration is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise HwtuiError("worker configuration is not a JSON object")
        version = raw.get("version")
        if version != CONFIG_VERSION:
            raise HwtuiError(f"worker configuration version {version!r} is not {CONFIG_VERSION}: the launcher and "
                             "the worker come from different hwtui installs")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise HwtuiError(f"worker configuration has unknown field(s) {', '.join(unknown)}")
        try:
            raw["transport"] = TransportChoice(**raw["transport"])
            raw["timeouts"] = Timeouts(**raw["timeouts"])
            return cls(**raw)
        except (KeyError, TypeError) as exc:
            raise HwtuiError(f"worker configuration is incomplete: {exc}") from None
