"""``hwtui replicate``: push a planned version to every rank, verified, with a two-phase commit.

With ``--events -`` the JSON-lines event stream owns stdout (the TUI reads it) and every
human-readable line goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

from hwtui.probes.dist.replication_defaults import DEFAULT_CHUNK_MB

HELP = "replicate planned weights to N ranks over torch.distributed (bucketed, windowed, verified)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, metavar="FILE", help="plan written by `hwtui plan`")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "hip", "xpu", "hpu"),
                        help="where the weights live (hip: an AMD GPU under a ROCm build of torch; checked before anything starts)")
    parser.add_argument("--nproc", type=int, metavar="N",
                        help="start N local ranks (default: join the world of torchrun/SLURM if present, else 2)")
    parser.add_argument("--inflight", type=int, metavar="K",
                        help="buckets in flight at once (default: HOTWEIGHTS_IPC_INFLIGHT_BUCKETS, else 4)")
    parser.add_argument("--max-inflight-mb", type=float, metavar="MB", help="also cap the bytes in flight")
    parser.add_argument("--adaptive", action="store_true", help="steer the window towards --target-bucket-ms per bucket")
    parser.add_argument("--target-bucket-ms", type=float, default=50.0, metavar="MS", help="adaptive target (default 50)")
    parser.add_argument("--chunk-mb", type=float, metavar="M",
                        help=f"largest broadcast in MiB: bigger buckets are split, file-contiguous smaller ones travel together "
                             f"(default: HOTWEIGHTS_BCAST_CHUNK_MB, else {DEFAULT_CHUNK_MB:g})")
    parser.add_argument("--transport", metavar="NAME",
                        help="override the transport: gloo, cuda-ipc, nccl, rccl, xccl, ccl, hccl")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                        help="check every bucket's xxh3 on every receiver (default: on)")
    parser.add_argument("--same-host", action=argparse.BooleanOptionalAction, default=True,
                        help="receivers on the source's host copy buckets from its page cache instead of the network "
                             "(default: on; each rank's path and why is printed at start)")
    parser.add_argument("--commit", action="store_true",
                        help="switch every receiver to the new version once all ranks verified it (needs --out)")
    parser.add_argument("--out", metavar="DIR", help="per-rank served versions: DIR/rank<R>/CURRENT, versions/, staging/")
    parser.add_argument("--timeout", type=float, default=20.0, metavar="S", help="seconds any bucket may wait (default 20)")
    parser.add_argument("--init-timeout", type=float, default=60.0, metavar="S", help="seconds to form the world (default 60)")
    parser.add_argument("--events", metavar="FILE",
                        help="write events as JSON lines to FILE ('-' = stdout; '{rank}' in FILE is replaced by the rank)")
    parser.add_argument("--report", metavar="FILE", help="write the final JSON report to FILE (atomically; '{rank}' as above)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every bucket of every rank")


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
    """The human view: decision line, start, throughput about once a second, commit, summary."""

    def __init__(self, out: IO[str], verbose: bool, quiet_rank: int | None = None):
        # quiet_rank: this process is that rank (not 0) of a launcher's world. Only rank 0 prints the
        # world's view (it has every receiver's outcome); the others say one line when they fail.
        self.out, self.verbose, self.quiet_rank = out, verbose, quiet_rank
        self._last = 0.0
        self._ranks_phase: str | None = None

    def _p(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def __call__(self, ev: Any) -> None:
        import time

        from hwtui.core.events import ErrorEvent, LogEvent
        from hwtui.engine.replication.events import ReplBucket, ReplCommit, ReplDone, ReplRanks, ReplStart, ReplThroughput

        if self.quiet_rank is not None:
            if isinstance(ev, ErrorEvent) and ev.where == "replication":
                print(f"hwtui: rank {self.quiet_rank}: error: {ev.message}", file=sys.stderr, flush=True)
            return
        if isinstance(ev, LogEvent):
            self._p(ev.message)
        elif isinstance(ev, ReplStart):
            self._p(f"replicating {ev.model} {ev.version}: {ev.total_bytes / 1e6:.1f} MB in {ev.n_buckets} bucket(s) of "
                    f"{ev.bucket_bytes / 2**20:g} MiB to {ev.world_size} ranks on {ev.device} via {ev.transport}; "
                    f"window {ev.window}, chunk {ev.chunk_bytes / 2**20:g} MiB")
        elif isinstance(ev, ReplRanks):
            # One line each time the whole world reaches a phase (every update with -v), e.g.
            # "ranks: 3/3 world joined (ready 1/3)".
            whole = ev.counts.get(ev.phase, 0) >= ev.world_size
            if self.verbose or (whole and ev.phase != self._ranks_phase):
                self._ranks_phase = ev.phase if whole else self._ranks_phase
                tail = "" if ev.phase == "ready" else f" (ready {ev.ready}/{ev.world_size})"
                self._p(f"ranks: {ev.counts.get(ev.phase, 0)}/{ev.world_size} {ev.phase}{tail}")
        elif isinstance(ev, ReplThroughput):
            now = time.monotonic()
            if now - self._last >= 1.0 or ev.bytes_done >= ev.total_bytes or self.verbose:
                self._last = now
                self._p(f"  {ev.bytes_done / 1e6:9.1f} / {ev.total_bytes / 1e6:.1f} MB  {ev.gbps:6.2f} GB/s  "
                        f"{ev.elapsed_s:6.2f} s")
        elif isinstance(ev, ReplBucket) and (self.verbose or ev.state == "failed"):
            who = "all ranks" if ev.rank is None else f"rank {ev.rank}"
            self._p(f"  bucket {ev.bucket_id} {ev.state} on {who} ({ev.nbytes} B, {ev.seconds * 1e3:.1f} ms)")
        elif isinstance(ev, ReplCommit):
            self._p(f"commit {ev.phase}: {'ok' if ev.ok else 'FAILED'} ({ev.detail})")
        elif isinstance(ev, ErrorEvent):
            if ev.where == "replication":
                print(f"hwtui: error: {ev.message}", file=sys.stderr, flush=True)
            elif self.verbose or ev.where in ("verify", "source"):
                print(f"  {ev.message}", file=sys.stderr, flush=True)
        elif isinstance(ev, ReplDone):
            if ev.ok:
                r = ev.report or {}
                mem = (r.get("peak_memory") or {}).get("max_pool_peak_bytes", 0)
                checked = "verified" if r.get("verify") else "NOT verified (--no-verify)"
                self._p(f"done: {ev.bytes / 1e6:.1f} MB in {ev.seconds:.3f} s = {ev.gbps:.2f} GB/s, {checked} on "
                        f"{r.get('world_size', '?')} ranks; peak bucket memory {mem / 2**20:.1f} MiB"
                        + ("; committed" if r.get("committed") else ""))
            serving = (ev.report or {}).get("serving") or {}
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
    sink = Fanout(Printer(human, args.verbose, quiet_rank=joined["rank"] if joined and joined["rank"] != 0 else None), events)
    opts = ReplicationOptions(plan=args.plan, device=args.device, nproc=args.nproc, inflight=args.inflight,
                              max_inflight_mb=args.max_inflight_mb, adaptive=args.adaptive,
                              target_bucket_ms=args.target_bucket_ms, chunk_mb=args.chunk_mb, transport=args.transport,
                              verify=args.verify, same_host=args.same_host, commit=args.commit, out=args.out, timeout=args.timeout,
                              init_timeout=args.init_timeout)
    try:
        result = run_replication(opts, on_event=sink)
    except HwtuiError as exc:
        if args.events == "-":  # the TUI reads stdout: tell it too (a file stays unwritten)
            JsonlWriter("-")(ErrorEvent(message=str(exc), where="input"))
        raise
    finally:
        if events is not None:
            events.close()
    if args.report:
        atomic_write_text(args.report, json.dumps(result.report, indent=2) + "\n")
    return result.exit_code
