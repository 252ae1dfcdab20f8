"""The source's bucket reads through the parallel reader, checked by the planner's own bucket checksums."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hwtui.engine.replication.bucket_reader import BucketReader
from hwtui.engine.replication.checksum import xxh3_hex
from hwtui.engine.replication.plan import load_plan
from hwtui.engine.replication.reader import MIN_SLICE
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


def test_a_device_ring_slice_is_a_share_of_the_largest_bucket_but_not_below_the_floor() -> None:
    """Pinned ring slices: a bucket's share per thread, at least DEVICE_MIN_SLICE for a device (16
    threads on 64 MiB buckets cut 4 MiB slices, a third of the reader's speed on an H200), never
    more than the largest bucket needs; host rings keep the 1 MiB floor."""
    mib = 1 << 20
    ring = lambda device, largest: BucketReader([], device, readers=16, largest=largest).slice_bytes  # noqa: E731
    assert ring("cuda:0", 64 * mib) == 16 * mib
    assert ring("cuda:0", 1024 * mib) == 64 * mib  # a share of 64 MiB, the ring's most
    assert ring("cuda:0", 4 * mib) == 4 * mib  # small buckets: no ring larger than a bucket
    assert ring("cpu", 64 * mib) == 4 * mib


def test_a_ring_for_reads_cut_into_shares_holds_a_share_not_the_device_floor() -> None:
    """The IPC source cuts every bucket into T shares (min_slice=MIN_SLICE): its ring slices are a
    share of the largest bucket (16 threads x 2 x 2 MiB pinned for 32 MiB buckets, not 16 MiB
    slices and 512 MiB), still never larger than the largest bucket."""
    mib = 1 << 20
    ring = lambda largest: BucketReader([], "cuda:0", readers=16, largest=largest,  # noqa: E731
                                        min_slice=MIN_SLICE).slice_bytes
    assert ring(32 * mib) == 2 * mib
    assert ring(1024 * mib) == 64 * mib
    assert ring(8 * mib) == MIN_SLICE  # a share of 512 KiB: the floor
    assert ring(64 << 10) == 64 << 10


def test_a_ring_for_empty_buckets_is_one_page_and_an_unknown_size_the_rings_most() -> None:
    for min_slice in (None, MIN_SLICE):
        assert BucketReader([], "cuda:0", readers=16, largest=0, min_slice=min_slice).slice_bytes == 4096
    assert BucketReader([], "cuda:0", readers=16).slice_bytes == 16 << 20  # the device floor, a 64 MiB bucket assumed
