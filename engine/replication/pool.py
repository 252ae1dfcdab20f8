"""A recycled pool of bucket buffers: the memory bound of a replication is this pool's peak.

Buffers are allocated once (and touched, so page faults are paid before the clock starts: a
fresh 256 MB allocation costs ~1 s of faults on this class of machine, more than the transfer)
and handed out again and again. The pool never holds more than ``count`` buffers, and the window
never admits a bucket without one, so peak bucket memory <= window x bucket bytes by construction,
and ``peak_bytes`` measures it.
"""

from __future__ import annotations

from typing import Any


class PoolExhausted(RuntimeError):
    pass


class BufferPool:
    def __init__(self, count: int, buffer_bytes: int, device: str = "cpu", pin: bool = False):
        if count < 1 or buffer_bytes < 1:
            raise ValueError("a pool needs at least one buffer of at least one byte")
        self.count, self.buffer_bytes, self.device, self.pin = count, buffer_bytes, device, pin
        self._free: list[Any] = []
        self._allocated = 0
        self.in_use_bytes = 0
        self.peak_bytes = 0  # peak bytes handed out at once
        self.allocated_bytes = 0  # bytes the pool has allocated (its real footprint)

    def _new(self) -> Any:
        import torch

        buf = torch.empty(self.buffer_bytes, dtype=torch.uint8, device=self.device,
                          pin_memory=self.pin and self.device == "cpu")
        buf.zero_()  # touch every page now, not in the middle of a transfer
        self._allocated += 1
        self.allocated_bytes += self.buffer_bytes
        return buf

    def warm(self, n: int) -> None:
        while self._allocated < min(n, self.count):
            self._free.append(self._new())

    def acquire(self, nbytes: int) -> Any:
        """A buffer of ``buffer_bytes`` (callers slice ``[:nbytes]``)."""
        if nbytes > self.buffer_bytes:
            raise ValueError(f"bucket of {nbytes} bytes does not fit the pool's {self.buffer_bytes}-byte buffers")
        if self._free:
            buf = self._free.pop()
        elif self._allocated < self.count:
            buf = self._new()
        else:
            raise PoolExhausted(f"all {self.count} buffers are in flight")
        self.in_use_bytes += self.buffer_bytes
        self.peak_bytes = max(self.peak_bytes, self.in_use_bytes)
        return buf

    def spare(self, n: int = 1) -> bool:
        """True when ``n`` acquire()s would hand out a buffer now (free, or not yet made) without exhausting the pool."""
        return len(self._free) + self.count - self._allocated >= n

    def release(self, buf: Any) -> None:
        self.in_use_bytes -= self.buffer_bytes
        self._free.append(buf)

    def stats(self) -> dict[str, int]:
        return {"count": self.count, "buffer_bytes": self.buffer_bytes, "allocated_bytes": self.allocated_bytes,
                "peak_in_use_bytes": self.peak_bytes}
