"""``hwtui train``: every device in the box trains, whatever its vendor; copies merged by samples.

One worker process per device (``--gpu-ids 0,1`` global ids, or ``cuda:0,xpu:0,hip:0,cpu:0,cpu:1``;
``--cuda-ids`` kept for compatibility). Without any accelerator the default is two CPU workers.
``--events -`` streams JSON lines on stdout (the TUI reads them) and moves every human line to
stderr. SIGINT/SIGTERM stop the run cleanly: workers are stopped, the last good checkpoint stays.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from hwtui.app.push.options import PushOptions
    from hwtui.app.push.training import TrainPusher
    from hwtui.engine.training.config import TrainConfig
    from hwtui.engine.training.report import TrainReport

HELP = "train a small model on every selected device (mixed vendors), merged by samples"


def finite_float(text: str) -> float:
    """A float that is a real number: nan, inf and overflowing literals (1e999) are usage errors."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number (got {text!r})")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sel = parser.add_argument_group("devices")
    sel.add_argument("--gpu-ids", metavar="IDS", help="devices: global ids (0,1) or cuda:0,xpu:0,hip:0,hpu:0,cpu:0,cpu:1 "
                                                      "(default: every usable accelerator, else cpu:0,cpu:1)")
    sel.add_argument("--cuda-ids", metavar="IDS", help="legacy form: torch.cuda indices (0,1)")
    run = parser.add_argument_group("training")
    run.add_argument("--steps", type=int, default=200, help="steps of the merged model (default 200)")
    run.add_argument("--batch-size", type=int, default=16, help="samples per batch and chunk (default 16)")
    run.add_argument("--lr", type=finite_float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    run.add_argument("--merge-every", type=int, default=20, help="steps between merge rounds (default 20)")
    run.add_argument("--eval-every", type=int, default=5, metavar="ROUNDS",
                     help="rounds between held-out evaluations of the workers' and the merged model "
                          "(default 5; the last round is always evaluated; evaluation costs training time)")
    run.add_argument("--merge", choices=("outer-nesterov", "average"), default="outer-nesterov",
                     help="how copies are merged each round: outer-nesterov (default) = DiLoCo's outer SGD step "
                          "with Nesterov momentum on the sample-weighted mean of the workers' deltas; average = "
                          "sample-weighted mean of the weights")
    run.add_argument("--outer-lr", type=finite_float, default=0.7, help="outer learning rate for outer-nesterov (default 0.7)")
    run.add_argument("--outer-momentum", type=finite_float, default=0.5,
                     help="outer Nesterov momentum, in [0, 1) (default 0.5; DiLoCo's 0.9 suits hundreds of inner "
                          "steps per round, not tens: see docs/training.md)")
    run.add_argument("--eval-windows", type=int, default=256, metavar="N",
                     help="held-out windows per evaluation during training (default 256; `hwtui eval` measures more)")
    run.add_argument("--balance", choices=("dynamic", "equal", "static"), default="dynamic",
                     help="dynamic: chunks claimed as devices free up (default); equal: same share each; "
                          "static: shares from a measured calibration")
    run.add_argument("--optimizer-state", choices=("average", "reset", "keep"), default="average",
                     help="what merging does to AdamW state (default average; see engine/training/merge.py)")
    run.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                     help="auto: bf16 autocast where the device supports it, else fp32")
    run.add_argument("--activation-checkpointing", action="store_true", help="recompute activations (less memory)")
    run.add_argument("--model", default="char", metavar="MODEL",
                     help="char (the built-in byte model, default), a local Hugging Face model directory (config.json; "
                          "its model.safetensors if present, else a seeded random init), or package.module:function "
                          "returning an nn.Module (docs/training.md); nothing is downloaded")
    run.add_argument("--data", metavar="PATH",
                     help="training text: a text file, a directory of .txt files or a .jsonl with a \"text\" field "
                          "(default: the Python standard library's source); the last tenth is held out")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--context", type=int, default=64, help="model context in bytes (default 64)")
    run.add_argument("--d-model", type=int, default=64)
    run.add_argument("--layers", type=int, default=2)
    run.add_argument("--heads", type=int, default=4)
    ck = parser.add_argument_group("checkpoints")
    ck.add_argument("--checkpoint-dir", metavar="DIR", help="write a checkpoint after merge rounds")
    ck.add_argument("--checkpoint-every", type=int, default=1, metavar="ROUNDS", help="rounds between checkpoints (default 1)")
    ck.add_argument("--keep-checkpoints", type=int, default=3, metavar="N")
    ck.add_argument("--resume", action="store_true", help="continue from the last good checkpoint in --checkpoint-dir "
                                                          "(refused if a hyper-parameter changed, unless --override names it; "
                                                          "rounds recorded after the checkpoint are replayed exactly)")
    ck.add_argument("--override", metavar="NAMES", default="",
                    help="with --resume: comma list of hyper-parameters allowed to differ from the checkpoint's "
                         "(batch-size, lr, merge-every, seed, optimizer-state, merge, outer-lr, outer-momentum, "
                         "balance, precision)")
    ck.add_argument("--replay-assignment", metavar="FILE", help="train exactly the chunk assignment recorded in FILE (a --report "
                                                     "or a checkpoint dir's assignments.json): with the same seed, "
                                                     "the same run bit for bit, whatever --balance")
    h = parser.add_argument_group("health")
    h.add_argument("--heartbeat-timeout", type=finite_float, default=30.0, metavar="S", help="silence before a worker is lost")
    h.add_argument("--stall-timeout", type=finite_float, default=300.0, metavar="S", help="no progress while holding work")
    h.add_argument("--group-timeout", type=finite_float, default=120.0, metavar="S", help="gloo rendezvous/collective timeout")
    out = parser.add_argument_group("output")
    out.add_argument("--events", metavar="FILE", help="write events as JSON lines to FILE ('-' = stdout, humans to stderr)")
    out.add_argument("--report", metavar="FILE", help="write the run report (JSON) atomically to FILE")
    out.add_argument("--save-hf", metavar="DIR", help="write the merged model as a Hugging Face directory DIR (config.json, "
                                                      "model.safetensors, tokenizer files) at the end; needs --model DIR")
    push = parser.add_argument_group("push (serve what trains: docs/training.md)")
    push.add_argument("--push-to", metavar="AGENTS",
                      help="SOURCE,RECEIVER,...: push the merged model (the model.safetensors --save-hf writes) into "
                           "these node agents at the end, through the same verified, all-or-nothing push as "
                           "`hwtui push`; the first agent sends and must read this host's files; needs --model DIR")
    push.add_argument("--push-every", type=int, metavar="ROUNDS",
                      help="with --push-to: also push every ROUNDS merge rounds (a push never holds training back)")
    from hwtui.app.node_api.client_options import add_client_options

    add_client_options(push)


# Upper bounds for the counts and seconds `train` takes. Far beyond any real run, and low enough
# that nothing downstream overflows: --group-timeout 1e308 became a timedelta the TCPStore could
# not convert to a C int (exit 3), --stall-timeout 1e308 a deadline past time_t in the worker,
# --eval-windows 1e14 one tensor of 1e14 windows.
MAX_COUNT = 10**9
MAX_EVAL_WINDOWS = 1 << 20
MAX_TIMEOUT_S = 7 * 86400.0
# Below this a timeout only races the machinery it bounds (the heartbeat is sent every second;
# the store's first connect takes milliseconds): --group-timeout 1e-308 was an exit-3 traceback.
MIN_TIMEOUT_S = {"heartbeat_timeout": 2.0, "stall_timeout": 1.0, "group_timeout": 1.0}
SEED_RANGE = (-(2**63), 2**63 - 1)  # what torch.manual_seed takes as a signed 64-bit seed


def _positive(args: argparse.Namespace) -> None:
    from hwtui.core.errors import HwtuiError

    for name in ("steps", "batch_size", "merge_every", "context", "d_model", "layers", "heads", "checkpoint_every", "eval_every",
                 "eval_windows", "keep_checkpoints"):
        value, flag = getattr(args, name), f"--{name.replace('_', '-')}"
        if value < 1:
            raise HwtuiError(f"{flag} must be at least 1 (got {value})")
        top = MAX_EVAL_WINDOWS if name == "eval_windows" else MAX_COUNT
        if value > top:
            raise HwtuiError(f"{flag} {str(value)[:24]}{'...' if len(str(value)) > 24 else ''} is beyond what any run "
                             f"takes; give at most {top:,}")
    if not SEED_RANGE[0] <= args.seed <= SEED_RANGE[1]:
        raise HwtuiError(f"--seed must fit in 64 bits (between {SEED_RANGE[0]} and {SEED_RANGE[1]})")
    if not args.lr > 0:
        raise HwtuiError(f"--lr must be positive (got {args.lr})")
    if args.d_model % args.heads:
        raise HwtuiError(f"--d-model {args.d_model} must be a multiple of --heads {args.heads}")
    if not args.outer_lr > 0:
        raise HwtuiError("--outer-lr must be positive")
    for name, low in MIN_TIMEOUT_S.items():
        value = getattr(args, name)
        if not low <= value <= MAX_TIMEOUT_S:
            raise HwtuiError(f"--{name.replace('_', '-')} {value:g}: give seconds between {low:g} and {MAX_TIMEOUT_S:g} "
                             "(7 days)")
    if not 0 <= args.outer_momentum < 1:
        raise HwtuiError(f"--outer-momentum must be in [0, 1) (got {args.outer_momentum})")
    if args.override and not args.resume:
        raise HwtuiError("--override goes with --resume (it names what may differ from the checkpoint)")


def check_model_and_data(args: argparse.Namespace) -> str:
    """--model, --data and --save-hf checked before any worker starts; returns the model source.

    A model directory's config, its tokenizer against its vocabulary and the text itself are read
    here (one line, exit 2, nothing written); a package.module:function is called only in the
    workers (a failure there is the same one line before training starts)."""
    import os
    from pathlib import Path

    from hwtui.core.errors import HwtuiError
    from hwtui.engine.training import modelspec, textdata

    try:
        spec = modelspec.parse(args.model)
        if args.save_hf is not None:
            out = Path(args.save_hf)
            if spec.kind != "hf":
                raise HwtuiError("--save-hf writes a Hugging Face model: it needs --model DIR (a model directory)")
            if out.exists() or out.is_symlink():
                raise HwtuiError(f"--save-hf {args.save_hf}: already exists (give a new directory)")
            parent = out.parent if str(out.parent) else Path(".")
            if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
                raise HwtuiError(f"--save-hf {args.save_hf}: {parent} is not a writable directory")
        if getattr(args, "push_to", None) is not None and spec.kind != "hf":
            raise HwtuiError("--push-to pushes the model --save-hf writes: it needs --model DIR (a model directory)")
        docs = textdata.read_documents(args.data) if args.data is not None else None
        if spec.kind == "hf":
            from hwtui.engine.training import models

            facts = models.hf_facts(spec)
            if facts.positions is not None and args.context > facts.positions:
                raise HwtuiError(f"--context {args.context}: the model takes at most {facts.positions} positions")
            tokenizer = models.load_tokenizer(spec)
            if tokenizer is not None and len(tokenizer) > facts.vocab:
                raise HwtuiError(f"--model {spec.value}: the tokenizer has {len(tokenizer)} tokens but the model's "
                                 f"vocabulary only {facts.vocab}")
            if docs is not None:
                textdata.tokenize(docs, tokenizer, args.context, facts.vocab)
            elif tokenizer is None and facts.vocab < 256:
                raise HwtuiError(f"--model {spec.value}: a vocabulary of {facts.vocab} ids, no tokenizer; bytes need 256")
        elif docs is not None:
            textdata.tokenize(docs, None, args.context, None)
    except (modelspec.ModelSpecError, textdata.DataError) as exc:
        raise HwtuiError(str(exc)) from None
    return spec.value


# `hwtui train` exits 4 when the training delivered (exit 0 otherwise) but a --push-to push failed:
# the run, its checkpoints, --save-hf and its report stand; the pushes are listed in the report.
EXIT_PUSH_FAILED = 4


def push_options(args: argparse.Namespace) -> Callable[[str], PushOptions] | None:
    """--push-to checked before anything is written: the agents' list, the agent extra (httpx),
    --token-file/--cacert, --push-every, a model --save-hf can export. The push's own settings are
    `hwtui push`'s defaults (its parser: one default for each); returns PushOptions for a plan."""
    import dataclasses

    from hwtui.app.commands import push as push_cmd
    from hwtui.core.errors import HwtuiError

    if args.push_to is None:
        if args.push_every is not None:
            raise HwtuiError("--push-every goes with --push-to (it says how often to push)")
        return None
    if args.push_every is not None and not 1 <= args.push_every <= MAX_COUNT:
        raise HwtuiError(f"--push-every must be between 1 and {MAX_COUNT:,} rounds (got {args.push_every})")
    from hwtui.app.node_api.client import import_httpx
    from hwtui.app.push.orchestrate import targets_of

    targets_of(args.push_to)  # one line for a bad list, before the agent extra is asked for
    import_httpx()  # a base install: the one-line "needs the agent extra"
    parser = argparse.ArgumentParser(add_help=False)
    push_cmd.add_arguments(parser)
    ns = parser.parse_args(["--plan", "-", "--agents", args.push_to])
    ns.token_file, ns.cacert = args.token_file, args.cacert
    base = push_cmd.options(ns)
    from hwtui.app.node_api.client_options import resolve_client

    resolve_client(base.token_file, base.cacert)  # a bad --cacert or token file: one line now
    return lambda plan: dataclasses.replace(base, plan=plan)


def resolve_devices(args: argparse.Namespace) -> list:
    """DeviceRefs from --gpu-ids / --cuda-ids (or the default), errors as one line."""
    from hwtui.app.host_args import host_from_args
    from hwtui.core.errors import HwtuiError
    from hwtui.probes.gpu_ids import GpuIdError, parse_cuda_ids, parse_gpu_ids
    from hwtui.probes.inventory import detect_devices

    # `is not None`: an empty --gpu-ids '' is an error, never a silent fall back to the defaults.
    if args.gpu_ids is not None and args.cuda_ids is not None:
        raise HwtuiError("--gpu-ids and --cuda-ids are alternatives: give one")
    devices, _facts = detect_devices(host_from_args(args))
    try:
        if args.cuda_ids is not None:
            return parse_cuda_ids(args.cuda_ids, devices)
        if args.gpu_ids is not None:
            return parse_gpu_ids(args.gpu_ids, devices)
        usable = [d for d in devices if d.usable and d.backend in ("cuda", "hip", "xpu", "hpu")]
        spec = ",".join(f"{d.backend}:{d.index}" for d in usable) or "cpu:0,cpu:1"
        return parse_gpu_ids(spec, devices)
    except GpuIdError as exc:
        raise HwtuiError(str(exc)) from None


class TrainProgress:
    """How far the merged model is, from the engine's events alone.

    A merge round (``train.merge``) fixes the merged model's step exactly. Between merges each
    worker's chunk count (``train.worker.step``, one optimizer step per chunk) says how far the
    round is: a round of ``m`` steps is ``m`` chunks per worker, so the chunks trained since the
    last merge over the workers alive are the steps since it (capped at the next merge). Time is
    the events' own timestamps, from ``train.start``.
    """

    def __init__(self) -> None:
        self.steps = self.base = self.merged = self.merge_every = 0
        self.alive = 1
        self.t0: float | None = None
        self.chunks: dict[int, int] = {}
        self.chunks_at_merge = 0

    def feed(self, ev: Any) -> None:
        k = ev.kind
        if k == "train.start":
            self.steps, self.merge_every = ev.steps, ev.merge_every
            self.base = self.merged = getattr(ev, "start_step", 0)
            self.alive, self.t0 = max(1, len(ev.workers)), ev.t
        elif k == "train.worker":
            self.chunks[ev.rank] = ev.step
        elif k == "train.merge":
            self.chunks_at_merge += (ev.step - self.merged) * self.alive
            self.merged = ev.step
        elif k == "train.worker_lost":
            self.alive = max(1, self.alive - 1)

    @property
    def started(self) -> bool:
        return self.t0 is not None

    def step(self) -> float:
        """The merged model's step now, fractional between merges."""
        if self.merged >= self.steps:
            return float(self.steps)
        since = (sum(self.chunks.values()) - self.chunks_at_merge) / self.alive
        # A round ends at its merge (evaluation and checkpoint included): until then, just short of it.
        upto = min(self.merged + self.merge_every, self.steps) - 1e-6
        return min(max(float(self.merged), self.merged + since), upto)

    def elapsed(self, ev: Any) -> float:
        return max(0.0, float(ev.t) - (self.t0 if self.t0 is not None else float(ev.t)))

    def figures(self, ev: Any) -> tuple[float, float, float]:
        """(done, total, elapsed_s) of this run (a resume counts from its checkpoint's step)."""
        return self.step() - self.base, float(self.steps - self.base), self.elapsed(ev)


class _Printer:
    """Human-readable progress, on stdout or (with --events -) stderr.

    A bar with % and ETA on a terminal (redrawn as workers report); in a log, each merge round's
    line carries % and ETA, plus a progress line every ten seconds of a long round. -q: only the
    summary, lost workers and errors; -v: every worker's figures too.
    """

    def __init__(self, stream: TextIO, verbosity: int = 0, mode: str | None = None):
        from hwtui.app.output.progress import ProgressLine, mode_for

        self.stream, self.verbosity = stream, verbosity
        self.progress = ProgressLine(stream, mode or mode_for(stream, verbosity), every=10.0)
        self.track = TrainProgress()

    def __call__(self, ev: Any) -> None:
        from hwtui.app.output.progress import LIVE, status

        if getattr(ev, "where", None) == "startup" or (ev.kind == "train.done" and ev.report is None):
            return  # a run that could not start: the CLI prints that one line itself (exit 2)
        self.track.feed(ev)
        if self.verbosity < 0 and ev.kind not in ("train.done", "train.worker_lost", "error"):
            return
        text = self.format(ev)
        if ev.kind == "log" and ev.level == "debug" and self.verbosity > 0:
            text = str(ev.message)  # e.g. whether each worker was forked or exec'd, and why
        if ev.kind == "train.worker" and self.verbosity > 0:
            loss = "-" if ev.loss is None else f"{ev.loss:.4f}"
            text = f"  worker {ev.rank} ({ev.device}): step {ev.step}, {ev.samples:,} samples, {ev.samples_per_s:.1f}/s, loss {loss}"
        if ev.kind == "train.merge" and self.track.started:
            done, total, elapsed = self.track.figures(ev)
            text = f"{text}  [{status(done, total, elapsed, f'step {ev.step}/{self.track.steps}')}]"
        if ev.kind in ("train.done", "error"):
            self.progress.clear()
        if text:
            self.progress.line(text)
        # On a terminal the bar follows every report; in a log the round lines carry % and ETA, and
        # workers' reports add a line only every ten seconds (a long round is not silent).
        live = self.progress.mode == LIVE
        if (ev.kind == "train.worker" or (live and ev.kind in ("train.start", "train.merge"))) and self.track.started:
            done, total, elapsed = self.track.figures(ev)
            self.progress.update(elapsed, "training", done, total,
                                 f"step {int(self.track.step())}/{self.track.steps}", force=ev.kind == "train.start")

    @staticmethod
    def format(ev: Any) -> str | None:
        k = ev.kind
        if k == "train.start":
            devs = ", ".join(f"{w['rank']}={w['device']} ({w['name'] if w['name'].startswith(w['vendor']) else w['vendor'] + ' ' + w['name']})"
                             for w in ev.workers)
            return (f"training {ev.params:,} parameters for {ev.steps} steps on {devs}; batch {ev.batch_size}, "
                    f"merge every {ev.merge_every}, balance {ev.balance}")
        if k == "train.merge":
            shares = " ".join(f"{s:.0%}" for s in ev.shares)
            lm = "-" if ev.loss_merged is None else f"{ev.loss_merged:.4f}"
            lw = "-" if ev.loss_workers_mean is None else f"{ev.loss_workers_mean:.4f}"
            return f"round {ev.round} step {ev.step}: shares {shares}; held-out loss merged {lm} vs workers' mean {lw}"
        if k == "train.checkpoint":
            return f"checkpoint {ev.path} (step {ev.step})"
        if k == "train.worker_lost":
            return f"worker {ev.rank} ({ev.device}) lost: {ev.reason}; {ev.chunks_requeued} chunk(s) back in the queue"
        if k == "train.done":
            fl = "-" if ev.final_loss is None else f"{ev.final_loss:.4f}"
            return f"{'done' if ev.ok else 'stopped'} in {ev.seconds:.1f}s: {ev.samples:,} samples, final held-out loss {fl}"
        if k == "error":
            return f"error: {ev.message}"
        if k == "log":
            return None if ev.level == "debug" else str(ev.message)  # debug lines: -v only (__call__)
        return None


def run(args: argparse.Namespace) -> int:
    # rank_fork first, before anything imports numpy (a --model directory's check imports torch):
    # numpy's BLAS pool would make this a process with threads, and CPU workers fork from it.
    from hwtui.core.errors import HwtuiError
    from hwtui.engine import rank_fork  # noqa: F401

    _positive(args)
    push = push_options(args)
    refs = resolve_devices(args)
    model_source = check_model_and_data(args)
    if args.resume and not args.checkpoint_dir:
        raise HwtuiError("--resume needs --checkpoint-dir")

    from hwtui.core.events import Fanout, JsonlWriter
    from hwtui.engine.training.config import TrainingError
    from hwtui.engine.training.launcher import Coordinator
    from hwtui.engine.training.report import write_report

    cfg = _train_config(args, refs, model_source)
    if push is not None:
        from hwtui.app.push.orchestrate import preflight, targets_of

        preflight(push("-"), targets_of(args.push_to))  # an agent that refuses: one line, exit 2, nothing written
    to_stdout = args.events == "-"
    human = _Printer(sys.stderr if to_stdout else sys.stdout, getattr(args, "verbosity", 0))
    try:
        writer = JsonlWriter(args.events) if args.events else None
    except OSError as exc:
        raise HwtuiError(f"--events {args.events}: {exc.strerror}") from None
    pusher = _pusher(args, push) if push is not None else None
    if pusher is not None:
        import dataclasses

        cfg = dataclasses.replace(cfg, export_dir=str(pusher.work_dir), export_every=args.push_every or 0)
    coord = Coordinator(cfg, Fanout(human, writer, *([pusher] if pusher else [])))
    received: list[int] = []
    # A signal once training is over (the command waits for the last push) stops that wait; the
    # handlers stay until then, so a second Ctrl-C is never a KeyboardInterrupt that loses the report.
    give_up = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        coord.request_stop(signal.Signals(signum).name)
        if trained.is_set():
            give_up.set()

    trained = threading.Event()
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        report = coord.run()
    except TrainingError as exc:
        raise HwtuiError(str(exc)) from None
    finally:
        trained.set()
        human.progress.clear()  # no half-drawn bar before an error line
        if writer:
            writer.close()
        try:
            pushes = _wait_for_pushes(pusher, give_up) if pusher is not None else None
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
    if pushes is not None:
        report["pushes"] = pushes
        _say_pushes(pushes, human.stream)
    if args.report:
        write_report(args.report, report)
    if received:
        return 128 + received[0]
    return _exit_code(report, pushes)


def _wait_for_pushes(pusher: TrainPusher, give_up: threading.Event) -> list[dict[str, Any]]:
    """The push records, once the last push is over or the user stopped waiting (a signal)."""
    version = pusher.in_flight()
    if version is not None and not give_up.is_set():
        print(f"hwtui train: waiting for the push of {version} to finish (bounded by the push's "
              "--timeout; Ctrl-C stops waiting, the agents then finish or abort it on their own)",
              file=sys.stderr, flush=True)
    return pusher.close(give_up=give_up)


def _exit_code(report: TrainReport, pushes: list[dict[str, Any]] | None) -> int:
    """0 delivered; 1 the training failed; 4 (EXIT_PUSH_FAILED) delivered, but a push failed."""
    from hwtui.core.errors import EXIT_FAILED

    if not report["ok"]:
        return EXIT_FAILED
    failed = [p for p in pushes or [] if not p["ok"] and p["outcome"] != "superseded"]
    return EXIT_PUSH_FAILED if failed else 0


def _train_config(args: argparse.Namespace, refs: list[Any], model_source: str) -> TrainConfig:
    """The engine's frozen settings from the checked arguments (a value it refuses: one line)."""
    from pathlib import Path

    from hwtui.core.errors import HwtuiError
    from hwtui.engine.training.config import ConfigError, ModelConfig, TrainConfig, TrainingError
    from hwtui.engine.training.resume import read_assignments

    overrides = frozenset(x.strip().replace("-", "_") for x in args.override.split(",") if x.strip())
    try:
        replay = read_assignments(args.replay_assignment) if args.replay_assignment else {}
        if args.replay_assignment and not replay:
            raise HwtuiError(f"--replay-assignment {args.replay_assignment}: no such file, or no round recorded in it")
        return TrainConfig(
            devices=tuple(refs), steps=args.steps, batch_size=args.batch_size, lr=args.lr, merge_every=args.merge_every,
            merge=args.merge, outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
            eval_every=args.eval_every, eval_windows=args.eval_windows, balance=args.balance,
            checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints, resume=args.resume, overrides=overrides, replay=replay,
            seed=args.seed, precision=args.precision, activation_checkpointing=args.activation_checkpointing,
            optimizer_state=args.optimizer_state,
            model=ModelConfig(context=args.context, d_model=args.d_model, layers=args.layers, heads=args.heads),
            model_source=model_source, data=str(Path(args.data).resolve()) if args.data else None,
            save_hf=str(Path(args.save_hf).resolve()) if args.save_hf else None,
            heartbeat_timeout=args.heartbeat_timeout, stall_timeout=args.stall_timeout, group_timeout=args.group_timeout,
        )
    except (ConfigError, TrainingError) as exc:
        raise HwtuiError(str(exc)) from None


def _pusher(args: argparse.Namespace, push: Callable[[str], PushOptions]) -> TrainPusher:
    """The --push-to pusher, its working directory (exports between rounds, plans) owner-only
    beside --save-hf's (or in the system's temporary directory)."""
    import tempfile
    from pathlib import Path

    from hwtui.app.push.orchestrate import targets_of
    from hwtui.app.push.training import TrainPusher

    parent = str(Path(args.save_hf).resolve().parent) if args.save_hf else None
    work = tempfile.mkdtemp(prefix=".hwtui-push-", dir=parent)
    return TrainPusher(push, targets_of(args.push_to), work)


def _say_pushes(pushes: list[dict[str, Any]], stream: Any) -> None:
    """Each push in the summary; a failed one also on stderr (one line each)."""
    from hwtui.app.push.training import line
    from hwtui.core.terminal_text import clean

    for rec in pushes:
        if rec["outcome"] == "superseded":
            continue
        text = clean(line(rec), 2000)
        print(text, file=stream, flush=True)
        if not rec["ok"] and stream is not sys.stderr:
            print(f"hwtui: {text}", file=sys.stderr, flush=True)
