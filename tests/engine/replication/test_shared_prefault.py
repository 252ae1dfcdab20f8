"""A likely host leader's staging memory (engine.replication.shared_prefault) and the follower's read of it.

Checked by state: the memory is a private file (0600 in a 0700 run directory) whose pages are all
mapped in this process once taken (its /proc/self/smaps Rss), so the network's ``recv`` writes into
pages that exist instead of faulting each one in; a follower reading it gets every byte and the
digest of what landed.
"""

from __future__ import annotations

import ctypes
import os
import stat

import numpy as np
import pytest
import xxhash

from hwtui.engine.replication.host_copy import read_hashed
from hwtui.engine.replication.shared_prefault import SharedPrefaulted


@pytest.fixture()
def shm(tmp_path, monkeypatch):
    base = tmp_path / "shm"
    base.mkdir(mode=0o1777)
    monkeypatch.setenv("HWTUI_SHM_DIR", str(base))
    return base


def _rss_of(buf) -> int:
    """Resident bytes of the mapping that holds ``buf`` (this process's page tables)."""
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    rss, inside = 0, False
    with open("/proc/self/smaps", encoding="ascii") as fh:
        for line in fh:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "Rss:":
                rss = int(line.split()[1]) * 1024
    return rss


def test_shared_memory_is_private_and_faulted_in_before_it_is_handed_out(shm):
    n = 8 << 20
    sp = SharedPrefaulted.make(n)
    assert sp is not None
    d, f = os.stat(sp.run_dir.path), os.lstat(sp.path)
    assert stat.S_IMODE(d.st_mode) == 0o700 and stat.S_IMODE(f.st_mode) == 0o600 and stat.S_ISREG(f.st_mode)
    assert os.path.dirname(sp.path) == sp.run_dir.path and sp.run_dir.path.startswith(str(shm))
    assert sp.ready(30.0)
    buf = sp.take(30.0)
    assert buf is not None and len(buf) == n and sp.populated
    assert _rss_of(buf) >= n  # every page mapped already: the transfer faults none in
    # What this rank writes is what a host-mate reads from the file (shared, not a private copy).
    buf[123:126] = b"abc"
    with open(sp.path, "rb") as fh:
        fh.seek(123)
        assert fh.read(3) == b"abc"
    sp.discard()
    assert not os.path.exists(sp.run_dir.path)
    assert buf[123:126] == b"abc"  # unlinked, still mapped: a rank that does not lead keeps its memory
    buf.close()


def test_no_room_in_shared_memory_means_private_memory_as_before(shm, monkeypatch):
    import hwtui.engine.replication.shared_prefault as mod

    def full(fd, nbytes, what):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mod, "preallocate", full)
    sp = SharedPrefaulted.make(1 << 20)
    assert sp is not None
    assert not sp.ready(30.0)
    assert sp.take(30.0) is None
    assert not os.path.exists(sp.run_dir.path)  # nothing left behind in /dev/shm
    assert SharedPrefaulted.make(0) is None


def test_no_shared_memory_directory_means_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HWTUI_SHM_DIR", str(tmp_path / "missing"))
    assert SharedPrefaulted.make(1 << 20) is None


def test_a_follower_reads_every_byte_and_hashes_what_landed(tmp_path):
    data = np.random.default_rng(3).integers(0, 256, 3 * (1 << 20) + 77, dtype=np.uint8)
    path = tmp_path / "leader"
    path.write_bytes(b"HDR" + data.tobytes())
    dest = np.zeros(data.size, dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        digest = read_hashed(fd, 3, dest, step=1 << 20)
        assert np.array_equal(dest, data)
        assert digest == f"{xxhash.xxh3_64(data.tobytes()).intdigest():016x}"
        short = np.zeros(data.size + 10, dtype=np.uint8)
        with pytest.raises(OSError, match="ended 10 bytes early"):
            read_hashed(fd, 3, short)
    finally:
        os.close(fd)


def _follower(leader_file: str, data_bytes: int, *, data_at: int | None = 0, file: str | None = None):
    """Just what RankHostCopy._map_leader_copy reads of a follower rank."""
    from types import SimpleNamespace

    return SimpleNamespace(rank=3, leader_of={3: 2}, leader_files={2: leader_file}, leader_data_at={2: data_at},
                           staging=SimpleNamespace(file=file, data_bytes=data_bytes), _leader_map=None)


@pytest.mark.torch
def test_a_follower_maps_its_leaders_shared_memory_at_setup_and_a_short_copy_is_named(tmp_path):
    """Mapped read-only with every page in this process's page tables (its smaps Rss) before any
    bucket moves; only a leader staging in shared memory (data at 0) and a copy into memory; a file
    shorter than the copy is a named transport failure, not a short copy found by a checksum."""
    from hwtui.engine.replication.host_copy import RankHostCopy
    from hwtui.engine.replication.rank_signals import TransportFailure

    data = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    leader = tmp_path / "staging"
    leader.write_bytes(data.tobytes())
    rank = _follower(str(leader), data.size)
    assert RankHostCopy._map_leader_copy(rank) >= 0.0  # type: ignore[arg-type]
    mapped = rank._leader_map
    assert mapped is not None and mapped.size == data.size
    assert bytes(mapped.tensor.numpy()[:4096]) == data[:4096].tobytes()
    with open("/proc/self/smaps", encoding="ascii") as fh:
        text = fh.read()
    block = text[text.index(str(leader)):].split("VmFlags")[0]
    rss_kb = int(next(line.split()[1] for line in block.splitlines() if line.startswith("Rss:")))
    assert rss_kb * 1024 == data.size  # populated: no fault left for the transfer
    RankHostCopy._unmap_leader_copy(rank)  # type: ignore[arg-type]
    assert rank._leader_map is None and str(leader) not in open("/proc/self/maps", encoding="ascii").read()
    for other in (_follower(str(leader), data.size, data_at=None), _follower(str(leader), data.size, file="/out/x")):
        assert RankHostCopy._map_leader_copy(other) == 0.0 and other._leader_map is None  # type: ignore[arg-type]
    short = _follower(str(leader), data.size + 4096)
    with pytest.raises(TransportFailure, match=r"rank 3: its host leader's staging copy has 1048576 bytes, fewer than the 1052672"):
        RankHostCopy._map_leader_copy(short)  # type: ignore[arg-type]
    assert short._leader_map is None and str(leader) not in open("/proc/self/maps", encoding="ascii").read()
