"""``hwtui list-gpus``: one table, one global id across vendors (the mixed-vendor design's table)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hwtui.app.output.style import printable

if TYPE_CHECKING:  # probes are imported lazily (CLI start-up time)
    from hwtui.probes.devices import Device

HELP = "list accelerators of every vendor with one global id"

# The --json document's schema tag: consumers check it before reading "devices", so a later change of
# shape is a new tag, never a silent misread.
SCHEMA = "hwtui.gpus/1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help=f"print one JSON document (schema {SCHEMA}: devices as rows) instead of a table")
    parser.add_argument("--all", action="store_true", help="also list devices that cannot be used (passthrough, wrong driver)")


def _vram(n: int | None) -> str:
    return "-" if not n else f"{n / 1024**3:.0f} GB"


def format_table(devices: Sequence[Device]) -> str:
    rows = [("ID", "Vendor", "Model", "VRAM", "Backend", "Device", "PCI", "Driver")]
    for d in devices:
        rows.append((
            "-" if d.id is None else str(d.id), d.vendor, d.name, _vram(d.vram_total), d.backend,
            d.device or f"({d.reason})", d.pci, d.driver or "-",
        ))
    shown = [tuple(printable(str(c)).replace("\n", "\\n") for c in r) for r in rows]
    widths = [max(len(r[i]) for r in shown) for i in range(len(shown[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in shown)


def run(args: argparse.Namespace) -> int:
    from hwtui.app.host_args import host_from_args
    from hwtui.core.redact import redact
    from hwtui.probes.inventory import detect_devices

    host = host_from_args(args)
    devices, _facts = detect_devices(host)
    usable = [d for d in devices if d.usable]
    shown = devices if (args.all or args.json) else usable
    if args.json:
        json.dump({"schema": SCHEMA, "devices": redact([d.to_dict() for d in shown])}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not shown:
        print("No accelerator found: hwtui's engine will run on CPU workers (gloo).")
    else:
        print(format_table(shown))
    hidden = len(devices) - len(shown)
    if hidden:
        print(f"({hidden} more device(s) not usable here; --all lists them)", file=sys.stderr)
    return 0
