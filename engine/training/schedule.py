"""Scheduling decisions the coordinator makes, as pure functions of what it knows.

Speed-sized inner steps: with ``--balance dynamic`` nobody owns a chunk and each worker claims
the next one when it is free, so each device's number of inner steps in a round follows its
measured speed (a device three times faster trains three times as many). What is left is the end
of a round: :func:`tail_defer` holds back a slow worker's claim when a faster one would finish the
remaining chunks sooner, so the fast device is not left waiting at the merge for a slow straggler.
Each round records every worker's idle share of the round (``idle`` in the report), the measure
of how well this worked.
"""

from __future__ import annotations

from collections.abc import Sequence

from hwtui.engine.training.workers import WorkerState


def busy_left(x: WorkerState, now: float) -> float:
    """Estimated seconds until ``x`` has trained every chunk it holds (current + prefetched)."""
    if not x.held or x.chunk_time is None:
        return 0.0
    return max(0.0, x.chunk_time - (now - x.started_at)) + (len(x.held) - 1) * x.chunk_time


def tail_defer(w: WorkerState, alive: Sequence[WorkerState], pending: int, now: float) -> bool:
    """Dynamic balancing's end of round: hold back ``w``'s claim when a faster worker would finish
    the ``pending`` chunks before ``w`` finished the chunk it asks for.

    A prefetch (a claim made while still training) would only start once the chunks in hand are
    done, so that time counts against it: the slow worker is not granted a chunk to sit on at the
    end of a round that the fast one would finish sooner."""
    if w.chunk_time is None or pending == 0:
        return False
    mine = busy_left(w, now) + w.chunk_time
    best = None
    for x in alive:
        if x is w or x.chunk_time is None:
            continue
        finish = busy_left(x, now) + pending * x.chunk_time
        best = finish if best is None else min(best, finish)
    return best is not None and best < mine


def is_eval_round(round_no: int, last: bool, eval_every: int) -> bool:
    """Held-out evaluation on every ``eval_every``-th round and always on the last (the final loss)."""
    return last or round_no % max(1, eval_every) == 0


def idle_shares(busy: dict[int, float], wall: float) -> dict[str, float]:
    """Each worker's idle share of a round: 1 - (seconds it trained / the round's wall time)."""
    if wall <= 0:
        return {str(r): 0.0 for r in busy}
    return {str(r): round(max(0.0, 1.0 - b / wall), 4) for r, b in sorted(busy.items())}
