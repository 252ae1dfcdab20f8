"""What a display reads of a replication run: a Protocol over the state folded from the engine's events.

The TUI folds ``repl.*`` events into its run state (``app/tui/run_state.Replication``); the widgets
that draw it sit below the app and may not import it. This Protocol, beside the events it is made
of, is the contract between the two: the widgets are typed by it, and mypy checks at every call
site that the app's state still has every figure a widget reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from hwtui.engine.replication.events import BucketState, ReplRanks


class ReplicationView(Protocol):
    @property
    def lanes(self) -> Sequence[int | None]:
        """The source's window: slot -> bucket id (None: idle)."""

    @property
    def states(self) -> Mapping[int, BucketState]:
        """bucket id -> its world-level state."""

    @property
    def ranks(self) -> ReplRanks | None:
        """Rank start-up as the launcher last reported it."""

    @property
    def window(self) -> int: ...

    @property
    def n_buckets(self) -> int: ...

    @property
    def starting_up(self) -> bool: ...

    @property
    def occupancy(self) -> int: ...

    @property
    def bytes_in_flight(self) -> int: ...

    @property
    def awaiting_receivers(self) -> int: ...

    @property
    def throughput(self) -> Iterable[tuple[float, float]]:
        """(seconds into the run, GB/s) samples, oldest first."""

    @property
    def current_gbps(self) -> float | None: ...

    @property
    def peak_gbps(self) -> float: ...

    @property
    def average_gbps(self) -> float | None: ...

    def phase_counts(self) -> list[tuple[str, int]]: ...

    def count(self, state: BucketState | str) -> int: ...
