"""Human and file forms of the cluster test's results.

The live printer turns the engine's events into lines as they arrive (so a slow sweep shows
progress); the bandwidth table uses nccl-tests' columns so the figures can be pasted next to an
``all_reduce_perf`` run. The report file is the redacted JSON document rank 0 assembled, written
atomically.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from hwtui.core.atomic import atomic_write_text
from hwtui.core.events import ErrorEvent, Event
from hwtui.core.redact import redact
from hwtui.engine.cluster.events import BandwidthEvent, CorrectnessEvent, DoneEvent, MismatchEvent, NodeEvent

BW_HEADER = f"{'op':>12} {'size(B)':>12} {'time(us)':>11} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}"


def bandwidth_row(op: str, size_bytes: int, seconds: float, algbw: float, busbw: float) -> str:
    return f"{op:>12} {size_bytes:>12} {seconds * 1e6:>11.1f} {algbw:>12.4f} {busbw:>12.4f}"


class LivePrinter:
    """Event sink that prints each cluster event as one or more human lines."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self._bw_header = False

    def _out(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def __call__(self, ev: Event) -> None:
        if isinstance(ev, NodeEvent):
            self._out(f"rank {ev.rank:>3} on {ev.node}: {'ok' if ev.ok else 'PROBLEMS'}  {ev.summary}")
        elif isinstance(ev, MismatchEvent):
            f = ev.finding
            self._out(f"[{f['status'].upper()}] {f['title']}  ({f['id']})")
        elif isinstance(ev, CorrectnessEvent):
            got = ", ".join(f"{g:g}" for g in ev.got)
            self._out(f"correctness: all-reduce expected {ev.expected:g}, got [{got}]: {'ok' if ev.ok else 'WRONG'}")
        elif isinstance(ev, BandwidthEvent):
            if not self._bw_header:
                self._out(BW_HEADER)
                self._bw_header = True
            self._out(bandwidth_row(ev.op, ev.size_bytes, ev.seconds, ev.algbw, ev.busbw))
        elif isinstance(ev, DoneEvent):
            self._out(f"cluster test {'PASSED' if ev.ok else 'FAILED'}: {ev.world_size} rank(s) on "
                      f"{len(ev.nodes)} node(s) ({', '.join(ev.nodes)})")
        elif isinstance(ev, ErrorEvent):
            self._out(f"error: {ev.message}")


def write_report(path: str | Path, report: Mapping[str, Any]) -> None:
    atomic_write_text(path, json.dumps(redact(report), indent=2, default=str) + "\n")
