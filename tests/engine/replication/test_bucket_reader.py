"""The source's bucket reads through the parallel reader, checked by the planner's own bucket checksums."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hwtui.engine.replication.bucket_reader import BucketReader
from hwtui.engine.replication.checksum import xxh3_hex
from hwtui.engine.replication.plan import load_plan
from hwtui.engine.replication.weights import load_torch_state, tensor_bytes
from tests.engine.replication.helpers import make_model, write_plan


@pytest.mark.parametrize("align", [1, 64])
@pytest.mark.parametrize("readers", [1, 2])
def test_every_bucket_matches_the_plan_checksum(tmp_path: Path, align: int, readers: int) -> None:
    make_model(tmp_path / "m")
    write_plan(tmp_path / "m", tmp_path / "p.json", version="v1", bucket_kib=48, align=align)
    plan = load_plan(tmp_path / "p.json")
    states = {i: {k: tensor_bytes(v) for k, v in load_torch_state(f["path"]).items()}
              for i, f in enumerate(plan["files"]) if f["format"] != "safetensors"}

    def other(it: dict) -> torch.Tensor:
        piece: torch.Tensor = states[it["file"]][it["name"]][it["tensor_offset"]:it["tensor_offset"] + it["nbytes"]]
        return piece

    largest = max(b["size"] for b in plan.buckets)
    buf = torch.full((largest,), 0xAB, dtype=torch.uint8)  # garbage: padding must be zeroed, not left
    r = BucketReader(plan["files"], "cpu", readers=readers, direct="off")
    try:
        for b, bk in enumerate(plan.buckets):
            r.fill(plan.bucket_items[b], bk["size"], buf, other)
            assert xxh3_hex(buf[:bk["size"]].numpy()) == bk["checksum"], b
            buf.fill_(0xAB)
    finally:
        r.close()
    assert r.stats is None  # closed
