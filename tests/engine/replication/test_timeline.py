"""The per-phase timeline (engine.replication.timeline) reads the ranks' own events, nothing else.

Each number it gives is checked against the event it came from: a verify step lasts exactly the
``seconds`` of the bucket's ``done`` state and ends at its ``t``; a network receive ends when the
bucket arrived (its post plus the ``verifying`` state's seconds) and starts no earlier than the
previous arrival; a follower's copy is its ``verifying`` state; spans are taken as sent. The live
check, on a real 2 x 2 namespace run, is in test_hierarchical.py.
"""

from __future__ import annotations

import os

import pytest

from hwtui.core.events import from_dict
from hwtui.engine.replication.events import SPAN_PHASES, ReplBucket, ReplSpan
from hwtui.engine.replication.timeline import (
    cpu_between,
    cpu_sample,
    follower_lag,
    render,
    steps_from_events,
    summarize,
)


def _b(rank: int, b: int, state: str, t: float, seconds: float = 0.0) -> dict:
    return ReplBucket(bucket_id=b, state=state, nbytes=100, seconds=seconds, rank=rank, t=t).to_dict()


def _s(rank: int, b: int, phase: str, t: float, seconds: float) -> dict:
    return ReplSpan(rank=rank, bucket_id=b, phase=phase, seconds=seconds, t=t).to_dict()


EVENTS = [
    # source: bucket 0 and 1 posted at 10.0, sent by 10.5 and 10.9; hashed beside the send
    _b(0, 0, "staged", 10.0), _b(0, 0, "inflight", 10.0), _b(0, 1, "staged", 10.0), _b(0, 1, "inflight", 10.01),
    _b(0, 0, "done", 10.5, 0.5), _b(0, 1, "done", 10.9, 0.89), _s(0, 0, "hash", 10.2, 0.1), _s(0, 1, "hash", 10.6, 0.1),
    # leader: both posted at 10.0; bucket 0 arrived at 10.5 (verified by 10.6), bucket 1 at 10.9
    _b(2, 0, "inflight", 10.0), _b(2, 1, "inflight", 10.0),
    _b(2, 0, "verifying", 10.5, 0.5), _b(2, 0, "done", 10.6, 0.1), _s(2, 0, "announce", 10.6, 0.0),
    _b(2, 1, "verifying", 10.95, 0.9), _b(2, 1, "done", 11.0, 0.05), _s(2, 1, "announce", 11.0, 0.0),
    # follower: waited for each announcement, copied, verified
    _s(3, -1, "map", 10.0, 0.0), _s(3, 0, "wait", 10.61, 0.61), _b(3, 0, "inflight", 10.61),
    _b(3, 0, "verifying", 10.7, 0.09), _b(3, 0, "done", 10.71, 0.01),
    _s(3, 1, "wait", 11.01, 0.3), _b(3, 1, "inflight", 11.01), _b(3, 1, "verifying", 11.1, 0.09), _b(3, 1, "done", 11.1, 0.0),
    # noise the timeline must ignore: world-level bucket events, other kinds
    ReplBucket(bucket_id=0, state="done", nbytes=100, seconds=0.7, rank=None, t=10.7).to_dict(),
    {"kind": "repl.window", "occupancy": 1, "window": 4, "bytes_in_flight": 100, "t": 10.0},
]
PATHS = {0: "source", 2: "network", 3: "host-copy"}


def _by(steps, rank, phase):
    return {s.bucket: s for s in steps if s.rank == rank and s.phase == phase}


def test_every_step_is_read_from_its_event():
    steps = steps_from_events(EVENTS, PATHS)
    send = _by(steps, 0, "send")
    assert (send[0].start, send[0].end) == (10.0, 10.5) and (send[1].start, send[1].end) == (10.01, 10.9)
    assert _by(steps, 0, "hash")[1].seconds == pytest.approx(0.1) and _by(steps, 0, "hash")[1].end == 10.6
    receive = _by(steps, 2, "receive")
    assert (receive[0].start, receive[0].end) == (10.0, 10.5)  # post to arrival
    # Arrived at post + 0.9 = 10.9, not at the event's t (10.95, after bucket 0 was verified);
    # its bytes flowed after bucket 0's arrival, on the one connection.
    assert receive[1].end == pytest.approx(10.9) and receive[1].start == 10.5
    verify = _by(steps, 2, "verify")
    assert verify[0].end == 10.6 and verify[0].seconds == pytest.approx(0.1)
    assert verify[1].end == 11.0 and verify[1].seconds == pytest.approx(0.05)
    assert _by(steps, 3, "wait")[0].seconds == pytest.approx(0.61)
    copy = _by(steps, 3, "copy")
    assert copy[0].end == 10.7 and copy[0].seconds == pytest.approx(0.09)
    assert _by(steps, 3, "verify")[0].seconds == pytest.approx(0.01)
    assert _by(steps, 3, "map")[-1].seconds == 0.0
    assert not [s for s in steps if s.rank not in PATHS]  # the world-level event is not a rank's step


def test_sums_lag_and_rendering_agree_with_the_steps():
    steps = steps_from_events(EVENTS, PATHS)
    sums = summarize(steps)
    assert sums[2]["verify"] == pytest.approx(0.15) and sums[3]["wait"] == pytest.approx(0.91)
    lag = follower_lag(steps, leader=2, follower=3)
    # bucket 0: leader verified 10.6, follower copy started 10.61, verified 10.71; bucket 1: 11.0, 11.01, 11.1
    assert lag["to_copy_start"] == pytest.approx(0.01) and lag["to_verified"] == pytest.approx(0.105)
    text = render(steps, paths=PATHS, total_bytes=200,
                  cpu={2: {"process_s": 0.3, "host_busy_s": 1.5, "wall_s": 1.0, "cores": 2}})
    assert "rank 2 network" in text and "verify 150" in text and "cpu 0.30 s" in text
    assert "1.50 busy core-seconds of 2 x 1.00 s" in text and "(75% of the cores" in text
    assert render([]) == "timeline: no bucket events"


def test_paths_are_guessed_from_the_events_when_not_given():
    steps = steps_from_events(EVENTS)
    assert _by(steps, 0, "send") and _by(steps, 2, "receive") and _by(steps, 3, "copy")


def test_span_events_survive_the_wire_and_bad_fields_are_skipped():
    ev = from_dict(_s(3, 4, "wait", 5.0, 0.25))
    assert isinstance(ev, ReplSpan) and (ev.rank, ev.bucket_id, ev.phase, ev.seconds, ev.t) == (3, 4, "wait", 0.25, 5.0)
    assert set(SPAN_PHASES) >= {"hash", "announce", "wait", "map", "transfer"}
    junk = [{"kind": "repl.bucket", "rank": "2", "t": 1.0}, {"kind": "repl.span", "rank": 1, "t": "x"},
            {"kind": "repl.bucket", "rank": 1, "t": 1.0, "bucket_id": None, "state": "done"}]
    assert steps_from_events(junk) == []


def test_cpu_between_two_samples():
    a = cpu_sample()
    sum(i * i for i in range(200_000))  # some CPU of this process
    c = cpu_between(a, cpu_sample())
    assert c["process_s"] > 0 and c["wall_s"] > 0 and c["host_busy_s"] >= 0 and c["cores"] >= 1
    # The kernel's part: a process that only writes to a pipe spends system time, and it is counted.
    r, w = os.pipe()
    try:
        a = cpu_sample()
        block = b"x" * 65536
        for _ in range(3000):
            os.write(w, block)
            os.read(r, 65536)
        c = cpu_between(a, cpu_sample())
    finally:
        os.close(r)
        os.close(w)
    assert 0 < c["process_sys_s"] <= c["process_s"] and 0 <= c["host_softirq_s"] <= c["host_busy_s"] + 0.02
