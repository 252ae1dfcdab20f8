"""``hwtui snapshot -o host.json``: record everything the probes read, secrets redacted."""

from __future__ import annotations

import argparse
import json

HELP = "record this machine (everything the probes read, secrets redacted) for --replay"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the snapshot JSON")


def run(args: argparse.Namespace) -> int:
    import sys

    from hwtui.app.host_args import host_from_args, timeout_scale
    from hwtui.core.atomic import atomic_write_text
    from hwtui.core.errors import HwtuiError
    from hwtui.core.finding import summarize
    from hwtui.probes.catalog import catalog
    from hwtui.probes.framework import run_checks
    from hwtui.probes.host import RecordingHost

    recorder = RecordingHost(host_from_args(args))
    collectors, rules = catalog()
    # Every collector runs, so the record holds what --check, list-gpus and the TUI's sampler read
    # (NVML/amdsmi figures included).
    result = run_checks(recorder, collectors, rules, timeout_scale=timeout_scale(args))
    snap = recorder.snapshot()
    try:
        atomic_write_text(args.output, json.dumps(snap, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise HwtuiError(f"-o {args.output}: {exc.strerror or exc}") from None
    s = summarize(result.findings)
    print(f"wrote {args.output}: {sum(len(v) for k, v in snap.items() if isinstance(v, dict) and k != 'source')} "
          f"recorded answers, {s['total']} findings ({s['fail']} fail, {s['warn']} warn)", file=sys.stderr)
    return 0
