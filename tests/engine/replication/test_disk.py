"""A staging file costs what the disk costs: reserved before the transfer, written out behind it.

The filesystem's answers are faked only at the os boundary (``disk.fallocate``, ``os.pwrite``,
``disk.start_write_out``); the files are real.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

torch: Any = pytest.importorskip("torch")

from hwtui.core.errors import HwtuiError  # noqa: E402
from hwtui.engine.replication import disk  # noqa: E402
from hwtui.engine.replication.checksum import tensor_hex  # noqa: E402
from hwtui.engine.replication.staging import Staging  # noqa: E402


def _tensors(sizes: list[int]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    g = torch.Generator().manual_seed(5)
    data = {f"t{i}": torch.randint(0, 255, (n,), dtype=torch.uint8, generator=g) for i, n in enumerate(sizes)}
    meta = [{"name": k, "dtype": "U8", "shape": [v.numel()], "nbytes": v.numel(), "checksum": tensor_hex(v)}
            for k, v in data.items()]
    return meta, data


def _fill_and_check(st: Staging, data: dict[str, Any], path: os.PathLike[str]) -> None:
    from safetensors.torch import load_file

    for name, t in data.items():
        st.write_hashed(st.layout[name][0], t.numpy())
    assert st.verify() == []
    st.flush()
    st.close()
    got = load_file(str(path))
    assert all(torch.equal(got[k], data[k]) for k in data)


def test_the_staging_file_is_reserved_whole_before_the_first_byte(tmp_path: Path) -> None:
    meta, data = _tensors([300_000, 5, 200_000])
    path = tmp_path / "s" / "model.safetensors"
    st = Staging(meta, {"format": "pt"}, file=path)
    total = len(st.header) + st.data_bytes
    # On 7309e8d the file was sparse: only the header's block was allocated before the transfer.
    assert st.preallocated and os.stat(path).st_blocks * 512 >= total
    _fill_and_check(st, data, path)


@pytest.mark.parametrize("err", [errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL])
def test_a_filesystem_that_cannot_preallocate_gets_a_sparse_file_that_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    calls = []

    def refuse(fd: int, offset: int, length: int) -> None:
        calls.append(length)
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(disk, "fallocate", refuse)
    meta, data = _tensors([70_000, 3])
    path = tmp_path / "model.safetensors"
    st = Staging(meta, {"format": "pt"}, file=path)
    assert calls and not st.preallocated
    _fill_and_check(st, data, path)


def test_no_space_to_preallocate_is_one_no_space_error_naming_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(disk, "fallocate", full)
    meta, _ = _tensors([70_000])
    path = tmp_path / "model.safetensors"
    with pytest.raises(HwtuiError, match=r"no space left on device for the staging copy .*model\.safetensors"):
        Staging(meta, {"format": "pt"}, file=path)


def test_where_nothing_can_be_reserved_a_disk_already_too_full_is_one_no_space_line(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """ext2 cannot preallocate: a staging copy bigger than the free space used to meet the full disk
    mid-transfer (through a receiver's mapping: "rank 2 hung"); the free space is checked first."""
    monkeypatch.setattr(disk, "fallocate", lambda fd, off, n: (_ for _ in ()).throw(OSError(errno.EOPNOTSUPP, "no")))
    real = os.fstatvfs

    def little(fd: int) -> Any:
        st = real(fd)
        return os.statvfs_result((st.f_bsize, 4096, st.f_blocks, 3, 3, st.f_files, st.f_ffree, st.f_favail,
                                  st.f_flag, st.f_namemax))

    monkeypatch.setattr(os, "fstatvfs", little)  # 12 KiB free
    meta, data = _tensors([70_000])
    with pytest.raises(HwtuiError, match=r"no space left on device for the staging copy .*model\.safetensors "
                                         r"\(\d[\d,]* bytes\): 12,288 bytes free there"):
        Staging(meta, {"format": "pt"}, file=tmp_path / "model.safetensors")
    small, small_data = _tensors([2_000])  # it fits: a sparse file, as before
    st = Staging(small, {"format": "pt"}, file=tmp_path / "small.safetensors")
    assert not st.preallocated
    _fill_and_check(st, small_data, tmp_path / "small.safetensors")


def test_another_preallocation_error_is_not_swallowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(disk, "fallocate", broken)
    meta, _ = _tensors([10])
    with pytest.raises(OSError, match="Input/output error"):
        Staging(meta, {"format": "pt"}, file=tmp_path / "model.safetensors")


def test_a_full_disk_under_a_sparse_copy_reads_as_no_space_not_an_internal_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the filesystem could not preallocate, the disk can still fill while bytes land.
    monkeypatch.setattr(disk, "fallocate", lambda fd, off, n: (_ for _ in ()).throw(OSError(errno.EOPNOTSUPP, "no")))
    meta, data = _tensors([70_000])
    st = Staging(meta, {"format": "pt"}, file=tmp_path / "model.safetensors")
    real = os.pwrite

    def full(fd: int, buf: Any, offset: int) -> int:
        if offset >= len(st.header):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, buf, offset)

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(HwtuiError, match="no space left on device for the staging copy"):
        st.write_hashed(0, data["t0"].numpy())
    with pytest.raises(HwtuiError, match="no space left on device for the staging copy"):
        st.write_at(0, data["t0"].numpy())
    st.close()


def test_landed_bytes_start_their_write_out_in_spans_and_flush_still_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kicked: list[tuple[int, int]] = []
    monkeypatch.setattr(disk, "WRITE_BEHIND_BYTES", 64 << 10)
    monkeypatch.setattr(disk, "start_write_out", lambda fd, off, n: kicked.append((off, n)))
    synced = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    meta, data = _tensors([100_000, 100_000, 30_000])
    path = tmp_path / "model.safetensors"
    st = Staging(meta, {"format": "pt"}, file=path)
    hlen = len(st.header)
    for name in ("t0", "t1", "t2"):
        st.write_hashed(st.layout[name][0], data[name].numpy())
    st.flush()
    # A kick per step landed (an eighth of this small copy), covering what landed since the last
    # one, in file offsets (header included); the fsync still ran, before any vote could.
    step = min(64 << 10, (hlen + st.data_bytes) // 8)
    assert all(data[n].numel() >= step for n in data)  # so each tensor written is one kick
    assert sorted(kicked) == sorted((hlen + st.layout[n][0], data[n].numel()) for n in data)
    assert synced
    st.close()


def test_write_behind_drains_every_kick_before_the_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = threading.Event(), threading.Event()
    done = []

    def slow(fd: int, offset: int, nbytes: int) -> None:
        started.set()
        release.wait(30)
        done.append(offset)

    monkeypatch.setattr(disk, "start_write_out", slow)
    wb = disk.WriteBehind(fd=-1, step=10)
    try:
        wb.landed(0, 10)
        wb.landed(10, 10)
        assert started.wait(30)
        waiter = threading.Thread(target=wb.drain)
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive()  # drain is waiting on the kicks in flight (never wrongly: release is not set)
        release.set()
        waiter.join(30)
        assert not waiter.is_alive() and done == [0, 10] and wb.kicks == 2
    finally:
        release.set()
        wb.close()


def test_a_memory_copy_starts_no_write_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk, "start_write_out", lambda fd, off, n: pytest.fail("a memory copy has no file"))
    meta, data = _tensors([70_000])
    st = Staging(meta, {"format": "pt"})
    st.write_hashed(0, data["t0"].numpy())
    st.landed(0, 70_000)
    assert st.verify() == []
    st.close()


@pytest.mark.torch
@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", ["same-host", "shm", "network"])
def test_every_receivers_staging_file_is_reserved_and_written_out_behind_the_transfer(tmp_path: Path, path: str) -> None:
    """Every way bytes land -- copied by pwrite from the source's page cache (same-host) or from its
    /dev/shm copy (shm), received through the mapping (network) -- start their write-out before prepare, and the copy is still every byte the
    source's, committed. On 7309e8d the report had no staging_disk: the file was sparse and
    nothing was written out before the fsync."""
    from hwtui.engine.replication.launcher import ReplicationOptions, run_replication
    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic
    from tests.engine.replication.helpers import assert_bytes_equal, make_model, served

    model = make_model(tmp_path / "src", seed=3)
    sources = [str(tmp_path / "src" / "model.safetensors"), str(tmp_path / "src" / "head.pt")]
    if path == "same-host":  # one safetensors file: the replica is that file, copied from its pages
        from safetensors import safe_open

        sources = sources[:1]
        with safe_open(sources[0], "pt") as fh:
            model = {k: model[k] for k in fh.keys()}  # noqa: SIM118 - safe_open is no dict
    write_json_atomic(tmp_path / "v1.json", build_plan_from_files(sources, model="tiny", version="v1", bucket_bytes=64 << 10))
    result = run_replication(ReplicationOptions(plan=str(tmp_path / "v1.json"), nproc=3, commit=True,
                                                out=str(tmp_path / "out"), same_host=path != "network"))
    assert result.ok, result.error
    receivers = [r for r in result.report["ranks"] if r["rank"] != 0]
    assert {r["path"] for r in receivers} == {path}
    for r in receivers:
        disk_stats = r["memory"]["staging_disk"]
        assert disk_stats["preallocated"] is True and disk_stats["write_out_kicks"] >= 1, (r["rank"], disk_stats)
        version, tensors = served(tmp_path / "out", r["rank"])
        assert version == "v1"
        assert_bytes_equal(tensors, model)


def test_a_staging_file_made_ahead_is_taken_whole_and_resized_when_the_layout_differs(tmp_path: Path) -> None:
    from hwtui.engine.replication.staging import PrefaultedFile

    meta, data = _tensors([70_000, 3000])
    path = tmp_path / "model.safetensors"
    made = PrefaultedFile(path, sum(t["nbytes"] for t in meta))  # the data's size: the header comes later
    assert made.take(60.0) and made.preallocated and os.stat(path).st_size == 73_000
    st = Staging(meta, {"format": "pt"}, file=path, reuse_file=True)
    total = len(st.header) + st.data_bytes
    assert os.stat(path).st_size == total and os.stat(path).st_blocks * 512 >= total
    _fill_and_check(st, data, path)


def test_no_space_for_a_staging_file_made_ahead_is_raised_in_the_ranks_thread(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from hwtui.engine.replication.staging import PrefaultedFile

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(disk, "fallocate", full)
    made = PrefaultedFile(tmp_path / "model.safetensors", 1 << 20)
    with pytest.raises(HwtuiError, match="no space left on device for the staging copy"):
        made.take(60.0)


def _at_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes: list[int]) -> tuple[Staging, dict[str, Any], Path]:
    """A copy kept in memory and written whole at flush (a GPU receiver's device copy, on CPU),
    written out 1000 bytes at a time: chunks that cut tensors and the header's end anywhere."""
    from hwtui.engine.replication import staging

    monkeypatch.setenv(staging.AT_FLUSH_ENV, "at-flush")
    monkeypatch.setattr(staging, "WRITE_OUT_CHUNK", 1000)
    meta, data = _tensors(sizes)
    path = tmp_path / "s" / "model.safetensors"
    path.parent.mkdir()
    st = Staging(meta, {"format": "pt"}, file=path)
    for name, t in data.items():
        st.write_hashed(st.layout[name][0], t.numpy())
    return st, data, path


def test_a_copy_written_at_flush_in_chunks_is_the_model_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write of a device copy goes a chunk at a time (staging.WRITE_OUT_CHUNK): every byte lands
    where one write of the whole would have put it, and a should_stop that never says stop is
    asked before every chunk and before the fsync."""
    from safetensors.torch import load_file

    st, data, path = _at_flush(tmp_path, monkeypatch, [4321, 5, 2000, 999])
    asked = []
    st.flush(lambda: asked.append(1) and False)
    st.close()
    got = load_file(str(path))
    assert all(torch.equal(got[k], data[k]) for k in data)
    assert len(asked) == -(-st.data_bytes // 1000) + 1


def test_a_copy_written_at_flush_stops_between_chunks_when_a_newer_push_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """should_stop saying so after three chunks: WriteStopped, no more bytes written and no fsync
    (the caller never switches to the file); asked at the very end, it still stops before the fsync."""
    from hwtui.engine.replication import staging

    st, _, path = _at_flush(tmp_path, monkeypatch, [8000, 3000])
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    calls = []
    with pytest.raises(staging.WriteStopped, match="stopped after 3000 of 11000 bytes"):
        st.flush(lambda: calls.append(1) is None and len(calls) > 3)
    assert os.path.getsize(path) == len(st.header) + 3000 and synced == []
    n = -(-st.data_bytes // 1000)
    late = []
    with pytest.raises(staging.WriteStopped, match="was not made durable"):
        st.flush(lambda: late.append(1) is None and len(late) > n)
    assert os.path.getsize(path) == len(st.header) + st.data_bytes and synced == []
    st.close()
