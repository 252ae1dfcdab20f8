"""Scheduling decisions, on a virtual clock: the end-of-round rule, speed estimates, idle accounting.

The round simulator stands in for the coordinator's loop (claims granted or held back by
``tail_defer``, chunks of a fixed length per worker) so the rule is checked on exact times, not on
a machine's timing."""

from __future__ import annotations

import pytest

from hwtui.engine.training import schedule
from hwtui.engine.training.schedule import (
    DEFER,
    GRANT,
    HALF,
    chunk_estimate,
    idle_parts,
    others_finish,
    tail_choice,
    tail_defer,
)
from hwtui.engine.training.workers import WorkerState


def worker(rank: int, chunk_time: float | None, held: int = 0, started_at: float = 0.0) -> WorkerState:
    w = WorkerState(rank, ref=None, child=None)  # type: ignore[arg-type]  # no process: a decision's inputs only
    w.chunk_time, w.held, w.started_at = chunk_time, list(range(held)), started_at
    return w


def simulate_round(times: list[float], chunks: int, offsets: list[float] | None = None,
                   rule=None, halves: bool = False) -> tuple[float, list[float]]:
    """One round of ``chunks`` chunks on workers whose chunks take ``times`` seconds (known exactly),
    each starting ``offsets`` late. ``rule`` (default :func:`tail_choice`) answers each claim with
    grant / half / defer; a half cuts the next chunk in two in its place, as the queue does.
    Returns (round seconds, each worker's idle share)."""
    def choose(w, ws, pending, now):
        if rule is None:
            return tail_choice(w, ws, pending, now, halves=halves)
        return DEFER if rule(w, ws, pending, now) else GRANT

    ws = [worker(r, t) for r, t in enumerate(times)]
    offsets = offsets or [0.0] * len(ws)
    busy = [0.0] * len(ws)
    pending, now = [1.0] * chunks, 0.0  # each pending unit's fraction of a chunk, in queue order
    size: dict[int, float] = {}
    while True:
        for w in ws:  # every free worker asks; a held-back claim asks again at the next event
            if not w.held and pending and now >= offsets[w.rank]:
                answer = choose(w, ws, pending, now)
                if answer == DEFER:
                    continue
                if answer == HALF:
                    pending[:1] = [0.5, 0.5]
                size[w.rank] = pending.pop(0)
                w.held, w.started_at = [0 if size[w.rank] == 1.0 else (0, 0, 2)], now
        ends = [w.started_at + size[w.rank] * (w.chunk_time or 0.0) for w in ws if w.held]
        if not ends and not pending:
            break
        later = [o for o in offsets if o > now]
        now = min(ends + later)
        for w in ws:
            if w.held and w.started_at + size[w.rank] * (w.chunk_time or 0.0) <= now + 1e-12:
                w.held, busy[w.rank] = [], busy[w.rank] + size[w.rank] * (w.chunk_time or 0.0)
    return now, [1 - b / now for b in busy]


def makespan_rule(w: WorkerState, alive, pending, now: float) -> bool:
    """The rule before: hold back when the others would finish every pending chunk sooner."""
    others = [x for x in alive if x is not w]
    return others_finish(others, pending, now) < schedule.busy_left(w, now) + (w.chunk_time or 0.0)


SLOWER = [2.5 + i * 0.1 for i in range(11)]  # a device 2.5x to 3.5x slower: every phase of its last chunk


@pytest.mark.parametrize("ratio", SLOWER)
def test_no_worker_idles_more_than_a_tenth_of_a_round_with_one_device_three_times_slower(ratio):
    seconds, idle = simulate_round([1.0, ratio], 40)  # merge every 20 on two workers: 40 chunks
    assert max(idle) <= 0.10, (seconds, idle)


def test_the_rule_bounds_idle_where_finishing_first_left_the_slow_device_waiting():
    worst_new = max(max(simulate_round([1.0, r], 40, rule=tail_defer)[1]) for r in SLOWER)
    worst_old = max(max(simulate_round([1.0, r], 40, rule=makespan_rule)[1]) for r in SLOWER)
    assert worst_new < worst_old


FINE = [2.5 + i * 0.02 for i in range(51)]  # 2.5x to 3.5x slower in finer steps: every phase of the tail


@pytest.mark.parametrize("chunks", [20, 40, 60])  # merge every 10, 20, 30 on two workers
def test_half_chunks_at_the_tail_halve_the_worst_idle_of_a_round(chunks):
    whole = max(max(simulate_round([1.0, r], chunks, rule=tail_defer)[1]) for r in FINE)
    halves = max(max(simulate_round([1.0, r], chunks, halves=True)[1]) for r in FINE)
    # merge every 20: 6.5% -> 3.3%; every 10: 13.5% (over the target) -> 6.5%
    assert halves <= 0.55 * whole and halves <= 0.07, (whole, halves)


def test_equal_workers_split_an_odd_last_chunk_instead_of_one_waiting_a_whole_chunk():
    assert max(simulate_round([1.0, 1.0], 41, rule=tail_defer)[1]) == pytest.approx(1 / 21)
    seconds, idle = simulate_round([1.0, 1.0], 41, halves=True)
    assert seconds == pytest.approx(20.5) and max(idle) == pytest.approx(0.0)


def test_a_half_is_granted_only_when_it_leaves_less_idle_than_a_whole_chunk_or_waiting():
    fast, slow = worker(0, 1.0, held=1, started_at=-0.95), worker(1, 3.0)
    # The fast one is 0.05 s from done, two chunks pending. Whole: slow ends at 3.0, fast at 1.05
    # (waits 1.95). Held back: the fast one trains both, ends at 2.05 and the slow one waits 2.05.
    # Half: slow ends at 1.5; fast does its other half and the last chunk, ends at 1.55 (waits 0.05).
    assert tail_choice(slow, [fast, slow], [1.0, 1.0], 0.0, halves=True) == HALF
    assert tail_choice(slow, [fast, slow], [1.0, 1.0], 0.0) == GRANT  # without halves: the old answer
    assert tail_choice(slow, [fast, slow], [0.5, 1.0], 0.0, halves=True) in (GRANT, DEFER)  # a half is not cut again
    assert tail_choice(slow, [fast, slow], [1.0] * 30, 0.0, halves=True) == GRANT  # early in a round


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
