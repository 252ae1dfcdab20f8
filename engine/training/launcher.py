"""The coordinator: starts one worker per device, owns the chunk queue, runs merge rounds, recovers.

It runs in the ``hwtui train`` process and is single-threaded: one loop waits on every worker's
answer pipe (one :class:`hwtui.core.supervisor.Group`), handles the messages, judges liveness and
serves the requests that can be served. All decisions (which chunk, when to merge, who writes the
checkpoint, when a worker is lost) are made here, so accounting is exact without distributed
locking. The TCPStore the gloo groups rendezvous on is hosted here too, so it outlives any worker.
Pieces live beside it: ``workers`` (a worker process as the coordinator sees it), ``schedule``
(pure scheduling decisions), ``resume`` (resume checks and the recorded chunk assignment),
``config`` (the frozen run and worker configs).

The run moves through :class:`Phase`: STARTING (workers import torch, build, say hello) ->
TRAINING <-> MERGING (once per round) -> FINISHING (the last round's writer reports) -> done.

Round protocol (generation ``gen`` = one incarnation of the gloo group over the live workers):

1. Workers claim chunks until the round's chunks are all done (a request with nothing to hand
   out simply waits: the reply is deferred, not polled for). A worker asks for its next chunk
   while it trains the current one (``prefetch``: one chunk ahead, granted under the same
   end-of-round rule as any claim), so no chunk starts with a round trip through this loop; it
   reports a finished chunk with its next claim, or with ``done`` when a claim is already out.
2. Every live worker gets ``merge`` with its sample count; each all-reduces (and, with
   ``--merge outer-nesterov``, proposes the outer step) and answers ``reduced`` (or ``merge_failed``).
3. All reduced in the current generation -> ``commit`` (on evaluation rounds every worker then
   evaluates its own pre-merge copy and reports ``evaluated``; on evaluation and checkpoint
   rounds the round's slowest worker also evaluates the merged model / writes the checkpoint and
   reports ``merged``; the ``train.merge`` event goes out when those reports are in).
   Anything else -> the round is aborted: workers keep their own weights, a new generation is
   formed, chunks a lost worker had touched this round are trained again by the survivors, and
   the merge is retried.

A worker that reports a non-finite loss or weight (``diverged``) ends the run as failed at once:
that round is never committed, so no checkpoint of it exists and ``latest.json`` keeps naming the
last good one.

Held-out evaluation (each worker's own copy as it was before the merge, the merged model) costs
compute on every device, so it runs only every ``eval_every`` rounds and on the last one
(``--eval-every``); other rounds merge without it and their ``train.merge`` event carries no
losses. All of it happens after the commit: the all-reduce never waits for a slow device's
evaluation (the others train the next round meanwhile), and the last round's evaluations fall
after the run's timed training (``t_train`` to the last commit, the report's ``train_seconds``).
"""

from __future__ import annotations

import enum
import signal
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from hwtui.core.events import ErrorEvent, EventSink, LogEvent

if TYPE_CHECKING:
    from hwtui.engine.training.report import TrainReport
from hwtui.core.supervisor import Group, exit_text
from hwtui.engine.training import knobs, resume, worker_fork
from hwtui.engine.training.config import TrainConfig, TrainingError, WorkerConfig
from hwtui.engine.training.events import (
    TrainCheckpoint,
    TrainDone,
    TrainExport,
    TrainMerge,
    TrainStart,
    TrainWorker,
    TrainWorkerLost,
)
from hwtui.engine.training.health import Liveness
from hwtui.engine.training.queue import ChunkQueue, Unit, unit_from_message, unit_message, unit_samples
from hwtui.engine.training.schedule import (
    DEFER,
    GRANT,
    HALF,
    RECENT_CHUNKS,
    chunk_estimate,
    idle_parts,
    idle_shares,
    is_eval_round,
    tail_choice,
)
from hwtui.engine.training.workers import MAX_AHEAD, WorkerState, start_worker

__all__ = ["Coordinator", "Phase", "TrainConfig", "TrainingError", "is_eval_round"]


class Phase(enum.Enum):
    STARTING = "starting"
    TRAINING = "training"
    MERGING = "merging"
    FINISHING = "finishing"


class Coordinator:
    def __init__(self, cfg: TrainConfig, sink: EventSink):
        self.cfg, self.sink = cfg, sink
        self.workers: list[WorkerState] = []
        self.group = Group()
        self.queue = ChunkQueue(cfg.balance)
        self.live = Liveness(cfg.heartbeat_timeout, cfg.stall_timeout)
        self.gen = 0
        self.phase = Phase.STARTING
        self.round = 0
        self.step = 0
        self.round_steps = 0
        self.round_started = 0.0
        self.replaying = False  # this round trains a recorded assignment
        self.samples_committed = 0
        self.samples_discarded = 0
        self.rounds: list[dict[str, Any]] = []
        self.assignments: resume.Assignment = {}  # every committed round: rank -> chunks
        self.replay: resume.Assignment = {r: dict(a) for r, a in cfg.replay.items()}
        self.checkpoints: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.failure: str | None = None  # why the run must end as failed (a worker diverged)
        self.final_loss: float | None = None
        self.awaiting_round: int | None = None  # the last committed round whose evaluations/checkpoint are still out
        self.awaiting: set[int] = set()  # ranks whose report on it (evaluated / merged) has not come yet
        self.t0 = time.monotonic()
        self.t_train: float | None = None
        self.init_from: str | None = None
        self.resumed_from: dict[str, Any] | None = None
        self.resume_point: resume.ResumePoint | None = None
        self.weights: dict[int, float] = {}
        self.params = cfg.model.param_count()
        self.fingerprint: str | None = None
        self.t_done = 0.0
        self.merge_gen = -1
        self.round_wall = 0.0
        self.merge_started = 0.0
        self.halves_knob = knobs.halves()
        self.saved_hf: dict[str, Any] | None = None  # --save-hf: what the last round's writer reported
        self.configured = False  # every worker was sent its config (so each may hold work to finish)

    # -- public -----------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason

    def run(self) -> TrainReport:
        self._prepare_resume()
        timeout = self._store_timeout()  # before any worker starts: the store is started after them
        ok = False
        try:
            self._spawn(timeout)
            ok = self._loop()
        except TrainingError as exc:
            self.sink(ErrorEvent(message=str(exc), where="startup"))
            self.sink(TrainDone(ok=False, seconds=round(time.monotonic() - self.t0, 3), samples=self.samples_committed,
                                final_loss=self.final_loss, report=None))
            raise
        finally:
            self._shutdown()
        from hwtui.engine.training.report import build_report

        if ok and self.cfg.save_hf and not (self.saved_hf or {}).get("ok"):
            ok = False  # the model asked for was not written: the run did not deliver
            if self.saved_hf is None:
                self.saved_hf = {"path": self.cfg.save_hf, "ok": False, "error": "the last round's writer never reported"}
        report = build_report(self)
        self.sink(TrainDone(ok=ok, seconds=round(time.monotonic() - self.t0, 3), samples=self.samples_committed,
                            final_loss=self.final_loss, report=report))
        report["ok"] = ok
        return report

    # -- setup ------------------------------------------------------------------------------------
    def _prepare_resume(self) -> None:
        cfg = self.cfg
        if not cfg.resume:
            return
        point = resume.load(cfg)
        self.resume_point = point
        self.init_from = point.path
        self.resumed_from = point.describe()
        self.step, self.round = point.step, point.round
        self.queue.next_chunk = point.next_chunk
        self.samples_committed = point.samples
        # Rounds up to the checkpoint stay in the log this run keeps writing; later ones are replayed.
        recorded = resume.read_assignments(f"{cfg.checkpoint_dir}/{resume.ASSIGNMENTS}")
        self.assignments = {r: a for r, a in recorded.items() if r <= point.round}
        self.replay = {**point.replay, **self.replay}  # an explicit --replay-assignment wins

    def _store_timeout(self) -> timedelta:
        # The store takes its timeout as C milliseconds: a config that reached here unchecked
        # (`hwtui train` bounds it to 7 days) is one clear line, not an OverflowError (exit 3).
        try:
            return timedelta(seconds=self.cfg.group_timeout)
        except OverflowError:
            raise TrainingError(f"group timeout {self.cfg.group_timeout:g} s is beyond what the store takes; "
                                "give at most 7 days (604800 s)") from None

    def _start_store(self, timeout: timedelta) -> None:
        import torch.distributed as dist

        try:
            self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
        except OverflowError:
            raise TrainingError(f"group timeout {self.cfg.group_timeout:g} s is beyond what the store takes; "
                                "give at most 7 days (604800 s)") from None

    def _spawn(self, store_timeout: timedelta) -> None:
        """Start every worker, then the store, then send each its config (which names the store).

        In that order because CPU workers fork from this process (worker_fork), and the store's
        server thread would make it a process with threads, which is never forked. A worker
        waits for its config on stdin, so nothing it does depends on the store before then.
        """
        refusal = worker_fork.prepare(self.cfg)
        for rank, ref in enumerate(self.cfg.devices):
            w = start_worker(rank, ref, self.cfg.cpu_threads, refusal)
            self.group.add(w.child)
            self.workers.append(w)
            self.live.add(rank)
            self.sink(LogEvent(message=f"worker {rank} ({w.device}) {w.start_mode}", level="debug", source="train.launch"))
        self._start_store(store_timeout)
        for w in self.workers:
            w.send(WorkerConfig.for_rank(self.cfg, w.rank, w.ref, self.store.port, self.init_from).to_message())
        self.configured = True

    # -- plumbing ---------------------------------------------------------------------------------
    def alive(self) -> list[WorkerState]:
        return [w for w in self.workers if w.alive]

    def _by_child(self, child: Any) -> WorkerState:
        return next(w for w in self.workers if w.child is child)

    def _pump(self, timeout: float) -> None:
        for m in self.group.poll(timeout):
            w = self._by_child(m.child)
            if m.msg is not None:
                self._handle(w, m.msg)
            elif w.alive:  # its answer pipe closed: it exited (or is about to)
                code = w.child.poll()
                if code is None:
                    try:
                        code = w.child.wait(timeout=5)
                    except Exception:
                        code = None
                self._lost(w, _exit_reason(code))

    # -- messages ---------------------------------------------------------------------------------
    def _handle(self, w: WorkerState, msg: dict[str, Any]) -> None:
        kind = msg.get("kind")
        if not w.alive:
            return
        self.live.seen(w.rank, progress=kind != "hb")
        if kind == "hb":
            w.mem_used, w.mem_total = msg.get("mem_used"), msg.get("mem_total")
            return
        if kind == "hello":
            w.hello = msg
            w.mem_used, w.mem_total = msg.get("mem_used"), msg.get("mem_total")
            return
        if kind in ("refuse", "error"):
            if self.phase is Phase.STARTING:
                text = str(msg.get("message"))
                raise TrainingError(text if text.startswith(w.device) else f"{w.device}: {text}")
            self.sink(ErrorEvent(message=f"{w.device}: {msg.get('message')}", rank=w.rank, where="worker"))
            return  # its exit follows; _lost handles it
        if kind == "diverged":
            self._diverged(w, msg)
            return
        if kind in ("merged", "evaluated"):
            self._round_report(w, msg)
            return
        if kind == "done":  # a report only (its claim is already out): no answer expected
            self._chunk_done(w, msg["done"])
            return
        if kind == "claim" and msg.get("done"):
            self._chunk_done(w, msg["done"])
        if kind == "regroup_failed" and msg.get("gen") == self.gen:
            self.gen += 1  # the rendezvous failed for everyone: form another generation
        if kind in ("merge_failed", "reduced"):
            w.in_merge = False
        if kind in ("claim", "reduced", "merge_failed", "regroup_failed"):  # requests that await our answer
            w.pending = msg

    def _diverged(self, w: WorkerState, msg: dict[str, Any]) -> None:
        """A worker hit a NaN/inf: the run stops as failed, this round is never merged or saved."""
        if self.failure:
            return
        where = f"chunk {msg['chunk']}, " if msg.get("chunk") is not None else ""
        kept = self.checkpoints[-1]["path"] if self.checkpoints else (self.init_from or "none")
        self.failure = (f"worker {w.rank} ({w.device}) diverged: {msg.get('what')} is {msg.get('value')} at its step "
                        f"{msg.get('worker_step')} ({where}round {self.round}, merged model at step {self.step}); "
                        f"round not merged, no checkpoint written (last good checkpoint: {kept}); "
                        f"try a lower --lr")

    def _chunk_done(self, w: WorkerState, done: dict[str, Any]) -> None:
        unit = unit_from_message(done)
        self.queue.complete(w.rank, unit)
        w.held.remove(unit)
        w.started_at = time.monotonic()  # its prefetched chunk (if any) starts now
        samples = unit_samples(unit, self.cfg.batch_size)
        w.samples += samples
        w.busy_samples += samples
        w.chunks_done += 1
        w.busy_seconds += done["seconds"]
        w.round_busy += done["seconds"]
        now = time.monotonic()
        w.round_first = done.get("start", now) if w.round_first is None else w.round_first
        w.round_last = done.get("end", now)
        if isinstance(unit, int):  # a half batch does not take half the time exactly: speeds come from whole chunks
            w.recent.append(done["seconds"])
            if len(w.recent) > RECENT_CHUNKS:
                w.recent.popleft()
            w.chunk_time = chunk_estimate(w.recent)
        w.losses.append(done["loss"])
        if time.monotonic() - w.last_emit >= self.cfg.telemetry_interval:
            self._emit_worker(w)

    def _emit_worker(self, w: WorkerState) -> None:
        w.last_emit = time.monotonic()
        wall = max(1e-9, w.last_emit - (self.t_train or w.last_emit))
        self.sink(TrainWorker(rank=w.rank, device=w.device, step=w.chunks_done, samples=w.samples,
                              samples_per_s=round(w.samples / wall, 2) if self.t_train else 0.0,
                              loss=w.losses[-1] if w.losses else None, mem_used=w.mem_used, mem_total=w.mem_total,
                              chunks_claimed=w.chunks_claimed))

    def _round_report(self, w: WorkerState, msg: dict[str, Any]) -> None:
        """A worker's report on a committed round, sent after the commit: ``evaluated`` (the
        held-out loss of its own copy before the merge) or, from the round's writer, ``merged``
        (that, plus the merged model's loss and the checkpoint it wrote). The round's merge event
        goes out once every report it waits for is in."""
        rnd = msg["round"]
        record = next((r for r in self.rounds if r["round"] == rnd), None)
        if record is None:
            return
        if msg.get("loss_local") is not None:
            record["loss_workers"][str(w.rank)] = msg["loss_local"]
            record["loss_workers"] = dict(sorted(record["loss_workers"].items()))
        if msg["kind"] == "merged":
            record["loss_merged"] = msg.get("loss_merged")
            if record["loss_merged"] is not None:
                self.final_loss = record["loss_merged"]
            if msg.get("exported") or msg.get("export_error"):
                self._exported(rnd, record["step"], msg)
            if msg.get("checkpoint"):
                entry = {"path": msg["checkpoint"], "step": record["step"], "round": rnd, "written_by": w.device}
                self.checkpoints.append(entry)
                self.sink(TrainCheckpoint(path=msg["checkpoint"], step=record["step"], round=rnd))
        if self.awaiting_round == rnd:
            self.awaiting.discard(w.rank)
            self._emit_merge_when_reported()

    def _exported(self, rnd: int, step: int, msg: dict[str, Any]) -> None:
        """The round's writer exported the merged model (or failed to): --save-hf's record, and a
        train.export event for whoever pushes it (--push-to)."""
        final = step >= self.cfg.steps
        if final and self.cfg.save_hf:
            self.saved_hf = {"path": msg.get("exported") or self.cfg.save_hf, "ok": bool(msg.get("exported")),
                             "error": msg.get("export_error")}
            self.sink(LogEvent(message=f"--save-hf: wrote {msg['exported']}" if msg.get("exported") else
                               f"--save-hf {self.cfg.save_hf} failed: {msg['export_error']}",
                               level="info" if msg.get("exported") else "error", source="train"))
        self.sink(TrainExport(round=rnd, step=step, path=msg.get("exported"), error=msg.get("export_error"), final=final))

    def _export_path(self, last: bool) -> str | None:
        """Where this round's writer exports the merged model: --save-hf at the last round, else a
        directory of its own under export_dir on --push-to's rounds (and at the end)."""
        cfg = self.cfg
        if last and cfg.save_hf:
            return cfg.save_hf
        if cfg.export_dir and (last or (cfg.export_every and self.round % cfg.export_every == 0)):
            return f"{cfg.export_dir}/round-{self.round}"
        return None

    def _emit_merge_when_reported(self) -> None:
        if self.awaiting_round is None or self.awaiting:
            return
        record = next(r for r in self.rounds if r["round"] == self.awaiting_round)
        losses = list(record["loss_workers"].values())
        record["loss_workers_mean"] = sum(losses) / len(losses) if losses else None
        self.awaiting_round = None
        self.sink(TrainMerge(round=record["round"], step=record["step"], shares=record["shares"],
                             loss_merged=record["loss_merged"], loss_workers_mean=record["loss_workers_mean"]))

    # -- health -----------------------------------------------------------------------------------
    def _check_health(self) -> None:
        for w in self.alive():
            code = w.exit_code()
            if code is not None:
                self._lost(w, _exit_reason(code))
                continue
            if w.hello is None:
                continue  # still importing torch / building: the startup timeout covers it
            reason = self.live.verdict(w.rank, holds_work=bool(w.held) or w.in_merge)
            if reason:
                w.child.kill()  # a hung process cannot be asked nicely
                self._lost(w, reason)

    def _lost(self, w: WorkerState, reason: str) -> None:
        if not w.alive or self.failure:
            return
        if self.phase is Phase.STARTING:
            raise TrainingError(f"{w.device} failed to start: {reason}")
        unstarted = set(w.held[1:])  # granted ahead, never begun: requeued, not counted as a training
        w.alive, w.lost_reason, w.pending, w.held, w.in_merge = False, reason, None, [], False
        self.live.remove(w.rank)
        back = self.queue.release(w.rank, unstarted)
        trained = sum(unit_samples(u, self.cfg.batch_size) for u in back
                      if self.queue.chunks[u].attempts[-1]["outcome"] == "lost-after-training")
        w.requeued = len(back)
        # Its unmerged work died with it: those samples are counted as discarded, not as trained.
        w.samples_discarded += trained
        w.samples -= trained
        self.samples_discarded += trained
        self.gen += 1  # the gloo group that included it is broken for good
        self.awaiting.discard(w.rank)  # its report on the last round will not come
        self._emit_merge_when_reported()
        self.sink(TrainWorkerLost(rank=w.rank, device=w.device, reason=reason, chunks_requeued=len(back)))
        w.child.signal_group(signal.SIGKILL)  # whatever it left behind goes too

    # -- scheduling -------------------------------------------------------------------------------
    def _start(self) -> None:
        cfg = self.cfg
        if cfg.balance == "static":
            self.weights = {w.rank: float((w.hello or {}).get("calibration") or 1.0) for w in self.workers}
        prints = {(w.hello or {}).get("fingerprint") for w in self.workers}
        if len(prints) > 1:
            raise TrainingError("workers see different standard-library text (different Python installs via "
                                "HWTUI_PYTHON_*); every worker must train on the same corpus")
        self.fingerprint = prints.pop()
        if self.resume_point and self.resume_point.fingerprint not in (None, self.fingerprint):
            raise TrainingError(f"--resume: {self.resume_point.path} was trained on another Python's standard library "
                                f"(corpus {self.resume_point.fingerprint}, here {self.fingerprint})")
        hello0 = self.workers[0].hello or {}
        self.params = hello0.get("params", self.params)
        self.sink(LogEvent(message=f"corpus: {hello0.get('corpus')}", source="train"))
        self.sink(TrainStart(workers=[{"rank": w.rank, "device": w.device, "vendor": w.ref.vendor, "name": w.ref.name}
                                      for w in self.workers], steps=cfg.steps, batch_size=cfg.batch_size,
                             balance=cfg.balance, merge_every=cfg.merge_every, params=self.params,
                             start_step=self.step))
        self.phase = Phase.TRAINING
        self.t_train = time.monotonic()
        self._next_round()

    def _next_round(self) -> None:
        self.round += 1
        self.round_steps = min(self.cfg.merge_every, self.cfg.steps - self.step)
        ranks = [w.rank for w in self.alive()]
        recorded = self.replay.get(self.round)
        self.replaying = self.queue.start_round(self.round, self.round_steps * len(ranks), ranks, self.weights, recorded)
        if recorded is not None and not self.replaying:
            self.sink(LogEvent(message=f"round {self.round}: the recorded assignment does not fit this round "
                                       f"(other chunks or workers); balancing as usual", level="warning", source="train"))
        self.round_started = time.monotonic()
        for w in self.workers:
            w.round_busy, w.round_first, w.round_last = 0.0, None, None

    def _advance(self) -> None:
        if self.phase is Phase.STARTING:
            if not all(w.hello for w in self.workers):
                return
            self._start()
        alive = self.alive()
        if self.phase is Phase.MERGING:
            if not all(w.pending_kind in ("reduced", "merge_failed") for w in alive):
                return  # still inside the collective (a dead peer surfaces there within milliseconds)
            if all(w.pending_kind == "reduced" and w.gen == self.gen for w in alive) and self.merge_gen == self.gen:
                self._commit(alive)
                return
            if self.merge_gen == self.gen:
                self.gen += 1  # a collective failed with everyone alive (network, timeout): new group all the same
            self.phase = Phase.TRAINING  # requeued chunks (if any) are trained again, then the merge is retried
            self.sink(LogEvent(message=f"round {self.round}: merge aborted, regrouping as generation {self.gen}",
                               level="warning", source="train"))
        if self.phase is not Phase.TRAINING:
            return
        for w in alive:
            if w.pending is None:
                continue
            if w.gen != self.gen:
                group = [x.rank for x in alive]
                w.reply({"kind": "regroup", "gen": self.gen, "group_rank": group.index(w.rank), "world_size": len(group)})
                w.gen = self.gen
            elif w.pending_kind == "claim":
                self._grant(w, alive)
        if self.queue.complete() and all(w.pending_kind == "claim" and w.gen == self.gen for w in alive):
            self._begin_merge(alive)

    def _grant(self, w: WorkerState, alive: list[WorkerState]) -> None:
        """Answer ``w``'s claim with as many units as it asked to hold (``ahead``: one chunk
        beyond the one training, more when its chunks are short), each decided by the end-of-round
        rule; a claim nothing can be granted to waits."""
        ahead = max(1, min(MAX_AHEAD, int((w.pending or {}).get("ahead") or 1)))
        cap = 1 + ahead  # held: the unit training and those ahead of it
        most = 1 if ahead == 1 else cap  # one chunk ahead: one per claim, as before
        units: list[Unit] = []
        while len(w.held) < cap and len(units) < most and (answer := self._tail(w, alive)) != DEFER:
            unit = self.queue.claim(w.rank, split=answer == HALF)
            if unit is None:
                break
            if not w.held:
                w.started_at = time.monotonic()
            w.held.append(unit)
            w.chunks_claimed += 1
            units.append(unit)
            if answer == HALF:
                break  # the tail: pieces go one at a time
        if len(units) == 1:
            w.reply({"kind": "chunk", **unit_message(units[0])})
        elif units:
            w.reply({"kind": "chunks", "units": [unit_message(u) for u in units]})

    def _tail(self, w: WorkerState, alive: list[WorkerState]) -> str:
        """Grant ``w``'s claim, grant half a chunk, or hold it back (dynamic balance, not replaying)."""
        if self.cfg.balance != "dynamic" or self.replaying:
            return GRANT
        pending = self.queue.pending_fractions(w.rank)
        halves = self.cfg.batch_size >= 2  # a half must hold at least one sample
        answer = tail_choice(w, alive, pending, time.monotonic(), halves=halves)
        if answer == GRANT and halves and pending == [1.0] and self.halves_knob:
            return HALF  # the test-only knob: every round's last chunk in halves (the timing cannot be relied on)
        return answer

    def _begin_merge(self, alive: list[WorkerState]) -> None:
        self.phase, self.merge_gen = Phase.MERGING, self.gen
        self.merge_started = time.monotonic()
        self.round_wall = self.merge_started - self.round_started
        samples_by = self.queue.samples_by(self.cfg.batch_size)
        for w in alive:
            w.in_merge = True
            w.reply({"kind": "merge", "round": self.round, "gen": self.gen, "samples": samples_by.get(w.rank, 0)})

    def _commit(self, alive: list[WorkerState]) -> None:
        cfg = self.cfg
        samples_by = self.queue.samples_by(cfg.batch_size)
        total = sum(samples_by.values())
        self.step += self.round_steps
        self.samples_committed += total
        record = self.queue.round_record(cfg.batch_size) | {
            "step": self.step, "gen": self.gen, "samples": total, "replayed": self.replaying,
            "shares": [round(samples_by.get(w.rank, 0) / total, 6) if total else 0.0 for w in self.workers],
            "seconds": round(self.round_wall, 4),
            "merge_seconds": round(time.monotonic() - self.merge_started, 4),  # the all-reduce, up to the commit
            "idle": idle_shares({w.rank: w.round_busy for w in alive}, self.round_wall),
            "idle_parts": idle_parts(alive, self.round_started, self.round_started + self.round_wall),
            "loss_workers_mean": None, "loss_workers": {},  # reported after the commit (_round_report)
            "loss_merged": None, "t": round(time.monotonic() - self.t0, 3),
            "train_t": round(time.monotonic() - (self.t_train or self.t0), 3),  # on the train_seconds clock
        }
        self.rounds.append(record)
        self.assignments[self.round] = self.queue.assignment()
        if cfg.checkpoint_dir:  # before any checkpoint of this round can exist: a resume replays it
            resume.write_assignments(cfg.checkpoint_dir, cfg.seed, self.assignments)
        last = self.step >= cfg.steps
        evaluate = is_eval_round(self.round, last, cfg.eval_every)
        ckpt = None
        if cfg.checkpoint_dir and (last or self.round % max(1, cfg.checkpoint_every) == 0):
            ckpt = {"dir": cfg.checkpoint_dir, "step": self.step, "keep": cfg.keep_checkpoints, "manifest": self._manifest()}
        # The slowest worker of the round evaluates the merged model and writes the checkpoint: the
        # throughput lost while it does is smallest there (the others keep claiming chunks).
        # On an evaluation round every worker evaluates its own copy too -- after the commit, not
        # before the all-reduce: there a slow device's evaluation held the collective (and every
        # faster device) back, and on the last round it was inside the run's timed training.
        # A round with neither evaluation nor checkpoint needs no writer: its merge event goes out now.
        export = self._export_path(last)
        writer = min(alive, key=lambda w: (samples_by.get(w.rank, 0), w.rank)) if evaluate or ckpt or export else None
        # A run on one device has no workers' mean to compare with: its own copy is not evaluated
        # (the merged model is). Evaluations before the last round are telemetry, and with a small
        # batch --eval-windows can cost several rounds of training: they use at most the windows
        # one round trains on (merge_every x batch_size, forward only: about a third of a round's
        # work). The last round's, which give the final loss, use every --eval-windows.
        local = evaluate and len(cfg.devices) > 1
        windows = cfg.eval_windows if last else min(cfg.eval_windows, cfg.merge_every * cfg.batch_size)
        self.awaiting_round = self.round
        self.awaiting = {w.rank for w in alive} if local else ({writer.rank} if writer else set())
        for w in alive:
            w.reply({"kind": "commit", "writer": w is writer, "evaluate": evaluate, "evaluate_local": local,
                     "eval_windows": windows, "checkpoint": ckpt if w is writer else None,
                     "export": export if w is writer else None})
        self._emit_merge_when_reported()
        for w in alive:
            self._emit_worker(w)
        if last:
            self.phase = Phase.FINISHING
            self.t_done = time.monotonic()
        else:
            self.phase = Phase.TRAINING
            self._next_round()

    def _manifest(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "round": self.round, "next_chunk": self.queue.next_chunk, "samples": self.samples_committed,
            "model": cfg.model.to_dict(), "model_source": cfg.model_source, "hyperparameters": cfg.hyperparameters(),
            "seed": cfg.seed, "batch_size": cfg.batch_size, "lr": cfg.lr,
            "balance": cfg.balance, "optimizer_state": cfg.optimizer_state, "merge": cfg.merge,
            "fingerprint": self.fingerprint, "resumed_from": self.resumed_from,
            "workers": [{"rank": w.rank, "device": w.device, "vendor": w.ref.vendor, "name": w.ref.name,
                         "samples": w.samples, "chunks": w.chunks_done, "alive": w.alive, "lost": w.lost_reason}
                        for w in self.workers],
            "rounds": [{k: r[k] for k in ("round", "step", "samples", "shares", "done_by", "retrained")} for r in self.rounds],
        }

    # -- main loop and shutdown ---------------------------------------------------------------------
    def _loop(self) -> bool:
        started = time.monotonic()
        while True:
            self._pump(0.05)
            if self.failure:
                self.sink(ErrorEvent(message=self.failure, where="train"))
                return False
            if self.stop_reason:
                self.sink(ErrorEvent(message=f"stopped: {self.stop_reason}; last good checkpoint kept", where="train"))
                return False
            if self.phase is Phase.STARTING and time.monotonic() - started > self.cfg.startup_timeout:
                raise TrainingError(f"workers did not start within {self.cfg.startup_timeout:g}s")
            self._check_health()
            if not self.alive():
                self.sink(ErrorEvent(message="every worker was lost; stopping (last good checkpoint kept)", where="train"))
                return False
            self._advance()
            if self.phase is Phase.FINISHING:
                waited = time.monotonic() - self.t_done
                if self.awaiting_round is None or waited > self.cfg.stall_timeout:
                    return True

    def _shutdown(self) -> None:
        """Ask every worker to stop, let the last writer finish its report, then clear every group.

        Workers that never got their config (the store could not start: torch.distributed missing,
        no port) have nothing to finish: they are not given the grace, which made such an error
        line wait 15 s."""
        deadline = time.monotonic() + (self.cfg.stop_grace if self.configured else 0.0)
        for w in self.workers:
            if w.pending is not None:
                w.reply({"kind": "stop"})
        while any(w.child.running for w in self.workers) and time.monotonic() < deadline and self.group.open_pipes:
            for m in self.group.poll(0.05):
                if m.msg is None:
                    continue
                w = self._by_child(m.child)
                kind = m.msg.get("kind")
                if kind in ("merged", "evaluated"):
                    self._round_report(w, m.msg)
                elif kind not in ("hb", "refuse", "error", "hello", "done", "diverged"):
                    w.send({"kind": "stop"})
        for w in self.workers:
            proc = w.child.proc
            if proc is not None and proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        self.group.terminate(grace_s=5.0)
        self.group.close()


def _exit_reason(code: int | None) -> str:
    return "pipe closed" if code is None else exit_text(code)
