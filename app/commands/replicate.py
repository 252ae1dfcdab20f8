"""``hwtui replicate``: push a planned version to every rank, verified, with a two-phase commit.

With ``--events -`` the JSON-lines event stream owns stdout (the TUI reads it) and every
human-readable line goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from hwtui.probes.distributed.replication_defaults import DEFAULT_CHUNK_MB, DEFAULT_WINDOW, MAX_WINDOW

if TYPE_CHECKING:
    from hwtui.core.events import ErrorEvent, LogEvent
    from hwtui.engine.replication.events import ReplBucket, ReplCommit, ReplDone, ReplRanks, ReplStart, ReplThroughput

HELP = "replicate planned weights to N ranks over torch.distributed (bucketed, windowed, verified)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, metavar="FILE", help="plan written by `hwtui plan`")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "hip", "xpu", "hpu"),
                        help="where the weights live (hip: an AMD GPU under a ROCm build of torch; checked before anything starts)")
    parser.add_argument("--nproc", type=int, metavar="N",
                        help="start N local ranks (default: join the world of torchrun/SLURM if present, else 2)")
    parser.add_argument("--inflight", type=int, metavar="K",
                        help=f"buckets in flight at once, at most {MAX_WINDOW} "
                             f"(default: HOTWEIGHTS_IPC_INFLIGHT_BUCKETS, else {DEFAULT_WINDOW})")
    parser.add_argument("--max-inflight-mb", type=float, metavar="MB", help="also cap the bytes in flight")
    parser.add_argument("--adaptive", action="store_true", help="steer the window towards --target-bucket-ms per bucket")
    parser.add_argument("--target-bucket-ms", type=float, default=50.0, metavar="MS", help="adaptive target (default 50)")
    parser.add_argument("--chunk-mb", type=float, metavar="M",
                        help=f"largest broadcast in MiB: bigger buckets are split, file-contiguous smaller ones travel together "
                             f"(default: HOTWEIGHTS_BCAST_CHUNK_MB, else {DEFAULT_CHUNK_MB:g})")
    parser.add_argument("--transport", metavar="NAME",
                        help="override the transport: gloo, cuda-ipc, nccl, rccl, xccl, ccl, hccl")
    parser.add_argument("--readers", type=int, metavar="N",
                        help="threads reading the weight files on the source, 1-64 (default: from the cores and the ranks)")
    parser.add_argument("--direct-io", choices=("auto", "on", "off"), default="auto",
                        help="read the weight files with O_DIRECT, skipping the page cache (auto: files larger than "
                             "the free memory; falls back with its reason where the filesystem refuses it)")
    parser.add_argument("--net-streams", type=int, metavar="N",
                        help="TCP streams per peer for the ranks that receive over the network, 1-8 (default: "
                             "HWTUI_NET_STREAMS, else 2); used where GLOO_SOCKET_IFNAME names one interface")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                        help="check every bucket's xxh3 on every receiver (default: on)")
    parser.add_argument("--same-host", action=argparse.BooleanOptionalAction, default=True,
                        help="receivers on the source's host copy buckets from its page cache instead of the network "
                             "(default: on; each rank's path and why is printed at start)")
    parser.add_argument("--commit", action="store_true",
                        help="switch every receiver to the new version once all ranks verified it (needs --out)")
    parser.add_argument("--out", metavar="DIR", help="per-rank served versions: DIR/rank<R>/CURRENT, versions/, staging/")
    parser.add_argument("--serve-group", metavar="GROUP",
                        help="let GROUP read what --out serves: served files 0640 and group-owned, directories 0750 "
                             "(default: owner-only, 0600/0700); a name or gid known on every receiver's host")
    parser.add_argument("--timeout", type=float, default=20.0, metavar="S", help="seconds any bucket may wait (default 20)")
    parser.add_argument("--init-timeout", type=float, default=60.0, metavar="S", help="seconds to form the world (default 60)")
    parser.add_argument("--events", metavar="FILE",
                        help="write events as JSON lines to FILE ('-' = stdout; '{rank}' in FILE is replaced by the rank)")
    parser.add_argument("--report", metavar="FILE", help="write the final JSON report to FILE (atomically; '{rank}' as above)")


class _LazyJsonl:
    """Opens the events file on the first event, so bad input (rejected before any event) writes nothing."""

    def __init__(self, target: str):
        self.target = target
        self.writer: Any = None

    def __call__(self, ev: Any) -> None:
        from hwtui.core.events import JsonlWriter

        if self.writer is None:
            self.writer = JsonlWriter(self.target)
        self.writer(ev)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Printer:
    """The human view: decision line, start, a progress bar (% and ETA) or a line a second, commit, summary.

    ``verbose`` (-v) adds every bucket and every rank update; ``quiet`` (-q) keeps only results (commit,
    summary, what each rank serves) and errors. Every figure is the engine's (:mod:`hwtui.app.output.progress`).
    ``quiet_rank``: this process is that rank (not 0) of a launcher's world. Only rank 0 prints the
    world's view (it has every receiver's outcome); the others say one line when they fail.
    """

    def __init__(self, out: IO[str], verbose: bool, quiet: bool = False, mode: str | None = None,
                 quiet_rank: int | None = None):
        from hwtui.app.output.progress import NORMAL, OFF, QUIET, VERBOSE, ProgressLine, mode_for

        self.out, self.verbose, self.quiet, self.quiet_rank = out, verbose and not quiet, quiet, quiet_rank
        verbosity = QUIET if quiet else (VERBOSE if verbose else NORMAL)
        if quiet_rank is not None:
            mode = OFF  # a rank that does not print draws no progress either
        self.progress = ProgressLine(out, mode or mode_for(out, verbosity), every=0.0 if self.verbose else 1.0)
        self._ranks_phase: str | None = None

    def _p(self, text: str) -> None:
        self.progress.line(text)

    def _info(self, text: str) -> None:
        if not self.quiet:
            self._p(text)

    def _err(self, text: str) -> None:
        self.progress.clear()
        print(text, file=sys.stderr, flush=True)

    def __call__(self, ev: Any) -> None:
        from hwtui.core.events import ErrorEvent, LogEvent
        from hwtui.engine.replication.events import ReplBucket, ReplCommit, ReplDone, ReplRanks, ReplStart, ReplThroughput

        if self.quiet_rank is not None:
            if isinstance(ev, ErrorEvent) and ev.where == "replication":
                print(f"hwtui: rank {self.quiet_rank}: error: {ev.message}", file=sys.stderr, flush=True)
            return
        handlers: tuple[tuple[type, Callable[[Any], None]], ...] = (
            (LogEvent, self._log), (ReplStart, self._start), (ReplRanks, self._ranks),
            (ReplThroughput, self._throughput), (ReplBucket, self._bucket), (ReplCommit, self._commit),
            (ErrorEvent, self._error), (ReplDone, self._done))
        for kind, handle in handlers:
            if isinstance(ev, kind):
                handle(ev)
                return

    def _log(self, ev: LogEvent) -> None:
        if ev.level == "debug" and not self.verbose:
            return  # e.g. why ranks were exec'd rather than forked: -v shows it
        self._info(ev.message)

    def _start(self, ev: ReplStart) -> None:
        self._info(f"replicating {ev.model} {ev.version}: {ev.total_bytes / 1e6:.1f} MB in {ev.n_buckets} bucket(s) of "
                   f"{ev.bucket_bytes / 2**20:g} MiB to {ev.world_size} ranks on {ev.device} via {ev.transport}; "
                   f"window {ev.window}, chunk {ev.chunk_bytes / 2**20:g} MiB")

    def _ranks(self, ev: ReplRanks) -> None:
        # One line each time the whole world reaches a phase (every update with -v), e.g.
        # "ranks: 3/3 world joined (ready 1/3)".
        whole = ev.counts.get(ev.phase, 0) >= ev.world_size
        if self.verbose or (whole and ev.phase != self._ranks_phase):
            self._ranks_phase = ev.phase if whole else self._ranks_phase
            tail = "" if ev.phase == "ready" else f" (ready {ev.ready}/{ev.world_size})"
            self._info(f"ranks: {ev.counts.get(ev.phase, 0)}/{ev.world_size} {ev.phase}{tail}")

    def _throughput(self, ev: ReplThroughput) -> None:
        from hwtui.app.output.progress import format_bytes

        # Throttled on the engine's own clock (elapsed_s): one line a second in a log, a redraw
        # ten times a second on a terminal, every event with -v.
        self.progress.update(ev.elapsed_s, "replicating", ev.bytes_done, ev.total_bytes,
                             f"{format_bytes(ev.bytes_done)}/{format_bytes(ev.total_bytes)}",
                             f"{ev.gbps:.2f} GB/s  {ev.elapsed_s:.1f} s")

    def _bucket(self, ev: ReplBucket) -> None:
        if self.verbose or ev.state == "failed":
            who = "all ranks" if ev.rank is None else f"rank {ev.rank}"
            self._info(f"  bucket {ev.bucket_id} {ev.state} on {who} ({ev.nbytes} B, {ev.seconds * 1e3:.1f} ms)")

    def _commit(self, ev: ReplCommit) -> None:
        # -q: a prepare that went well is a step on the way; a switch or a failure is a result.
        text = f"commit {ev.phase}: {'ok' if ev.ok else 'FAILED'} ({ev.detail})"
        if ev.ok and ev.phase == "prepare":
            self._info(text)
        else:
            self._p(text)

    def _error(self, ev: ErrorEvent) -> None:
        if ev.where == "replication":
            self._err(f"hwtui: error: {ev.message}")
        elif self.verbose or ev.where in ("verify", "source"):
            self._err(f"  {ev.message}")

    def _done(self, ev: ReplDone) -> None:
        self.progress.close()
        r = ev.report
        if ev.ok:
            # .get, not [...]: a report read back from an older run's events may lack a field.
            mem = r.get("peak_memory", {}).get("max_pool_peak_bytes", 0) if r else 0
            checked = "verified" if r and r.get("verify") else "NOT verified (--no-verify)"
            self._p(f"done: {ev.bytes / 1e6:.1f} MB in {ev.seconds:.3f} s = {ev.gbps:.2f} GB/s, {checked} on "
                    f"{r.get('world_size', '?') if r else '?'} ranks; peak bucket memory {mem / 2**20:.1f} MiB"
                    + ("; committed" if r and r.get("committed") else ""))
        serving = (r.get("serving") if r else None) or {}
        if serving:
            # The per-rank truth read from disk after the run, success or not: the final line
            # and the report always agree on what every rank serves.
            self._p("serving: " + ", ".join(f"rank {r} {v or 'nothing'}" for r, v in serving.items()))


def run(args: argparse.Namespace) -> int:
    import json
    import os

    from hwtui.core.atomic import atomic_write_text
    from hwtui.core.errors import HwtuiError
    from hwtui.core.events import ErrorEvent, Fanout, JsonlWriter
    from hwtui.engine.replication.launcher import ReplicationOptions, joined_world, run_replication

    if args.net_streams is not None:
        from hwtui.engine.replication.net_streams import STREAMS_ENV, check_streams

        n = check_streams(str(args.net_streams), f"--net-streams {args.net_streams}")
        # The flag wins over the environment, for this process (a torchrun rank) and the ranks it starts.
        os.environ[STREAMS_ENV] = str(n)
    # Under torchrun/srun/mpirun every rank runs this command: "{rank}" in a path keeps their files apart.
    try:
        joined = joined_world(dict(os.environ)) if args.nproc is None else None
    except HwtuiError:
        joined = None  # run_replication below says what is wrong, through the same path as any bad input
    rank = str(joined["rank"]) if joined else "0"
    for attr in ("events", "report"):
        if getattr(args, attr) and "{rank}" in getattr(args, attr):
            setattr(args, attr, getattr(args, attr).replace("{rank}", rank))
    human = sys.stderr if args.events == "-" else sys.stdout
    events = _LazyJsonl(args.events) if args.events else None
    verbosity = getattr(args, "verbosity", 0)
    printer = Printer(human, verbose=verbosity > 0, quiet=verbosity < 0,
                      quiet_rank=joined["rank"] if joined and joined["rank"] != 0 else None)
    sink = Fanout(printer, events)
    opts = ReplicationOptions(plan=args.plan, device=args.device, nproc=args.nproc, window=args.inflight,
                              max_inflight_mb=args.max_inflight_mb, adaptive=args.adaptive,
                              target_bucket_ms=args.target_bucket_ms, chunk_mb=args.chunk_mb, transport=args.transport,
                              verify=args.verify, same_host=args.same_host, commit=args.commit, out=args.out,
                              serve_group=args.serve_group, timeout=args.timeout,
                              init_timeout=args.init_timeout, readers=args.readers, direct_io=args.direct_io)
    try:
        result = run_replication(opts, on_event=sink)
    except HwtuiError as exc:
        if args.events == "-":  # the TUI reads stdout: tell it too (a file stays unwritten)
            JsonlWriter("-")(ErrorEvent(message=str(exc), where="input"))
        raise
    finally:
        printer.progress.clear()  # a run that raised leaves no half-drawn bar before its error line
        if events is not None:
            events.close()
    if args.report:
        atomic_write_text(args.report, json.dumps(result.report, indent=2) + "\n")
    return result.exit_code
