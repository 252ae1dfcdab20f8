"""``hwtui plan``: lay out weight files into a verified, versioned replication plan."""

from __future__ import annotations

import argparse
from typing import IO, Any

from hwtui.probes.distributed.replication_defaults import DEFAULT_BUCKET_MB

HELP = "plan a weight replication: buckets, checksums, delta against a previous manifest"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", nargs="+", required=True, metavar="PATH",
                        help="safetensors files (memory-mapped) or torch state dicts (loaded with weights_only=True)")
    parser.add_argument("--prev", metavar="MANIFEST",
                        help="manifest (or plan) of the version the receivers serve now: only changed tensors are sent")
    parser.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB, metavar="N",
                        help=f"bucket size in MiB (default {DEFAULT_BUCKET_MB:g})")
    parser.add_argument("--align", type=int, default=1, metavar="B",
                        help="align each tensor inside a bucket to B bytes (a power of two; default 1 keeps buckets "
                             "contiguous file ranges that are sent without packing)")
    parser.add_argument("--model", help="model id (default: the first file's name)")
    # dest differs from the name: the top-level parser's --version (print hwtui's version) shares the namespace
    parser.add_argument("--version", dest="plan_version", metavar="V",
                        help="version of these weights (default: derived from their checksums)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="where to write the plan, e.g. model.plan (atomically; format hwtui.plan/2: a JSON header and binary "
                             "tables, so a *.json name gets a warning)")
    parser.add_argument("--manifest", metavar="FILE", help="also write the manifest of this version (the next --prev)")


class PlanPrinter:
    """``hwtui plan``'s progress from the planner's own events: a bar (% and ETA) on a terminal,
    a line a second elsewhere, nothing with -q."""

    PHASES = {"tensors": "hashing tensors (pass 1 of 2)", "buckets": "hashing buckets (pass 2 of 2)"}

    def __init__(self, out: IO[str], verbosity: int = 0, mode: str | None = None):
        from hwtui.app.output.progress import ProgressLine, mode_for

        self.progress = ProgressLine(out, mode or mode_for(out, verbosity), every=0.0 if verbosity > 0 else 1.0)

    def __call__(self, ev: Any) -> None:
        from hwtui.app.output.progress import format_bytes

        # The bar and its ETA run over both passes; the sizes are this pass's, so they read as the
        # model's size (both passes together are twice it).
        done, total = (ev.pass_done, ev.pass_bytes) if ev.pass_bytes else (ev.bytes_done, ev.total_bytes)
        self.progress.update(ev.elapsed_s, "plan", ev.bytes_done, ev.total_bytes,
                             f"{format_bytes(done)}/{format_bytes(total)}", self.PHASES.get(ev.phase, ev.phase))


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from hwtui.core.errors import HwtuiError
    from hwtui.engine.replication.plan import build_plan_from_files, manifest_of, write_json_atomic, write_plan

    bucket_bytes = int(args.bucket_mb * (1 << 20))
    if bucket_bytes <= 0:
        raise HwtuiError("--bucket-mb must be positive")
    verbosity = getattr(args, "verbosity", 0)
    t0 = time.perf_counter()
    printer = PlanPrinter(sys.stdout, verbosity)
    try:
        plan = build_plan_from_files(args.weights, model=args.model, version=args.plan_version, bucket_bytes=bucket_bytes,
                                     align=args.align, prev_path=args.prev, on_event=printer)
    finally:
        printer.progress.clear()  # the bar gives way to the result line (or to the error)
    write_plan(args.output, plan)
    if args.manifest:
        write_json_atomic(args.manifest, manifest_of(plan))
    sent, n = int(plan.tables.send.sum()), len(plan.tables.names)
    kind = f"delta from {plan['prev_version']}" if plan["prev_version"] else "full push"
    print(f"plan {args.output}: {plan['model']} {plan['version']} ({kind}): {sent}/{n} tensors, "
          f"{plan['total_bytes'] / 1e6:.1f} MB in {len(plan['buckets'])} bucket(s), {len(plan['deleted'])} deleted, "
          f"digest {plan['digest'][:16]} ({time.perf_counter() - t0:.2f} s)")
    if str(args.output).lower().endswith(".json"):
        # Written all the same (scripts and the TUI name plans *.json, and `replicate` reads either):
        # but the file is binary, and an editor or jq given it would choke.
        print(f"hwtui: warning: {args.output} is a binary plan (hwtui.plan/2: a JSON header and binary tables), "
              f"not JSON; name plans *.plan", file=sys.stderr)
    return 0
