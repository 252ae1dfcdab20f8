"""The chunk queue: who trains which piece of data, with exact accounting.

A round is ``merge_every`` steps of the merged model, i.e. ``merge_every x live workers`` chunks
of one batch each. How chunks reach workers depends on ``balance``:

* ``dynamic`` (default): nobody owns a chunk; each worker claims the next one when it is free, so
  a device three times faster trains three times as many.
* ``equal``: chunks are dealt round-robin in advance; a fast worker idles at the end of a round.
* ``static``: chunks are dealt in advance in proportion to weights measured by a short
  calibration on each device (never guessed from the vendor or the VRAM size).

Accounting: a chunk is ``pending`` -> ``claimed`` (by a rank) -> ``done``. When a worker is lost
every chunk it touched in the current round goes back to ``pending`` with no owner -- including
the ones it finished, because their effect lived only in the dead worker's weights, which never
got merged. A chunk the worker had been granted ahead (prefetched) but not started yet goes back
too, recorded as ``lost-unstarted`` (an attempt, but not a training: it does not make the chunk
"retrained"). Every attempt is recorded, so "trained twice" is always visible and counted, and a
round commits only when each of its chunks is done exactly once by a live worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hwtui.engine.training.config import BALANCES


class QueueError(RuntimeError):
    pass


@dataclass
class Chunk:
    id: int
    owner: int | None  # pre-assigned rank (equal/static); None = anyone may claim
    state: str = "pending"  # pending | claimed | done
    rank: int | None = None  # who holds it / did it
    attempts: list[dict[str, Any]] = field(default_factory=list)  # {"rank", "outcome"}


def shares_from_weights(n: int, ranks: list[int], weights: dict[int, float]) -> dict[int, int]:
    """Split n chunks in proportion to weights (largest remainder, so the counts sum to n)."""
    total = sum(max(weights.get(r, 0.0), 0.0) for r in ranks)
    if total <= 0:
        weights, total = {r: 1.0 for r in ranks}, float(len(ranks))
    exact = {r: n * max(weights.get(r, 0.0), 0.0) / total for r in ranks}
    counts = {r: int(exact[r]) for r in ranks}
    by_remainder = sorted(ranks, key=lambda r: (-(exact[r] - counts[r]), r))
    for r in by_remainder[: n - sum(counts.values())]:
        counts[r] += 1
    return counts


class ChunkQueue:
    def __init__(self, balance: str = "dynamic", next_chunk: int = 0):
        if balance not in BALANCES:
            raise QueueError(f"balance {balance!r}: use one of {', '.join(BALANCES)}")
        self.balance = balance
        self.next_chunk = next_chunk
        self.round_no = 0
        self.chunks: dict[int, Chunk] = {}
        self.requeued_total = 0

    def start_round(self, round_no: int, n_chunks: int, ranks: list[int], weights: dict[int, float] | None = None,
                    assignment: Mapping[int, Sequence[int]] | None = None) -> bool:
        """Open the next round. ``assignment`` (rank -> chunk ids, as :meth:`assignment` recorded
        it) replays a recorded round: each chunk is owned by the rank that trained it, which then
        trains its own in the same (ascending) order. Returns whether the assignment was used: it
        is ignored (balance as usual) unless it covers exactly this round's chunks and live ranks."""
        if self.chunks and not self.complete():
            raise QueueError(f"round {self.round_no} still has unfinished chunks")
        self.round_no = round_no
        ids = list(range(self.next_chunk, self.next_chunk + n_chunks))
        self.next_chunk += n_chunks
        owners: list[int | None]
        replayed = False
        if assignment is not None and set(assignment) <= set(ranks) and \
                sorted(c for cs in assignment.values() for c in cs) == ids:
            owner_of = {c: r for r, cs in assignment.items() for c in cs}
            owners, replayed = [owner_of[c] for c in ids], True
        elif self.balance == "dynamic":
            owners = [None] * n_chunks
        else:
            counts = shares_from_weights(n_chunks, ranks, (weights or {}) if self.balance == "static" else {})
            # Deal round-robin while a rank still has quota, so each rank's chunks are spread over the round.
            owners, left = [], dict(counts)
            while len(owners) < n_chunks:
                for r in ranks:
                    if left[r] > 0:
                        owners.append(r)
                        left[r] -= 1
        self.chunks = {cid: Chunk(cid, owner) for cid, owner in zip(ids, owners, strict=True)}
        return replayed

    def claim(self, rank: int) -> int | None:
        """The next chunk for ``rank``: its own pre-assigned ones first, then ownerless ones."""
        first_free = None
        for chunk in self.chunks.values():
            if chunk.state != "pending":
                continue
            if chunk.owner == rank:
                first_free = chunk
                break
            if chunk.owner is None and first_free is None:
                first_free = chunk
        if first_free is None:
            return None
        first_free.state, first_free.rank = "claimed", rank
        return first_free.id

    def complete(self, rank: int | None = None, chunk_id: int | None = None) -> bool:
        """With arguments: mark a chunk done by ``rank``. Without: is every chunk of the round done?"""
        if chunk_id is None:
            return all(c.state == "done" for c in self.chunks.values())
        chunk = self.chunks.get(chunk_id)
        if chunk is None or chunk.state != "claimed" or chunk.rank != rank:
            raise QueueError(f"rank {rank} reported chunk {chunk_id} done but does not hold it")
        chunk.state = "done"
        chunk.attempts.append({"rank": rank, "outcome": "done"})
        return True

    def release(self, rank: int, unstarted: frozenset[int] | set[int] = frozenset()) -> list[int]:
        """A worker is gone: everything it held or finished this round goes back, ownerless.

        ``unstarted``: chunks it held only as its prefetched next one (never began training)."""
        back = []
        for chunk in self.chunks.values():
            if chunk.owner == rank and chunk.state == "pending":
                chunk.owner = None  # its pre-assigned quota is now anyone's
            if chunk.rank != rank or chunk.state == "pending":
                continue
            if chunk.state == "done":
                outcome = "lost-after-training"
            else:
                outcome = "lost-unstarted" if chunk.id in unstarted else "lost-in-progress"
            if chunk.state == "done":
                chunk.attempts[-1]["outcome"] = outcome
            else:
                chunk.attempts.append({"rank": rank, "outcome": outcome})
            chunk.state, chunk.rank, chunk.owner = "pending", None, None
            back.append(chunk.id)
        self.requeued_total += len(back)
        return back

    def busy(self) -> bool:
        return any(c.state == "claimed" for c in self.chunks.values())

    def has_pending(self) -> bool:
        return any(c.state == "pending" for c in self.chunks.values())

    def done_by(self) -> dict[int, int]:
        """Chunks done this round per rank (the merge weights, in chunks)."""
        return {r: len(cs) for r, cs in self.assignment().items()}

    def assignment(self) -> dict[int, tuple[int, ...]]:
        """Who trained what this round: rank -> the chunk ids it did, ascending (its training order)."""
        out: dict[int, list[int]] = {}
        for chunk in self.chunks.values():
            if chunk.state == "done" and chunk.rank is not None:
                out.setdefault(chunk.rank, []).append(chunk.id)
        return {r: tuple(sorted(cs)) for r, cs in sorted(out.items())}

    def round_record(self) -> dict[str, Any]:
        return {
            "round": self.round_no,
            "chunks": [min(self.chunks), max(self.chunks)] if self.chunks else [],
            "done_by": {str(r): n for r, n in sorted(self.done_by().items())},
            "assignment": {str(r): list(cs) for r, cs in self.assignment().items()},
            "retrained": sorted(c.id for c in self.chunks.values()
                                if sum(a["outcome"] != "lost-unstarted" for a in c.attempts) > 1),
            "attempts": {str(c.id): c.attempts for c in self.chunks.values() if len(c.attempts) > 1},
        }
