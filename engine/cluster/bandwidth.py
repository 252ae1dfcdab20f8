"""Correctness all-reduce and the broadcast / all-reduce bandwidth sweep.

Figures follow nccl-tests (doc/PERFORMANCE.md) so they can be compared with what a vendor or a
colleague measured with ``all_reduce_perf``:

* ``algbw = size_bytes / 1e9 / seconds`` (GB/s, decimal), ``seconds`` being one operation's time;
* ``busbw = algbw * factor`` with factor 1 for broadcast and ``2 (n-1) / n`` for all-reduce, the
  share of the data each rank's link must carry, so busbw is comparable across world sizes;
* the time is each rank's own average over the timed iterations, then averaged across ranks
  (nccl-tests' default ``-a 1``).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from typing import Any

OPS = ("broadcast", "all_reduce")
_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2, "MIB": 1024**2,
          "G": 1024**3, "GB": 1024**3, "GIB": 1024**3}
ELEMENT = 4  # float32


def parse_size(text: str) -> int:
    """``4096``, ``64K``, ``4M``, ``1G`` (binary multiples, as nccl-tests' -b/-e take them)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (use e.g. 4096, 64K, 4M, 1G)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def size_series(min_bytes: int, max_bytes: int, factor: int = 4) -> list[int]:
    """Message sizes from min to max, each ``factor`` times the last; max is always included."""
    if min_bytes < ELEMENT or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"bad sweep: min {min_bytes} B, max {max_bytes} B, factor {factor} "
                         f"(need {ELEMENT} <= min <= max and factor >= 2)")
    sizes, size = [], min_bytes
    while size < max_bytes:
        sizes.append(size - size % ELEMENT)
        size *= factor
    sizes.append(max_bytes - max_bytes % ELEMENT)
    return sorted(set(sizes))


def bus_factor(op: str, world_size: int) -> float:
    if op == "broadcast":
        return 1.0
    if op == "all_reduce":
        return 2.0 * (world_size - 1) / world_size
    raise ValueError(f"unknown collective {op!r}")


def algbw(size_bytes: int, seconds: float) -> float:
    return size_bytes / 1e9 / seconds if seconds > 0 else float("inf")


def busbw(op: str, size_bytes: int, seconds: float, world_size: int) -> float:
    return algbw(size_bytes, seconds) * bus_factor(op, world_size)


@dataclass
class BandwidthResult:
    op: str
    size_bytes: int
    seconds: float
    algbw: float
    busbw: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Correctness:
    ok: bool
    expected: float
    got: list[float]  # the first element each rank ended with, in rank order
    bad_ranks: list[int]
    broadcast_ok: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


def correctness(rank: int, world_size: int, device: Any, count: int = 1024) -> Correctness:
    """All-reduce (sum) where rank r contributes r+1 everywhere: every element on every rank must
    then be n(n+1)/2 exactly (small integers are exact in float32). Then a broadcast of a byte
    pattern from rank 0 checked byte for byte. Each rank checks its own copy; the verdicts are
    all-gathered so rank 0 can name the rank that got a wrong answer."""
    import torch
    import torch.distributed as dist

    expected = world_size * (world_size + 1) / 2
    t = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    local_ok = bool(torch.all(t == expected).item())
    first = float(t[0].item())

    pattern = (torch.arange(count * 4, dtype=torch.int64) % 251).to(torch.uint8)
    b = pattern.clone() if rank == 0 else torch.zeros(count * 4, dtype=torch.uint8)
    b = b.to(device)
    dist.broadcast(b, src=0)
    bcast_ok = bool(torch.equal(b.cpu(), pattern))

    mine = torch.tensor([first, float(local_ok), float(bcast_ok)], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(every, mine)
    rows = [e.cpu().tolist() for e in every]
    bad = [r for r, row in enumerate(rows) if row[1] != 1.0 or row[2] != 1.0]
    return Correctness(ok=not bad, expected=expected, got=[row[0] for row in rows], bad_ranks=bad,
                       broadcast_ok=all(row[2] == 1.0 for row in rows))


def measure(op: str, size_bytes: int, rank: int, world_size: int, device: Any, iters: int, warmup: int) -> BandwidthResult:
    import torch
    import torch.distributed as dist

    t = torch.zeros(max(size_bytes // ELEMENT, 1), dtype=torch.float32, device=device)

    def once() -> None:
        if op == "broadcast":
            dist.broadcast(t, src=0)
        else:
            # Zeros stay zeros, so repeated in-place sums never overflow into inf.
            dist.all_reduce(t, op=dist.ReduceOp.SUM)

    for _ in range(warmup):
        once()
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        once()
    _sync(device)
    mine = (time.perf_counter() - start) / iters
    avg = torch.tensor([mine], dtype=torch.float64, device=device)
    dist.all_reduce(avg, op=dist.ReduceOp.SUM)
    seconds = float(avg.item()) / world_size
    return BandwidthResult(op, size_bytes, seconds, algbw(size_bytes, seconds), busbw(op, size_bytes, seconds, world_size))


def floor_failures(results: list[BandwidthResult], min_busbw: float) -> list[BandwidthResult]:
    """The operations whose busbw at the largest size measured is below the floor.

    Small messages are latency-bound and never reach link speed, so only the largest size of each
    operation is held to the floor (nccl-tests' "peak" column, not its average)."""
    worst = []
    for op in {r.op for r in results}:
        largest = max((r for r in results if r.op == op), key=lambda r: r.size_bytes)
        if largest.busbw < min_busbw:
            worst.append(largest)
    return sorted(worst, key=lambda r: r.op)
