"""Chunk queue: balancing modes and exact accounting when a worker is lost."""

from __future__ import annotations

import pytest

from hwtui.engine.training.queue import ChunkQueue, QueueError, shares_from_weights


def drain(q: ChunkQueue, order: list[int]) -> dict[int, list[int]]:
    """Claim and complete in the given rank order until nothing is left; returns chunks per rank."""
    got: dict[int, list[int]] = {r: [] for r in set(order)}
    progress = True
    while progress:
        progress = False
        for r in order:
            cid = q.claim(r)
            if cid is not None:
                q.complete(r, cid)
                got[r].append(cid)
                progress = True
    return got


def test_dynamic_lets_the_faster_worker_take_more():
    q = ChunkQueue("dynamic")
    q.start_round(1, 12, [0, 1])
    got = drain(q, [0, 0, 0, 1])  # rank 0 asks three times as often
    assert len(got[0]) == 9 and len(got[1]) == 3
    assert q.complete() and sorted(got[0] + got[1]) == list(range(12))


def test_equal_gives_each_rank_the_same_share_whatever_its_speed():
    q = ChunkQueue("equal")
    q.start_round(1, 12, [0, 1])
    got = drain(q, [0, 0, 0, 1])
    assert len(got[0]) == 6 and len(got[1]) == 6


def test_static_follows_measured_weights():
    q = ChunkQueue("static")
    q.start_round(1, 20, [0, 1], {0: 300.0, 1: 100.0})
    got = drain(q, [0, 1])
    assert (len(got[0]), len(got[1])) == (15, 5)


def test_shares_sum_to_n_with_largest_remainder():
    counts = shares_from_weights(10, [0, 1, 2], {0: 1, 1: 1, 2: 1})
    assert sum(counts.values()) == 10 and sorted(counts.values()) == [3, 3, 4]
    assert shares_from_weights(4, [0, 1], {}) == {0: 2, 1: 2}  # no weights: equal


def test_lost_worker_returns_done_and_in_progress_chunks_with_attempts_recorded():
    q = ChunkQueue("equal")
    q.start_round(1, 8, [0, 1])
    a, b = q.claim(1), q.claim(1)
    q.complete(1, a)  # trained by rank 1, but rank 1's weights die with it
    back = q.release(1)
    assert sorted(back) == sorted([a, b])
    assert q.chunks[a].attempts == [{"rank": 1, "outcome": "lost-after-training"}]
    assert q.chunks[b].attempts == [{"rank": 1, "outcome": "lost-in-progress"}]
    got = drain(q, [0])  # the survivor takes everything, its own share and the orphaned one
    assert sorted(got[0]) == list(range(8))
    rec = q.round_record()
    assert rec["done_by"] == {"0": 8}
    assert sorted(rec["retrained"]) == sorted([a, b])
    assert q.requeued_total == 2


def test_a_lost_workers_prefetched_chunk_goes_back_once_and_is_not_counted_as_retrained():
    q = ChunkQueue("dynamic")
    q.start_round(1, 6, [0, 1])
    done, training, ahead = q.claim(1), q.claim(1), q.claim(1)  # one finished, one in hand, one prefetched
    q.complete(1, done)
    back = q.release(1, unstarted={ahead})
    assert sorted(back) == sorted([done, training, ahead]) and q.requeued_total == 3
    assert q.chunks[ahead].attempts == [{"rank": 1, "outcome": "lost-unstarted"}]
    assert q.release(1) == [] and q.requeued_total == 3  # released once: a second release finds nothing
    got = drain(q, [0])
    assert sorted(got[0]) == list(range(6)) and q.done_by() == {0: 6}
    rec = q.round_record()
    assert sorted(rec["retrained"]) == sorted([done, training])  # the prefetched one was trained once only
    assert rec["attempts"][str(ahead)] == [{"rank": 1, "outcome": "lost-unstarted"}, {"rank": 0, "outcome": "done"}]


def test_completing_a_chunk_one_does_not_hold_is_refused():
    q = ChunkQueue("dynamic")
    q.start_round(1, 2, [0, 1])
    cid = q.claim(0)
    with pytest.raises(QueueError):
        q.complete(1, cid)
    with pytest.raises(QueueError):
        q.start_round(2, 2, [0, 1])  # the round is not finished
    with pytest.raises(QueueError):
        ChunkQueue("fastest-first")


def test_chunk_ids_continue_across_rounds():
    q = ChunkQueue("dynamic", next_chunk=100)
    q.start_round(5, 3, [0])
    assert drain(q, [0])[0] == [100, 101, 102]
    q.start_round(6, 2, [0])
    assert drain(q, [0])[0] == [103, 104]
