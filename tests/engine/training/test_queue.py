"""Chunk queue: balancing modes and exact accounting when a worker is lost."""

from __future__ import annotations

import pytest

from hwtui.engine.training.queue import ChunkQueue, QueueError, shares_from_weights, unit_name, unit_parse


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
    rec = q.round_record(8)
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
    rec = q.round_record(8)
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


def test_a_split_chunk_is_two_halves_in_its_place_and_every_sample_is_counted_once():
    q = ChunkQueue("dynamic")
    q.start_round(1, 4, [0, 1])
    assert [q.claim(0), q.claim(0)] == [0, 1]
    assert q.pending_fractions(1) == [1.0, 1.0]
    assert q.claim(1, split=True) == (2, 0, 2)  # the next chunk, cut in two: its first half
    assert q.pending_fractions(0) == [0.5, 1.0]  # the other half stays first in line
    assert q.claim(0, split=True) == (2, 1, 2)  # a half is never cut again
    assert q.claim(0) == 3 and q.claim(1) is None
    for rank, unit in ((0, 0), (0, 1), (1, (2, 0, 2)), (0, (2, 1, 2)), (0, 3)):
        q.complete(rank, unit)
    assert q.complete() and q.done_by() == {0: 3.5, 1: 0.5}
    assert q.samples_by(7) == {0: 7 + 7 + 4 + 7, 1: 3}  # rows [0, 3) and [3, 7) of chunk 2's batch of 7
    assert sum(q.samples_by(7).values()) == 4 * 7
    rec = q.round_record(7)
    assert rec["assignment"] == {"0": [0, 1, "2:1/2", 3], "1": ["2:0/2"]} and rec["pieces"] == 2
    assert rec["chunks"] == [0, 3] and rec["retrained"] == []


def test_a_lost_workers_half_goes_back_as_a_half():
    q = ChunkQueue("dynamic")
    q.start_round(1, 2, [0, 1])
    assert q.claim(0) == 0 and q.claim(1, split=True) == (1, 0, 2)
    assert q.release(1) == [(1, 0, 2)]
    got = drain(q, [0])
    assert got[0] == [(1, 0, 2), (1, 1, 2)]  # the survivor trains both halves: the chunk once, whole
    q.complete(0, 0)
    assert q.samples_by(8) == {0: 16} and q.round_record(8)["retrained"] == ["1:0/2"]  # it was in progress


def test_a_recorded_assignment_with_halves_replays_and_a_broken_one_is_not_used():
    q = ChunkQueue("dynamic", next_chunk=8)
    assert q.start_round(3, 3, [0, 1], assignment={0: (8, (10, 1, 2)), 1: ((10, 0, 2), 9)})
    assert [q.claim(1), q.claim(1), q.claim(0), q.claim(0), q.claim(0)] == [9, (10, 0, 2), 8, (10, 1, 2), None]
    for bad in ({0: (11, (13, 1, 2)), 1: (12,)},  # half of chunk 13 missing
                {0: (11, (13, 0, 2), (13, 0, 2)), 1: (12, (13, 1, 2))},  # a half twice
                {0: (11, 13, (13, 0, 2)), 1: (12, (13, 1, 2))}):  # a chunk whole and in halves
        q = ChunkQueue("dynamic", next_chunk=11)
        assert not q.start_round(4, 3, [0, 1], assignment=bad)
        assert list(q.chunks) == [11, 12, 13]


@pytest.mark.parametrize("text, unit", [(5, 5), ("41:1/2", (41, 1, 2)), ("0:0/2", (0, 0, 2))])
def test_units_are_written_and_read_back(text, unit):
    assert unit_parse(text) == unit and unit_name(unit) == text


@pytest.mark.parametrize("bad", [-1, True, "41", "41:2/2", "41:0/1", "a:0/2", "41:0/2/3", 4.0, None, [41, 0, 2]])
def test_anything_else_is_not_a_unit(bad):
    with pytest.raises(ValueError):
        unit_parse(bad)
