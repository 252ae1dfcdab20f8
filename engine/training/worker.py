"""The worker process: one per device, started by the coordinator as a fresh interpreter.

``python -m hwtui.engine.training.worker --answer-fd N``, started through hwtui.core.supervisor,
with two pipes: commands arrive as JSON lines on stdin (the first one is the frozen, versioned
:class:`~hwtui.engine.training.config.WorkerConfig`), answers leave on the answer pipe ``N``. Every
message is an object with a ``"kind"``. The worker points its stdout at its stderr first thing,
so anything a vendor library prints can never corrupt ``--events -``.

Loop: claim a chunk -> train one batch on it -> report and claim the next. The coordinator may
answer a claim with ``merge`` (the round's data is all trained), ``regroup`` (the set of live
workers changed: rebuild the gloo group) or ``stop``.

With ``prefetch`` (the default) the claim for the next chunk goes out while the current one
trains, so the answer is usually waiting when the batch ends and the device never idles for a
round trip through the coordinator. At most one claim is out at a time and at most two chunks are
in hand (the one training, the one ahead); a chunk finished while a claim is out is reported on
its own (``done``, no answer expected), otherwise the report rides on the next claim.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
import zlib
from collections import deque
from typing import Any

from hwtui.core.forking import die_with_parent
from hwtui.engine.training import knobs
from hwtui.engine.training.channel import ChannelClosed, WorkerChannel
from hwtui.engine.training.config import ConfigError, WorkerConfig
from hwtui.engine.training.queue import Unit, unit_chunk, unit_from_message, unit_message, unit_name, unit_rows
from hwtui.engine.training.workers import MAX_AHEAD


class Diverged(RuntimeError):
    """A non-finite loss or weight: training cannot go on, and nothing of it may be merged or saved."""

    def __init__(self, what: str, value: float, chunk: int | None = None):
        super().__init__(f"{what} is {value}")
        self.what, self.value, self.chunk = what, value, chunk


def first_non_finite(tensors: dict[str, Any]) -> str | None:
    """The name of the first floating tensor holding a NaN or an infinity, else None."""
    import torch

    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


AHEAD_SECONDS = 0.025  # work a worker holds granted beyond the chunk it trains (at least one chunk)


def ahead_depth(chunk_seconds: float | None) -> int:
    """How many chunks to hold beyond the one training: one, or as many as make AHEAD_SECONDS
    when chunks are shorter than that. One chunk ahead covers the round trip through the
    coordinator for any chunk that takes longer than the coordinator takes to answer; a chunk of a
    millisecond or two (a tiny model, a fast GPU) does not, and one chunk per round trip left the
    device idle most of the time on a busy machine. Several granted per claim take the round trip
    off the critical path; the end of a round is still decided chunk by chunk (tail_choice)."""
    if not chunk_seconds or chunk_seconds <= 0:
        return 1
    return max(1, min(MAX_AHEAD, int(AHEAD_SECONDS / chunk_seconds)))


def make_optimizer(model: Any, lr: float) -> Any:
    """AdamW, fused where this torch has a fused kernel for the device (one kernel for every
    parameter instead of a loop over them: the per-step cost that dominates small models),
    else torch's default implementation."""
    import torch

    params = list(model.parameters())
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)
    except (RuntimeError, ValueError, TypeError):  # no fused kernel for this device or dtype
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


class Worker:
    def __init__(self, cfg: WorkerConfig, chan: WorkerChannel):
        import torch

        from hwtui.engine.training.backend import TrainDevice
        from hwtui.engine.training.modelspec import parse

        self.cfg, self.chan, self.rank = cfg, chan, cfg.rank
        self.spec = parse(cfg.model_source)
        self.tokenizer: Any = None
        if cfg.backend == "cpu":
            torch.set_num_threads(max(1, cfg.cpu_threads))
        self.dev = TrainDevice(cfg.backend, cfg.index)
        self.dev.set_device()
        self.precision = self.dev.resolve_precision(cfg.precision)
        self.mcfg = cfg.model
        self.reply_timeout = float(cfg.reply_timeout)
        self.outer: Any = None  # merge.OuterNesterov with --merge outer-nesterov
        self.slowdown = knobs.slowdown(self.rank)
        self._walls: deque[float] = deque(maxlen=9)  # the slowdown knob's recent batch wall times
        self.faults = knobs.faults(self.rank)
        self.chunks_trained = 0
        self._chunk_seconds: float | None = None  # a running mean of whole chunks' seconds (ahead_depth)
        self._training_mode = False  # model.train() walks every module: only when the mode changes
        self.group_rank: int | None = None

    # -- setup ---------------------------------------------------------------------------------
    def memory_refusal(self) -> str | None:
        from hwtui.engine.training.memory import check_fits, check_params_fit

        free, _total = self.dev.memory()
        if self.dev.spec.name == "cpu":
            free //= max(1, self.cfg.cpu_workers)  # CPU ranks share host RAM
        if not self.spec.is_char:  # the real parameter count is known once the model is built (on the CPU)
            return check_params_fit(self.dev.name, sum(p.numel() for p in self.model.parameters()), free)
        return check_fits(self.dev.name, self.mcfg, self.cfg.batch_size, self.precision,
                          self.cfg.activation_checkpointing, free)

    def load_model(self) -> None:
        """Build the model --model names (on the CPU, seeded) and the corpus it trains on."""
        from hwtui.engine.training import models

        self.net = models.build(self.spec, self.mcfg, self.cfg.seed, self.cfg.activation_checkpointing)
        self.model = self.net.module
        if self.spec.kind == "hf":
            self.tokenizer = models.load_tokenizer(self.spec)
        self.corpus = self._corpus()

    def _corpus(self) -> Any:
        from hwtui.engine.training import data, textdata

        if self.spec.is_char and self.cfg.data is None:
            return data.load_corpus()
        vocab = self.net.vocab()
        if self.cfg.data is not None:
            return textdata.tokenize(textdata.read_documents(self.cfg.data), self.tokenizer, self.mcfg.context, vocab)
        if self.tokenizer is not None:  # the standard library's text through the model's own tokenizer
            files = sorted(p for p in data.stdlib_dir().glob("*.py") if p.is_file())
            docs = textdata.Documents(tuple(p.read_text("utf-8", "replace") for p in files), len(files), "stdlib")
            return textdata.tokenize(docs, self.tokenizer, self.mcfg.context, vocab)
        if vocab is not None and vocab < 256:
            raise textdata.DataError(f"the model's vocabulary holds {vocab} ids; bytes need 256")
        return data.load_corpus()

    def build(self) -> None:
        from datetime import timedelta
        from pathlib import Path

        import torch

        from hwtui.engine.training import checkpoint, merge

        cfg = self.cfg
        self.model = self.model.to(self.dev.device)
        self.opt = make_optimizer(self.model, cfg.lr)
        if cfg.optimizer_state == "average":
            merge.ensure_optimizer_state(self.opt)
        outer_state = None
        if cfg.init_from:
            model_t, opt_t = checkpoint.load_tensors(Path(cfg.init_from))
            merge.load_model_tensors(self.model, model_t)
            if opt_t and cfg.optimizer_state == "average":
                merge.load_optimizer_tensors(self.opt, self.model, opt_t)
            outer_state = checkpoint.load_outer(Path(cfg.init_from))
        if cfg.merge == "outer-nesterov":  # the anchor is the model every worker starts from
            self.outer = merge.OuterNesterov(self.model, cfg.outer_lr, cfg.outer_momentum, outer_state)
        self.scaler = self.dev.grad_scaler(self.precision)
        self.store = torch.distributed.TCPStore(cfg.store_host, cfg.store_port, is_master=False,
                                                timeout=timedelta(seconds=cfg.group_timeout))

    def calibrate(self, batches: int = 3) -> float:
        """Samples/s of forward+backward on this device, weights untouched (for --balance static)."""
        from hwtui.engine.training.data import chunk_batch

        self.model.train()
        rate = 0.0
        for i in range(batches + 1):  # the first batch warms up kernels and allocators
            x, y = (t.to(self.dev.device) for t in chunk_batch(self.corpus, -1 - i, self.cfg.batch_size,
                                                              self.mcfg.context, self.cfg.seed))
            t0 = time.perf_counter()
            with self.dev.autocast(self.precision):
                loss = self.net.loss(x, y)
            loss.backward()
            self.dev.synchronize()
            dt = (time.perf_counter() - t0) * self.slowdown
            if i:
                rate += self.cfg.batch_size / dt / batches
        self.opt.zero_grad(set_to_none=True)
        return rate

    # -- work ----------------------------------------------------------------------------------
    def _fault(self, trigger: str, count: int) -> None:
        for fault in self.faults:
            if fault.trigger == trigger and fault.at == count and fault.action == "nan":
                import torch

                with torch.no_grad():
                    next(self.model.parameters()).fill_(math.nan)
            elif fault.trigger == trigger and fault.at == count:
                os.kill(os.getpid(), signal.SIGKILL if fault.action == "kill" else signal.SIGSTOP)

    def _clock(self) -> tuple[float, float]:
        return time.perf_counter(), time.thread_time()

    def _slow_down(self, since: tuple[float, float], smooth: bool = False, rows: int = 1, whole: bool = True) -> None:
        """The test-only slowdown knob: all of this device's work (batches and evaluations alike)
        takes ``slowdown`` times its wall time, like a slower device would.

        Wall time, not this thread's CPU time: on a shared machine a batch's wall time includes
        waiting for a core, which a faster device beside it waits for too; scaling only the CPU
        time made a "3x" worker 1.47x slower than its fast peer at load 11 on 2 cores (benchmark,
        issue 18). The benchmark prints the ratio it actually got either way.

        Batches (``smooth``) sleep in proportion to the mean wall time of this worker's last
        batches, not of this one: a slower device takes longer to compute, but a moment the host
        took its core away costs it the same as anyone else. Scaling each batch's own wall time
        turned every 50 ms the core was taken into 150 ms for a "3x" worker -- three times the
        jitter of its fast peer, which is what made the fast one wait at the merges. The mean is
        per sample (``rows``) of whole batches only: half a batch at the end of a round sleeps half
        as long as a whole one, and its own (higher) per-sample time does not slow the next ones."""
        if self.slowdown <= 1:
            return
        wall = time.perf_counter() - since[0]
        if smooth:
            if whole or not self._walls:
                self._walls.append(wall / max(1, rows))
            wall = sum(self._walls) / len(self._walls) * max(1, rows)
        time.sleep(wall * (self.slowdown - 1))

    def train_chunk(self, unit: Unit) -> dict[str, Any]:
        """One optimizer step on a chunk's batch, or on the rows of one piece of it (a piece at
        the end of a round: the same bytes whoever trains it)."""
        import torch

        from hwtui.engine.training.data import chunk_batch

        chunk_id = unit_chunk(unit)

        # The batch is cut inside the timed span: it is this device's work too (the idle share of a
        # round must not count it as waiting).
        since = self._clock()
        t0 = since[0]
        start = time.monotonic()
        if not self._training_mode:
            self.model.train()
            self._training_mode = True
        lo, hi = unit_rows(unit, self.cfg.batch_size)
        # Randomness inside the model (dropout) is a pure function of (seed, unit) like the batch:
        # a resumed or replayed run, or another worker training the same unit, draws the same masks.
        # torch.manual_seed seeds every backend's generators (~60 us); a CPU worker's dropout draws
        # from the CPU generator alone (~1 us), which matters at a millisecond per step.
        unit_seed = zlib.crc32(f"{self.cfg.seed}/{unit_name(unit)}".encode())
        if self.dev.spec.name == "cpu":
            torch.default_generator.manual_seed(unit_seed)
        else:
            torch.manual_seed(unit_seed)
        x, y = (t[lo:hi].to(self.dev.device, non_blocking=True) for t in
                chunk_batch(self.corpus, chunk_id, self.cfg.batch_size, self.mcfg.context, self.cfg.seed))
        self.opt.zero_grad(set_to_none=True)
        with self.dev.autocast(self.precision):
            loss = self.net.loss(x, y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        value = float(loss.detach())  # .item() synchronises the device too
        self._slow_down(since, smooth=True, rows=hi - lo, whole=isinstance(unit, int))
        self.chunks_trained += 1
        if not math.isfinite(value):
            raise Diverged("the training loss", value, chunk_id)
        self._fault("chunk", self.chunks_trained)
        # start/end on the system-wide monotonic clock the coordinator reads too: it places the
        # chunk in the round's timeline (idle before the first chunk, between chunks, after the last).
        seconds = time.perf_counter() - t0
        if isinstance(unit, int):
            self._chunk_seconds = seconds if self._chunk_seconds is None else 0.8 * self._chunk_seconds + 0.2 * seconds
        return {**unit_message(unit), "loss": value, "seconds": seconds, "start": start, "end": time.monotonic()}

    def evaluate(self, windows: int | None = None) -> float:
        import torch

        from hwtui.engine.training.data import heldout_batch

        self.model.eval()
        self._training_mode = False
        x, y = heldout_batch(self.corpus, windows or self.cfg.eval_windows, self.mcfg.context)
        since = self._clock()
        with torch.no_grad(), self.dev.autocast(self.precision):
            value = float(self.net.loss(x.to(self.dev.device), y.to(self.dev.device)))
        self._slow_down(since)
        if not math.isfinite(value):
            raise Diverged("the held-out loss", value)
        return value

    def regroup(self, msg: dict[str, Any]) -> dict[str, Any]:
        from hwtui.engine.training.merge import join_group

        try:
            join_group(self.store, msg["gen"], msg["group_rank"], msg["world_size"], self.cfg.group_timeout)
        except Exception as exc:  # a peer died during the rendezvous: the coordinator starts another generation
            return {"kind": "regroup_failed", "gen": msg["gen"], "error": f"{type(exc).__name__}: {exc}"}
        self.group_rank = msg["group_rank"]
        return {"kind": "claim", "done": None, "gen": msg["gen"]}

    def merge(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """Two-phase merge. Returns the next message to send, or None to stop."""
        from hwtui.engine.training import merge as M

        self._fault("merge", msg["round"])
        tensors = M.model_tensors(self.model)
        bad = first_non_finite(tensors)
        if bad is not None:  # checked before the collective: a poisoned copy never reaches the others
            raise Diverged(f"weight {bad}", math.nan)
        averaged_opt = self.cfg.optimizer_state == "average"
        if averaged_opt:
            tensors |= {f"opt:{k}": v for k, v in M.optimizer_tensors(self.opt, self.model).items()}
        try:
            merged, total = M.weighted_allreduce(tensors, msg["samples"])
        except Exception as exc:  # a peer died or hung: the group is broken, keep our own weights
            reply = self.chan.request({"kind": "merge_failed", "round": msg["round"], "error": f"{type(exc).__name__}: {exc}"},
                                      self.reply_timeout)
            return self.dispatch(reply)
        if self.outer is not None and total > 0:  # the outer step on the averaged deltas (proposed, not applied)
            merged |= self.outer.propose({k: v for k, v in merged.items() if not k.startswith("opt:")})
        bad = first_non_finite(merged)
        if bad is not None:  # finite inputs can still overflow when summed: never apply or save that
            raise Diverged(f"merged tensor {bad}", math.nan)
        reply = self.chan.request({"kind": "reduced", "round": msg["round"], "total": total}, self.reply_timeout)
        if reply["kind"] != "commit":
            if self.outer is not None:
                self.outer.reject()
            return self.dispatch(reply)  # abort: regroup and redo the round; merged copy discarded
        # Evaluation rounds: this copy's held-out loss, now that the round is committed (before the
        # all-reduce, a slow device's evaluation kept every other device waiting in the collective).
        windows = reply.get("eval_windows")
        loss_local = self.evaluate(windows) if reply.get("evaluate_local", reply.get("evaluate", True)) else None
        if self.outer is not None:
            self.outer.accept()
        self._load_merged(merged, averaged_opt)
        if reply.get("writer"):
            loss_merged = self.evaluate(windows) if reply.get("evaluate", True) else None
            done: dict[str, Any] = {"kind": "merged", "round": msg["round"], "loss_merged": loss_merged, "checkpoint": None,
                                    "loss_local": loss_local}
            self.chan.send(done | self._write_merged(reply, merged))
        elif loss_local is not None:
            self.chan.send({"kind": "evaluated", "round": msg["round"], "loss_local": loss_local})
        return {"kind": "claim", "done": None}

    def _load_merged(self, merged: dict[str, Any], averaged_opt: bool) -> None:
        """The committed round's weights (and averaged optimizer state, or a reset one) into this copy."""
        from hwtui.engine.training import merge as M

        M.load_model_tensors(self.model, {k: v for k, v in merged.items() if not k.startswith("opt:")})
        if averaged_opt:
            M.load_optimizer_tensors(self.opt, self.model, {k[4:]: v for k, v in merged.items() if k.startswith("opt:")})
        elif self.cfg.optimizer_state == "reset":
            self.opt.state.clear()

    def _write_merged(self, reply: dict[str, Any], merged: dict[str, Any]) -> dict[str, Any]:
        """The writer's duties for a committed round: the checkpoint and, on the last round, the Hugging
        Face export, when the coordinator asks for them; what was written, for the "merged" message."""
        out: dict[str, Any] = {}
        ck = reply.get("checkpoint")
        if ck:
            from hwtui.engine.training import checkpoint

            model_t = {k: v for k, v in merged.items() if not k.startswith("opt:")}
            opt_t = {k[4:]: v for k, v in merged.items() if k.startswith("opt:")} or None
            outer_t = self.outer.state() if self.outer is not None else None
            path = checkpoint.save(ck["dir"], ck["step"], model_t, opt_t, ck["manifest"], keep=ck.get("keep", 3),
                                   outer=outer_t)
            out["checkpoint"] = str(path)
        export = reply.get("export")
        if export:  # the last round: the merged model (now loaded) as a Hugging Face directory
            from hwtui.engine.training.export import save_hf

            try:
                out["exported"] = str(save_hf(self.model, self.tokenizer, export))
            except Exception as exc:  # reported; the run's checkpoints and report stand
                out["export_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return out

    def dispatch(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        kind = msg.get("kind")
        if kind == "chunk":
            return {"kind": "claim", "done": self.train_chunk(unit_from_message(msg))}
        if kind == "regroup":
            return self.regroup(msg)
        if kind == "merge":
            return self.merge(msg)
        if kind == "stop":
            return None
        raise RuntimeError(f"unexpected command from the coordinator: {msg!r}")

    def loop(self) -> None:
        from collections import deque

        prefetch = self.cfg.prefetch and knobs.prefetch()
        depth = 1 if prefetch else 0  # chunks to hold beyond the one training (grows for short chunks)
        ahead: deque[Unit] = deque()  # granted, not started
        result: dict[str, Any] | None = None  # the chunk just trained, not reported yet
        control: dict[str, Any] | None = None  # a merge/regroup/stop answer, handled once reported
        waiting = False  # a claim is out and its answer not read yet
        while True:
            if waiting and control is None and (msg := self.chan.poll()) is not None:
                waiting = False
                if msg["kind"] == "chunk":
                    ahead.append(unit_from_message(msg))
                elif msg["kind"] == "chunks":
                    ahead.extend(unit_from_message(m) for m in msg["units"])
                else:
                    control = msg
            if not waiting and control is None and len(ahead) <= depth:
                # The report rides on the next claim; "ahead" says how many units it would hold.
                self.chan.send({"kind": "claim", "done": result, "ahead": depth})
                result, waiting = None, True
            elif result is not None:
                self.chan.send({"kind": "done", "done": result})
                result = None
            if ahead and control is None:
                result = self.train_chunk(ahead.popleft())
                if prefetch:
                    depth = ahead_depth(self._chunk_seconds)
                continue
            if control is None:  # nothing to train: there is always a claim out here
                control, waiting = self.chan.recv(self.reply_timeout), False
            msg, control = control, None
            if msg["kind"] == "chunk":
                ahead.append(unit_from_message(msg))
                continue
            if msg["kind"] == "chunks":
                ahead.extend(unit_from_message(m) for m in msg["units"])
                continue
            # merge (only once every chunk of the round is reported), regroup (may come with a chunk
            # still ahead: it trains after the new group is formed) or stop.
            nxt = self.dispatch(msg)
            if nxt is None:
                return
            self.chan.send(nxt)  # the claim (or regroup_failed) that follows: it expects an answer
            waiting = True

    def memory_info(self) -> dict[str, Any]:
        try:
            _free, total = self.dev.memory()
            return {"mem_used": self.dev.memory_used(), "mem_total": total}
        except Exception:
            return {"mem_used": None, "mem_total": None}


def main(argv: list[str] | None = None) -> int:
    # Vendor libraries print on stdout; ours may be the user's --events stream. Point fd 1 at our
    # stderr before anything is imported that could print.
    os.dup2(2, 1)
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator decides when we stop
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--answer-fd" or not args[1].isdigit():
        print("usage: python -m hwtui.engine.training.worker --answer-fd N (started by hwtui train)", file=sys.stderr)
        return 2
    chan = WorkerChannel(sys.stdin.fileno(), int(args[1]))
    try:
        cfg = WorkerConfig.from_message(chan.recv(timeout=120))
    except (ChannelClosed, TimeoutError):
        return 2
    except (ConfigError, TypeError, ValueError) as exc:
        with contextlib.suppress(OSError):
            chan.send({"kind": "error", "message": f"bad worker config: {exc}"})
        return 2
    worker: Worker | None = None
    try:
        worker = Worker(cfg, chan)
        try:
            worker.load_model()
        except ValueError as exc:  # ModelSpecError, DataError: the user's --model / --data, one line
            chan.send({"kind": "refuse", "message": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})
            return 0
        refusal = worker.memory_refusal()
        if refusal:
            chan.send({"kind": "refuse", "message": refusal})
            return 0
        worker.build()
        calib = worker.calibrate() if cfg.balance == "static" else None
        from hwtui.engine.training.health import HeartbeatSender

        HeartbeatSender(chan.send, cfg.heartbeat_interval, worker.memory_info).start()
        chan.send({"kind": "hello", "rank": worker.rank, "pid": os.getpid(), "fingerprint": worker.corpus.fingerprint,
                   "corpus": worker.corpus.describe(), "precision": worker.precision, "calibration": calib,
                   "params": sum(p.numel() for p in worker.model.parameters()), **worker.memory_info()})
        worker.loop()
        return 0
    except ChannelClosed:
        return 1
    except Diverged as exc:
        # Strings, not floats: a NaN is not JSON, and this message must get through.
        with contextlib.suppress(OSError):
            chan.send({"kind": "diverged", "what": exc.what, "value": str(exc.value), "chunk": exc.chunk,
                       "worker_step": worker.chunks_trained if worker else 0})
        return 1
    except Exception as exc:  # reported to the coordinator as one line, never a traceback on the user
        with contextlib.suppress(OSError):
            chan.send({"kind": "error", "message": f"{type(exc).__name__}: {exc}"})
        if os.environ.get("HWTUI_DEBUG"):
            raise
        return 1


if __name__ == "__main__":
    sys.exit(main())
