"""``hwtui env``: print the exports that make this node ready for a distributed job.

Runs the ``env`` checks (launcher, rendezvous, NCCL/RDMA, vendor runtimes, knobs, hygiene) and
turns what they detected into shell lines. ``--write FILE`` saves them atomically as a file to
``source`` instead of printing them (one line says where); the per-rank variables stay with the
launcher.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from hwtui.app.host_args import host_from_args, timeout_scale
from hwtui.core.errors import EXIT_OK, HwtuiError

HELP = "print the environment exports that make this node ready (NCCL, RDMA, rendezvous, vendor runtimes)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write", metavar="FILE", help="save the exports to FILE (atomically) instead of printing them, to `source FILE`")
    parser.add_argument("--checkpoint-dir", metavar="DIR",
                        help="checkpoint directory to check and export (default: $HWTUI_CHECKPOINT_DIR)")


def run(args: argparse.Namespace) -> int:
    from hwtui.core.finding import Status
    from hwtui.probes.catalog import catalog
    from hwtui.probes.distributed.exports import build_lines, render
    from hwtui.probes.framework import run_checks

    host = host_from_args(args)
    if args.checkpoint_dir:
        path = args.checkpoint_dir
        # A live path is made absolute here: ranks resolve a relative one against their own cwd.
        host.env["HWTUI_CHECKPOINT_DIR"] = os.path.abspath(path) if host.is_live else path
    collectors, rules = catalog()
    result = run_checks(host, collectors, rules, only={"env"}, timeout_scale=timeout_scale(args))
    lines = build_lines(result.facts, result.findings)
    bad = [f for f in result.findings if f.status in (Status.FAIL, Status.ERROR)]
    warned = [f for f in result.findings if f.status == Status.WARN]
    header = [f"hwtui env: exports for {host.description}, {time.strftime('%Y-%m-%d %H:%M:%S')}",
              "Load with: source <this file>. RANK, LOCAL_RANK and WORLD_SIZE are left to the launcher.",
              f"Checks: {len(bad)} failed, {len(warned)} warned (details: hwtui --check --only env)"]
    text = render(lines, header)
    if args.write:
        from hwtui.core.atomic import atomic_write_text

        try:
            atomic_write_text(args.write, text)
        except OSError as exc:
            raise HwtuiError(f"--write {args.write}: {exc.strerror or exc}") from None
        print(f"hwtui: wrote {args.write}; load it with: source {args.write}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if bad:
        print(f"hwtui: {len(bad)} env check(s) failed: " + ", ".join(f.id for f in bad[:6])
              + (" ..." if len(bad) > 6 else "") + "; see hwtui --check --only env", file=sys.stderr)
    return EXIT_OK
