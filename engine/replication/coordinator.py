"""The launcher's view of the world: every rank's messages turned into the world's events, and
each rank's final report as a typed :class:`RankResult`.

Ranks speak JSON lines (engine.replication.rank_base.internal); nothing here trusts their shape
beyond what it reads: a field that is missing or of the wrong type reads as "not reported".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hwtui.core.events import ErrorEvent, Event, from_dict
from hwtui.engine.replication.events import RANK_PHASES, ReplBucket, ReplCommit, ReplRanks, ReplThroughput
from hwtui.engine.replication.plan import Plan

_FORWARDED = {"repl.bucket", "repl.span", "repl.window", "log", "error"}
# Where an error happened, most useful first (see failure_text).
_WHERE_ORDER = ("input", "source", "verify", "commit", "transport", "signal", "internal")


@dataclass(frozen=True)
class RankResult:
    """What one rank reported when it finished (its ``result`` message), or that it never did."""

    rank: int
    ok: bool = False  # this rank's outcome: verified, voted yes, and (with --commit) switched
    clean: bool = False  # it ended through its own abort path (voted, reported), not by falling over
    bad_input: bool = False  # it refused its input (exit 2 for the run)
    transfer_s: float = 0.0  # its transfer phase, in seconds (0 when it never got there)
    row: Mapping[str, Any] = field(default_factory=dict)  # its report row, as it sent it

    @classmethod
    def from_message(cls, rank: int, raw: Mapping[str, Any]) -> RankResult:
        phases = raw.get("phases")
        transfer = phases.get("transfer", 0.0) if isinstance(phases, dict) else 0.0
        return cls(rank=rank, ok=bool(raw.get("ok")), clean=bool(raw.get("clean")), bad_input=bool(raw.get("bad_input")),
                   transfer_s=float(transfer) if isinstance(transfer, (int, float)) else 0.0,
                   row={k: v for k, v in raw.items() if k not in ("kind", "what", "t")})

    @classmethod
    def missing(cls, rank: int) -> RankResult:
        """A rank that never reported: not ok, and its report row says only which rank it was."""
        return cls(rank=rank, row={"rank": rank})


class Coordinator:
    """Turns per-rank messages into world events and the final result."""

    def __init__(self, plan: Plan, ranks: list[int], sink: Callable[[Event], None], world_size: int | None = None):
        self.plan, self.ranks, self.sink = plan, ranks, sink
        self.world_size = world_size if world_size is not None else len(ranks)
        self.rank_phase: dict[int, int] = {}  # rank -> index in RANK_PHASES of the furthest phase it reported
        self.done_ranks: dict[int, set[int]] = {}
        self.first_seen: dict[int, float] = {}
        self.bytes_done = 0
        self.transfer_t0: float | None = None
        self.last_sample = (0.0, 0)
        self.results: dict[int, RankResult] = {}
        self.errors: list[ErrorEvent] = []
        self.progress: dict[int, tuple[float, str]] = {r: (time.monotonic(), "starting") for r in ranks}
        self.decided: dict[str, Any] | None = None
        self.prepared: dict[int, dict[str, Any]] = {}
        self.reached: dict[int, int] = {}  # highest bucket id each rank has reported
        self.tally: dict[str, Any] | None = None  # joined rank 0: what every receiver serves (vote._tally)

    def feed(self, raw: dict[str, Any]) -> None:
        now = time.monotonic()
        kind = raw.get("kind")
        rank = raw.get("rank")
        if isinstance(rank, int) and rank in self.progress:
            self.progress[rank] = (now, self._describe(raw))
            if kind == "repl.bucket":
                self.reached[rank] = max(self.reached.get(rank, -1), int(raw.get("bucket_id", -1)))
        if kind == "_rank":
            self._internal(raw, now)
            return
        if kind not in _FORWARDED:
            return
        ev = from_dict(raw)
        if isinstance(ev, ErrorEvent):
            self.errors.append(ev)
        self.sink(ev)
        if isinstance(ev, ReplBucket):
            self._bucket(ev, now)

    @staticmethod
    def _describe(raw: dict[str, Any]) -> str:
        if raw.get("kind") == "repl.bucket":
            return f"bucket {raw.get('bucket_id')} {raw.get('state')}"
        if raw.get("kind") == "_rank":
            return str(raw.get("what"))
        return str(raw.get("kind"))

    def _bucket(self, ev: ReplBucket, now: float) -> None:
        self.first_seen.setdefault(ev.bucket_id, now)
        if ev.state != "done":
            return
        done = self.done_ranks.setdefault(ev.bucket_id, set())
        done.add(ev.rank if ev.rank is not None else -1)
        if len(done) < len(self.ranks):
            return
        self.sink(ReplBucket(bucket_id=ev.bucket_id, state="done", nbytes=ev.nbytes,
                             seconds=round(now - self.first_seen[ev.bucket_id], 6), rank=None))
        self.bytes_done += ev.nbytes
        t0 = self.transfer_t0 if self.transfer_t0 is not None else now
        last_t, last_b = self.last_sample
        last_t = last_t or t0
        finished = self.bytes_done >= self.plan["total_bytes"]
        if now - last_t >= 0.2 or finished:
            dt = max(now - last_t, 1e-9)
            self.sink(ReplThroughput(gbps=round((self.bytes_done - last_b) / dt / 1e9, 4), bytes_done=self.bytes_done,
                                     total_bytes=self.plan["total_bytes"], elapsed_s=round(now - t0, 6)))
            self.last_sample = (now, self.bytes_done)

    def _internal(self, raw: dict[str, Any], now: float) -> None:
        what, rank = raw.get("what"), raw.get("rank")
        if not isinstance(rank, int):
            return
        if what == "phase":
            self._rank_phase(rank, raw.get("phase"))
        elif what == "transfer_start" and self.transfer_t0 is None:
            self.transfer_t0 = now
            self.last_sample = (now, 0)
        elif what == "prepared":
            self.prepared[rank] = raw
        elif what == "decided" and self.decided is None:
            # Only the vote is reported here; what each rank serves afterwards is read from disk
            # by the launcher (a rank may still fail between the decision and its switch).
            self.decided = raw
            ok = bool(raw.get("unanimous"))
            detail = "every rank verified every bucket" if ok else self._first_failure()
            self.sink(ReplCommit(version=self.plan["version"], phase="prepare", ok=ok, detail=detail))
            if not ok:
                self.sink(ReplCommit(version=self.plan["version"], phase="abort", ok=True,
                                     detail=f"every rank keeps serving {self.plan['prev_version'] or 'what it had'}"))
        elif what == "result":
            self.results[rank] = RankResult.from_message(rank, raw)
        elif what == "tally":
            self.tally = raw

    def _rank_phase(self, rank: int, phase: Any) -> None:
        """A rank reached a start-up phase: send the world's counts (only what ranks said, never a guess)."""
        if phase not in RANK_PHASES or rank not in self.progress:
            return
        idx = RANK_PHASES.index(phase)
        if idx <= self.rank_phase.get(rank, -1):
            return
        self.rank_phase[rank] = idx
        counts = {p: sum(1 for v in self.rank_phase.values() if v >= i) for i, p in enumerate(RANK_PHASES)}
        # The furthest phase every rank of the world has reached ("started" until all have).
        common = [p for p in RANK_PHASES if counts[p] >= self.world_size]
        self.sink(ReplRanks(world_size=self.world_size, ready=counts["ready"], phase=common[-1] if common else RANK_PHASES[0],
                            counts=counts))

    def _first_failure(self) -> str:
        for r in sorted(self.prepared):
            if not self.prepared[r].get("ok"):
                return self.prepared[r].get("detail") or f"rank {r} voted no"
        return "a rank voted no"


    def result_of(self, rank: int) -> RankResult:
        """The rank's final report, or :meth:`RankResult.missing` when it has not sent one."""
        return self.results.get(rank, RankResult.missing(rank))


def failure_text(coord: Coordinator, rank: int | None = None) -> str | None:
    """The most useful error (of one rank, or of any): bad input, then a verification failure, then anything else."""
    for where in _WHERE_ORDER:
        for ev in coord.errors:
            if ev.where == where and (rank is None or ev.rank == rank):
                return ev.message
    return None


def hung_text(coord: Coordinator, suspects: list[int]) -> str:
    """Name the rank(s) that fell behind: among the silent ones, those that reached the fewest buckets
    (a peer waiting for the hung rank is silent too, but further along)."""
    now = time.monotonic()
    if len(suspects) > 1:
        least = min(coord.reached.get(r, -1) for r in suspects)
        suspects = [r for r in suspects if coord.reached.get(r, -1) == least]
    parts = []
    for r in suspects:
        last, what = coord.progress[r]
        parts.append(f"rank {r} hung (no progress for {now - last:.1f} s, last: {what})")
    others = sorted({e.rank for e in coord.errors if e.where == "transport" and e.rank is not None})
    tail = f"; rank(s) {', '.join(map(str, others))} timed out waiting for it" if others else ""
    return "; ".join(parts) + tail + "; nothing was committed"


