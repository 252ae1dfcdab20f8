"""One rank of the merge test world: ``python -m tests.engine.training._merge_rank RANK WORLD PORT OUT``.

Rank r holds tensors whose values are a function of r and trained ``SAMPLES[r]`` samples. Round 1
merges across all ranks; then the last rank exits (a worker lost), the survivors' collective on
the old group fails, they form generation 1 and merge again. Results go to OUT as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from hwtui.engine.training.merge import join_group, weighted_allreduce

SAMPLES = [10, 30, 0]


def tensors_of(rank: int) -> dict[str, torch.Tensor]:
    return {
        "w": torch.arange(6, dtype=torch.float32).reshape(2, 3) + 100 * rank,
        "half": torch.full((4,), 1.0 + rank, dtype=torch.bfloat16),
        "count": torch.tensor([3 * rank + 1, 7], dtype=torch.int64),
        "flag": torch.tensor([rank == 1]),
    }


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    join_group(store, 0, rank, world, 20)
    merged, total = weighted_allreduce(tensors_of(rank), SAMPLES[rank])
    result = {"round1": {k: v.tolist() for k, v in merged.items()}, "dtypes": {k: str(v.dtype) for k, v in merged.items()},
              "total1": total}
    if rank == world - 1:
        with open(out, "w") as fh:
            json.dump(result, fh)
        os._exit(0)  # a worker lost between rounds: no goodbye, its sockets just close
    try:
        weighted_allreduce(tensors_of(rank), SAMPLES[rank])
        result["old_group"] = "succeeded"
    except Exception as exc:  # the broken group must fail, not hang
        result["old_group"] = type(exc).__name__
    join_group(store, 1, rank, world - 1, 20)
    merged, total = weighted_allreduce(tensors_of(rank), SAMPLES[rank] + 1)
    result["round2"] = {k: v.tolist() for k, v in merged.items()}
    result["total2"] = total
    dist.destroy_process_group()
    with open(out, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()
