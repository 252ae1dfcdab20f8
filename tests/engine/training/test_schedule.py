"""Scheduling decisions, on a virtual clock: the end-of-round rule, speed estimates, idle accounting.

The round simulator stands in for the coordinator's loop (claims granted or held back by
``tail_defer``, chunks of a fixed length per worker) so the rule is checked on exact times, not on
a machine's timing."""

from __future__ import annotations

import pytest

from hwtui.engine.training import schedule
from hwtui.engine.training.schedule import chunk_estimate, idle_parts, others_finish, tail_defer
from hwtui.engine.training.workers import WorkerState


def worker(rank: int, chunk_time: float | None, held: int = 0, started_at: float = 0.0) -> WorkerState:
    w = WorkerState(rank, ref=None, child=None)  # type: ignore[arg-type]  # no process: a decision's inputs only
    w.chunk_time, w.held, w.started_at = chunk_time, list(range(held)), started_at
    return w


def simulate_round(times: list[float], chunks: int, offsets: list[float] | None = None,
                   rule=tail_defer) -> tuple[float, list[float]]:
    """One round of ``chunks`` chunks on workers whose chunks take ``times`` seconds (known exactly),
    each starting ``offsets`` late. Returns (round seconds, each worker's idle share)."""
    ws = [worker(r, t) for r, t in enumerate(times)]
    offsets = offsets or [0.0] * len(ws)
    busy = [0.0] * len(ws)
    pending, now = chunks, 0.0
    while True:
        for w in ws:  # every free worker asks; a held-back claim asks again at the next event
            if not w.held and pending and now >= offsets[w.rank] and not rule(w, ws, pending, now):
                w.held, w.started_at, pending = [chunks - pending], now, pending - 1
        ends = [w.started_at + (w.chunk_time or 0.0) for w in ws if w.held]
        if not ends and not pending:
            break
        later = [o for o in offsets if o > now]
        now = min(ends + later)
        for w in ws:
            if w.held and w.started_at + (w.chunk_time or 0.0) <= now + 1e-12:
                w.held, busy[w.rank] = [], busy[w.rank] + (w.chunk_time or 0.0)
    return now, [1 - b / now for b in busy]


def makespan_rule(w: WorkerState, alive, pending: int, now: float) -> bool:
    """The rule before: hold back when the others would finish every pending chunk sooner."""
    others = [x for x in alive if x is not w]
    return others_finish(others, pending, now) < schedule.busy_left(w, now) + (w.chunk_time or 0.0)


SLOWER = [2.5 + i * 0.1 for i in range(11)]  # a device 2.5x to 3.5x slower: every phase of its last chunk


@pytest.mark.parametrize("ratio", SLOWER)
def test_no_worker_idles_more_than_a_tenth_of_a_round_with_one_device_three_times_slower(ratio):
    seconds, idle = simulate_round([1.0, ratio], 40)  # merge every 20 on two workers: 40 chunks
    assert max(idle) <= 0.10, (seconds, idle)


def test_the_rule_bounds_idle_where_finishing_first_left_the_slow_device_waiting():
    worst_new = max(max(simulate_round([1.0, r], 40)[1]) for r in SLOWER)
    worst_old = max(max(simulate_round([1.0, r], 40, rule=makespan_rule)[1]) for r in SLOWER)
    assert worst_new < worst_old


def test_equal_workers_share_a_round_evenly():
    seconds, idle = simulate_round([1.0, 1.0], 40)
    assert seconds == pytest.approx(20.0) and max(idle) == pytest.approx(0.0)


def test_early_in_a_round_every_claim_is_granted():
    fast, slow = worker(0, 1.0, held=1), worker(1, 3.0)
    assert not tail_defer(slow, [fast, slow], pending=30, now=0.0)
    assert not tail_defer(fast, [fast, slow], pending=30, now=0.0)


def test_a_slow_claim_at_the_very_end_waits_for_the_fast_worker():
    fast, slow = worker(0, 1.0, held=1, started_at=-0.5), worker(1, 3.0)
    # one chunk left: the fast worker would finish it at 1.5 (the slow one waits 1.5); granted, the
    # slow one would end at 3.0 and the fast one wait 2.5
    assert tail_defer(slow, [fast, slow], pending=1, now=0.0)
    assert not tail_defer(fast, [fast, slow], pending=1, now=0.45)  # its current chunk nearly done: it takes it


def test_a_prefetch_near_the_end_is_decided_only_when_its_current_chunk_is_nearly_done():
    fast = worker(0, 1.0, held=2, started_at=0.0)  # 2.0 s of work in hand
    slow = worker(1, 3.0, held=1, started_at=0.0)  # just started a 3 s chunk, asks for the next one
    assert tail_defer(slow, [fast, slow], pending=3, now=0.0)  # 3 s left: not decided yet
    # 0.05 s left: decided on the merits -- granted, the others wait 0.05 s (held back, it would wait 1.95 s)
    assert not tail_defer(slow, [fast, slow], pending=3, now=2.95)
    assert not tail_defer(slow, [fast, slow], pending=30, now=0.0)  # early in the round: granted at once


def test_speed_estimate_ignores_one_stretched_chunk_and_follows_a_real_change():
    assert chunk_estimate([]) is None
    assert chunk_estimate([0.1, 0.1, 0.9, 0.1, 0.1]) == pytest.approx(0.1)
    assert chunk_estimate([0.1, 0.1, 0.3, 0.3, 0.3]) == pytest.approx(0.3)


def test_others_finish_hands_each_chunk_to_whoever_would_finish_it_first():
    a, b = worker(0, 1.0), worker(1, 3.0, held=1, started_at=0.0)
    assert others_finish([a, b], 0, 0.0) == pytest.approx(3.0)  # b finishes the chunk it holds
    assert others_finish([a, b], 4, 0.0) == pytest.approx(4.0)  # a takes all four (b would end at 6)


def test_idle_parts_split_a_round_into_before_between_and_after():
    w = worker(0, 1.0)
    w.round_first, w.round_last, w.round_busy = 10.5, 18.0, 6.0
    assert idle_parts([w], 10.0, 20.0) == {"0": {"before": 0.5, "between": 1.5, "after": 2.0}}
    idle = worker(1, 1.0)  # trained nothing this round
    assert idle_parts([idle], 10.0, 20.0) == {"1": {"before": 10.0, "between": 0.0, "after": 0.0}}
