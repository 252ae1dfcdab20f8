"""Replication events: the contract between the engine, the CLI printer, ``--events`` JSONL and the TUI.

Workers emit them as JSON lines over a pipe (never pickled); the launcher aggregates world-level
views (a bucket is ``done`` with ``rank=None`` when every rank has it) and fans everything out.
The transport decision line is a shared :class:`~hwtui.core.events.LogEvent` and failures are
:class:`~hwtui.core.events.ErrorEvent`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from hwtui.core.events import ErrorEvent, Event, LogEvent, event

if TYPE_CHECKING:  # the report's shape, for the type checker; events stay importable without it
    from hwtui.engine.replication.report import ReplicationReport


class BucketState(str, enum.Enum):
    """A bucket's state, in pipeline order ("failed" is terminal like "done"); the one definition.

    On the wire (``ReplBucket.state``) a state is its value, a plain string; ``pending`` is never
    sent (a bucket nobody has touched yet) but readers such as the TUI start every bucket there.
    """

    PENDING = "pending"
    STAGED = "staged"
    INFLIGHT = "inflight"
    VERIFYING = "verifying"
    DONE = "done"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value

    @property
    def order(self) -> int:
        return list(BucketState).index(self)


# The states a worker sends (everything but PENDING).
BUCKET_STATES = tuple(s.value for s in BucketState if s is not BucketState.PENDING)
COMMIT_PHASES = ("prepare", "commit", "abort")


@event("repl.start")
class ReplStart(Event):
    plan_digest: str
    model: str
    version: str
    total_bytes: int
    n_buckets: int
    bucket_bytes: int
    world_size: int
    device: str
    transport: str
    window: int
    chunk_bytes: int


# Start-up phases a rank passes before the first byte moves, in order (``ReplRanks.counts`` keys).
RANK_PHASES = ("started", "plan loaded", "world joined", "ready")


@event("repl.ranks")
class ReplRanks(Event):
    """Rank start-up: how many ranks reached each phase, so a view can say "ranks ready 2/4 (world joined)".

    The launcher sends one whenever a rank moves on (aggregated from the ranks' own reports, never
    guessed from time). ``phase`` is the furthest phase *every* rank has reached.
    """

    world_size: int
    ready: int  # ranks that finished set-up and wait for (or run) the transfer
    phase: str  # one of RANK_PHASES
    counts: dict[str, int]  # phase -> ranks that reached it (a rank past a phase counts for it)


@event("repl.bucket")
class ReplBucket(Event):
    bucket_id: int
    state: str  # one of BUCKET_STATES
    nbytes: int
    seconds: float = 0.0  # time spent in the state that just ended (0 if n/a)
    rank: int | None = None  # None: the whole world


# Timed steps a bucket's states do not show (ReplSpan.phase), for the per-phase timeline
# (engine.replication.timeline): the source hashing a bucket beside its send, a host leader
# announcing a verified bucket, a follower waiting for that announcement, and a follower mapping
# its leader's staging copy, and each rank's whole transfer phase (bucket_id -1: not one bucket).
SPAN_PHASES = ("hash", "announce", "wait", "map", "transfer")


@event("repl.span")
class ReplSpan(Event):
    """One rank spent ``seconds`` on one step of one bucket, ending at ``t`` (wall clock, as every event)."""

    rank: int
    bucket_id: int
    phase: str  # one of SPAN_PHASES
    seconds: float = 0.0


@event("repl.window")
class ReplWindow(Event):
    occupancy: int
    window: int
    bytes_in_flight: int


@event("repl.throughput")
class ReplThroughput(Event):
    gbps: float
    bytes_done: int
    total_bytes: int
    elapsed_s: float


@event("repl.plan")
class PlanProgress(Event):
    """``hwtui plan`` hashing its input. Planning reads every byte twice (each tensor's checksum,
    then each bucket's), so ``total_bytes`` counts both passes and ``bytes_done`` only grows (the
    bar and its ETA); ``pass_done`` / ``pass_bytes`` are this phase's own, which is what a person
    reads as a size (a 268 MB model showed "536.9 MB/536.9 MB")."""

    phase: str  # one of PLAN_PHASES
    bytes_done: int
    total_bytes: int
    elapsed_s: float  # since planning started
    pass_done: int = 0  # bytes hashed in this phase
    pass_bytes: int = 0  # bytes this phase hashes (0: not known, from a planner before these fields)


PLAN_PHASES = ("tensors", "buckets")


@event("repl.commit")
class ReplCommit(Event):
    version: str
    phase: str  # one of COMMIT_PHASES
    ok: bool
    detail: str = ""


@event("repl.done")
class ReplDone(Event):
    ok: bool
    bytes: int
    seconds: float
    gbps: float
    report: ReplicationReport | None = None


__all__ = ["PlanProgress", "PLAN_PHASES", "ReplStart", "ReplRanks", "RANK_PHASES", "ReplBucket", "ReplSpan", "SPAN_PHASES", "ReplWindow", "ReplThroughput", "ReplCommit", "ReplDone", "LogEvent", "ErrorEvent",
           "BUCKET_STATES", "BucketState", "COMMIT_PHASES"]
