"""Health: heartbeats from each worker, liveness judged by the coordinator.

Two clocks per worker, because dying and hanging look different:

* ``last_seen`` -- any message, including the heartbeat a background thread sends every
  ``interval``. Silence longer than ``heartbeat_timeout`` means the process is frozen (SIGSTOP,
  a wedged driver call holding the GIL, a machine under swap) or gone.
* ``last_progress`` -- a message from the training loop itself. A worker that keeps beating but
  holds a chunk for longer than ``stall_timeout`` is stuck in a kernel or a collective.

A worker whose process has exited is lost at once (its pipe closes within milliseconds).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class HeartbeatSender(threading.Thread):
    """Worker side: send ``{"kind": "hb", ...info()}`` every ``interval`` seconds until stopped."""

    def __init__(self, send: Callable[[dict[str, Any]], None], interval: float, info: Callable[[], dict[str, Any]]):
        super().__init__(name="hwtui-heartbeat", daemon=True)
        self._send, self.interval, self._info = send, interval, info
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self._send({"kind": "hb", **self._info()})
            except OSError:  # the coordinator is gone; the main loop will notice and exit
                return

    def stop(self) -> None:
        self._stop_event.set()


@dataclass
class Liveness:
    heartbeat_timeout: float
    stall_timeout: float
    clock: Callable[[], float] = time.monotonic
    last_seen: dict[int, float] = field(default_factory=dict)
    last_progress: dict[int, float] = field(default_factory=dict)

    def add(self, rank: int) -> None:
        now = self.clock()
        self.last_seen[rank] = self.last_progress[rank] = now

    def seen(self, rank: int, progress: bool) -> None:
        now = self.clock()
        self.last_seen[rank] = now
        if progress:
            self.last_progress[rank] = now

    def remove(self, rank: int) -> None:
        self.last_seen.pop(rank, None)
        self.last_progress.pop(rank, None)

    def verdict(self, rank: int, holds_work: bool) -> str | None:
        """Why ``rank`` should be declared lost, or None while it looks healthy."""
        now = self.clock()
        silent = now - self.last_seen.get(rank, now)
        if silent > self.heartbeat_timeout:
            return f"no heartbeat for {silent:.1f}s (timeout {self.heartbeat_timeout:g}s)"
        stuck = now - self.last_progress.get(rank, now)
        if holds_work and stuck > self.stall_timeout:
            return f"no progress for {stuck:.1f}s while holding work (stall timeout {self.stall_timeout:g}s)"
        return None
