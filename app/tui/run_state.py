"""The headless core of the Run screen: typed engine events folded into typed state.

Nothing here imports Textual. The stream reader thread applies events under a lock and the UI
reads the result when it repaints; keeping the fold out of the widgets means a burst of ten
thousand bucket events costs ten thousand small updates, not ten thousand repaints, and the whole
dashboard logic is testable without a terminal.

Events stay typed end to end: :meth:`RunState.apply` turns anything it is given (a typed event,
an ``UnknownEvent`` from a reader that had not imported the engine yet, a decoded dict) into the
engine's own event class once, then ``match``es on the class. What the panels draw is the source
of truth the engine itself reports:

* replication lanes are the SOURCE's window (rank 0 admits at most ``window`` buckets and a bucket
  leaves when rank 0's send completes), so the lanes never show more than the window; buckets the
  source has sent but the receivers have not all verified are a separate count;
* training progress is the step of the last merge (what the engine counts) plus the chunks done
  in the current round, never past the total before ``train.done``; the ETA is the measured rate
  of chunks between worker reports.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hwtui.core.events import ErrorEvent, Event, LogEvent, UnknownEvent, from_dict
from hwtui.core.terminal_text import clean
from hwtui.engine.cluster.events import BandwidthEvent, CorrectnessEvent, DoneEvent, MismatchEvent, NodeEvent
from hwtui.engine.replication.events import (
    RANK_PHASES,
    BucketState,
    ReplBucket,
    ReplCommit,
    ReplDone,
    ReplRanks,
    ReplSpan,
    ReplStart,
    ReplThroughput,
    ReplWindow,
)
from hwtui.engine.training.events import (
    TrainCheckpoint,
    TrainDone,
    TrainExport,
    TrainMerge,
    TrainStart,
    TrainWorker,
    TrainWorkerLost,
)

_ALARMING = re.compile(r"error|warn|traceback|exception|fatal|killed|not found|refused", re.IGNORECASE)
LOG_LINE_MAX = 4000  # characters of one log line (a traceback's line, a long path): the rest is "…"
HISTORY = 600  # points kept for the throughput and loss charts (10 min at 1 Hz)
SOURCE_RANK = 0  # the replication source: its window is the window
# Until the engine's own "done, ok" the bar stops short of full: "99.9%", never "100.0%".
FINISHING_FRACTION = 0.999


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def node_count(done: DoneEvent) -> int:
    """``cluster.done`` names the nodes (a list); streams from older versions gave a number."""
    nodes: Any = done.nodes
    return len(nodes) if isinstance(nodes, (list, tuple)) else int(nodes or 0)


def to_event(ev: Event | dict[str, Any]) -> Event:
    """The engine's own class for ``ev``: decoded dicts and ``UnknownEvent`` payloads are rebuilt once."""
    if isinstance(ev, dict):
        return from_dict(ev)
    if isinstance(ev, UnknownEvent):
        return from_dict(ev.payload) if ev.payload.get("kind") == ev.kind_name else ev
    return ev


@dataclass
class Replication:
    start: ReplStart | None = None
    states: dict[int, BucketState] = field(default_factory=dict)  # bucket_id -> world state
    lanes: list[int | None] = field(default_factory=list)  # the source's window: slot -> bucket_id
    sent: set[int] = field(default_factory=set)  # the source's send completed
    window: int = 0  # the source's current limit (adaptive mode moves it)
    peak_lanes: int = 0  # most lanes ever busy at once (== the source's peak_occupancy)
    nbytes: dict[int, int] = field(default_factory=dict)  # bucket_id -> its size, as the engine reported it
    throughput: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    peak_gbps: float = 0.0
    bytes_done: int = 0
    total_bytes: int = 0
    elapsed_s: float = 0.0
    commits: list[ReplCommit] = field(default_factory=list)
    done: ReplDone | None = None
    ranks: ReplRanks | None = None  # rank start-up as the launcher last reported it
    moving: bool = False  # the first bucket moved: start-up is over
    spans: int = 0  # repl.span timings received (kept out of the log)

    @property
    def starting_up(self) -> bool:
        """Ranks are still starting (the launcher reported them and no bucket has moved yet)."""
        return self.ranks is not None and not self.moving and self.done is None

    def ranks_text(self) -> str:
        """``"ranks ready 2/4 (world joined)"``: the launcher's own counts, never guessed from time."""
        rk = self.ranks
        if rk is None:
            return ""
        return f"ranks ready {rk.ready}/{rk.world_size} ({rk.phase})"

    def phase_counts(self) -> list[tuple[str, int]]:
        """Ranks that reached each start-up phase, in the engine's phase order (unknown phases last)."""
        counts = dict(self.ranks.counts) if self.ranks is not None else {}
        ordered = [(p, int(counts.pop(p, 0))) for p in RANK_PHASES]
        return ordered + [(str(p), int(n)) for p, n in counts.items()]

    @property
    def n_buckets(self) -> int:
        return self.start.n_buckets if self.start is not None else len(self.states)

    @property
    def occupancy(self) -> int:
        """Lanes busy now: the header counts the very lanes drawn below it, so the two always agree."""
        return sum(1 for b in self.lanes if b is not None)

    @property
    def bytes_in_flight(self) -> int:
        return sum(self.nbytes.get(b, 0) for b in self.lanes if b is not None)

    @property
    def bytes_verified(self) -> int:
        """Bytes of the buckets every rank verified (the world-level ``done``): what "buckets N/M" counts."""
        return sum(self.nbytes.get(b, 0) for b, s in self.states.items() if s is BucketState.DONE)

    @property
    def current_gbps(self) -> float | None:
        """The engine's last throughput sample; None before its first (never a made-up 0.00)."""
        return self.throughput[-1][1] if self.throughput else None

    @property
    def average_gbps(self) -> float | None:
        if self.done is not None:
            return self.done.gbps
        return self.bytes_done / self.elapsed_s / 1e9 if self.elapsed_s > 0 else None

    @property
    def awaiting_receivers(self) -> int:
        """Buckets the source has sent that the receivers are still receiving or verifying."""
        return sum(1 for b in self.sent if self.states.get(b) not in (BucketState.DONE, BucketState.FAILED))

    def count(self, state: BucketState | str) -> int:
        return sum(1 for s in self.states.values() if s == state)

    def _enter_window(self, bucket_id: int) -> None:
        if bucket_id in self.lanes or bucket_id in self.sent:
            return
        if None in self.lanes:
            self.lanes[self.lanes.index(None)] = bucket_id
        else:  # only if the engine broke its own bound; drawn, so a broken bound is visible
            self.lanes.append(bucket_id)
        self.peak_lanes = max(self.peak_lanes, sum(1 for b in self.lanes if b is not None))

    def _leave_window(self, bucket_id: int) -> None:
        self.sent.add(bucket_id)
        if bucket_id in self.lanes:
            self.lanes[self.lanes.index(bucket_id)] = None
            while len(self.lanes) > max(self.lanes_shown, 1) and self.lanes[-1] is None:
                self.lanes.pop()

    @property
    def lanes_shown(self) -> int:
        return self.start.window if self.start is not None else max(self.window, 1)


@dataclass
class WorkerRow:
    """One training worker as the table shows it (the last report merged over the start entry)."""

    rank: int
    device: str
    step: int = 0  # chunks this worker finished (cumulative)
    samples: int = 0
    samples_per_s: float = 0.0
    loss: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    lost: str = ""  # why it was lost; "" while it works


@dataclass
class Training:
    start: TrainStart | None = None
    workers: dict[int, WorkerRow] = field(default_factory=dict)
    loss: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=HISTORY))  # (step, mean loss)
    merges: list[TrainMerge] = field(default_factory=list)
    checkpoints: list[TrainCheckpoint] = field(default_factory=list)
    lost: list[TrainWorkerLost] = field(default_factory=list)
    done: TrainDone | None = None
    chunks_at_merge: float = 0.0  # chunks done when the last merge came: this round's progress starts there
    first_report: tuple[float, float] | None = None  # (t, chunks) of the first worker report: the rate's origin
    last_report: tuple[float, float] | None = None

    @property
    def steps(self) -> int:
        return self.start.steps if self.start is not None else 0

    @property
    def merged_step(self) -> int:
        return self.merges[-1].step if self.merges else 0

    @property
    def chunks_done(self) -> float:
        """Whole chunks' worth of samples the workers trained: at the end of a round a worker may
        train half a chunk (one optimizer step on half a batch), which counts as half."""
        if self.start is not None and self.start.batch_size > 0:
            return sum(w.samples for w in self.workers.values()) / self.start.batch_size
        return float(sum(w.step for w in self.workers.values()))

    @property
    def trained_step(self) -> float:
        """Steps the workers have trained: merged steps plus this round's chunks per worker."""
        n = max(len(self.workers), 1)
        in_round = max(self.chunks_done - self.chunks_at_merge, 0) / n
        if self.start is not None:  # a round is merge_every steps; requeued chunks never push past it
            in_round = min(in_round, float(self.start.merge_every))
        return min(self.merged_step + in_round, float(self.steps or "inf"))

    @property
    def step(self) -> float:
        """Progress in the engine's own count: trained steps, but "all" only once merged or done."""
        if self.done is not None and self.done.ok:
            return float(self.steps)
        if self.steps and self.merged_step >= self.steps:
            return float(self.merged_step)  # the engine merged the last round: all steps are done
        # Workers' reports alone never make it "all": the last round still has to merge.
        cap = self.steps - 1e-9 if self.steps else float("inf")
        return min(self.trained_step, cap)

    @property
    def finishing(self) -> bool:
        """The engine merged the last round and has not said done yet."""
        return self.done is None and bool(self.steps) and self.merged_step >= self.steps

    @property
    def shown_step(self) -> int:
        """The step the header shows; the loss line is labelled with the same number."""
        return int(self.step)

    def eta(self) -> float | None:
        """Seconds left at the measured rate of chunks between the first and the last worker report."""
        if self.done is not None:
            return 0.0
        if self.finishing:
            return None  # no rate covers shutting down
        if self.first_report is None or self.last_report is None or not self.steps:
            return None
        (t0, c0), (t1, c1) = self.first_report, self.last_report
        if t1 <= t0 or c1 <= c0:
            return None
        rate = (c1 - c0) / (t1 - t0)  # chunks per second, all workers together
        steps_per_s = rate / max(len(self.workers), 1)
        return max(self.steps - self.step, 0.0) / steps_per_s

    def shares(self) -> dict[int, float]:
        """Share of the work per rank: the last merge's shares, else samples done so far."""
        if self.merges:
            return dict(enumerate(self.merges[-1].shares))
        total = sum(w.samples for w in self.workers.values())
        return {r: (w.samples / total if total else 0.0) for r, w in self.workers.items()}


@dataclass
class Cluster:
    nodes: dict[int, NodeEvent] = field(default_factory=dict)
    mismatches: list[MismatchEvent] = field(default_factory=list)
    correctness: CorrectnessEvent | None = None
    bandwidth: list[BandwidthEvent] = field(default_factory=list)
    done: DoneEvent | None = None


class RunState:
    """Everything the dashboard shows about one engine run. Thread-safe via ``lock``."""

    def __init__(self, log_lines: int = 500):
        self.lock = threading.Lock()
        self.version = 0  # bumped on every change; the UI repaints only when it moved
        self.mode: str | None = None
        self.repl = Replication()
        self.train = Training()
        self.cluster = Cluster()
        self.log: deque[tuple[str, str]] = deque(maxlen=log_lines)  # (level, text)
        self.log_total = 0  # lines ever logged: lets the log widget append only what is new
        self.errors: list[str] = []
        self.exit_code: int | None = None
        self.stopped = False  # the user stopped it (not a failure, not a finished run)
        self.stderr_tail: deque[str] = deque(maxlen=40)  # held back: shown only if the engine fails
        self.phase = "starting the engine"  # what it is doing before the first figures arrive
        self.first_t: float | None = None
        self.last_t: float | None = None

    def _log(self, entry: tuple[str, str]) -> None:
        # Engine lines carry names from the weights and the network (a safetensors header's tensor
        # names, a peer's host name): ESC sequences in them reached the terminal through the log
        # (Textual writes a Text's characters as they are). One clean line each (core.terminal_text).
        level, text = entry
        self.log.append((level, clean(text, LOG_LINE_MAX)))
        self.log_total += 1

    def _outcome(self, ok: bool, text: str) -> None:
        """Log a phase's result; a failure is also an error, so it is shown, never only logged.

        After the user's stop, the engine reporting "FAILED" is that stop: a warning, not an error.
        """
        if ok:
            self._log(("info", text))
        else:
            self._error(text)

    def _finished_phase(self, ok: bool) -> str:
        return "done" if ok else ("stopped" if self.stopped else "failed")

    def _error(self, text: str) -> None:
        # After the user pressed stop, ranks dying of SIGTERM are the stop, not failures.
        if self.stopped:
            self._log(("warn", text))
        else:
            self.errors.append(clean(text, LOG_LINE_MAX))
            self._log(("error", text))

    # -- writers (reader thread) ----------------------------------------------------------
    def apply(self, ev: Event | dict[str, Any]) -> str:
        event = to_event(ev)
        with self.lock:
            self._apply(event)
            self.version += 1
        return event.kind if not isinstance(event, UnknownEvent) else event.kind_name

    def add_log(self, text: str, level: str = "info") -> None:
        with self.lock:
            if level == "error":
                self._error(text)
            else:
                self._log((level, text))
            self.version += 1

    def add_stderr(self, line: str) -> None:
        """The engine's human output: with ``--events -`` it repeats what the events already say.

        So it is not logged a second time; warnings and errors are (they may say what no event
        does), and the rest is kept as a tail that :meth:`finish` logs when the engine failed.
        """
        with self.lock:
            if _ALARMING.search(line) and not any(line.strip() in text for _, text in self.log):
                self._log(("stderr", line))
                self.version += 1
            else:
                self.stderr_tail.append(line)

    def mark_stopped(self) -> None:
        """The user asked for the stop: what follows (exit 143, killed ranks) is that stop."""
        with self.lock:
            self.stopped = True
            if self.done_ok is not True:
                self.phase = "stopping"
            self.version += 1

    def finish(self, exit_code: int) -> None:
        with self.lock:
            self.exit_code = exit_code
            if self.stopped:
                self._log(("warn", f"engine stopped by the user (exit status {exit_code})"))
                if self.done_ok is not True:
                    self.phase = "stopped"
            elif exit_code != 0:
                for line in self.stderr_tail:  # what the engine said last explains the failure
                    self._log(("stderr", line))
                self._error(f"engine exited with status {exit_code}")
            self.version += 1

    def _apply(self, ev: Event) -> None:
        if isinstance(ev.t, (int, float)):
            self.first_t = ev.t if self.first_t is None else min(self.first_t, ev.t)
            self.last_t = ev.t if self.last_t is None else max(self.last_t, ev.t)
        match ev:
            case ReplStart() | ReplRanks() | ReplBucket() | ReplWindow() | ReplThroughput() | ReplCommit() | ReplDone():
                self.mode = self.mode or "replicate"
                self._replication(ev)
            case ReplSpan():
                # Timing of steps the bucket states do not show (hash, copy, ...), for a timeline:
                # several per bucket and rank. Logged, they were dict dumps that pushed every
                # other line out of the log's last 500 within a few hundred buckets.
                self.mode = self.mode or "replicate"
                self.repl.spans += 1
            case TrainStart() | TrainWorker() | TrainMerge() | TrainCheckpoint() | TrainExport() | TrainWorkerLost() | TrainDone():
                self.mode = self.mode or "train"
                self._training(ev)
            case NodeEvent() | MismatchEvent() | CorrectnessEvent() | BandwidthEvent() | DoneEvent():
                self.mode = self.mode or "cluster"
                self._cluster(ev)
            case LogEvent(message=message, level=level, source=source):
                self._log((level, f"[{source}] {message}" if source else message))
                if level in ("error", "critical"):
                    self._error_only(message)
            case ErrorEvent(message=message, rank=rank, where=where):
                place = " ".join(x for x in (f"rank {rank}" if rank is not None else "", where) if x)
                self._error(f"{place}: {message}" if place else message)
            case UnknownEvent(kind_name=name, payload=payload):
                self._log(("debug", f"{name} {payload}"))
            case _:
                self._log(("debug", f"{ev.kind} {ev.to_dict()}"))

    def _error_only(self, text: str) -> None:
        if not self.stopped:
            self.errors.append(clean(text, LOG_LINE_MAX))

    # replication ---------------------------------------------------------------------------
    def _replication(self, ev: Event) -> None:
        r = self.repl
        match ev:
            case ReplStart():
                self.mode = "replicate"
                # A rank report may come before the start event: keep it.
                self.repl = Replication(start=ev, window=ev.window, total_bytes=ev.total_bytes, ranks=r.ranks)
                self.repl.states = {i: BucketState.PENDING for i in range(ev.n_buckets)}
                self.repl.lanes = [None] * max(ev.window, 1)
                self.phase = (r.ranks_text() if r.ranks is not None
                              else f"starting {ev.world_size} ranks (forming the world)")
                self._log(("info", f"replicating {ev.model} version {ev.version}: {ev.n_buckets} buckets, "
                                   f"{ev.world_size} ranks on {ev.device} via {ev.transport}"))
            case ReplRanks():
                r.ranks = ev
                if not r.moving and r.done is None:
                    self.phase = r.ranks_text()
            case ReplBucket():
                self._bucket(ev)
            case ReplWindow():
                # Only the limit: occupancy and bytes in flight are the lanes' own (the bucket
                # events and this one interleave, so copying its counts drew "3/4" over 4 busy lanes).
                r.window = ev.window
            case ReplThroughput():
                r.elapsed_s = ev.elapsed_s
                r.throughput.append((ev.elapsed_s, ev.gbps))
                r.peak_gbps = max(r.peak_gbps, ev.gbps)
                # The bytes the buckets say were verified are the floor: the bar never shows
                # less than "buckets N/M" does.
                r.bytes_done = max(ev.bytes_done or 0, r.bytes_verified)
                r.total_bytes = ev.total_bytes or r.total_bytes
            case ReplCommit():
                r.commits.append(ev)
                self._outcome(ev.ok, f"commit of version {ev.version} {ev.phase}: "
                                     f"{'ok' if ev.ok else 'FAILED'} {ev.detail}".rstrip())
            case ReplDone():
                r.done = ev
                r.bytes_done = ev.bytes or r.bytes_done
                r.elapsed_s = ev.seconds or r.elapsed_s
                self.phase = self._finished_phase(ev.ok)
                self._outcome(ev.ok, f"replication {'done' if ev.ok else 'FAILED'}: "
                                     f"{ev.gbps:.2f} GB/s average over {ev.seconds:.3g} s")

    def _bucket(self, ev: ReplBucket) -> None:
        r = self.repl
        bid, new = ev.bucket_id, BucketState(ev.state)
        self.phase = "transferring"
        r.moving = True
        if ev.nbytes > 0:
            r.nbytes[bid] = ev.nbytes
        if ev.rank == SOURCE_RANK:
            # The source's own stages drive the lanes: staged/inflight enter its window, its
            # "done" (the send completed) leaves it, whatever the receivers are doing.
            if new in (BucketState.STAGED, BucketState.INFLIGHT):
                r._enter_window(bid)
            elif new is BucketState.DONE:
                r._leave_window(bid)
        current = r.states.get(bid, BucketState.PENDING)
        if current is BucketState.FAILED:
            return
        if ev.rank is not None and new is not BucketState.FAILED:
            # A rank's own progress moves the bucket forward but never to done: the world-level
            # event (rank None) says done once every rank verified it.
            if new is BucketState.DONE or new.order <= current.order:
                return
        r.states[bid] = new
        if new is BucketState.DONE and ev.rank is None:
            r.bytes_done = max(r.bytes_done, r.bytes_verified)
        if new is BucketState.FAILED:
            self._error(f"bucket {bid} failed on rank {ev.rank if ev.rank is not None else '?'}")

    # training ------------------------------------------------------------------------------
    def _training(self, ev: Event) -> None:
        tr = self.train
        match ev:
            case TrainStart():
                self.mode = "train"
                self.train = Training(start=ev)
                for w in ev.workers:
                    rank = int(w.get("rank", len(self.train.workers)))
                    self.train.workers[rank] = WorkerRow(rank=rank, device=str(w.get("device", "?")))
                self.phase = f"starting {len(ev.workers)} workers (0/{len(ev.workers)} reported)"
                self._log(("info", f"training {ev.steps} steps on {len(self.train.workers)} workers "
                                   f"(balance {ev.balance}, merge every {ev.merge_every})"))
            case TrainWorker():
                row = tr.workers.setdefault(ev.rank, WorkerRow(rank=ev.rank, device=ev.device))
                row.device, row.step, row.samples, row.samples_per_s = ev.device, ev.step, ev.samples, ev.samples_per_s
                row.loss, row.mem_used, row.mem_total = ev.loss, ev.mem_used, ev.mem_total
                point = (ev.t, tr.chunks_done)
                tr.first_report = tr.first_report or point
                tr.last_report = point
                reported = sum(1 for w in tr.workers.values() if w.step > 0)
                self.phase = ("training" if reported == len(tr.workers)
                              else f"starting workers ({reported}/{len(tr.workers)} reported)")
                losses = [w.loss for w in tr.workers.values() if w.loss is not None]
                if losses:
                    step = tr.shown_step  # the header's step: "step 35/50" beside "loss step 35"
                    mean = sum(losses) / len(losses)
                    if tr.loss and tr.loss[-1][0] == step:
                        tr.loss[-1] = (step, mean)
                    else:
                        tr.loss.append((step, mean))
            case TrainMerge():
                before = tr.merged_step
                tr.merges.append(ev)
                tr.chunks_at_merge = tr.chunks_done
                if tr.loss and before < tr.loss[-1][0] < tr.shown_step:
                    # The round's last point was drawn while the step stayed short of the total
                    # (not all before the merge): it is this merge's step, as the header now says.
                    tr.loss[-1] = (tr.shown_step, tr.loss[-1][1])
                if tr.finishing:
                    self.phase = "finishing"
            case TrainCheckpoint():
                tr.checkpoints.append(ev)
                self._log(("info", f"checkpoint step {ev.step} -> {ev.path}"))
            case TrainExport(path=path, error=error):
                # A line, not a dump: the run's final --save-hf failure also comes as an error log event.
                what = f"export of round {ev.round} (step {ev.step})"
                self._log(("warning", f"{what} failed: {error}") if error else ("info", f"{what} -> {path}"))
            case TrainWorkerLost():
                tr.lost.append(ev)
                tr.workers.setdefault(ev.rank, WorkerRow(rank=ev.rank, device=ev.device)).lost = ev.reason or "lost"
                self._error(f"worker rank {ev.rank} ({ev.device}) lost: {ev.reason}; {ev.chunks_requeued} chunks requeued")
            case TrainDone():
                tr.done = ev
                self.phase = self._finished_phase(ev.ok)
                # 4 decimals, as the worker table and the merge rounds show losses ("3.000429391860962").
                loss = "-" if ev.final_loss is None else f"{ev.final_loss:.4f}"
                self._outcome(ev.ok, f"training {'done' if ev.ok else 'FAILED'}: {ev.samples} samples in "
                                     f"{ev.seconds:.1f} s, final loss {loss}")

    # cluster smoke test --------------------------------------------------------------------
    def _cluster(self, ev: Event) -> None:
        c = self.cluster
        match ev:
            case NodeEvent():
                c.nodes[ev.rank] = ev
                self._log(("info" if ev.ok else "error", f"node {ev.node} rank {ev.rank}: {ev.summary}"))
            case MismatchEvent():
                c.mismatches.append(ev)
                self._log(("warn", f"mismatch: {ev.finding.get('title', ev.finding)}"))
            case CorrectnessEvent():
                c.correctness = ev
                if not ev.ok:
                    self._error(f"all-reduce correctness: expected {ev.expected}, got {ev.got}")
            case BandwidthEvent():
                c.bandwidth.append(ev)
                self._log(("info", f"{ev.op} {_size(ev.size_bytes)}: algbw {ev.algbw:.2f} GB/s busbw {ev.busbw:.2f} GB/s"))
            case DoneEvent():
                c.done = ev
                self._log(("info" if ev.ok else "error",
                           f"cluster test {'passed' if ev.ok else 'FAILED'}: {ev.world_size} ranks on {node_count(ev)} nodes"))
                if not ev.ok:
                    failed = [f.get("title", "?") for f in ev.findings if f.get("status") in ("fail", "error")]
                    self._error_only("cluster test FAILED" + (f": {failed[0]}" if failed else ""))

    # -- readers (UI thread, under lock) -------------------------------------------------------
    @property
    def done_ok(self) -> bool | None:
        """The engine's own verdict (None until it gave one)."""
        done = self.repl.done or self.train.done or self.cluster.done
        return None if done is None else done.ok

    def progress(self) -> tuple[float, float | None, str]:
        """``(fraction 0..1, eta seconds or None, label)`` for the mode that is running.

        A run that ended without the engine's "ok" (stopped, failed) has no ETA: "ETA 00:00" beside
        a stopped bar read as "about to finish".
        """
        ended = self.exit_code is not None or self.stopped
        if self.mode == "replicate":
            r = self.repl
            total = r.total_bytes
            ok = r.done is not None and r.done.ok
            # All bytes moved is not done: verification and the commit follow (seconds, with --commit).
            frac = 1.0 if ok else min(r.bytes_done / total if total else 0.0, FINISHING_FRACTION)
            rate = r.bytes_done / r.elapsed_s if r.elapsed_s > 0 else 0.0
            eta: float | None = 0.0 if ok else ((total - r.bytes_done) / rate if rate > 0 else None)
            label = f"{_size(r.bytes_done)} / {_size(total)}"
            if not ok and (ended or r.done is not None):
                eta = None
                label += f"  {self.phase}"
            elif r.bytes_done == 0 and r.done is None:
                label += f"  {self.phase}"
            return min(frac, 1.0), eta, label
        if self.mode == "train":
            tr = self.train
            ok = tr.done is not None and tr.done.ok
            frac = 1.0 if ok else min(tr.step / tr.steps if tr.steps else 0.0, FINISHING_FRACTION)
            label = f"step {tr.shown_step} / {tr.steps} (merged {tr.merged_step})"
            eta = tr.eta()
            if not ok and (ended or tr.done is not None):
                eta = None
                label += f"  {self.phase}"
            elif tr.finishing:
                # The last round merged; the workers stop and the report is written (1-6 s on a
                # GPU box, with no events): not 100 % until the engine says done.
                frac, eta = min(frac, FINISHING_FRACTION), None
                label += "  finishing (workers stopping, writing the report)"
            elif tr.done is None and self.phase != "training":
                label += f"  {self.phase}"
            return min(frac, 1.0), eta, label
        if self.mode == "cluster":
            done = self.cluster.done is not None
            return (1.0 if done else 0.0), (0.0 if done else None), f"{len(self.cluster.nodes)} nodes reported"
        return 0.0, None, "waiting for the engine"

    @property
    def finished(self) -> bool:
        return self.exit_code is not None
