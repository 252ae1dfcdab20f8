"""Events of the cluster smoke test, for the CLI printer, ``--events`` JSON lines and the TUI Run screen.

Only rank 0 emits them: it is the rank that holds every node's report after the gather.
"""

from __future__ import annotations

from hwtui.core.events import Event, event
from hwtui.core.finding import FindingDict


@event("cluster.node")
class NodeEvent(Event):
    """One rank's local check arrived at rank 0 (``ok`` is False when it found a failure)."""

    rank: int
    node: str
    ok: bool
    summary: str


@event("cluster.mismatch")
class MismatchEvent(Event):
    """A cross-node comparison that did not pass; ``finding`` is ``Finding.to_dict()``."""

    finding: FindingDict


@event("cluster.correctness")
class CorrectnessEvent(Event):
    ok: bool
    expected: float
    got: list[float]


@event("cluster.bandwidth")
class BandwidthEvent(Event):
    """One point of the sweep; GB/s as nccl-tests defines algbw and busbw."""

    op: str
    size_bytes: int
    algbw: float
    busbw: float
    seconds: float


@event("cluster.done")
class DoneEvent(Event):
    ok: bool
    world_size: int
    nodes: list[str]
    findings: list[FindingDict]
