"""The headless core of the Run screen: engine events folded into plain state.

Nothing here imports Textual. The stream reader thread applies events under a lock and the UI
reads the result when it repaints; keeping the fold out of the widgets means a burst of ten
thousand bucket events costs ten thousand dict updates, not ten thousand repaints, and the whole
dashboard logic is testable without a terminal.

Events arrive in either typed form (an engine package registered its classes) or as
``UnknownEvent`` (it has not): :func:`normalize` turns both into ``(kind, fields)``.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# Bucket states in pipeline order; "failed" is terminal like "done".
BUCKET_STATES = ("pending", "staged", "inflight", "verifying", "done", "failed")
ACTIVE_STATES = {"staged", "inflight", "verifying"}
_ORDER = {state: i for i, state in enumerate(BUCKET_STATES)}
HISTORY = 600  # points kept for the throughput and loss charts (10 min at 1 Hz)


def normalize(ev: Any) -> tuple[str, dict[str, Any]]:
    """``(kind, fields)`` of a typed event, an ``UnknownEvent`` or an already-decoded dict."""
    if isinstance(ev, dict):
        return str(ev.get("kind", "event")), ev
    if type(ev).__name__ == "UnknownEvent" or getattr(ev, "kind", None) == "unknown":
        payload = dict(getattr(ev, "payload", {}) or {})
        return str(getattr(ev, "kind_name", payload.get("kind", "unknown"))), payload
    data = ev.to_dict() if hasattr(ev, "to_dict") else dict(vars(ev))
    return str(data.get("kind", getattr(ev, "kind", "event"))), data


def _num(value: Any, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _count(value: Any) -> Any:
    """``cluster.done`` names the nodes (a list); older streams gave a number."""
    return len(value) if isinstance(value, (list, tuple)) else (value if value is not None else "?")


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


@dataclass
class Replication:
    start: dict[str, Any] = field(default_factory=dict)
    states: dict[int, str] = field(default_factory=dict)  # bucket_id -> state
    lanes: list[int | None] = field(default_factory=list)  # window slot -> bucket_id
    window: int = 0
    occupancy: int = 0
    bytes_in_flight: int = 0
    throughput: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    peak_gbps: float = 0.0
    bytes_done: int = 0
    total_bytes: int = 0
    elapsed_s: float = 0.0
    commits: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None

    @property
    def n_buckets(self) -> int:
        return int(self.start.get("n_buckets") or len(self.states))

    @property
    def current_gbps(self) -> float:
        return self.throughput[-1][1] if self.throughput else 0.0

    @property
    def average_gbps(self) -> float:
        if self.done and self.done.get("gbps") is not None:
            return _num(self.done["gbps"])
        return self.bytes_done / self.elapsed_s / 1e9 if self.elapsed_s > 0 else 0.0

    def count(self, state: str) -> int:
        return sum(1 for s in self.states.values() if s == state)

    def _place(self, bucket_id: int, state: str) -> None:
        """Keep each active bucket in one window lane, so the lanes read like a pipeline."""
        if bucket_id in self.lanes:
            if state not in ACTIVE_STATES:
                self.lanes[self.lanes.index(bucket_id)] = None
                # Overflow lanes go away once they are free again: the window is the normal shape.
                while len(self.lanes) > max(self.window, 1) and self.lanes[-1] is None:
                    self.lanes.pop()
            return
        if state not in ACTIVE_STATES:
            return
        while len(self.lanes) < max(self.window, 1):
            self.lanes.append(None)
        if None in self.lanes:
            self.lanes[self.lanes.index(None)] = bucket_id
        else:  # more active buckets than the window: draw the overflow; it is worth seeing
            self.lanes.append(bucket_id)


@dataclass
class Training:
    start: dict[str, Any] = field(default_factory=dict)
    workers: dict[int, dict[str, Any]] = field(default_factory=dict)
    loss: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=HISTORY))  # (step, mean loss)
    merges: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    lost: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None

    @property
    def steps(self) -> int:
        return int(self.start.get("steps") or 0)

    @property
    def step(self) -> int:
        return max((int(w.get("step") or 0) for w in self.workers.values()), default=0)

    def shares(self) -> dict[int, float]:
        """Share of the work per rank: the last merge's shares, else samples done so far."""
        if self.merges and isinstance(self.merges[-1].get("shares"), (list, dict)):
            raw = self.merges[-1]["shares"]
            items = raw.items() if isinstance(raw, dict) else enumerate(raw)
            return {int(k): _num(v) for k, v in items}
        total = sum(_num(w.get("samples")) for w in self.workers.values())
        return {r: (_num(w.get("samples")) / total if total else 0.0) for r, w in self.workers.items()}


@dataclass
class Cluster:
    nodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    mismatches: list[Any] = field(default_factory=list)
    correctness: dict[str, Any] | None = None
    bandwidth: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None


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
        self.first_t: float | None = None
        self.last_t: float | None = None

    def _log(self, entry: tuple[str, str]) -> None:
        self.log.append(entry)
        self.log_total += 1

    def _outcome(self, ok: bool, text: str) -> None:
        """Log a phase's result; a failure is also an error, so it is shown, never only logged."""
        self._log(("info" if ok else "error", text))
        if not ok:
            self.errors.append(text)

    # -- writers (reader thread) ----------------------------------------------------------
    def apply(self, ev: Any) -> str:
        kind, data = normalize(ev)
        with self.lock:
            self._apply(kind, data)
            self.version += 1
        return kind

    def add_log(self, text: str, level: str = "info") -> None:
        with self.lock:
            self._log((level, text))
            if level == "error":
                self.errors.append(text)
            self.version += 1

    def finish(self, exit_code: int) -> None:
        with self.lock:
            self.exit_code = exit_code
            if exit_code != 0:
                msg = f"engine exited with status {exit_code}"
                self.errors.append(msg)
                self._log(("error", msg))
            self.version += 1

    def _apply(self, kind: str, d: dict[str, Any]) -> None:
        t = d.get("t")
        if isinstance(t, (int, float)):
            self.first_t = t if self.first_t is None else min(self.first_t, t)
            self.last_t = t if self.last_t is None else max(self.last_t, t)
        family = kind.split(".", 1)[0]
        if family in ("repl", "train", "cluster") and self.mode is None:
            self.mode = {"repl": "replicate"}.get(family, family)
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, d)
        elif kind == "log":
            level = str(d.get("level") or "info")
            src = f"[{d['source']}] " if d.get("source") else ""
            self._log((level, f"{src}{d.get('message', '')}"))
            if level in ("error", "critical"):
                self.errors.append(str(d.get("message", "")))
        elif kind == "error":
            where = " ".join(x for x in (f"rank {d['rank']}" if d.get("rank") is not None else "", str(d.get("where") or "")) if x)
            msg = f"{where}: {d.get('message', '')}" if where else str(d.get("message", ""))
            self.errors.append(msg)
            self._log(("error", msg))
        else:
            self._log(("debug", f"{kind} {d}"))

    # replication ---------------------------------------------------------------------------
    def _repl_start(self, d: dict[str, Any]) -> None:
        self.mode = "replicate"
        self.repl = Replication(start=dict(d), window=int(d.get("window") or 0), total_bytes=int(d.get("total_bytes") or 0))
        self.repl.states = {i: "pending" for i in range(int(d.get("n_buckets") or 0))}
        self.repl.lanes = [None] * max(self.repl.window, 1)
        self._log(("info", f"replicating {d.get('model', '?')} version {d.get('version', '?')}: "
                                 f"{d.get('n_buckets', '?')} buckets, {d.get('world_size', '?')} ranks on "
                                 f"{d.get('device', '?')} via {d.get('transport', '?')}"))

    def _repl_bucket(self, d: dict[str, Any]) -> None:
        bid, state = int(d.get("bucket_id", -1)), str(d.get("state", ""))
        current = self.repl.states.get(bid, "pending")
        if d.get("rank") is not None and state != "failed":
            # A rank's own progress moves the bucket forward but never to done: the world-level
            # event (rank None) says done once every rank verified it.
            if state == "done" or _ORDER.get(state, 0) <= _ORDER.get(current, 0):
                return
        if current == "failed":
            return
        self.repl.states[bid] = state
        self.repl._place(bid, state)
        if state == "failed":
            self.errors.append(f"bucket {bid} failed on rank {d.get('rank', '?')}")
            self._log(("error", self.errors[-1]))

    def _repl_window(self, d: dict[str, Any]) -> None:
        self.repl.window = int(d.get("window") or self.repl.window)
        self.repl.occupancy = int(d.get("occupancy") or 0)
        self.repl.bytes_in_flight = int(d.get("bytes_in_flight") or 0)

    def _repl_throughput(self, d: dict[str, Any]) -> None:
        gbps = _num(d.get("gbps"))
        r = self.repl
        r.elapsed_s = _num(d.get("elapsed_s"), r.elapsed_s)
        r.throughput.append((r.elapsed_s, gbps))
        r.peak_gbps = max(r.peak_gbps, gbps)
        r.bytes_done = int(d.get("bytes_done") or r.bytes_done)
        r.total_bytes = int(d.get("total_bytes") or r.total_bytes)

    def _repl_commit(self, d: dict[str, Any]) -> None:
        self.repl.commits.append(dict(d))
        ok = d.get("ok", True)
        self._outcome(ok, f"commit of version {d.get('version', '?')} {d.get('phase', '?')}: "
                                 f"{'ok' if ok else 'FAILED'} {d.get('detail', '')}".rstrip())

    def _repl_done(self, d: dict[str, Any]) -> None:
        self.repl.done = dict(d)
        if d.get("bytes"):
            self.repl.bytes_done = int(d["bytes"])
        if d.get("seconds"):
            self.repl.elapsed_s = _num(d["seconds"])
        ok = bool(d.get("ok"))
        self._outcome(ok, f"replication {'done' if ok else 'FAILED'}: "
                                 f"{_num(d.get('gbps')):.2f} GB/s average over {_num(d.get('seconds')):.3g} s")

    # training ------------------------------------------------------------------------------
    def _train_start(self, d: dict[str, Any]) -> None:
        self.mode = "train"
        self.train = Training(start=dict(d))
        for w in d.get("workers") or []:
            self.train.workers[int(w.get("rank", len(self.train.workers)))] = {**w, "step": 0, "samples": 0}
        self._log(("info", f"training {d.get('steps', '?')} steps on {len(self.train.workers)} workers "
                                 f"(balance {d.get('balance', '?')}, merge every {d.get('merge_every', '?')})"))

    def _train_worker(self, d: dict[str, Any]) -> None:
        rank = int(d.get("rank", -1))
        self.train.workers.setdefault(rank, {}).update(d)
        losses = [_num(w["loss"]) for w in self.train.workers.values() if w.get("loss") is not None]
        if losses:
            step = self.train.step
            if self.train.loss and self.train.loss[-1][0] == step:
                self.train.loss[-1] = (step, sum(losses) / len(losses))
            else:
                self.train.loss.append((step, sum(losses) / len(losses)))

    def _train_merge(self, d: dict[str, Any]) -> None:
        self.train.merges.append(dict(d))

    def _train_checkpoint(self, d: dict[str, Any]) -> None:
        self.train.checkpoints.append(dict(d))
        self._log(("info", f"checkpoint step {d.get('step', '?')} -> {d.get('path', '?')}"))

    def _train_lost(self, d: dict[str, Any]) -> None:
        self.train.lost.append(dict(d))
        w = self.train.workers.setdefault(int(d.get("rank", -1)), {})
        w["lost"] = d.get("reason") or "lost"
        msg = (f"worker rank {d.get('rank', '?')} ({d.get('device', '?')}) lost: {d.get('reason', '?')}; "
               f"{d.get('chunks_requeued', 0)} chunks requeued")
        self.errors.append(msg)
        self._log(("error", msg))

    def _train_done(self, d: dict[str, Any]) -> None:
        self.train.done = dict(d)
        ok = bool(d.get("ok"))
        self._outcome(ok, f"training {'done' if ok else 'FAILED'}: {d.get('samples', '?')} samples "
                                 f"in {_num(d.get('seconds')):.1f} s, final loss {d.get('final_loss', '?')}")

    # cluster smoke test --------------------------------------------------------------------
    def _cluster_node(self, d: dict[str, Any]) -> None:
        self.cluster.nodes[int(d.get("rank", len(self.cluster.nodes)))] = dict(d)
        self._log(("info" if d.get("ok") else "error", f"node {d.get('node', '?')} rank {d.get('rank', '?')}: {d.get('summary', '')}"))

    def _cluster_mismatch(self, d: dict[str, Any]) -> None:
        self.cluster.mismatches.append(d.get("finding"))
        f = d.get("finding") or {}
        text = f.get("title") if isinstance(f, dict) else str(f)
        self._log(("warn", f"mismatch: {text}"))

    def _cluster_correctness(self, d: dict[str, Any]) -> None:
        self.cluster.correctness = dict(d)
        if not d.get("ok"):
            self.errors.append(f"all-reduce correctness: expected {d.get('expected')}, got {d.get('got')}")
            self._log(("error", self.errors[-1]))

    def _cluster_bandwidth(self, d: dict[str, Any]) -> None:
        self.cluster.bandwidth.append(dict(d))
        self._log(("info", f"{d.get('op', '?')} {_size(int(d.get('size_bytes') or 0))}: "
                                 f"algbw {_num(d.get('algbw')):.2f} GB/s busbw {_num(d.get('busbw')):.2f} GB/s"))

    def _cluster_done(self, d: dict[str, Any]) -> None:
        self.cluster.done = dict(d)
        self._log(("info" if d.get("ok") else "error",
                         f"cluster test {'passed' if d.get('ok') else 'FAILED'}: {d.get('world_size', '?')} ranks on {_count(d.get('nodes'))} nodes"))
        if not d.get("ok"):
            failed = [f.get("title", "?") for f in d.get("findings") or [] if isinstance(f, dict) and f.get("status") in ("fail", "error")]
            self.errors.append("cluster test FAILED" + (f": {failed[0]}" if failed else ""))

    # -- readers (UI thread, under lock) -------------------------------------------------------
    def progress(self) -> tuple[float, float | None, str]:
        """``(fraction 0..1, eta seconds or None, label)`` for the mode that is running."""
        if self.mode == "replicate":
            r = self.repl
            total = r.total_bytes or int(r.start.get("total_bytes") or 0)
            frac = 1.0 if r.done and r.done.get("ok") else (r.bytes_done / total if total else 0.0)
            rate = r.bytes_done / r.elapsed_s if r.elapsed_s > 0 else 0.0
            eta = (total - r.bytes_done) / rate if rate > 0 and not r.done else (0.0 if r.done else None)
            return min(frac, 1.0), eta, f"{_size(r.bytes_done)} / {_size(total)}"
        if self.mode == "train":
            tr = self.train
            steps = tr.steps
            step = tr.step
            frac = 1.0 if tr.done and tr.done.get("ok") else (step / steps if steps else 0.0)
            elapsed = (self.last_t - self.first_t) if self.first_t is not None and self.last_t is not None else 0.0
            eta = None
            if tr.done:
                eta = 0.0
            elif step > 0 and elapsed > 0 and steps:
                eta = (steps - step) * elapsed / step
            return min(frac, 1.0), eta, f"step {step} / {steps}"
        if self.mode == "cluster":
            done = self.cluster.done is not None
            return (1.0 if done else 0.0), (0.0 if done else None), f"{len(self.cluster.nodes)} nodes reported"
        return 0.0, None, "waiting for the engine"

    @property
    def finished(self) -> bool:
        return self.exit_code is not None


_HANDLERS = {
    "repl.start": RunState._repl_start,
    "repl.bucket": RunState._repl_bucket,
    "repl.window": RunState._repl_window,
    "repl.throughput": RunState._repl_throughput,
    "repl.commit": RunState._repl_commit,
    "repl.done": RunState._repl_done,
    "train.start": RunState._train_start,
    "train.worker": RunState._train_worker,
    "train.merge": RunState._train_merge,
    "train.checkpoint": RunState._train_checkpoint,
    "train.worker_lost": RunState._train_lost,
    "train.done": RunState._train_done,
    "cluster.node": RunState._cluster_node,
    "cluster.mismatch": RunState._cluster_mismatch,
    "cluster.correctness": RunState._cluster_correctness,
    "cluster.bandwidth": RunState._cluster_bandwidth,
    "cluster.done": RunState._cluster_done,
}

