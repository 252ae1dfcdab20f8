"""The launcher's watch over local ranks: a state per rank, and the first failure that ends the run.

In the spirit of torch.distributed.elastic's ``WorkerState`` and ``_monitor_workers``: every
poll turns each rank's exit code and reports into a :class:`RankState`; the run ends with a
:class:`RunOutcome` once every rank has exited, or shortly after the first failure (a short grace
for the others to report what they saw, then the group is torn down). What counts as a failure,
in order:

1. the user's stop (SIGTERM/SIGINT, or the TUI's stop event);
2. a rank that fell over (:attr:`RankState.FAILED`): it ends the run at once, whatever phase it
   was in (before the world forms its peers would otherwise only notice at the init timeout);
3. a transport error a peer reported: half a second later, the ranks that are still running and
   said nothing are named as hung (a peer sees a dead rank's socket close a moment before the
   dead rank can be reaped, so a death is reported as a death, not as a hang);
4. the watchdog: a running rank silent for longer than its state allows. Peers normally name a
   hung rank through their own timeouts; this catches the rest.
"""

from __future__ import annotations

import enum
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from hwtui.core.errors import EXIT_FAILED, EXIT_USAGE
from hwtui.core.events import LogEvent
from hwtui.core.supervisor import Child, Group, exit_text
from hwtui.engine.replication.config import Timeouts
from hwtui.engine.replication.coordinator import Coordinator, RankResult, failure_text, hung_text
from hwtui.engine.replication.events import RANK_PHASES

# A peer's transport error is acted on this long after it arrives: time for a dead rank to be reaped
# and for a failing one to say why. 0.5 s was too short under load: a rank failing on purpose at
# the commit (a test fault) said so 0.5-1 s after its peer's transport error, on a 2-core box running
# four test processes, and was named "hung". A rank that reports or exits ends the wait sooner.
TRANSPORT_GRACE_S = 2.0
# After the first failure (or every rank's exit with a pipe still open), this long to drain reports.
DRAIN_S = 1.0


class RankState(enum.Enum):
    """Where one local rank stands, as the launcher sees it."""

    STARTING = "starting"  # running, not yet through the start barrier (interpreter, torch, plan, world)
    RUNNING = "running"  # through the start barrier: transfer, vote, commit
    SUCCEEDED = "succeeded"  # exited 0
    ABORTED = "aborted"  # exited non-zero after reporting a clean end (it voted no, or aborted with the others)
    GAVE_UP = "gave up"  # exited after timing out on a peer: a witness; the transport rule names the peer
    FAILED = "failed"  # exited non-zero without a clean report: it fell over

    @property
    def is_running(self) -> bool:
        return self in (RankState.STARTING, RankState.RUNNING)


def rank_state(code: int | None, ready: bool, result: RankResult, timed_out_on_peer: bool) -> RankState:
    """One rank's state from its exit code (None: still running), whether it passed the start
    barrier, its final report, and whether it reported a transport error of its own."""
    if code is None:
        return RankState.RUNNING if ready else RankState.STARTING
    if code == 0:
        return RankState.SUCCEEDED
    if result.clean:
        return RankState.ABORTED
    if timed_out_on_peer and code > 0:
        return RankState.GAVE_UP
    return RankState.FAILED


@dataclass(frozen=True)
class RunOutcome:
    """How the ranks' run ended: no error and exit code 0, or the first failure and its exit code."""

    error: str | None = None
    exit_code: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class StallLimits:
    """The watchdog's patience, in seconds, for a rank that reports nothing."""

    starting: float  # includes interpreter start and `import torch` on a loaded host
    running: float

    @classmethod
    def from_timeouts(cls, timeouts: Timeouts) -> StallLimits:
        return cls(starting=timeouts.init + 60.0, running=max(timeouts.bucket, timeouts.commit) + 5.0)

    def limit(self, state: RankState) -> float:
        return self.running if state is RankState.RUNNING else self.starting


class Stop:
    """SIGTERM/SIGINT (main thread only) or an external threading.Event end the run as an abort."""

    def __init__(self, external: threading.Event | None):
        self.external = external
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Stop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    @property
    def requested(self) -> bool:
        return self.signum is not None or bool(self.external and self.external.is_set())

    def describe(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}" if self.signum else "stopped on request"



class Monitor:
    """Watches a group of local ranks until the run ends; :meth:`watch` returns the outcome."""

    def __init__(self, group: Group, children: dict[int, Child], coord: Coordinator, stopper: Stop,
                 timeouts: Timeouts, phases: dict[str, float], t_launch: float):
        self.group, self.children, self.coord, self.stopper = group, children, coord, stopper
        self.phases, self.t_launch = phases, t_launch
        self.limits = StallLimits.from_timeouts(timeouts)
        self.rank_of = {c: r for r, c in children.items()}
        self.ready: set[int] = set()
        self.codes: dict[int, int | None] = {r: None for r in children}
        self.states: dict[int, RankState] = {r: RankState.STARTING for r in children}
        self.failure: RunOutcome | None = None
        self.fail_at: float | None = None
        self.all_exited_at: float | None = None
        self.transport_err_at: float | None = None

    def watch(self) -> RunOutcome:
        while not self._tick():
            pass
        return self.failure or RunOutcome()

    def _tick(self) -> bool:
        """One poll: read the ranks' messages, update their states, judge. True: stop watching."""
        self._drain()
        now = time.monotonic()
        self._update_states()
        if self.failure is None:
            self.failure = self._judge(now)
            if self.failure is not None:
                self.fail_at = now
        return self._finished(now)

    def _drain(self, timeout: float = 0.05) -> int:
        """Feed the ranks' messages that arrive within ``timeout``; how many there were."""
        got = self.group.poll(timeout)
        for m in got:
            raw = m.msg
            if raw is None:
                continue
            if raw.get("kind") == "_rank" and raw.get("what") == "ready":
                self.ready.add(self.rank_of[m.child])
                if len(self.ready) == len(self.children):
                    self.phases["launch_to_ready"] = time.perf_counter() - self.t_launch
            self.coord.feed(raw)
        return len(got)

    def _update_states(self) -> None:
        self.codes = {r: c.poll() for r, c in self.children.items()}
        # A rank writes its last words (its error, its result) before it exits, but they can still
        # sit in its pipe, beyond what the last read took, when its exit is seen: read them before
        # the exit is judged, or a rank that gave up on a dead peer is blamed for the peer's death.
        if any(code is not None for code in self.codes.values()):
            for _ in range(1000):  # bounded: a live rank may keep talking
                if not self._drain(0.0):
                    break
        transport = {e.rank for e in self.coord.errors if e.where == "transport"}
        self.states = {r: rank_state(code, r in self.ready, self.coord.result_of(r), r in transport)
                       for r, code in self.codes.items()}

    def _judge(self, now: float) -> RunOutcome | None:
        """The first failure by the rules of the module docstring, or None while all is well."""
        if self.stopper.requested:
            stop_ranks(self.children, self.coord)
            return RunOutcome(self.stopper.describe(), 128 + (self.stopper.signum or signal.SIGTERM))
        for r, state in self.states.items():
            if state is RankState.FAILED:
                return self._fell_over(r)
        failure = self._transport_failure(now)
        if failure is not None:
            return failure
        for r, state in self.states.items():
            if state.is_running and now - self.coord.progress[r][0] > self.limits.limit(state):
                return RunOutcome(hung_text(self.coord, [r]), EXIT_FAILED)
        return None

    def _fell_over(self, r: int) -> RunOutcome:
        said = failure_text(self.coord, r)
        if self.coord.result_of(r).bad_input:
            return RunOutcome(said or f"rank {r}: bad input", EXIT_USAGE)
        code = self.codes[r]
        assert code is not None, "a failed rank has exited"
        return RunOutcome(f"rank {r} {exit_text(code)} (last reported: {self.coord.progress[r][1]}"
                          + (f"; it said: {said}" if said else "") + ")", EXIT_FAILED)

    def _transport_failure(self, now: float) -> RunOutcome | None:
        """A peer reported a transport error: after the grace, name the silent ranks still running."""
        errors = self.coord.errors
        if self.transport_err_at is None and any(ev.where == "transport" for ev in errors):
            self.transport_err_at = now
        if self.transport_err_at is None or now - self.transport_err_at <= TRANSPORT_GRACE_S:
            return None
        said = {e.rank for e in errors}
        suspects = [r for r, state in self.states.items() if state.is_running and r not in said]
        if suspects:
            return RunOutcome(hung_text(self.coord, suspects), EXIT_FAILED)
        if all(not state.is_running for state in self.states.values()):
            return RunOutcome(failure_text(self.coord) or "transport failure", EXIT_FAILED)
        return None

    def _finished(self, now: float) -> bool:
        if all(not state.is_running for state in self.states.values()):
            self.all_exited_at = self.all_exited_at or now
            # Drain what the ranks wrote before exiting (bounded: a grandchild may hold a pipe open).
            if not self.group.open_pipes or now - self.all_exited_at > DRAIN_S:
                return True
        # A short grace for the others to report what they saw; then tear down.
        return self.failure is not None and self.fail_at is not None and now - self.fail_at > DRAIN_S


def stop_ranks(children: dict[int, Child], coord: Coordinator) -> None:
    """The user's stop, acted on at once (the TUI's `q` and `s` wait on it).

    A rank still starting (before its world joined: importing torch, loading the plan, blocked in
    the rendezvous, where a C++ wait does not even run Python's signal handler) has nothing to
    undo: it is killed. A rank past that gets SIGTERM now, so its abort runs while the launcher
    waits, not after the launcher's grace and the group's (1 s + 2 s: `q` during start-up took
    5.7 s, ended by the TUI's SIGKILL fallback). What a killed rank leaves in /dev/shm the launcher
    sweeps as it always does.
    """
    joined = RANK_PHASES.index("world joined")
    killed, told = [], []
    for rank, child in children.items():
        if child.poll() is not None:
            continue
        if coord.rank_phase.get(rank, -1) < joined:
            child.signal_group(signal.SIGKILL)
            killed.append(rank)
        else:
            child.signal_group(signal.SIGTERM)
            told.append(rank)
    parts = ([f"rank(s) {', '.join(map(str, killed))} killed while starting"] if killed else []) + (
        [f"rank(s) {', '.join(map(str, told))} told to abort (SIGTERM)"] if told else [])
    if parts:
        coord.sink(LogEvent(message="stop: " + "; ".join(parts), level="warn", source="replication"))


