"""The coordinator: spawns one worker per device, owns the chunk queue, runs merge rounds, recovers.

It runs in the ``hwtui train`` process and is single-threaded: one loop selects on every
worker's answer pipe, handles the messages, judges liveness and serves the requests that can be
served. All decisions (which chunk, when to merge, who writes the checkpoint, when a worker is
lost) are made here, so accounting is exact without distributed locking. The TCPStore the gloo
groups rendezvous on is hosted here too, so it outlives any worker.

Round protocol (generation ``gen`` = one incarnation of the gloo group over the live workers):

1. Workers claim chunks until the round's chunks are all done (a request with nothing to hand
   out simply waits: the reply is deferred, not polled for). A worker asks for its next chunk
   while it trains the current one (``prefetch``: one chunk ahead, granted under the same
   end-of-round rule as any claim), so no chunk starts with a round trip through this loop; it
   reports a finished chunk with its next claim, or with ``done`` when a claim is already out.
2. Every live worker gets ``merge`` with its sample count; each all-reduces and answers
   ``reduced`` (or ``merge_failed``).
3. All reduced in the current generation -> ``commit`` (on evaluation rounds and checkpoint
   rounds the round's slowest worker also evaluates the merged model / writes the checkpoint). Anything else -> the round is aborted: workers keep
   their own weights, a new generation is formed, chunks a lost worker had touched this round are
   trained again by the survivors, and the merge is retried.

Held-out evaluation (each worker's own copy before the merge, the merged model after it) costs
compute on every device and the pre-merge one holds the collective back, so it runs only every
``eval_every`` rounds and on the last one (``--eval-every``); other rounds merge without it and
their ``train.merge`` event carries no losses.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from hwtui.core.events import ErrorEvent, EventSink, LogEvent
from hwtui.engine.training import checkpoint
from hwtui.engine.training.channel import LineReader, encode
from hwtui.engine.training.events import TrainCheckpoint, TrainDone, TrainMerge, TrainStart, TrainWorker, TrainWorkerLost
from hwtui.engine.training.health import Liveness
from hwtui.engine.training.model import ModelConfig
from hwtui.engine.training.queue import ChunkQueue


class TrainingError(RuntimeError):
    """The run cannot start (bad device, memory refusal, checkpoint mismatch): one line for the user."""


@dataclass
class TrainConfig:
    devices: list[Any]  # DeviceRef
    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    merge_every: int = 20
    balance: str = "dynamic"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1  # rounds
    keep_checkpoints: int = 3
    resume: bool = False
    seed: int = 0
    precision: str = "auto"
    activation_checkpointing: bool = False
    optimizer_state: str = "average"
    model: ModelConfig = field(default_factory=ModelConfig)
    eval_windows: int = 32
    eval_every: int = 5  # rounds between held-out evaluations (the last round is always evaluated)
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 30.0
    stall_timeout: float = 300.0
    group_timeout: float = 120.0
    startup_timeout: float = 300.0
    stop_grace: float = 15.0
    telemetry_interval: float = 0.5
    cpu_threads: int = 1
    prefetch: bool = True  # workers claim their next chunk while training the current one


@dataclass
class WorkerState:
    rank: int
    ref: Any
    proc: subprocess.Popen
    reader: LineReader
    alive: bool = True
    hello: dict[str, Any] | None = None
    gen: int = -1
    pending: dict[str, Any] | None = None  # a request awaiting our answer
    held: list[int] = field(default_factory=list)  # chunks granted, not reported done: [training, prefetched]
    in_merge: bool = False
    samples: int = 0
    chunks_claimed: int = 0
    chunks_done: int = 0
    busy_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    mem_used: int | None = None
    mem_total: int | None = None
    lost_reason: str | None = None
    requeued: int = 0
    samples_discarded: int = 0
    last_emit: float = 0.0
    chunk_time: float | None = None  # moving average of its seconds per chunk
    started_at: float = 0.0  # when the first chunk of ``held`` began (grant if idle, else the previous done)

    @property
    def device(self) -> str:
        return self.ref.spec


class Coordinator:
    def __init__(self, cfg: TrainConfig, sink: EventSink):
        self.cfg, self.sink = cfg, sink
        self.workers: list[WorkerState] = []
        self.queue = ChunkQueue(cfg.balance)
        self.live = Liveness(cfg.heartbeat_timeout, cfg.stall_timeout)
        self.gen = 0
        self.phase = "starting"
        self.round = 0
        self.step = 0
        self.round_steps = 0
        self.samples_committed = 0
        self.samples_discarded = 0
        self.rounds: list[dict[str, Any]] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.merge_losses: dict[int, float] = {}
        self.reduced_losses: dict[int, float] = {}
        self.stop_reason: str | None = None
        self.failure: str | None = None  # why the run must end as failed (a worker diverged)
        self.final_loss: float | None = None
        self.awaiting_writer: int | None = None  # round whose merged report we still wait for
        self.t0 = time.monotonic()
        self.t_train = None
        self.init_from: str | None = None
        self.resumed_from: dict[str, Any] | None = None
        self.weights: dict[int, float] = {}
        self.params = cfg.model.param_count()
        self.fingerprint: str | None = None
        self.t_done = 0.0
        self.merge_gen = -1
        self.sel = selectors.DefaultSelector()

    # -- public -----------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason

    def run(self) -> dict[str, Any]:
        self._prepare_resume()
        self._start_store()
        ok = False
        try:
            self._spawn()
            ok = self._loop()
        except TrainingError as exc:
            self.sink(ErrorEvent(message=str(exc), where="startup"))
            self.sink(TrainDone(ok=False, seconds=round(time.monotonic() - self.t0, 3), samples=self.samples_committed,
                                final_loss=self.final_loss, report=None))
            raise
        finally:
            self._shutdown()
        from hwtui.engine.training.report import build_report

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
        if not cfg.checkpoint_dir:
            raise TrainingError("--resume needs --checkpoint-dir (where the previous run wrote its checkpoints)")
        found = checkpoint.latest(cfg.checkpoint_dir)
        if found is None:
            raise TrainingError(f"--resume: no complete checkpoint in {cfg.checkpoint_dir}")
        path, doc = found
        if doc.get("model") != cfg.model.to_dict():
            raise TrainingError(f"--resume: {path} holds a model {doc.get('model')}, this run builds {cfg.model.to_dict()}")
        if doc["step"] >= cfg.steps:
            raise TrainingError(f"--resume: {path} is already at step {doc['step']}; raise --steps above it to train on")
        self.init_from = str(path)
        self.resumed_from = {"path": str(path), "step": doc["step"], "round": doc["round"], "fingerprint": doc.get("fingerprint")}
        self.step, self.round = doc["step"], doc["round"]
        self.queue.next_chunk = doc["next_chunk"]
        self.samples_committed = doc.get("samples", 0)

    def _start_store(self) -> None:
        import torch.distributed as dist

        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=self.cfg.group_timeout))

    def _worker_env(self, ref: Any) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # so torch's cuda:N is the N the inventory printed
        env.setdefault("GLOO_SOCKET_IFNAME", _loopback_ifname())  # every rank is on this machine
        if ref.backend == "cpu":
            env["OMP_NUM_THREADS"] = str(self.cfg.cpu_threads)
        return env

    def _spawn(self) -> None:
        cfg = self.cfg
        n_cpu = sum(1 for r in cfg.devices if r.backend == "cpu")
        for rank, ref in enumerate(cfg.devices):
            r_fd, w_fd = os.pipe()
            env = self._worker_env(ref)
            env["HWTUI_TRAIN_FD"] = str(w_fd)
            python = os.environ.get(f"HWTUI_PYTHON_{ref.backend.upper()}", sys.executable)
            proc = subprocess.Popen(  # a fresh interpreter: the spawn start method, without pickling anything
                [python, "-m", "hwtui.engine.training.worker"], stdin=subprocess.PIPE, stdout=_stderr_fd(),
                pass_fds=(w_fd,), env=env, start_new_session=True, close_fds=True)
            os.close(w_fd)
            os.set_blocking(r_fd, False)
            w = WorkerState(rank, ref, proc, LineReader(r_fd))
            self.workers.append(w)
            self.sel.register(r_fd, selectors.EVENT_READ, w)
            self.live.add(rank)
            self._send(w, {"config": {
                "rank": rank, "backend": ref.backend, "index": ref.index, "store_host": "127.0.0.1",
                "store_port": self.store.port, "model": cfg.model.to_dict(), "batch_size": cfg.batch_size, "lr": cfg.lr,
                "seed": cfg.seed, "precision": cfg.precision, "activation_checkpointing": cfg.activation_checkpointing,
                "optimizer_state": cfg.optimizer_state, "balance": cfg.balance, "eval_windows": cfg.eval_windows,
                "heartbeat_interval": cfg.heartbeat_interval, "group_timeout": cfg.group_timeout,
                "reply_timeout": cfg.group_timeout + cfg.stall_timeout + cfg.startup_timeout,
                "cpu_workers": n_cpu, "cpu_threads": cfg.cpu_threads, "init_from": self.init_from,
                "prefetch": cfg.prefetch,
            }})

    # -- plumbing ---------------------------------------------------------------------------------
    def _send(self, w: WorkerState, msg: dict[str, Any]) -> None:
        try:
            w.proc.stdin.write(encode(msg))
            w.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it died; the liveness check reports it

    def _reply(self, w: WorkerState, msg: dict[str, Any]) -> None:
        w.pending = None
        self._send(w, msg)

    def alive(self) -> list[WorkerState]:
        return [w for w in self.workers if w.alive]

    def _pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            w: WorkerState = key.data
            for msg in w.reader.feed():
                self._handle(w, msg)
            if w.reader.closed:
                self.sel.unregister(w.reader.fd)
                os.close(w.reader.fd)
                if w.alive:
                    code = w.proc.wait(timeout=5) if w.proc.poll() is None else w.proc.returncode
                    self._lost(w, _exit_reason(code))

    # -- messages ---------------------------------------------------------------------------------
    def _handle(self, w: WorkerState, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if not w.alive:
            return
        self.live.seen(w.rank, progress=op != "hb")
        if op == "hb":
            w.mem_used, w.mem_total = msg.get("mem_used"), msg.get("mem_total")
            return
        if op == "hello":
            w.hello = msg
            w.mem_used, w.mem_total = msg.get("mem_used"), msg.get("mem_total")
            return
        if op in ("refuse", "error"):
            if self.phase == "starting":
                text = str(msg.get("message"))
                raise TrainingError(text if text.startswith(w.device) else f"{w.device}: {text}")
            self.sink(ErrorEvent(message=f"{w.device}: {msg.get('message')}", rank=w.rank, where="worker"))
            return  # its exit follows; _lost handles it
        if op == "diverged":
            self._diverged(w, msg)
            return
        if op == "merged":
            self._merged(w, msg)
            return
        if op == "done":  # a report only (its claim is already out): no answer expected
            self._chunk_done(w, msg["done"])
            return
        if op == "claim" and msg.get("done"):
            self._chunk_done(w, msg["done"])
        if op == "reduced" and msg.get("loss_local") is not None:
            self.reduced_losses[w.rank] = msg["loss_local"]
        if op == "regroup_failed" and msg.get("gen") == self.gen:
            self.gen += 1  # the rendezvous failed for everyone: form another generation
        if op in ("merge_failed", "reduced"):
            w.in_merge = False
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
        self.queue.complete(w.rank, done["chunk"])
        w.held.remove(done["chunk"])
        w.started_at = time.monotonic()  # its prefetched chunk (if any) starts now
        w.samples += self.cfg.batch_size
        w.chunks_done += 1
        w.busy_seconds += done["seconds"]
        w.chunk_time = done["seconds"] if w.chunk_time is None else 0.7 * w.chunk_time + 0.3 * done["seconds"]
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

    def _merged(self, w: WorkerState, msg: dict[str, Any]) -> None:
        rnd = msg["round"]
        record = next((r for r in self.rounds if r["round"] == rnd), None)
        if record is None:
            return
        record["loss_merged"] = msg.get("loss_merged")
        if record["loss_merged"] is not None:
            self.final_loss = record["loss_merged"]
        self.sink(TrainMerge(round=rnd, step=record["step"], shares=record["shares"], loss_merged=msg["loss_merged"],
                             loss_workers_mean=record["loss_workers_mean"]))
        if msg.get("checkpoint"):
            entry = {"path": msg["checkpoint"], "step": record["step"], "round": rnd, "written_by": w.device}
            self.checkpoints.append(entry)
            self.sink(TrainCheckpoint(path=msg["checkpoint"], step=record["step"], round=rnd))
        if self.awaiting_writer == rnd:
            self.awaiting_writer = None

    # -- health -----------------------------------------------------------------------------------
    def _check_health(self) -> None:
        for w in self.alive():
            code = w.proc.poll()
            if code is not None:
                self._lost(w, _exit_reason(code))
                continue
            if w.hello is None:
                continue  # still importing torch / building: the startup timeout covers it
            reason = self.live.verdict(w.rank, holds_work=bool(w.held) or w.in_merge)
            if reason:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.proc.pid, signal.SIGKILL)  # a hung process cannot be asked nicely
                self._lost(w, reason)

    def _lost(self, w: WorkerState, reason: str) -> None:
        if not w.alive or self.failure:
            return
        if self.phase == "starting":
            raise TrainingError(f"{w.device} failed to start: {reason}")
        unstarted = set(w.held[1:])  # granted ahead, never begun: requeued, not counted as a training
        w.alive, w.lost_reason, w.pending, w.held, w.in_merge = False, reason, None, [], False
        self.live.remove(w.rank)
        back = self.queue.release(w.rank, unstarted)
        trained = sum(1 for cid in back if self.queue.chunks[cid].attempts[-1]["outcome"] == "lost-after-training")
        w.requeued = len(back)
        # Its unmerged work died with it: those samples are counted as discarded, not as trained.
        w.samples_discarded += trained * self.cfg.batch_size
        w.samples -= trained * self.cfg.batch_size
        self.samples_discarded += trained * self.cfg.batch_size
        self.gen += 1  # the gloo group that included it is broken for good
        self.sink(TrainWorkerLost(rank=w.rank, device=w.device, reason=reason, chunks_requeued=len(back)))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.proc.pid, signal.SIGKILL)

    # -- scheduling -------------------------------------------------------------------------------
    def _start(self) -> None:
        cfg = self.cfg
        if self.cfg.balance == "static":
            self.weights = {w.rank: float(w.hello.get("calibration") or 1.0) for w in self.workers}
        prints = {w.hello["fingerprint"] for w in self.workers}
        if len(prints) > 1:
            raise TrainingError("workers see different standard-library text (different Python installs via "
                                "HWTUI_PYTHON_*); every worker must train on the same corpus")
        self.fingerprint = prints.pop()
        if self.resumed_from and self.resumed_from.get("fingerprint") not in (None, self.fingerprint):
            raise TrainingError(f"--resume: {self.resumed_from['path']} was trained on another Python's standard library "
                                f"(corpus {self.resumed_from['fingerprint']}, here {self.fingerprint})")
        self.params = self.workers[0].hello.get("params", self.params)
        self.sink(LogEvent(message=f"corpus: {self.workers[0].hello.get('corpus')}", source="train"))
        self.sink(TrainStart(workers=[{"rank": w.rank, "device": w.device, "vendor": w.ref.vendor, "name": w.ref.name}
                                      for w in self.workers], steps=cfg.steps, batch_size=cfg.batch_size,
                             balance=cfg.balance, merge_every=cfg.merge_every, params=self.params))
        self.phase = "training"
        self.t_train = time.monotonic()
        self._next_round()

    def _next_round(self) -> None:
        self.round += 1
        self.round_steps = min(self.cfg.merge_every, self.cfg.steps - self.step)
        ranks = [w.rank for w in self.alive()]
        self.queue.start_round(self.round, self.round_steps * len(ranks), ranks, self.weights)
        self.reduced_losses = {}

    def _advance(self) -> None:
        if self.phase == "starting":
            if not all(w.hello for w in self.workers):
                return
            self._start()
        alive = self.alive()
        if self.phase == "merging":
            if not all(w.pending and w.pending["op"] in ("reduced", "merge_failed") for w in alive):
                return  # still inside the collective (a dead peer surfaces there within milliseconds)
            if all(w.pending["op"] == "reduced" and w.gen == self.gen for w in alive) and self.merge_gen == self.gen:
                self._commit(alive)
                return
            if self.merge_gen == self.gen:
                self.gen += 1  # a collective failed with everyone alive (network, timeout): new group all the same
            self.phase = "training"  # requeued chunks (if any) are trained again, then the merge is retried
            self.sink(LogEvent(message=f"round {self.round}: merge aborted, regrouping as generation {self.gen}",
                               level="warning", source="train"))
        if self.phase != "training":
            return
        for w in alive:
            if w.pending is None:
                continue
            if w.gen != self.gen:
                group = [x.rank for x in alive]
                self._reply(w, {"op": "regroup", "gen": self.gen, "group_rank": group.index(w.rank), "world_size": len(group)})
                w.gen = self.gen
            elif w.pending["op"] == "claim" and len(w.held) < 2 and not self._tail_defer(w, alive):
                cid = self.queue.claim(w.rank)
                if cid is not None:
                    if not w.held:
                        w.started_at = time.monotonic()
                    w.held.append(cid)
                    w.chunks_claimed += 1
                    self._reply(w, {"op": "chunk", "chunk": cid})
        if self.queue.complete() and all(w.pending and w.pending["op"] == "claim" and w.gen == self.gen for w in alive):
            self._begin_merge(alive)

    def _tail_defer(self, w: WorkerState, alive: list[WorkerState]) -> bool:
        """Dynamic balancing's end of round: hold back a worker's claim when a faster one would
        finish the remaining chunks before this one finished the chunk it asks for (the round, and
        the merge everyone waits for, would otherwise end with the fast device idle).

        A prefetch (a claim made while still training) would only start once the chunks in hand
        are done, so that time counts against it: the slow worker is not granted a chunk to sit on
        at the end of a round that the fast one would finish sooner."""
        if self.cfg.balance != "dynamic" or w.chunk_time is None:
            return False
        pending = sum(1 for c in self.queue.chunks.values() if c.state == "pending" and c.owner in (None, w.rank))
        if pending == 0:
            return False
        now = time.monotonic()
        mine = self._busy_left(w, now) + w.chunk_time
        best = None
        for x in alive:
            if x is w or x.chunk_time is None:
                continue
            finish = self._busy_left(x, now) + pending * x.chunk_time
            best = finish if best is None else min(best, finish)
        return best is not None and best < mine

    @staticmethod
    def _busy_left(x: WorkerState, now: float) -> float:
        """Estimated seconds until ``x`` has trained every chunk it holds (current + prefetched)."""
        if not x.held or x.chunk_time is None:
            return 0.0
        return max(0.0, x.chunk_time - (now - x.started_at)) + (len(x.held) - 1) * x.chunk_time

    def _evaluating(self) -> bool:
        return is_eval_round(self.round, self.step + self.round_steps >= self.cfg.steps, self.cfg.eval_every)

    def _begin_merge(self, alive: list[WorkerState]) -> None:
        self.phase, self.merge_gen = "merging", self.gen
        done_by = self.queue.done_by()
        self.reduced_losses = {}
        evaluate = self._evaluating()
        for w in alive:
            w.in_merge = True
            self._reply(w, {"op": "merge", "round": self.round, "gen": self.gen, "evaluate": evaluate,
                            "samples": done_by.get(w.rank, 0) * self.cfg.batch_size})

    def _commit(self, alive: list[WorkerState]) -> None:
        cfg = self.cfg
        done_by = self.queue.done_by()
        total = sum(done_by.values()) * cfg.batch_size
        self.step += self.round_steps
        self.samples_committed += total
        record = self.queue.round_record() | {
            "step": self.step, "gen": self.gen, "samples": total,
            "shares": [round(done_by.get(w.rank, 0) * cfg.batch_size / total, 6) if total else 0.0 for w in self.workers],
            "loss_workers_mean": (sum(self.reduced_losses.values()) / len(self.reduced_losses)) if self.reduced_losses else None,
            "loss_workers": {str(r): v for r, v in sorted(self.reduced_losses.items())},
            "loss_merged": None, "t": round(time.monotonic() - self.t0, 3),
        }
        self.rounds.append(record)
        last = self.step >= cfg.steps
        evaluate = is_eval_round(self.round, last, cfg.eval_every)
        ckpt = None
        if cfg.checkpoint_dir and (last or self.round % max(1, cfg.checkpoint_every) == 0):
            ckpt = {"dir": cfg.checkpoint_dir, "step": self.step, "keep": cfg.keep_checkpoints, "manifest": self._manifest()}
        # The slowest worker of the round evaluates the merged model and writes the checkpoint: the
        # throughput lost while it does is smallest there (the others keep claiming chunks).
        # A round with neither evaluation nor checkpoint needs no writer: its merge event goes out now.
        writer = min(alive, key=lambda w: (done_by.get(w.rank, 0), w.rank)) if evaluate or ckpt else None
        self.awaiting_writer = self.round if writer else None
        for w in alive:
            self._reply(w, {"op": "commit", "writer": w is writer, "evaluate": evaluate,
                            "checkpoint": ckpt if w is writer else None})
        if writer is None:
            self.sink(TrainMerge(round=self.round, step=self.step, shares=record["shares"], loss_merged=None,
                                 loss_workers_mean=None))
        for w in alive:
            self._emit_worker(w)
        if last:
            self.phase = "finishing"
            self.t_done = time.monotonic()
        else:
            self.phase = "training"
            self._next_round()

    def _manifest(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "round": self.round, "next_chunk": self.queue.next_chunk, "samples": self.samples_committed,
            "model": cfg.model.to_dict(), "seed": cfg.seed, "batch_size": cfg.batch_size, "lr": cfg.lr,
            "balance": cfg.balance, "optimizer_state": cfg.optimizer_state, "fingerprint": self.fingerprint,
            "resumed_from": self.resumed_from,
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
            if self.phase == "starting" and time.monotonic() - started > self.cfg.startup_timeout:
                raise TrainingError(f"workers did not start within {self.cfg.startup_timeout:g}s")
            self._check_health()
            if not self.alive():
                self.sink(ErrorEvent(message="every worker was lost; stopping (last good checkpoint kept)", where="train"))
                return False
            self._advance()
            if self.phase == "finishing":
                waited = time.monotonic() - self.t_done
                if self.awaiting_writer is None or waited > self.cfg.stall_timeout:
                    return True

    def _shutdown(self) -> None:
        deadline = time.monotonic() + self.cfg.stop_grace
        for w in self.workers:
            if w.pending is not None:
                self._reply(w, {"op": "stop"})
        while any(w.proc.poll() is None for w in self.workers) and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                for key, _ in self.sel.select(0.05):
                    w = key.data
                    for msg in w.reader.feed():
                        if msg.get("op") == "merged":
                            self._merged(w, msg)
                        elif msg.get("op") not in ("hb", "refuse", "error", "hello", "done"):
                            self._send(w, {"op": "stop"})
                    if w.reader.closed:
                        self.sel.unregister(w.reader.fd)
                        os.close(w.reader.fd)
            if not any(self.sel.get_map()):
                break
        for w in self.workers:
            if w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.proc.pid, signal.SIGTERM)
        for w in self.workers:
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait(timeout=5)
            with contextlib.suppress(OSError):
                w.proc.stdin.close()
        with contextlib.suppress(Exception):
            self.sel.close()


def _stderr_fd() -> int | None:
    """Workers print to our stderr: stdout may be the ``--events -`` stream."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "pipe closed"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _loopback_ifname() -> str:
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address == "127.0.0.1" for a in addrs):
                return name
    except Exception:
        pass
    return "lo"


def is_eval_round(round_no: int, last: bool, eval_every: int) -> bool:
    """Held-out evaluation on every ``eval_every``-th round and always on the last (the final loss)."""
    return last or round_no % max(1, eval_every) == 0
