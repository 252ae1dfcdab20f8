"""What a display reads of a cluster test: a Protocol over the state folded from the engine's events.

The TUI folds ``cluster.*`` events into its run state (``app/tui/run_state.Cluster``); the widget
that draws it sits below the app and may not import it. This Protocol, beside the events it is made
of, is the contract between the two: the widget is typed by it, and mypy checks at the call site
that the app's state still has every part the widget reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from hwtui.engine.cluster.events import BandwidthEvent, CorrectnessEvent, DoneEvent, MismatchEvent, NodeEvent


class ClusterView(Protocol):
    @property
    def nodes(self) -> Mapping[int, NodeEvent]:
        """rank -> the node it reported from."""

    @property
    def mismatches(self) -> Sequence[MismatchEvent]: ...

    @property
    def correctness(self) -> CorrectnessEvent | None: ...

    @property
    def bandwidth(self) -> Sequence[BandwidthEvent]: ...

    @property
    def done(self) -> DoneEvent | None: ...
