"""The parallel file -> device reader (engine/replication/reader.py), on real files.

A host-memory stand-in for the device (StandInSeam: "pinned" buffers, streams, copies that
complete only when waited on) drives the ring, the ordering, the backpressure and every error
path without an accelerator; the live CUDA test is tests/gpu/test_reader_live.py.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication import reader as rd
from hwtui.engine.replication.reader import (
    ALIGN,
    Extent,
    HostSeam,
    ParallelReader,
    ReadFailed,
    WeightFile,
    check_readers,
    default_readers,
    read_file,
)

KB = 1024


def _file(tmp_path: Path, n: int, name: str = "w.bin", seed: int = 0) -> tuple[Path, np.ndarray]:
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    p = tmp_path / name
    data.tofile(p)
    return p, data


class StandInSeam:
    """A device made of host memory whose copies land only when waited on (like a stream's)."""

    on_host = False

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buffers = 0
        self.streams = 0
        self.copies: list[tuple[int, int]] = []  # (dst_offset, nbytes) in the order they were issued
        self.pending: dict[int, int] = {}  # id(buffer) -> copies issued and not waited on
        self.max_pending_per_buffer = 0
        self.reused_under_copy = False
        self.fail_copy_at: int | None = None

    def host_buffer(self, nbytes: int) -> tuple[Any, memoryview]:
        with self.lock:
            self.buffers += 1
        return rd._aligned_anon(nbytes)

    def stream(self) -> Any:
        with self.lock:
            self.streams += 1
        return object()

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int, stream: Any) -> Any:
        with self.lock:
            if self.fail_copy_at is not None and len(self.copies) == self.fail_copy_at:
                raise RuntimeError("device copy failed (stand-in)")
            if self.pending.get(id(src), 0):
                self.reused_under_copy = True
            self.pending[id(src)] = self.pending.get(id(src), 0) + 1
            self.copies.append((dst_offset, nbytes))
        payload = bytes(memoryview(src)[src_offset:src_offset + nbytes])  # what the buffer held when issued
        return (dst, dst_offset, payload, id(src))

    def wait(self, token: Any) -> None:
        if token is None:
            return
        dst, off, payload, key = token
        dst[off:off + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        with self.lock:
            self.pending[key] -= 1

    def synchronize(self) -> None:
        return None


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("direct", ["off", "on"])
def test_host_read_is_bit_exact(tmp_path: Path, threads: int, direct: str) -> None:
    p, data = _file(tmp_path, 3 * 64 * KB + 123)  # a tail that is not a whole block
    out = np.zeros(len(data), np.uint8)
    stats = read_file(p, out, threads=threads, direct=direct, slice_bytes=16 * KB)
    assert np.array_equal(out, data)
    assert stats.slices == -(-len(data) // (16 * KB))


def test_unaligned_extents_scattered_into_the_destination(tmp_path: Path) -> None:
    p, data = _file(tmp_path, 200 * KB + 7)
    extents = [Extent(4097, 10_000, 0), Extent(100_001, 33 * KB, 20_000), Extent(len(data) - 5, 5, 60_000)]
    for direct in ("off", "on"):
        for seam in (HostSeam(), StandInSeam()):
            out = np.zeros(60_005, np.uint8)
            with WeightFile(p, direct) as wf:
                r = ParallelReader(seam, threads=3, slice_bytes=8 * KB)
                r.read(wf, extents, out)
                r.close()
            for e in extents:
                assert np.array_equal(out[e.dst_offset:e.dst_offset + e.nbytes],
                                      data[e.file_offset:e.file_offset + e.nbytes]), (direct, type(seam).__name__)


def test_device_ring_double_buffers_in_file_order_with_backpressure(tmp_path: Path) -> None:
    p, data = _file(tmp_path, 40 * 16 * KB)
    seam = StandInSeam()
    out = np.zeros(len(data), np.uint8)
    with WeightFile(p) as wf:
        r = ParallelReader(seam, threads=3, slice_bytes=16 * KB, depth=2)
        r.read(wf, [Extent(0, len(data), 0)], out)
    assert np.array_equal(out, data)
    # Two buffers and one stream per thread that took a slice (on a loaded box one may take none),
    # allocated once; host memory bounded by the ring.
    assert seam.buffers == 2 * seam.streams and 1 <= seam.streams <= 3
    assert r.stats.peak_host_bytes == seam.buffers * (16 * KB + 2 * ALIGN)
    # A buffer is never read into while its previous copy is in flight.
    assert not seam.reused_under_copy
    # Slices are handed out in file order: with one thread, copies are issued in file order.
    seam1 = StandInSeam()
    with WeightFile(p) as wf:
        ParallelReader(seam1, threads=1, slice_bytes=16 * KB).read(wf, [Extent(0, len(data), 0)], out)
    assert [c[0] for c in seam1.copies] == list(range(0, len(data), 16 * KB))
    # A second read reuses the ring (pinning is paid once per reader, per thread).
    with WeightFile(p) as wf:
        r.read(wf, [Extent(0, len(data), 0)], out)
    assert seam.buffers == 2 * seam.streams <= 6


def test_a_failed_device_copy_is_raised_and_nothing_is_left_in_flight(tmp_path: Path) -> None:
    p, data = _file(tmp_path, 20 * 16 * KB)
    seam = StandInSeam()
    seam.fail_copy_at = 7
    with WeightFile(p) as wf, pytest.raises(RuntimeError, match="device copy failed"):
        ParallelReader(seam, threads=2, slice_bytes=16 * KB).read(wf, [Extent(0, len(data), 0)], np.zeros(len(data), np.uint8))
    assert all(v == 0 for v in seam.pending.values())


# ---------------------------------------------------------------- named errors, never wrong bytes


def _inject(monkeypatch: pytest.MonkeyPatch, fn: Any) -> None:
    real = os.preadv
    calls = [0]

    def fake(fd: int, bufs: Any, offset: int) -> int:
        calls[0] += 1
        return int(fn(real, fd, bufs, offset, calls[0]))

    monkeypatch.setattr(rd.os, "preadv", fake)


@pytest.mark.parametrize("seam_kind", ["host", "device"])
def test_eio_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seam_kind: str) -> None:
    p, data = _file(tmp_path, 100 * KB)

    def eio(real: Any, fd: int, bufs: Any, offset: int, n: int) -> int:
        if offset >= 50 * KB:
            raise OSError(errno.EIO, "Input/output error")
        return int(real(fd, bufs, offset))

    _inject(monkeypatch, eio)
    seam: Any = HostSeam() if seam_kind == "host" else StandInSeam()
    with WeightFile(p) as wf, pytest.raises(ReadFailed, match="I/O error reading weight file") as err:
        ParallelReader(seam, threads=2, slice_bytes=8 * KB).read(wf, [Extent(0, len(data), 0)], np.zeros(len(data), np.uint8))
    assert err.value.kind == "io-error"


def test_partial_reads_are_continued_and_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p, data = _file(tmp_path, 100 * KB + 3)

    def partial(real: Any, fd: int, bufs: Any, offset: int, n: int) -> int:  # at most 1000 bytes per call
        return int(real(fd, [bufs[0][:1000]], offset))

    _inject(monkeypatch, partial)
    out = np.zeros(len(data), np.uint8)
    read_file(p, out, threads=2, slice_bytes=16 * KB)
    assert np.array_equal(out, data)


def test_a_read_that_ends_early_is_a_short_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p, data = _file(tmp_path, 100 * KB)

    def ends(real: Any, fd: int, bufs: Any, offset: int, n: int) -> int:
        return 0 if offset >= 60 * KB else int(real(fd, bufs, offset))

    _inject(monkeypatch, ends)
    for seam in (HostSeam(), StandInSeam()):
        with WeightFile(p) as wf, pytest.raises(ReadFailed, match="short read of weight file") as err:
            ParallelReader(seam, threads=2, slice_bytes=8 * KB).read(wf, [Extent(0, len(data), 0)],
                                                                     np.zeros(len(data), np.uint8))
        assert err.value.kind == "short-read"


@pytest.mark.parametrize("direct", ["off", "on"])
def test_a_file_truncated_while_read_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: str) -> None:
    p, data = _file(tmp_path, 200 * KB)

    def truncate_midway(real: Any, fd: int, bufs: Any, offset: int, n: int) -> int:
        if n == 3:
            os.truncate(p, 64 * KB)  # a real truncation of the real file, between two reads
        return int(real(fd, bufs, offset))

    with WeightFile(p, direct) as wf:
        _inject(monkeypatch, truncate_midway)
        with pytest.raises(ReadFailed, match="was truncated while it was read") as err:
            ParallelReader(HostSeam(), threads=1, slice_bytes=16 * KB).read(wf, [Extent(0, len(data), 0)],
                                                                             np.zeros(len(data), np.uint8))
    assert err.value.kind == "truncated"


def test_a_file_truncated_then_regrown_is_named_not_mixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut and written back to its size mid-read: every read succeeds, the bytes are a mix; named."""
    p, data = _file(tmp_path, 200 * KB)

    def rewrite(real: Any, fd: int, bufs: Any, offset: int, n: int) -> int:
        if n == 3:
            with open(p, "r+b") as fh:
                fh.seek(150 * KB)
                fh.write(b"\0" * KB)
                os.utime(fh.fileno(), ns=(1, 1))  # even with a forged mtime the size or mtime differ
        return int(real(fd, bufs, offset))

    with WeightFile(p) as wf:
        _inject(monkeypatch, rewrite)
        with pytest.raises(ReadFailed, match="modified while it was read") as err:
            ParallelReader(HostSeam(), threads=1, slice_bytes=16 * KB).read(wf, [Extent(0, len(data), 0)],
                                                                             np.zeros(len(data), np.uint8))
    assert err.value.kind == "changed"


def test_a_file_replaced_during_the_read_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p, data = _file(tmp_path, 200 * KB)
    other, _ = _file(tmp_path, 200 * KB, name="new.bin", seed=1)

    def replace(real: Any, fd: int, bufs: Any, offset: int, n: int) -> int:
        if n == 2:
            os.replace(other, p)  # a new version renamed over the path, as a writer would
        return int(real(fd, bufs, offset))

    with WeightFile(p) as wf:
        _inject(monkeypatch, replace)
        with pytest.raises(ReadFailed, match="was replaced while it was read") as err:
            ParallelReader(StandInSeam(), threads=2, slice_bytes=16 * KB).read(wf, [Extent(0, len(data), 0)],
                                                                               np.zeros(len(data), np.uint8))
    assert err.value.kind == "replaced"


def test_extents_beyond_the_file_are_refused(tmp_path: Path) -> None:
    p, _ = _file(tmp_path, 10 * KB)
    with WeightFile(p) as wf, pytest.raises(ReadFailed, match="10240 bytes; bytes 8192..12288"):
        ParallelReader(HostSeam()).read(wf, [Extent(8192, 4096, 0)], np.zeros(4096, np.uint8))


# ---------------------------------------------------------------- O_DIRECT and its fallback


def test_direct_io_refused_falls_back_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem that refuses O_DIRECT (tmpfs before Linux 6.6) reads through the cache instead."""
    p, data = _file(tmp_path, 50 * KB + 1)
    real_open = os.open

    def no_direct(path: Any, flags: int, *a: Any, **k: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(rd.os, "open", no_direct)
    out = np.zeros(len(data), np.uint8)
    stats = read_file(p, out, direct="on", slice_bytes=8 * KB)
    assert np.array_equal(out, data)
    assert not stats.direct and stats.direct_reason == "the filesystem refuses O_DIRECT (EINVAL)"


def test_direct_io_auto_reads_a_file_that_fits_through_the_cache(tmp_path: Path) -> None:
    p, _ = _file(tmp_path, 8 * KB)
    with WeightFile(p, "auto") as wf:
        assert not wf.direct and wf.direct_reason.startswith("auto")


def test_direct_io_auto_goes_direct_for_a_file_larger_than_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p, data = _file(tmp_path, 40 * KB + 11)
    monkeypatch.setattr(rd, "_mem_available", lambda: 4 * KB)
    out = np.zeros(len(data), np.uint8)
    stats = read_file(p, out, direct="auto", slice_bytes=8 * KB)
    assert np.array_equal(out, data)
    assert stats.direct or "refuses" in stats.direct_reason


# ---------------------------------------------------------------- settings


def test_readers_setting() -> None:
    assert check_readers(1) == 1 and check_readers(64) == 64
    for bad in (0, 65, -1, True, 2.0, "4"):
        with pytest.raises(HwtuiError, match="--readers must be an integer from 1 to 64"):
            check_readers(bad)
    assert default_readers(16, 1) == 16 and default_readers(16, 8) == 2 and default_readers(2, 1) == 2
    assert default_readers(64, 1) == 16 and default_readers(1, 8) == 1


def test_warm_allocates_every_ring_before_the_first_read(tmp_path: Path) -> None:
    seam = StandInSeam()
    r = ParallelReader(seam, threads=4, slice_bytes=16 * KB)
    r.warm()
    assert seam.buffers == 8 and seam.streams == 4
    p, data = _file(tmp_path, 64 * KB)
    with WeightFile(p) as wf:
        r.read(wf, [Extent(0, len(data), 0)], np.zeros(len(data), np.uint8))
    assert seam.buffers == 8
    host_reader = ParallelReader(HostSeam(), threads=4)
    host_reader.warm()  # a CPU destination needs no ring: nothing allocated
    assert host_reader.stats.peak_host_bytes == 0


def test_descriptors_are_closed_on_close_and_when_dropped(tmp_path: Path) -> None:
    p, _ = _file(tmp_path, 8 * KB)
    before = len(os.listdir("/proc/self/fd"))
    wf = WeightFile(p, "on")
    assert len(os.listdir("/proc/self/fd")) > before
    wf.close()
    wf.close()  # twice is harmless
    assert len(os.listdir("/proc/self/fd")) == before
    WeightFile(p, "on")  # dropped without close (a resident rank's reader going with its push)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_request_is_cut_in_shares_of_the_threads_never_below_the_device_floor(tmp_path: Path) -> None:
    """A device read is cut into T shares, but no slice under DEVICE_MIN_SLICE (16 MiB): 64 MiB
    buckets cut in 4 MiB slices held an H200 source to 11-13 GB/s. A smaller request is one slice
    (the threads take the next read's). Host reads keep the 1 MiB floor (no copy launch per slice)."""
    mib = 1 << 20
    p, data = _file(tmp_path, 40 * mib)
    with WeightFile(p) as wf:
        for nbytes, want in ((40 * mib, [(0, 16 * mib), (16 * mib, 16 * mib), (32 * mib, 8 * mib)]),
                             (8 * mib, [(0, 8 * mib)])):
            seam = StandInSeam()
            out = np.zeros(nbytes, np.uint8)
            ParallelReader(seam, threads=4, slice_bytes=16 * mib).read(wf, [Extent(0, nbytes, 0)], out)
            assert sorted(seam.copies) == want
            assert np.array_equal(out, data[:nbytes])
        host = ParallelReader(HostSeam(), threads=4, slice_bytes=16 * mib)
        out = np.zeros(8 * mib, np.uint8)
        host.read(wf, [Extent(0, 8 * mib, 0)], out)
        assert host.stats.slices == 4 and np.array_equal(out, data[:8 * mib])
        # A caller that reads one bucket at a time (the IPC source) asks for T shares on a device too.
        seam = StandInSeam()
        out = np.zeros(8 * mib, np.uint8)
        one_at_a_time = ParallelReader(seam, threads=4, slice_bytes=16 * mib)  # held: a dropped reader stops
        one_at_a_time.submit(wf, [Extent(0, 8 * mib, 0)], out, min_slice=rd.MIN_SLICE).wait()
        assert sorted(seam.copies) == [(i * 2 * mib, 2 * mib) for i in range(4)] and np.array_equal(out, data[:8 * mib])


def test_extents_that_continue_each_other_are_read_as_one_range(tmp_path: Path) -> None:
    """Tensors back to back in the file and in the bucket: one slice, not one per tensor; a gap in
    either (padding in the bucket, a skipped tensor in the file) keeps them apart."""
    assert rd.coalesce([Extent(4, 4, 4), Extent(0, 4, 0), Extent(8, 0, 8), Extent(8, 4, 8)]) == [Extent(0, 12, 0)]
    assert rd.coalesce([Extent(0, 4, 0), Extent(4, 4, 8)]) == [Extent(0, 4, 0), Extent(4, 4, 8)]  # bucket padding
    assert rd.coalesce([Extent(0, 4, 0), Extent(8, 4, 4)]) == [Extent(0, 4, 0), Extent(8, 4, 4)]  # a file gap
    assert rd.coalesce([Extent(0, 0, 0)]) == []
    rng = np.random.default_rng(5)
    for _ in range(200):  # any extents: the same destination byte from the same file byte, none added or lost
        extents = [Extent(int(rng.integers(0, 64)), int(rng.integers(0, 9)), int(rng.integers(0, 64)))
                   for _ in range(int(rng.integers(0, 8)))]
        pairs = lambda es: sorted((e.dst_offset + i, e.file_offset + i) for e in es for i in range(e.nbytes))  # noqa: E731
        joined = rd.coalesce(extents)
        assert pairs(joined) == pairs(extents) and all(e.nbytes for e in joined)
    p, data = _file(tmp_path, 64 * KB)
    pieces = [Extent(i * 4 * KB, 4 * KB, i * 4 * KB) for i in range(8)] + [Extent(40 * KB, 8 * KB, 36 * KB)]
    seam = StandInSeam()
    out = np.zeros(44 * KB, np.uint8)
    with WeightFile(p) as wf:
        ParallelReader(seam, threads=1, slice_bytes=64 * KB).read(wf, pieces, out)
    assert sorted(seam.copies) == [(0, 32 * KB), (36 * KB, 8 * KB)]
    assert np.array_equal(out[:32 * KB], data[:32 * KB]) and np.array_equal(out[36 * KB:], data[40 * KB:48 * KB])
    assert not out[32 * KB:36 * KB].any()  # the gap in the bucket is not written


def test_a_destination_too_small_is_refused_before_any_read(tmp_path: Path) -> None:
    p, _ = _file(tmp_path, 64 * KB)
    for seam in (HostSeam(), StandInSeam()):
        with WeightFile(p) as wf, pytest.raises(ValueError, match="holds 4096 bytes; the extents need 8192"):
            ParallelReader(seam).read(wf, [Extent(0, 8192, 0)], np.zeros(4096, np.uint8))


@pytest.mark.parametrize("direct", ["off", "on"])
def test_the_torch_seam_itself_runs_on_torch_cpu(tmp_path: Path, direct: str) -> None:
    """The accelerator seam's own code (device module, streams, events, stream ordering, the
    pageable fallback where pinning is refused) driven through torch.cpu's stand-in device module."""
    import torch

    from hwtui.engine.replication.reader import TorchSeam

    p, data = _file(tmp_path, (3 << 20) + 4097)
    seam = TorchSeam("cpu")
    dst = torch.zeros(len(data), dtype=torch.uint8)
    with WeightFile(p, direct) as wf:
        r = ParallelReader(seam, threads=3, slice_bytes=1 << 20)
        r.read(wf, [Extent(0, len(data), 0)], dst)
        r.close()
    assert np.array_equal(dst.numpy(), data)


def test_direct_io_refused_at_the_first_read_falls_back_with_its_reason(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Some filesystems take the O_DIRECT flag at open and refuse the reads (EINVAL): probed at open."""
    p, data = _file(tmp_path, 50 * KB + 1)
    real_open, real_preadv = os.open, os.preadv
    direct_fds: set[int] = set()

    def tracking_open(path: Any, flags: int, *a: Any, **k: Any) -> int:
        fd = real_open(path, flags, *a, **k)
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        return fd

    def refusing(fd: int, bufs: Any, offset: int) -> int:
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, offset)

    monkeypatch.setattr(rd.os, "open", tracking_open)
    monkeypatch.setattr(rd.os, "preadv", refusing)
    out = np.zeros(len(data), np.uint8)
    stats = read_file(p, out, direct="on", slice_bytes=8 * KB)
    assert np.array_equal(out, data)
    assert not stats.direct and stats.direct_reason == "the filesystem refuses O_DIRECT reads (EINVAL)"


# ---------------------------------------------------------------- queued reads (read-ahead)


def test_a_queued_read_is_read_before_the_one_ahead_of_it_is_waited_on(tmp_path: Path) -> None:
    """The threads go from read A straight on to read B: B completes while nobody has waited on A
    (A's copies are still in flight on the stand-in device), and with one thread A's slices are
    all issued before B's (oldest read first)."""
    pa, da = _file(tmp_path, 6 * 16 * KB, "a.bin", seed=1)
    pb, db = _file(tmp_path, 5 * 16 * KB + 3, "b.bin", seed=2)
    for threads in (1, 3):
        seam = StandInSeam()
        oa, ob = np.zeros(len(da), np.uint8), np.zeros(len(db), np.uint8)
        r = ParallelReader(seam, threads=threads, slice_bytes=16 * KB, depth=16)  # a ring deep enough that no copy of A is landed to reuse a buffer
        with WeightFile(pa) as wa, WeightFile(pb) as wb:
            ra = r.submit(wa, [Extent(0, len(da), 0)], oa)
            rb = r.submit(wb, [Extent(0, len(db), 0)], ob)
            rb.wait()
            assert np.array_equal(ob, db)
            if threads == 1:
                assert not oa.any()  # A's copies were issued and never waited on: nothing landed yet
                issued = [c[0] for c in seam.copies]
                assert issued == list(range(0, len(da), 16 * KB)) + list(range(0, len(db), 16 * KB))
            ra.wait()
            assert np.array_equal(oa, da)
        r.close()
        assert all(v == 0 for v in seam.pending.values())


def test_a_failed_read_leaves_the_reads_queued_behind_it_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pa, da = _file(tmp_path, 8 * 16 * KB, "a.bin", seed=3)
    pb, db = _file(tmp_path, 8 * 16 * KB, "b.bin", seed=4)
    with WeightFile(pa) as wa, WeightFile(pb) as wb:
        bad = wa.fd

        def eio_on_a(real: Any, fd: int, bufs: Any, offset: int, n: int) -> int:
            if fd == bad and offset >= 3 * 16 * KB:
                raise OSError(errno.EIO, "Input/output error")
            return int(real(fd, bufs, offset))

        _inject(monkeypatch, eio_on_a)
        for seam in (HostSeam(), StandInSeam()):
            oa, ob = np.zeros(len(da), np.uint8), np.zeros(len(db), np.uint8)
            r = ParallelReader(seam, threads=2, slice_bytes=16 * KB)
            ra = r.submit(wa, [Extent(0, len(da), 0)], oa)
            rb = r.submit(wb, [Extent(0, len(db), 0)], ob)
            with pytest.raises(ReadFailed, match="I/O error reading weight file") as err:
                ra.wait()
            assert err.value.kind == "io-error"
            rb.wait()
            assert np.array_equal(ob, db), type(seam).__name__
            r.close()
            if isinstance(seam, StandInSeam):
                assert all(v == 0 for v in seam.pending.values())


def test_closing_abandons_a_queued_read_and_lands_every_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """close() while a read is queued: the slice in hand finishes, the rest are dropped and the
    read says so; no copy is left in flight and no reader thread is left."""
    p, data = _file(tmp_path, 10 * 16 * KB)
    entered, release = threading.Event(), threading.Event()

    def held(real: Any, fd: int, bufs: Any, offset: int, n: int) -> int:
        if n == 1:
            entered.set()
            release.wait(30)
        return int(real(fd, bufs, offset))

    _inject(monkeypatch, held)
    seam = StandInSeam()
    r = ParallelReader(seam, threads=1, slice_bytes=16 * KB)
    with WeightFile(p) as wf:
        reading = r.submit(wf, [Extent(0, len(data), 0)], np.zeros(len(data), np.uint8))
        assert entered.wait(30)
        closer = threading.Thread(target=r.close)
        closer.start()
        crew = r._crew
        with crew.cond:
            while not crew.closing:
                crew.cond.wait(0.05)
        release.set()
        closer.join(30)
        assert not closer.is_alive()
        with pytest.raises(RuntimeError, match="the reader was closed before this read finished"):
            reading.wait()
    assert len(seam.copies) == 1 and all(v == 0 for v in seam.pending.values())
    assert not crew.workers


def test_a_reader_nobody_closes_leaves_no_thread_behind(tmp_path: Path) -> None:
    """A resident rank lives on across pushes: a reader dropped without close() (a path that forgot
    it) is collected, and its threads end; before, each such reader kept its threads for good."""
    import gc
    import weakref

    p, data = _file(tmp_path, 64 * KB)
    before = {t for t in threading.enumerate() if t.name.startswith("hwtui-reader")}
    crews = []
    for _ in range(3):
        r = ParallelReader(HostSeam(), threads=3, slice_bytes=16 * KB)
        out = np.zeros(len(data), np.uint8)
        with WeightFile(p) as wf:
            r.read(wf, [Extent(0, len(data), 0)], out)
        assert np.array_equal(out, data)
        crews.append(r._crew)
        gone = weakref.ref(r)
        del r
        gc.collect()
        assert gone() is None  # the threads hold the crew, not the reader
    for crew in crews:
        for w in crew.workers:
            w.join(30)  # they were told to end when their reader went
            assert not w.is_alive()
    assert {t for t in threading.enumerate() if t.name.startswith("hwtui-reader")} <= before


def test_a_ring_that_cannot_be_made_whole_is_not_kept(tmp_path: Path) -> None:
    """The second buffer of a thread's ring cannot be had: that read fails with the allocation's
    error, and a later read (memory back) makes the whole ring, never a short one."""
    p, data = _file(tmp_path, 4 * 16 * KB)
    seam = StandInSeam()
    real = seam.host_buffer
    fail = [True]

    def second_fails(nbytes: int) -> Any:
        if fail[0] and seam.buffers == 1:
            raise MemoryError("pinned memory exhausted (stand-in)")
        return real(nbytes)

    seam.host_buffer = second_fails  # type: ignore[method-assign]
    r = ParallelReader(seam, threads=1, slice_bytes=16 * KB, depth=2)
    out = np.zeros(len(data), np.uint8)
    with WeightFile(p) as wf:
        with pytest.raises(MemoryError, match="stand-in"):
            r.read(wf, [Extent(0, len(data), 0)], out)
        fail[0] = False
        r.read(wf, [Extent(0, len(data), 0)], out)
    assert np.array_equal(out, data) and len(r._crew.rings[0]) == 2
    r.close()


def test_a_reader_whose_read_failed_is_still_collected_and_its_threads_end(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed read's error holds its traceback (the caller's frames, the reader in them): an idle
    thread must not pin that error, or the reader is never collected and its threads never end."""
    import gc
    import weakref

    p, data = _file(tmp_path, 64 * KB)
    _inject(monkeypatch, lambda real, fd, bufs, offset, n: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error")))
    r = ParallelReader(StandInSeam(), threads=2, slice_bytes=16 * KB)
    with WeightFile(p) as wf, pytest.raises(ReadFailed, match="I/O error"):
        r.read(wf, [Extent(0, len(data), 0)], np.zeros(len(data), np.uint8))
    crew, gone = r._crew, weakref.ref(r)
    del r
    gc.collect()  # the error and its traceback form a cycle: collected, not pinned by a live thread
    assert gone() is None
    for w in crew.workers:
        w.join(30)
        assert not w.is_alive()
