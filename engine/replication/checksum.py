"""Checksums: xxh3-64 over raw bytes, rendered as 16 hex digits.

xxh3 hashes at 15-20 GB/s on one core here (memcpy is 4-6 GB/s), so verifying every bucket on
every receiver costs a fraction of the transfer. It is not a cryptographic hash: it protects
against corruption and stale files, not against an adversary who can write the weights.
"""

from __future__ import annotations

from typing import Any

import xxhash

ZEROS = bytes(1 << 16)


def xxh3_hex(data: Any) -> str:
    """Hash any buffer-protocol object (bytes, memoryview, numpy array, mmap slice)."""
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


class Streaming:
    """Incremental xxh3 over pieces and zero padding (a bucket as the planner lays it out)."""

    def __init__(self) -> None:
        self._h = xxhash.xxh3_64()

    def update(self, data: Any) -> None:
        self._h.update(data)

    def pad(self, n: int) -> None:
        while n > 0:
            step = min(n, len(ZEROS))
            self._h.update(memoryview(ZEROS)[:step])
            n -= step

    def hexdigest(self) -> str:
        return f"{self._h.intdigest():016x}"


def tensor_hex(t: Any) -> str:
    """Hash a contiguous CPU torch uint8 tensor without copying it."""
    return xxh3_hex(t.numpy())
