"""The launcher's watch over local ranks (engine.replication.monitor): the rank-state machine, the
typed per-rank results, and the first failure that ends a run.

The monitor is driven by real child processes that speak the ranks' JSON lines on their answer
pipes and exit with a rank's exit codes; nothing of the monitor is faked. Every wait is the
monitor's own (bounded by its watchdog) and the test's timeout.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

import pytest

from hwtui.core.errors import EXIT_FAILED, EXIT_USAGE
from hwtui.core.events import ErrorEvent
from hwtui.core.supervisor import Child, Group
from hwtui.engine.replication.config import Timeouts
from hwtui.engine.replication.coordinator import Coordinator, RankResult
from hwtui.engine.replication.monitor import Monitor, RankState, RunOutcome, StallLimits, Stop, rank_state

# A stand-in rank: writes the given messages to its answer pipe, then exits with the given code,
# or first blocks until its stdin closes (the parent's group tears it down).
_RANK = """
import json, os, sys
fd, msgs, code, block = int(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "block"
for m in msgs:
    os.write(fd, (json.dumps(m) + "\\n").encode())
if block:
    sys.stdin.read()
sys.exit(code)
"""
_PLAN: Any = {"version": "v1", "prev_version": None, "total_bytes": 0}


def _internal(rank: int, what: str, **data: Any) -> dict[str, Any]:
    return {"kind": "_rank", "rank": rank, "what": what, "t": 0.0, **data}


def _result(rank: int, **data: Any) -> dict[str, Any]:
    return _internal(rank, "result", **{"ok": False, "clean": False, "bad_input": False, **data})


def _watch(ranks: dict[int, tuple[list[dict[str, Any]], int, bool]], *, stop: threading.Event | None = None,
           timeouts: Timeouts | None = None) -> tuple[RunOutcome, Monitor, dict[int, Child]]:
    """Start one stand-in per rank (messages, exit code, whether it blocks) and watch them to the end."""
    coord = Coordinator(_PLAN, sorted(ranks), lambda ev: None)
    phases: dict[str, float] = {}
    with Group() as group, Stop(stop) as stopper:
        children = {r: group.add(Child([sys.executable, "-c", _RANK, "{answer_fd}", json.dumps(msgs), str(code),
                                        "block" if block else "exit"], name=f"rank {r}", answer_pipe=True,
                                       stdin="pipe", stderr="null"))
                    for r, (msgs, code, block) in sorted(ranks.items())}
        monitor = Monitor(group, children, coord, stopper, timeouts or Timeouts(init=30, bucket=30, commit=30),
                          phases, 0.0)
        outcome = monitor.watch()
    return outcome, monitor, children


# ---------------------------------------------------------------------- the state machine


@pytest.mark.parametrize(("code", "ready", "clean", "timed_out", "state"), [
    (None, False, False, False, RankState.STARTING),
    (None, True, False, False, RankState.RUNNING),
    (None, True, False, True, RankState.RUNNING),  # a rank still running is judged by the watchdog, not here
    (0, False, False, False, RankState.SUCCEEDED),
    (0, True, False, True, RankState.SUCCEEDED),
    (1, True, True, False, RankState.ABORTED),  # voted no and reported: not the culprit
    (3, True, True, True, RankState.ABORTED),
    (3, True, False, True, RankState.GAVE_UP),  # timed out on a peer: a witness
    (3, True, False, False, RankState.FAILED),
    (-9, True, False, True, RankState.FAILED),  # killed by a signal: it fell over, whatever it said
    (2, False, False, False, RankState.FAILED),
])
def test_rank_state_from_exit_code_readiness_and_report(code, ready, clean, timed_out, state):
    result = RankResult(rank=1, clean=clean)
    assert rank_state(code, ready, result, timed_out) is state
    assert state.is_running == (code is None)


def test_stall_limits_depend_on_the_rank_state():
    limits = StallLimits.from_timeouts(Timeouts(init=10, bucket=3, commit=7))
    assert limits.limit(RankState.STARTING) == 70.0  # interpreter start and `import torch` included
    assert limits.limit(RankState.RUNNING) == 12.0


def test_rank_result_is_typed_from_the_ranks_message():
    raw = _result(2, ok=True, clean=True, phases={"transfer": 1.5, "load": 0.1}, path="network", serves="v1")
    r = RankResult.from_message(2, raw)
    assert (r.rank, r.ok, r.clean, r.bad_input, r.transfer_s) == (2, True, True, False, 1.5)
    # The report row is what the rank said, without the message envelope.
    assert dict(r.row) == {"rank": 2, "ok": True, "clean": True, "bad_input": False, "path": "network", "serves": "v1",
                           "phases": {"transfer": 1.5, "load": 0.1}}
    with pytest.raises(AttributeError):
        r.ok = False  # type: ignore[misc]  # frozen


def test_rank_result_reads_garbage_as_not_reported():
    r = RankResult.from_message(1, {"kind": "_rank", "ok": "yes", "phases": "fast", "clean": 0})
    assert (r.ok, r.clean, r.bad_input, r.transfer_s) == (True, False, False, 0.0)
    r = RankResult.from_message(1, {"phases": {"transfer": "slow"}})
    assert r.transfer_s == 0.0
    missing = RankResult.missing(3)
    assert (missing.ok, missing.clean, dict(missing.row)) == (False, False, {"rank": 3})


def test_coordinator_keeps_typed_results_and_names_missing_ones():
    coord = Coordinator(_PLAN, [0, 1], lambda ev: None)
    coord.feed(_result(1, ok=True, clean=True))
    assert coord.result_of(1) == RankResult.from_message(1, _result(1, ok=True, clean=True))
    assert coord.result_of(0) == RankResult.missing(0)


# ---------------------------------------------------------------------- the watch, over real processes


def test_every_rank_succeeding_ends_the_watch_without_a_failure():
    ok = {r: ([_internal(r, "ready"), _result(r, ok=True, clean=True)], 0, False) for r in (0, 1)}
    outcome, monitor, _ = _watch(ok)
    assert outcome == RunOutcome() and outcome.ok
    assert monitor.states == {0: RankState.SUCCEEDED, 1: RankState.SUCCEEDED}
    assert "launch_to_ready" in monitor.phases


def test_a_clean_abort_is_no_failure_of_the_watch():
    # Both ranks voted no and exited 1 after reporting: the run's verdict comes from the reports.
    aborted = {r: ([_internal(r, "ready"), _result(r, clean=True)], 1, False) for r in (0, 1)}
    outcome, monitor, _ = _watch(aborted)
    assert outcome.ok
    assert set(monitor.states.values()) == {RankState.ABORTED}


def test_a_rank_that_falls_over_is_named_with_what_it_last_reported():
    ranks = {0: ([_internal(0, "ready")], 0, True),
             1: ([_internal(1, "ready"), _internal(1, "transfer_start")], 3, False)}
    outcome, monitor, children = _watch(ranks)
    assert outcome.exit_code == EXIT_FAILED
    assert outcome.error == "rank 1 exited with status 3 (last reported: transfer_start)"
    assert monitor.states[1] is RankState.FAILED
    assert monitor.states[0] is RankState.RUNNING  # still blocked when the watch ended; the group tore it down


def test_a_rank_refusing_its_input_makes_the_run_bad_input():
    err = ErrorEvent(message="plan digest mismatch", rank=1, where="input").to_dict()
    ranks = {0: ([], 0, True), 1: ([err, _result(1, bad_input=True)], 2, False)}
    outcome, _, _ = _watch(ranks)
    assert outcome == RunOutcome("plan digest mismatch", EXIT_USAGE)


def test_a_rank_that_gave_up_on_a_silent_peer_names_the_peer():
    err = ErrorEvent(message="rank 1: broadcast of bucket 0 timed out", rank=1, where="transport").to_dict()
    ranks = {0: ([_internal(0, "ready")], 0, True), 1: ([_internal(1, "ready"), err], 3, False)}
    outcome, monitor, _ = _watch(ranks)
    assert monitor.states[1] is RankState.GAVE_UP
    assert outcome.exit_code == EXIT_FAILED
    assert outcome.error is not None
    assert outcome.error.startswith("rank 0 hung (no progress for ")
    assert outcome.error.endswith("; rank(s) 1 timed out waiting for it; nothing was committed")


def test_the_watchdog_names_a_running_rank_that_goes_silent():
    ranks = {0: ([_internal(0, "ready")], 0, True)}
    outcome, monitor, _ = _watch(ranks, timeouts=Timeouts(init=30, bucket=0.1, commit=0.1))
    assert monitor.states[0] is RankState.RUNNING
    assert outcome.exit_code == EXIT_FAILED
    assert outcome.error is not None and outcome.error.startswith("rank 0 hung (no progress for ")
    assert "last: ready" in outcome.error


def test_a_stop_request_kills_ranks_still_starting_and_ends_the_run():
    stop = threading.Event()
    stop.set()
    outcome, _, children = _watch({0: ([], 0, True), 1: ([], 0, True)}, stop=stop)
    assert outcome == RunOutcome("stopped on request", 128 + signal.SIGTERM)
    assert children[0].wait(timeout=30) == -signal.SIGKILL  # before the world joined: nothing to undo


def test_a_rank_that_gave_up_on_a_dead_peer_is_not_blamed_when_its_last_words_are_still_in_the_pipe():
    """Rank 1 is killed; rank 0 sees the peer vanish, reports a transport error, and exits 3. Both
    exits are seen in one poll while rank 0's last words still sit in its pipe, beyond the one
    64 KiB read a poll takes (its progress lines came first): the monitor must read them before it
    judges, and name rank 1. (Under load the launcher blamed rank 0: "rank 0 exited with status 3
    (last reported: bucket 6 done)" for a SIGTERM of rank 1.)"""
    chatter = [_internal(0, "progress", note="x" * 900) for _ in range(90)]  # ~85 KiB before the error
    err = ErrorEvent(message="rank 0: connection to rank 1 closed", rank=0, where="transport").to_dict()
    coord = Coordinator(_PLAN, [0, 1], lambda ev: None)
    with Group() as group, Stop(None) as stopper:
        children = {0: group.add(Child([sys.executable, "-c", _RANK, "{answer_fd}",
                                        json.dumps([_internal(0, "ready"), *chatter, err, _result(0)]), "3", "exit"],
                                       name="rank 0", answer_pipe=True, stdin="pipe", stderr="null")),
                    1: group.add(Child([sys.executable, "-c", _RANK, "{answer_fd}", json.dumps([_internal(1, "ready")]),
                                        "4", "exit"], name="rank 1", answer_pipe=True, stdin="pipe", stderr="null"))}
        import fcntl

        for child in children.values():
            # A pipe that holds all of rank 0's words (F_SETPIPE_SZ), so it can write them and exit
            # before the monitor's first read, which takes 64 KiB: the race, made certain.
            assert child.answer_fd is not None
            fcntl.fcntl(child.answer_fd, 1031, 1 << 20)
            child.wait(timeout=60)
        monitor = Monitor(group, children, coord, stopper, Timeouts(init=30, bucket=30, commit=30), {}, 0.0)
        outcome = monitor.watch()
    assert monitor.states[0] is RankState.GAVE_UP
    assert outcome.exit_code == EXIT_FAILED
    assert outcome.error is not None and outcome.error.startswith("rank 1 exited with status 4"), outcome.error
