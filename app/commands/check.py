"""``hwtui --check``: every probe headless, for people and for CI.

Exit codes: 0 no failure, 1 a failure (or a probe error: an unverified check is not a pass; with
--strict also a warning), 2 usage error. Results on stdout, diagnostics on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hwtui.app.host_args import host_from_args, timeout_scale
from hwtui.core.errors import EXIT_FAILED, EXIT_OK, HwtuiError

if TYPE_CHECKING:  # probes are imported lazily (CLI start-up time)
    from hwtui.probes.devices import Device
    from hwtui.probes.framework import CheckResult
    from hwtui.probes.host import Host

SCHEMA = "hwtui.check/1"


def _host_summary(result: CheckResult) -> dict[str, Any]:
    info = dict(result.facts.get("host") or {})
    info.pop("python_executable", None)
    return info


def build_document(host: Host, result: CheckResult, devices: Sequence[Device]) -> dict[str, Any]:
    from hwtui.core.finding import summarize
    from hwtui.core.redact import redact_doc

    doc = {
        "schema": SCHEMA,
        "host": {"source": host.description, **_host_summary(result)},
        "devices": [d.to_dict() for d in devices],
        "findings": [f.to_dict() for f in result.findings],
        "summary": summarize(result.findings),
        "duration_s": round(result.duration_s, 3),
    }
    return redact_doc(doc)


def is_failure(result: CheckResult, strict: bool) -> bool:
    from hwtui.core.finding import Status

    bad = {Status.FAIL, Status.ERROR} | ({Status.WARN} if strict else set())
    return any(f.status in bad for f in result.findings)


def run(args: argparse.Namespace) -> int:
    from hwtui.core.finding import Finding, summarize
    from hwtui.core.redact import redact_doc
    from hwtui.probes.catalog import areas, catalog
    from hwtui.probes.framework import run_checks
    from hwtui.probes.inventory import devices_from_facts

    host = host_from_args(args)
    only = None
    if args.only is not None:  # `--only ''` is a typo to report, not "everything"
        only = {a.strip() for a in args.only.split(",") if a.strip()}
        known = set(areas())
        unknown = only - known
        if unknown or not only:
            # Names echoed capped and repr'd: the message stays one short line whatever was typed.
            shown = ", ".join(repr(a[:30]) for a in sorted(unknown)[:5]) + (" ..." if len(unknown) > 5 else "")
            raise HwtuiError(f"--only: unknown area(s) {shown or '(empty)'}; choose from {', '.join(sorted(known))}")
    collectors, rules = catalog()
    result = run_checks(host, collectors, rules, only=only, timeout_scale=timeout_scale(args))
    # Findings are redacted at the boundary, so text, JSON and JUnit all get the same masked view.
    result.findings = [Finding.from_dict(redact_doc(f.to_dict())) for f in result.findings]
    devices = devices_from_facts(result.facts)

    if args.junit:
        from hwtui.app.output.junit import to_junit
        from hwtui.core.atomic import atomic_write_text

        try:
            atomic_write_text(args.junit, to_junit(result.findings, result.duration_s, strict=args.strict))
        except OSError as exc:
            raise HwtuiError(f"--junit {args.junit}: {exc.strerror or exc}") from None
    if args.json:
        json.dump(build_document(host, result, devices), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from hwtui.app.output.style import Painter, use_color
        from hwtui.app.output.text_report import render

        print(render(result.findings, summarize(result.findings), result.duration_s, host.description,
                     Painter(use_color(sys.stdout)), verbose=getattr(args, "verbosity", 0) > 0))
    return EXIT_FAILED if is_failure(result, args.strict) else EXIT_OK
