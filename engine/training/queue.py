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

Pieces (the finer tail): at the end of a dynamic round the coordinator may hand out a pending
chunk in two halves (:meth:`ChunkQueue.claim` with ``split``), so a slow device trains half a
batch and reaches the merge with the others. A piece is the unit ``(chunk, part, parts)``: the rows
``[B*part//parts, B*(part+1)//parts)`` of the chunk's batch, so the parts of a chunk together are
exactly its samples, each trained once. Pieces are queue units like whole chunks (claimed, done,
released, recorded, replayed); they are written ``"chunk:part/parts"`` in records (``"41:1/2"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from hwtui.engine.training.config import BALANCES

# A whole chunk (its id) or a piece of one: (chunk id, part, parts).
Unit = Union[int, tuple[int, int, int]]  # noqa: UP007  # a runtime alias (isinstance checks below)


class QueueError(RuntimeError):
    pass


def unit_chunk(u: Unit) -> int:
    return u if isinstance(u, int) else u[0]


def unit_fraction(u: Unit) -> float:
    """The share of a chunk's batch this unit trains (1.0 for a whole chunk, 0.5 for a half)."""
    return 1.0 if isinstance(u, int) else 1.0 / u[2]


def unit_rows(u: Unit, batch_size: int) -> tuple[int, int]:
    """The rows [start, stop) of the chunk's batch this unit trains."""
    if isinstance(u, int):
        return 0, batch_size
    _c, part, parts = u
    return batch_size * part // parts, batch_size * (part + 1) // parts


def unit_samples(u: Unit, batch_size: int) -> int:
    start, stop = unit_rows(u, batch_size)
    return stop - start


def unit_order(u: Unit) -> tuple[int, int]:
    """Training order: by chunk id, then part (a whole chunk and its pieces never coexist)."""
    return (u, 0) if isinstance(u, int) else (u[0], u[1])


def unit_name(u: Unit) -> int | str:
    """How a unit is written in records and messages: the chunk id, or ``"chunk:part/parts"``."""
    return u if isinstance(u, int) else f"{u[0]}:{u[1]}/{u[2]}"


def unit_message(u: Unit) -> dict[str, Any]:
    """How a unit travels between the coordinator and a worker: ``{"chunk": c}``, plus
    ``"part": [part, parts]`` for a piece (the inverse of :func:`unit_from_message`)."""
    return {"chunk": u} if isinstance(u, int) else {"chunk": u[0], "part": [u[1], u[2]]}


def unit_from_message(msg: Mapping[str, Any]) -> Unit:
    """The unit a ``chunk`` command or a worker's ``done`` report names (see :func:`unit_message`)."""
    part = msg.get("part")
    return int(msg["chunk"]) if part is None else (int(msg["chunk"]), int(part[0]), int(part[1]))


def unit_parse(x: Any) -> Unit:
    """The inverse of :func:`unit_name`. Raises ValueError for anything else."""
    if isinstance(x, bool):
        raise ValueError(f"not a chunk: {x!r}")
    if isinstance(x, int):
        if x < 0:
            raise ValueError(f"not a chunk: {x!r}")
        return x
    if isinstance(x, str):
        head, sep, tail = x.partition(":")
        part, sep2, parts = tail.partition("/")
        if not (sep and sep2 and head.isdigit() and part.isdigit() and parts.isdigit()):
            raise ValueError(f"not a chunk or piece: {x!r}")
        c, k, n = int(head), int(part), int(parts)
        if not 0 <= k < n or n < 2:
            raise ValueError(f"not a piece of a chunk: {x!r}")
        return (c, k, n)
    raise ValueError(f"not a chunk or piece: {x!r}")


@dataclass
class Chunk:
    id: Unit
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
        self.chunks: dict[Unit, Chunk] = {}
        self.round_ids: tuple[int, int] | None = None  # the round's first and last chunk id
        self.requeued_total = 0

    def start_round(self, round_no: int, n_chunks: int, ranks: list[int], weights: dict[int, float] | None = None,
                    assignment: Mapping[int, Sequence[Unit]] | None = None) -> bool:
        """Open the next round. ``assignment`` (rank -> units, as :meth:`assignment` recorded it)
        replays a recorded round: each chunk (or piece of one) is owned by the rank that trained
        it, which then trains its own in the same (ascending) order. Returns whether the assignment
        was used: it is ignored (balance as usual) unless it covers exactly this round's chunks,
        each whole once or in all its pieces once, and only live ranks."""
        if self.chunks and not self.complete():
            raise QueueError(f"round {self.round_no} still has unfinished chunks")
        self.round_no = round_no
        ids = list(range(self.next_chunk, self.next_chunk + n_chunks))
        self.round_ids = (ids[0], ids[-1]) if ids else None
        self.next_chunk += n_chunks
        if assignment is not None and set(assignment) <= set(ranks):
            units = covering_units(ids, [u for us in assignment.values() for u in us])
            if units is not None:
                owner_of = {u: r for r, us in assignment.items() for u in us}
                self.chunks = {u: Chunk(u, owner_of[u]) for u in units}
                return True
        owners: list[int | None]
        if self.balance == "dynamic":
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
        return False

    def claim(self, rank: int, split: bool = False) -> Unit | None:
        """The next unit for ``rank``: its own pre-assigned ones first, then ownerless ones.

        ``split``: if that is a whole chunk, cut it into two halves in its place in the queue and
        hand out the first (the other stays pending for whoever claims next)."""
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
        if split and isinstance(first_free.id, int):
            first_free = self._split(first_free)
        first_free.state, first_free.rank = "claimed", rank
        return first_free.id

    def _split(self, chunk: Chunk) -> Chunk:
        cid = unit_chunk(chunk.id)
        halves = [Chunk((cid, k, 2), chunk.owner, attempts=[dict(a) for a in chunk.attempts]) for k in range(2)]
        rebuilt: dict[Unit, Chunk] = {}
        for u, c in self.chunks.items():
            if u == chunk.id:
                rebuilt.update((h.id, h) for h in halves)
            else:
                rebuilt[u] = c
        self.chunks = rebuilt
        return halves[0]

    def pending_fractions(self, rank: int) -> list[float]:
        """What ``rank`` could still be given this round, in claim order, as fractions of a chunk."""
        return [unit_fraction(c.id) for c in self.chunks.values() if c.state == "pending" and c.owner in (None, rank)]

    def complete(self, rank: int | None = None, chunk_id: Unit | None = None) -> bool:
        """With arguments: mark a chunk done by ``rank``. Without: is every chunk of the round done?"""
        if chunk_id is None:
            return all(c.state == "done" for c in self.chunks.values())
        chunk = self.chunks.get(chunk_id)
        if chunk is None or chunk.state != "claimed" or chunk.rank != rank:
            raise QueueError(f"rank {rank} reported chunk {chunk_id} done but does not hold it")
        chunk.state = "done"
        chunk.attempts.append({"rank": rank, "outcome": "done"})
        return True

    def release(self, rank: int, unstarted: frozenset[Unit] | set[Unit] = frozenset()) -> list[Unit]:
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

    def done_by(self) -> dict[int, float]:
        """Chunks done this round per rank (a half counts 0.5: the sum is the round's chunk count)."""
        return {r: sum(unit_fraction(u) for u in us) for r, us in self.assignment().items()}

    def samples_by(self, batch_size: int) -> dict[int, int]:
        """Samples trained this round per rank (the merge weights): exact, pieces included."""
        return {r: sum(unit_samples(u, batch_size) for u in us) for r, us in self.assignment().items()}

    def assignment(self) -> dict[int, tuple[Unit, ...]]:
        """Who trained what this round: rank -> the units it did, ascending (its training order)."""
        out: dict[int, list[Unit]] = {}
        for chunk in self.chunks.values():
            if chunk.state == "done" and chunk.rank is not None:
                out.setdefault(chunk.rank, []).append(chunk.id)
        return {r: tuple(sorted(us, key=unit_order)) for r, us in sorted(out.items())}

    def round_record(self, batch_size: int) -> dict[str, Any]:
        retrained = [c.id for c in self.chunks.values() if sum(a["outcome"] != "lost-unstarted" for a in c.attempts) > 1]
        return {
            "round": self.round_no,
            "chunks": list(self.round_ids) if self.round_ids else [],
            "done_by": {str(r): n for r, n in sorted(self.done_by().items())},
            "samples_by": {str(r): n for r, n in sorted(self.samples_by(batch_size).items())},
            "assignment": {str(r): [unit_name(u) for u in us] for r, us in self.assignment().items()},
            "pieces": sum(not isinstance(u, int) for u in self.chunks),
            "retrained": [unit_name(u) for u in sorted(retrained, key=unit_order)],
            "attempts": {str(unit_name(c.id)): c.attempts for c in self.chunks.values() if len(c.attempts) > 1},
        }


def covering_units(ids: Sequence[int], units: Sequence[Unit]) -> list[Unit] | None:
    """``units`` in training order if they cover the chunks ``ids`` exactly (each chunk whole once,
    or each of its parts once), else None."""
    by_chunk: dict[int, list[Unit]] = {}
    for u in units:
        by_chunk.setdefault(unit_chunk(u), []).append(u)
    if sorted(by_chunk) != sorted(ids):
        return None
    for us in by_chunk.values():
        if len(us) == 1 and isinstance(us[0], int):
            continue
        pieces = [u for u in us if not isinstance(u, int)]
        if len(pieces) != len(us) or len({u[2] for u in pieces}) != 1 or \
                sorted(u[1] for u in pieces) != list(range(pieces[0][2])):
            return None
    return sorted(units, key=unit_order)
