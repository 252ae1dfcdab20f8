"""The in-flight window: at most ``limit`` buckets (and optionally ``max_bytes``) between
"staged/posted" and "done".

Adaptive mode steers ``limit`` between 1 and ``max_limit`` towards a target time per bucket:
more buckets in flight hide per-bucket latency (packing, hashing) but each bucket then waits
longer in the transport's queue; when buckets take longer than the target the window shrinks,
when they finish well under it the window grows. The limit never exceeds the pool size, so the
memory bound holds in every mode.
"""

from __future__ import annotations


class Window:
    def __init__(self, limit: int, *, max_bytes: int | None = None, adaptive: bool = False,
                 target_s: float | None = None, max_limit: int | None = None):
        if limit < 1:
            raise ValueError("the in-flight window must be at least 1")
        self.max_limit = max(limit, max_limit or limit)
        self.limit = min(2, self.max_limit) if adaptive else limit
        self.max_bytes = max_bytes
        self.adaptive = adaptive
        self.target_s = target_s if target_s and target_s > 0 else 0.05
        self.occupancy = 0
        self.bytes_in_flight = 0
        self.peak_occupancy = 0
        self.peak_bytes = 0
        self.changes = 0

    def can_admit(self, nbytes: int, count: int = 1) -> bool:
        """Room for ``count`` buckets of ``nbytes`` in all (a group sent as one collective)."""
        if self.occupancy > 0 and self.occupancy + count > self.limit:
            return False
        if self.occupancy >= self.limit:
            return False
        # A byte cap smaller than one bucket must still let one bucket through, or nothing moves.
        return self.max_bytes is None or self.occupancy == 0 or self.bytes_in_flight + nbytes <= self.max_bytes

    def admit(self, nbytes: int) -> None:
        self.occupancy += 1
        self.bytes_in_flight += nbytes
        self.peak_occupancy = max(self.peak_occupancy, self.occupancy)
        self.peak_bytes = max(self.peak_bytes, self.bytes_in_flight)

    def retire(self, nbytes: int, seconds: float) -> bool:
        """A bucket left the window after ``seconds`` in flight; returns True if the limit changed."""
        self.occupancy -= 1
        self.bytes_in_flight -= nbytes
        if not self.adaptive:
            return False
        old = self.limit
        if seconds > 1.25 * self.target_s and self.limit > 1:
            self.limit -= 1
        elif seconds < 0.8 * self.target_s and self.limit < self.max_limit:
            self.limit += 1
        if self.limit != old:
            self.changes += 1
        return self.limit != old
