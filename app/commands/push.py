"""``hwtui push``: replicate a plan's weights into the resident receivers of running agents.

The first agent listed is the source: it reads the plan's weight files from its own disk. Every
other agent receives, verifies and commits exactly as ``hwtui replicate --commit`` does (the same
worker: xxh3 per bucket, per-tensor checks, a unanimous vote, then the two-phase switch), into the
slot it is not serving. Agents keep torch imported and the process group formed between pushes, so
a second push into the same agents costs little more than its transfer.

The report says what each node serves as the node itself tells it when the push is over (read
back, never inferred from the push's messages; a node that cannot be read is "unknown"). A
version that was decided but not switched everywhere is a split, reported with the command that
finishes it: ``--resume`` (or a re-run of the same push) finishes the switch on the nodes that
missed it from their verified staged copy, and sends the version again to those without one.

Exit codes: 0 every receiver committed and serves the version; 1 the push failed or is split (what
each node serves is named); 2 bad input (plan, options, an agent refusing the request).

This module is the command line only: arguments -> :class:`hwtui.app.push.options.PushOptions` ->
:func:`hwtui.app.push.orchestrate.run_push` -> the report printed. ``hwtui train --push-to`` calls
the same orchestration.
"""

from __future__ import annotations

import argparse
import json
import sys

from hwtui.app.push.options import PushOptions
from hwtui.core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, HwtuiError
from hwtui.probes.distributed.replication_defaults import (
    DEFAULT_CHUNK_MB,
    DEFAULT_INIT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WINDOW,
    MAX_CHUNK_MB,
    MAX_TIMEOUT_S,
    MAX_WINDOW,
)

HELP = "push a plan's weights into the resident receivers of running agents (first agent = source)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", required=True, metavar="FILE", help="plan written by `hwtui plan` (paths as the source agent sees them)")
    p.add_argument("--agents", required=True, metavar="LIST",
                   help="SOURCE,RECEIVER,...: agents as HOST[:PORT] (default port 9477); the first one sends")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"per-bucket and commit wait (default {DEFAULT_TIMEOUT_S:g} s)")
    p.add_argument("--init-timeout", type=float, default=DEFAULT_INIT_TIMEOUT_S, metavar="S",
                   help=f"wait for a new process group to form (default {DEFAULT_INIT_TIMEOUT_S:g} s)")
    p.add_argument("--deadline", type=float, default=None, metavar="S",
                   help="give up on the whole push after S s and stop it on every agent "
                        "(default: init timeout + 2 min + 1 min per GB)")
    p.add_argument("--inflight", type=int, default=DEFAULT_WINDOW, metavar="K",
                   help=f"buckets in flight (default {DEFAULT_WINDOW}, at most {MAX_WINDOW})")
    p.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK_MB, metavar="MB",
                   help=f"largest collective (default {DEFAULT_CHUNK_MB:g}, at most {MAX_CHUNK_MB:g})")
    p.add_argument("--readers", type=int, metavar="N",
                   help="threads the source reads the weight files with, 1-64 (default: the source agent's)")
    p.add_argument("--direct-io", choices=("auto", "on", "off"),
                   help="the source reads with O_DIRECT (default: the source agent's setting)")
    p.add_argument("--wait-holds", type=float, default=0.0, metavar="S",
                   help="a GPU-resident receiver whose next slot a serving process still holds (POST "
                        "/v1/served/export): wait up to S seconds for it to be released (default: refuse at once)")
    p.add_argument("--resume", action="store_true",
                   help="finish a push whose version was decided but not switched everywhere (a split); "
                        "refused when nothing was decided. A plain re-run does the same when there is a decision")
    p.add_argument("--json", action="store_true", help="print one JSON document (schema hwtui.push/1)")
    from hwtui.app.node_api.client_options import add_client_options

    add_client_options(p)


def options(args: argparse.Namespace) -> PushOptions:
    """The push's options from its arguments, checked: one line (HwtuiError) for a value out of range."""
    for name in ("timeout", "init_timeout", "deadline"):
        v = getattr(args, name)
        if v is None:
            continue
        if not 0 < v <= MAX_TIMEOUT_S:
            raise HwtuiError(f"--{name.replace('_', '-')} {v}: expected 0 to {MAX_TIMEOUT_S:g} seconds")
    if not 0 <= args.wait_holds <= MAX_TIMEOUT_S:
        raise HwtuiError(f"--wait-holds {args.wait_holds}: expected 0 to {MAX_TIMEOUT_S:g} seconds")
    if not 1 <= args.inflight <= MAX_WINDOW or not 1 <= args.chunk_mb <= MAX_CHUNK_MB:
        raise HwtuiError(f"--inflight is 1 to {MAX_WINDOW} and --chunk-mb 1 to {MAX_CHUNK_MB:g}")
    if args.readers is not None:
        from hwtui.engine.replication.reader import check_readers

        check_readers(args.readers)
    return PushOptions(plan=args.plan, agents=args.agents, timeout=args.timeout, init_timeout=args.init_timeout,
                       deadline=args.deadline, inflight=args.inflight, chunk_mb=args.chunk_mb, resume=args.resume,
                       token_file=getattr(args, "token_file", None), cacert=getattr(args, "cacert", None),
                       readers=args.readers, direct_io=args.direct_io, wait_holds=args.wait_holds)


def run(args: argparse.Namespace) -> int:
    from hwtui.app.push.client import text
    from hwtui.app.push.orchestrate import run_push, targets_of
    from hwtui.app.push.report import final_line, node_lines

    targets = targets_of(args.agents)
    doc = run_push(options(args), targets)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for line in node_lines(doc):
            print(line)
        print(text(final_line(doc), 100_000))
    if doc["ok"]:
        return EXIT_OK
    if any(r.get("status") == 400 for r in doc["nodes"]):
        return EXIT_USAGE
    return EXIT_FAILED
