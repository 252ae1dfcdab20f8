"""The replication source reads its buckets through the parallel reader (issue 23.1): the settings
reach it from replicate, push and the agent, and a file changed under it is a named error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.config import WorkerConfig
from hwtui.engine.replication.plan import Plan, load_plan
from hwtui.engine.replication.pool import BufferPool
from hwtui.engine.replication.reader import ReadFailed
from hwtui.engine.replication.source_reader import SourceReader
from hwtui.engine.replication.transport import choose_transport
from hwtui.engine.resident.resident import PushRefused, ResidentRank
from tests.engine.replication.helpers import make_model, write_plan


def _plan(tmp_path: Path, align: int = 64) -> Plan:
    make_model(tmp_path / "m")
    write_plan(tmp_path / "m", tmp_path / "p.json", version="v1", bucket_kib=48, align=align)
    return load_plan(tmp_path / "p.json")


def test_packed_buckets_are_read_and_exact(tmp_path: Path) -> None:
    from hwtui.engine.replication.checksum import xxh3_hex

    plan = _plan(tmp_path)
    src = SourceReader(plan, readers=2, direct="off")
    pool = BufferPool(2, max(b["size"] for b in plan.buckets), "cpu")
    try:
        for b, bk in enumerate(plan.buckets):
            buf, pooled = src.stage(plan, b, pool)
            assert xxh3_hex(buf[:bk["size"]].numpy()) == bk["checksum"]
            if pooled:
                pool.release(buf)
        assert src.reader("cpu").threads == 2
    finally:
        src.close()


def test_a_weight_file_changed_under_the_source_is_named(tmp_path: Path) -> None:
    """Rewritten in place after the source opened it: the staged bucket is refused by name, not sent."""
    plan = _plan(tmp_path)
    st_path = tmp_path / "m" / "model.safetensors"
    src = SourceReader(plan, readers=2, direct="off")
    pool = BufferPool(2, max(b["size"] for b in plan.buckets), "cpu")
    packed = next(b for b in range(len(plan.buckets)) if not src.contiguous(plan, b)
                  and all(it["file"] == 0 for it in plan.bucket_items[b]))
    try:
        src.stage(plan, 0, pool)  # the reader has the file open now
        with open(st_path, "r+b") as fh:
            fh.seek(-64, os.SEEK_END)
            fh.write(b"\xff" * 64)
        st = st_path.stat()
        os.utime(st_path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later write, as a clock would show it
        with pytest.raises(ReadFailed, match="was modified while it was read"):
            src.stage(plan, packed, pool)
        assert pool.in_use_bytes <= pool.buffer_bytes  # the failed bucket's buffer went back
    finally:
        src.close()


def test_worker_config_carries_and_checks_the_read_settings() -> None:
    base = WorkerConfig(plan="p", transport=choose_transport("cpu", None), world_size=2, rank=0, readers=8, direct_io="on")
    back = WorkerConfig.from_json(base.to_json())
    assert back.readers == 8 and back.direct_io == "on"
    for bad in ('"readers":0', '"readers":65', '"direct_io":"always"'):
        text = base.to_json().replace('"readers":8', bad) if "readers" in bad else base.to_json().replace('"direct_io":"on"', bad)
        with pytest.raises(HwtuiError, match="--readers must be an integer|--direct-io must be auto, on or off"):
            WorkerConfig.from_json(text)


def test_push_settings_and_the_agent_default_reach_the_source_rank(tmp_path: Path) -> None:
    node = ResidentRank(node="n", out=tmp_path / "n", advertise="127.0.0.1", readers=5, direct_io="off")
    try:
        def cfg(settings: dict) -> WorkerConfig:
            return node._worker_cfg({}, settings, tmp_path / "p.plan", "d" * 64, 0, 2, "127.0.0.1", 1)

        assert (cfg({}).readers, cfg({}).direct_io) == (5, "off")  # the agent's --readers / --direct-io
        assert (cfg({"readers": 3, "direct_io": "on"}).readers, cfg({"direct_io": "on"}).direct_io) == (3, "on")
        for bad in ({"readers": 0}, {"readers": "4"}, {"readers": True}, {"direct_io": "yes"}):
            with pytest.raises(PushRefused, match="settings.readers must be|settings.direct_io must be"):
                cfg(bad)
    finally:
        node.close()


def test_a_device_pool_is_filled_by_the_reader_not_through_the_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A contiguous bucket bound for a device buffer is read by the reader (its stand-in here: a
    "device" pool on host memory); the mapping is only for zero-copy host sends and digests."""
    plan = _plan(tmp_path, align=1)
    src = SourceReader(plan, readers=2, direct="off")
    b = next(b for b in range(len(plan.buckets)) if src.contiguous(plan, b))
    pool = BufferPool(1, plan.buckets[b]["size"], "cpu")
    pool.warm(1)
    pool.device = "meta-device"  # stage() takes the device branch; the reader for that device is the host one below
    used: list[str] = []
    real = src.reader

    def reader(device: object) -> object:
        used.append(str(device))
        return real("cpu")

    monkeypatch.setattr(src, "reader", reader)
    try:
        buf, pooled = src.stage(plan, b, pool)
        assert pooled and used == ["cpu"]
        it = plan.bucket_items[b][0]
        want = (tmp_path / "m" / "model.safetensors").read_bytes()[it["file_offset"] - it["offset"]:][:plan.buckets[b]["size"]]
        assert bytes(buf[:len(want)].numpy()) == want
        assert isinstance(buf, torch.Tensor)
    finally:
        src.close()


@pytest.mark.parametrize("argv", [
    ["replicate", "--plan", "p.json", "--readers", "0"],
    ["replicate", "--plan", "p.json", "--readers", "65"],
    ["push", "--plan", "p.json", "--agents", "a:1,b:1", "--readers", "0"],
    ["agent", "--readers", "100"],
])
def test_readers_out_of_range_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    from hwtui.app.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--readers must be an integer from 1 to 64" in err, err


def test_push_options_carry_the_read_settings_only_when_given() -> None:
    from hwtui.app.push.options import PushOptions

    base = {"plan": "p", "agents": "a,b", "timeout": 20.0, "init_timeout": 60.0, "deadline": None, "inflight": 4,
            "chunk_mb": 64.0}
    assert "readers" not in PushOptions(**base).rank_settings()  # type: ignore[arg-type]
    got = PushOptions(**base, readers=6, direct_io="on").rank_settings()  # type: ignore[arg-type]
    assert got["readers"] == 6 and got["direct_io"] == "on"


def test_release_readers_frees_descriptors_and_threads_but_keeps_the_mapping(tmp_path: Path) -> None:
    """A resident rank lives on after its push: what the reads held goes when the send ends."""
    import threading

    def readers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("hwtui-reader")}

    plan = _plan(tmp_path)
    # Only this source's threads count: a shard process runs other modules' tests before this one.
    before = readers()
    fds = len(os.listdir("/proc/self/fd"))
    src = SourceReader(plan, readers=3, direct="off")
    pool = BufferPool(2, max(b["size"] for b in plan.buckets), "cpu")
    packed = next(b for b in range(len(plan.buckets)) if not src.contiguous(plan, b))
    buf, _ = src.stage(plan, packed, pool)
    assert readers() - before
    src.release_readers()
    assert not readers() - before
    assert src.bucket_digest(plan, packed) == plan.buckets[packed]["checksum"]  # the mapping still serves digests
    src.close()
    assert len(os.listdir("/proc/self/fd")) == fds


def test_one_reader_per_device_whichever_way_it_is_named(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    src = SourceReader(plan, readers=2, direct="off")
    try:
        assert src.reader("cpu") is src.reader(torch.device("cpu")) is src.reader(torch.zeros(1).device)
    finally:
        src.close()


def test_a_source_read_only_by_ipc_sizes_its_device_ring_to_shares(tmp_path: Path) -> None:
    """The worker builds the IPC-only source with min_slice (RankIpc._ipc_read_floor): it reaches
    the device reader's ring; a source that also sends over the network keeps the device floor."""
    from types import SimpleNamespace

    from hwtui.engine.replication.ipc_path import RankIpc
    from hwtui.engine.replication.reader import MIN_SLICE

    make_model(tmp_path / "m", big=1_200_000)  # a 4.8 MB tensor: 4 MiB buckets
    write_plan(tmp_path / "m", tmp_path / "p.json", version="v1", bucket_kib=4096, align=64)
    plan = load_plan(tmp_path / "p.json")
    assert max(b["size"] for b in plan.buckets) == 4 << 20
    floor = lambda ipc, net: RankIpc._ipc_read_floor(SimpleNamespace(_ipc_ranks=lambda: ipc, net_ranks=net))  # noqa: E731
    assert floor([1], [0]) == MIN_SLICE
    assert floor([1], [0, 2]) is None and floor([], [0, 1]) is None
    for min_slice in (None, MIN_SLICE):
        src = SourceReader(plan, readers=16, direct="off", min_slice=min_slice)
        try:  # no CUDA is touched until a read: the ring's size is decided here
            # 16 shares of 4 MiB are 256 KiB: the 1 MiB floor; without it the device floor, capped
            # at the largest bucket.
            assert src.reader("cuda:0").slice_bytes == (MIN_SLICE if min_slice else 4 << 20)
        finally:
            src.close()


def _packed_run(src: SourceReader, plan: Plan) -> list[int]:
    """Consecutive buckets the source must pack (no zero-copy view of the mapping)."""
    return [b for b in range(len(plan.buckets)) if not src.contiguous(plan, b)]


def test_reading_ahead_fills_the_next_bucket_into_a_spare_pool_buffer_only(tmp_path: Path) -> None:
    """stage(b, ahead=1) queues bucket b+1's read into a buffer the pool has spare, and staging b+1
    takes that buffer; with no spare buffer nothing is read ahead (the window's memory bound holds).
    Every bucket is exact either way."""
    from hwtui.engine.replication.checksum import xxh3_hex

    plan = _plan(tmp_path)
    largest = max(b["size"] for b in plan.buckets)
    for count in (1, 2, 3):
        src = SourceReader(plan, readers=2, direct="off")
        pool = BufferPool(count, largest, "cpu")
        try:
            for b, bk in enumerate(plan.buckets):
                ahead_before = b in src._ahead
                buf, pooled = src.stage(plan, b, pool, ahead=1)
                assert xxh3_hex(buf[:bk["size"]].numpy()) == bk["checksum"], (count, b)
                # Not a bucket holding pieces of a torch file: those are copied on the caller's thread.
                nxt = (b + 1 < len(plan.buckets) and not src.contiguous(plan, b + 1)
                       and all(it["file"] in src.mapped for it in plan.bucket_items[b + 1]))
                # One buffer staged plus the next bucket's, read ahead, when the pool has a spare one.
                assert (b + 1 in src._ahead) == (nxt and count - int(pooled) >= 1)
                assert pool.in_use_bytes == largest * (int(pooled) + int(b + 1 in src._ahead)) <= count * largest
                if ahead_before:
                    assert pooled
                if pooled:
                    pool.release(buf)
            assert pool.peak_bytes <= count * largest
        finally:
            src.close()


def test_a_bucket_alone_is_cut_into_shares_of_the_threads_and_a_queue_keeps_the_device_floor(tmp_path: Path) -> None:
    """A bucket staged with no read queued behind it and none possible (no spare buffer: a window
    full of buckets in flight) is cut into T shares (MIN_SLICE), as copy_into's one-at-a-time
    reads are; one with reads queued behind it, or read ahead itself, keeps the reader's device
    floor (None), which only pays where other reads keep the threads busy. A bucket holding a
    torch file's pieces is never read ahead. Every bucket exact."""
    from hwtui.engine.replication.checksum import xxh3_hex
    from hwtui.engine.replication.reader import MIN_SLICE

    plan = _plan(tmp_path)
    largest = max(b["size"] for b in plan.buckets)
    packed = _packed_run(SourceReader(plan, readers=2, direct="off"), plan)
    torch_buckets = [b for b in range(len(plan.buckets)) if any(it["file"] != 0 for it in plan.bucket_items[b])]
    assert torch_buckets and len(packed) >= 4
    for count, ahead in ((1, 2), (4, 3)):
        src = SourceReader(plan, readers=2, direct="off")
        asked: dict[int, int | None] = {}
        real = src.start_into

        def record(plan_: Plan, b: int, dst: object, *, min_slice: int | None = None, real=real, asked=asked) -> object:
            asked[b] = min_slice
            return real(plan_, b, dst, min_slice=min_slice)

        src.start_into = record  # type: ignore[method-assign]
        pool = BufferPool(count, largest, "cpu:0")  # host memory, but never zero-copy: every bucket read
        try:
            for b, bk in enumerate(plan.buckets):
                buf, _ = src.stage(plan, b, pool, ahead=ahead)
                assert xxh3_hex(buf[:bk["size"]].numpy()) == bk["checksum"], (count, b)
                pool.release(buf)
        finally:
            src.close()
        if count == 1:  # never a spare buffer: every bucket alone
            assert asked == {b: MIN_SLICE for b in range(len(plan.buckets))}
        else:
            assert asked[0] is None  # three more queued behind it
            read_ahead = [b for b, m in asked.items() if m is None and b]
            assert read_ahead and not set(read_ahead) & set(torch_buckets)


def test_copy_into_reads_one_bucket_in_shares_of_the_threads(tmp_path: Path) -> None:
    """The same-host path copies bucket by bucket (copy_into): no read is queued behind one, so it
    is cut into T shares, not at the device floor."""
    from hwtui.engine.replication.reader import MIN_SLICE

    plan = _plan(tmp_path)
    src = SourceReader(plan, readers=2, direct="off")
    seen: list[int | None] = []
    reader = src.reader("cpu")
    real = reader.start

    def record(*args: object, min_slice: int | None = None, **kw: object) -> object:
        seen.append(min_slice)
        return real(*args, min_slice=min_slice, **kw)  # type: ignore[arg-type]

    reader.start = record  # type: ignore[method-assign]
    try:
        src.copy_into(plan, 0, torch.zeros(plan.buckets[0]["size"], dtype=torch.uint8))
    finally:
        src.close()
    assert seen == [MIN_SLICE]


def test_a_bucket_read_ahead_that_fails_is_named_when_staged_and_its_buffer_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hwtui.engine.replication import reader as rd

    plan = _plan(tmp_path)
    src = SourceReader(plan, readers=2, direct="off")
    packed = _packed_run(src, plan)
    first, victim = next((a, a + 1) for a in packed if a + 1 in packed)
    lo = min(it["file_offset"] for it in plan.bucket_items[victim] if it["file"] == 0)
    hi = max(it["file_offset"] + it["nbytes"] for it in plan.bucket_items[victim] if it["file"] == 0)
    lo = max(lo, max(it["file_offset"] + it["nbytes"] for it in plan.bucket_items[first] if it["file"] == 0))
    real = os.preadv

    def eio_in_victim(fd: int, bufs: list[memoryview], offset: int) -> int:
        if lo <= offset < hi:
            raise OSError(5, "Input/output error")
        return real(fd, bufs, offset)

    monkeypatch.setattr(rd.os, "preadv", eio_in_victim)
    largest = max(b["size"] for b in plan.buckets)
    pool = BufferPool(2, largest, "cpu")
    try:
        buf, pooled = src.stage(plan, first, pool, ahead=1)  # bucket `first` is fine; its successor is read ahead
        assert pooled and victim in src._ahead
        pool.release(buf)
        with pytest.raises(ReadFailed, match="I/O error reading weight file"):
            src.stage(plan, victim, pool, ahead=1)
        # Its buffer is back; what was queued behind it is the pool's again when the readers go.
        assert victim not in src._ahead and pool.in_use_bytes == largest * len(src._ahead)
        src.release_readers()
        assert pool.in_use_bytes == 0
    finally:
        src.close()


def test_buckets_read_ahead_and_never_staged_go_back_to_the_pool(tmp_path: Path) -> None:
    """A transfer that stops early (a peer failed) releases its readers: the read ahead settles and
    its buffer is the pool's again."""
    plan = _plan(tmp_path)
    src = SourceReader(plan, readers=2, direct="off")
    packed = _packed_run(src, plan)
    first = next(a for a in packed if a + 1 in packed)
    largest = max(b["size"] for b in plan.buckets)
    pool = BufferPool(2, largest, "cpu")
    buf, _ = src.stage(plan, first, pool, ahead=1)
    assert pool.in_use_bytes == 2 * largest
    src.release_readers()
    assert pool.in_use_bytes == largest and not src._ahead
    src.close()


def test_staging_out_of_order_never_finds_the_pool_exhausted_by_a_read_ahead(tmp_path: Path) -> None:
    """Buckets staged out of order, skipped or twice: a bucket read ahead that is not next goes
    back to the pool before the staged one needs a buffer; every bucket exact, nothing leaked."""
    import random

    from hwtui.engine.replication.checksum import xxh3_hex

    plan = _plan(tmp_path)
    largest = max(b["size"] for b in plan.buckets)
    src = SourceReader(plan, readers=2, direct="off")
    packed = _packed_run(src, plan)
    first = next(a for a in packed if a + 2 in packed and a + 1 in packed)
    pool = BufferPool(2, largest, "cpu")
    try:
        held, _ = src.stage(plan, first, pool, ahead=1)  # first+1 read ahead: the pool is full
        buf, pooled = src.stage(plan, first + 2, pool, ahead=1)  # first+1 skipped
        assert pooled and xxh3_hex(buf[:plan.buckets[first + 2]["size"]].numpy()) == plan.buckets[first + 2]["checksum"]
        pool.release(buf)
        pool.release(held)
        rng = random.Random(23)
        for _ in range(20):
            order = [rng.choice(range(len(plan.buckets))) for _ in range(12)]
            ahead = rng.choice([1, 2])
            for b in order:
                buf, pooled = src.stage(plan, b, pool, ahead=ahead)
                assert xxh3_hex(buf[:plan.buckets[b]["size"]].numpy()) == plan.buckets[b]["checksum"], (order, b)
                if pooled:
                    pool.release(buf)
                assert pool.in_use_bytes == largest * len(src._ahead)
        src.release_readers()
        assert pool.in_use_bytes == 0
    finally:
        src.close()


def test_the_sources_buckets_hashed_on_several_threads_are_each_buckets_own(tmp_path: Path) -> None:
    """The source's check beside the send runs on hash_threads() threads (1..4 by the cores): every
    bucket's digest is its own whatever thread takes it and in whatever order they finish."""
    from concurrent.futures import ThreadPoolExecutor

    from hwtui.engine.replication.rank_base import hash_threads

    assert [hash_threads(c) for c in (1, 2, 4, 7, 8, 16, 128)] == [1, 1, 1, 1, 2, 4, 4]
    plan = _plan(tmp_path)
    src = SourceReader(plan, readers=1, direct="off")
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            got = [f.result() for f in [pool.submit(src.bucket_digest, plan, b) for b in range(len(plan.buckets))]]
        assert got == [bk["checksum"] for bk in plan.buckets] and len(set(got)) == len(got)
    finally:
        src.close()
