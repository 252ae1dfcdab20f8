"""Gather one JSON document per rank over torch.distributed, without pickle.

``all_gather_object`` pickles, and unpickling a peer's bytes runs whatever that peer (or anything
that can reach the port) chose. Here each rank encodes JSON to a uint8 tensor; the lengths are
all-gathered first so every rank can pad to the longest, then the bytes are all-gathered and each
slice is decoded with ``json.loads``: a malformed peer yields an error, never code execution.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

MAX_BYTES = 1024 * 1024  # a rank report is a few KiB; anything near this is a bug, not a report
_TOO_BIG = "_gather_error"


class GatherError(RuntimeError):
    pass


def all_gather_json(obj: Any, *, device: torch.device | str = "cpu", group: Any = None,
                    max_bytes: int = MAX_BYTES) -> list[Any]:
    """Every rank gets the list of every rank's ``obj``, in rank order.

    A rank whose document is over ``max_bytes`` still takes part (sending a short note instead),
    so every rank fails at once naming it, rather than the others waiting out the timeout."""
    data = json.dumps(obj, separators=(",", ":"), default=str).encode("utf-8")
    if len(data) > max_bytes:
        data = json.dumps({_TOO_BIG: f"its report of {len(data)} bytes exceeds the {max_bytes}-byte limit"}).encode()
    world = dist.get_world_size(group)
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)
    sizes = [int(t.item()) for t in lengths]
    if any(not 0 <= s <= max_bytes for s in sizes):
        raise GatherError(f"a peer announced a report size out of range: {sizes}")
    longest = max(sizes)
    padded = torch.zeros(max(longest, 1), dtype=torch.uint8)
    if data:
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    padded = padded.to(device)
    slots = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(slots, padded, group=group)
    out = []
    for rank, (slot, size) in enumerate(zip(slots, sizes, strict=True)):
        raw = slot[:size].cpu().numpy().tobytes()
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise GatherError(f"rank {rank} sent a report that is not JSON: {str(exc)[:200]}") from None
        if isinstance(doc, dict) and isinstance(doc.get(_TOO_BIG), str):
            raise GatherError(f"rank {rank}: {doc[_TOO_BIG][:200]}")
        out.append(doc)
    return out
