"""How the pusher follows and stops a push on one agent: the long poll (/v1/push/wait) and abort."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from hwtui.engine.resident.resident import PushRefused, ResidentRank


@pytest.fixture
def node(tmp_path):
    n = ResidentRank(node="n1", out=tmp_path / "agent", advertise="127.0.0.1")
    yield n
    n.close()


def _in_flight(node: ResidentRank, phase: str) -> None:
    with node._lock:
        node.busy = True
        node.in_flight = {"push_id": "p-1", "version": "v2", "rank": 1, "phase": phase, "progress": 0.0,
                          "bytes_done": 0, "total_bytes": 10, "timeline": {}}


def test_the_long_poll_answers_when_the_push_changes_phase(node):
    _in_flight(node, "transfer")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(node.wait, {"push_id": "p-1", "phase": "transfer", "timeout": 10})
        node._on_message({"kind": "_rank", "what": "prepared", "t": time.time()})
        doc = waiting.result(timeout=30)
    assert doc["in_flight"]["phase"] == "voting" and "prepared" in doc["in_flight"]["timeline"]
    # A phase the caller has not seen yet, or a push that is not this one: answered at once.
    assert node.wait({"push_id": "p-1", "phase": "transfer", "timeout": 10})["in_flight"]["phase"] == "voting"
    assert node.wait({"push_id": "other", "phase": None, "timeout": 10})["in_flight"]["push_id"] == "p-1"


def test_the_long_poll_answers_when_the_push_ends(node):
    _in_flight(node, "committing")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(node.wait, {"push_id": "p-1", "phase": "committing", "timeout": 10})
        with node._lock:
            node._finish({"code": 1, "usable": True})
        doc = waiting.result(timeout=30)
    assert doc["in_flight"] is None and doc["last"]["push_id"] == "p-1" and doc["last"]["outcome"] == "aborted"
    assert "done" in doc["last"]["timeline"]


def test_abort_never_stops_a_rank_past_the_vote_and_names_its_reason(node):
    _in_flight(node, "committing")
    assert node.abort({"push_id": "p-1", "reason": "node2 died"})["aborted"] is False
    assert node.busy and "stopped" not in node.in_flight
    _in_flight(node, "voting")
    assert node.abort({"push_id": "p-1", "reason": "node2 died"})["aborted"] is True
    assert node.in_flight["stopped"] == "node2 died"
    with node._lock:  # what the reader records once the stopped rank is gone
        node._finish({"code": -1, "usable": False})
    assert node.last["outcome"] == "aborted" and node.last["failures"][0] == "stopped: node2 died"


@pytest.mark.parametrize("body, needle", [({"push_id": "p-1", "timeout": 11}, "timeout"),
                                          ({"push_id": "p-1", "timeout": True}, "timeout"),
                                          ({"push_id": "../x"}, "push_id")])
def test_bad_long_polls_are_one_line_400s(node, body, needle):
    with pytest.raises(PushRefused) as info:
        node.wait(body)
    assert info.value.status == 400 and needle in str(info.value)
