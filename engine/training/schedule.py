"""Scheduling decisions the coordinator makes, as pure functions of what it knows.

Speed-sized inner steps: with ``--balance dynamic`` nobody owns a chunk and each worker claims
the next one when it is free, so each device's number of inner steps in a round follows its
measured speed (a device three times faster trains three times as many). What is left is the end
of a round, where a chunk is the unit and a slow device's chunk is a large piece of the round:
:func:`tail_defer` decides each claim near the end by which choice leaves the smaller idle at the
merge -- the asking worker waiting for the others to finish the remaining chunks, or the others
waiting for its chunk -- using each worker's :func:`chunk_estimate` (the median of its recent
chunk times: one chunk stretched by a busy machine must not make a device look slow for long).
A chunk is still coarse there: a device three times slower spends a tenth of a round (merge every
20) on one, so whichever of grant / defer is chosen, one side can wait up to half of it. The finer
tail (:func:`tail_choice`) adds a third answer: cut the chunk in two and grant half of it, the
other half staying in the queue for whoever is free first, which halves that granularity.
Each round records every worker's idle share and where that idle went (``idle``, ``idle_parts``
in the report), the measure of how well this worked.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from hwtui.engine.training.queue import unit_fraction
from hwtui.engine.training.workers import WorkerState

DECIDE_WITHIN = 0.1  # seconds of work left under which a worker's prefetch at the end of a round is decided
RECENT_CHUNKS = 9  # chunk times a speed estimate looks at (spans rounds: a new round starts informed)
GRANT, HALF, DEFER = "grant", "half", "defer"  # tail_choice's answers


def chunk_estimate(recent: Sequence[float]) -> float | None:
    """Seconds per chunk from a worker's recent chunk times: their median (None before its first).

    Not a moving average: on a shared machine a chunk now and then takes three times as long
    (the core was taken), and an average would carry that into the next decisions; the median
    of the last few ignores it, and still follows a device that really slows down within a few
    chunks."""
    return statistics.median(recent) if recent else None


def busy_left(x: WorkerState, now: float) -> float:
    """Estimated seconds until ``x`` has trained every unit it holds (current + prefetched; a
    piece takes its fraction of a chunk's time)."""
    if not x.held or x.chunk_time is None:
        return 0.0
    sizes = [unit_fraction(u) for u in x.held]
    return max(0.0, sizes[0] * x.chunk_time - (now - x.started_at)) + sum(sizes[1:]) * x.chunk_time


def _fractions(pending: int | Sequence[float]) -> list[float]:
    return [1.0] * pending if isinstance(pending, int) else list(pending)


def others_finish(others: Sequence[WorkerState], pending: int | Sequence[float], now: float) -> float:
    """When ``others`` would have trained what they hold plus the ``pending`` units (a count of
    whole chunks, or each unit's fraction of a chunk, in queue order), each unit going to
    whichever of them would finish it first (list scheduling on their estimates)."""
    lanes = [(busy_left(x, now), float(x.chunk_time or 0.0)) for x in others]  # (busy until, seconds per chunk)
    if not lanes:
        return 0.0
    for size in _fractions(pending):
        i = min(range(len(lanes)), key=lambda j: (lanes[j][0] + size * lanes[j][1], lanes[j][0], lanes[j][1]))
        end, t = lanes[i]
        lanes[i] = (end + size * t, t)
    return max(end for end, _t in lanes)


def tail_choice(w: WorkerState, alive: Sequence[WorkerState], pending: int | Sequence[float], now: float,
                halves: bool = False) -> str:
    """Dynamic balancing's end of round: grant ``w``'s claim (:data:`GRANT`), grant half of the
    next chunk (:data:`HALF`, with ``halves``) or hold it back (:data:`DEFER`), whichever leaves
    the least idle at the merge. ``pending``: what ``w`` could be given, in queue order (a count
    of whole chunks, or each unit's fraction of a chunk).

    Granting: ``w`` finishes what it holds plus the next unit, the others the rest; whoever is
    done first waits for the other (the gap between the two). Half: the same with half of the
    next chunk, the other half joining the rest. Deferring: the others train everything pending
    and ``w`` waits for them once it has finished what it holds. Only the makespan would say
    "defer when the others finish sooner", which leaves a slow device idle for almost a whole
    chunk of its own (a tenth of a round for a device three times slower at merge every 20) to
    shorten the round by a little; the smaller wait bounds the larger idle by about half a slow
    chunk plus half a fast one, and halves bound it by about half of that again.

    Early in a round (the others could not finish the pending chunks before ``w`` finishes its
    own anyway) a claim is always granted, without the simulation. Near the end, a prefetch (a
    claim made while ``w`` still trains) waits until ``w`` has at most :data:`DECIDE_WITHIN`
    seconds left: granted at once, a slow device's prefetch commits two of its chunks on estimates
    made that far ahead, and one stretched chunk then keeps the others waiting at the merge (the
    benchmark's worst rounds). A held-back claim is decided again at every turn of the
    coordinator's loop (at least every 50 ms), so the answer still arrives before it is needed."""
    sizes = _fractions(pending)
    if w.chunk_time is None or not sizes:
        return GRANT
    others = [x for x in alive if x is not w and x.chunk_time is not None]
    if not others:
        return GRANT
    mine_busy = busy_left(w, now)
    mine = mine_busy + sizes[0] * w.chunk_time
    rate = sum(1.0 / max(1e-9, x.chunk_time or 0.0) for x in others)
    if min(busy_left(x, now) for x in others) + sum(sizes[1:]) / rate > mine + max(x.chunk_time or 0.0 for x in others):
        return GRANT  # the others are still busy well after w's unit: nothing to balance yet
    if mine_busy > DECIDE_WITHIN:
        return DEFER  # a prefetch near the end: decided when w's current unit is nearly done (see above)
    idle = {GRANT: abs(mine - others_finish(others, sizes[1:], now)),
            DEFER: others_finish(others, sizes, now) - mine_busy}
    if halves and sizes[0] == 1.0:
        idle[HALF] = abs(mine_busy + 0.5 * w.chunk_time - others_finish(others, [0.5, *sizes[1:]], now))
    return min((GRANT, HALF, DEFER), key=lambda k: idle.get(k, float("inf")))  # ties: the coarser answer


def tail_defer(w: WorkerState, alive: Sequence[WorkerState], pending: int | Sequence[float], now: float) -> bool:
    """:func:`tail_choice` without halves: whether to hold ``w``'s claim back."""
    return tail_choice(w, alive, pending, now) == DEFER


def is_eval_round(round_no: int, last: bool, eval_every: int) -> bool:
    """Held-out evaluation on every ``eval_every``-th round and always on the last (the final loss)."""
    return last or round_no % max(1, eval_every) == 0


def idle_shares(busy: dict[int, float], wall: float) -> dict[str, float]:
    """Each worker's idle share of a round: 1 - (seconds it trained / the round's wall time)."""
    if wall <= 0:
        return {str(r): 0.0 for r in busy}
    return {str(r): round(max(0.0, 1.0 - b / wall), 4) for r, b in sorted(busy.items())}


def idle_parts(workers: Sequence[WorkerState], start: float, end: float) -> dict[str, dict[str, float]]:
    """Where each worker's idle seconds of a round went: ``before`` its first chunk (the merge
    being applied, the first grant), ``between`` chunks (claims, messages, the scheduler) and
    ``after`` its last chunk (waiting at the merge for the others: what balancing is for)."""
    out = {}
    for w in workers:
        if w.round_first is None or w.round_last is None:
            out[str(w.rank)] = {"before": round(end - start, 4), "between": 0.0, "after": 0.0}
            continue
        first, last = max(start, w.round_first), min(end, w.round_last)
        out[str(w.rank)] = {"before": round(max(0.0, first - start), 4),
                            "between": round(max(0.0, last - first - w.round_busy), 4),
                            "after": round(max(0.0, end - last), 4)}
    return out
