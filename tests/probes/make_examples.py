"""Regenerate the example snapshots users can replay (docs/examples/*.snapshot.json).

    .venv/bin/python -m tests.probes.make_examples          # writes docs/examples/
    hwtui --check --replay docs/examples/h100x8.snapshot.json      # replay one
    hwtui list-gpus --replay docs/examples/mixed3.snapshot.json

Each snapshot is a RecordingHost run over a recorded tree (tests/probes/recorded.py):
the full check, the device inventory and one dashboard sample, so everything a replay asks for
was recorded.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from hwtui.core.atomic import atomic_write_text
from hwtui.probes.catalog import catalog
from hwtui.probes.framework import run_checks
from hwtui.probes.host import RecordingHost
from hwtui.probes.inventory import detect_devices
from hwtui.probes.sampling import Sampler
from tests.probes.recorded import h100x8, mixed3

OUT = Path(__file__).resolve().parents[2] / "docs" / "examples"
ENV = {"PATH": "/home/alice/venv/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/home/alice", "USER": "alice",
       "LANG": "C.UTF-8", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
EXAMPLES = {
    "h100x8": (h100x8, "dgx-h100-example", "8x H100 80GB HBM3 SXM server, NVLink, driver 570, torch cu128"),
    "mixed3": (mixed3, "mixed3-example", "RTX 4090 + RX 7800 XT + Arc A750 workstation, torch cu128"),
}


def snapshot_of(builder, host_name: str, description: str, root: Path) -> dict:
    fs = builder(root)
    rec = RecordingHost(fs.host(ENV))
    collectors, rules = catalog()
    run_checks(rec, collectors, rules, timeout_scale=5)
    devices, _ = detect_devices(rec)
    Sampler(rec, devices).sample()
    snap = rec.snapshot()
    snap["created"] = "2025-06-01T12:00:00+0000"  # stable across regenerations
    snap["source"] = {"host": host_name, "description": description}
    return snap


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    for name, (builder, host_name, description) in EXAMPLES.items():
        with tempfile.TemporaryDirectory() as tmp:
            snap = snapshot_of(builder, host_name, description, Path(tmp))
        path = out / f"{name}.snapshot.json"
        atomic_write_text(path, json.dumps(snap, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
