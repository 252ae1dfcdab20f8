"""What a staging file on disk costs, kept near what the disk costs.

Measured here (ext4 on a virtio disk, 1 GB copied from a warm page cache into a new file, hashed
as it lands, then fsynced; medians of 5 interleaved rounds, docs/replication.md has the table):
a sparse file (``ftruncate``) takes 0.23-2.1 s to fill, because every 4 KiB page of a hole costs a
delayed-allocation block reservation and the dirty pages pile up until write-back throttles the
writer, then 0.25 s more to fsync. Two things bring it to what the disk costs:

- :func:`preallocate`: ``fallocate(2)`` reserves every block before the first byte (an unwritten
  extent: nothing is written, 1 ms for 1 GB), so a write is a plain page-cache copy (0.16 s). It
  also turns a full disk into one clear error *before* the transfer, where a hole on a full disk
  fails in the middle of it -- or, written through a mapping, kills the rank with SIGBUS.
- :class:`WriteBehind`: as buckets land, a thread asks the kernel to start writing them out
  (``sync_file_range(SYNC_FILE_RANGE_WRITE)``: start, never wait), so the disk works while the
  transfer goes on and the fsync before the vote finds little left (0.23 s -> 0.06 s). It only
  starts write-out; durability is still the fsync's, and the fsync still comes before the vote.

Not chosen (measured the same way): write-behind from the copying thread (0.22 s copy: the call
blocks on the request queue); write-behind one bucket behind (0.9 s); direct I/O of aligned
buckets (0.29 s, and the copy could then only be hashed from the source, not as it landed).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from hwtui.core.errors import HwtuiError

# fallocate(2) answers these when the filesystem cannot preallocate (then a sparse file it is).
# glibc's posix_fallocate is not used: where the filesystem refuses, it emulates by writing every
# block, i.e. a second copy of the whole model before the transfer starts.
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENOTSUP}
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
SYNC_FILE_RANGE_WRITE = 2
WRITE_BEHIND_BYTES = 32 << 20  # one default bucket: a kick per bucket, not per tensor piece

_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        lib.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        _libc = lib
    return _libc


def fallocate(fd: int, offset: int, length: int) -> None:
    """``fallocate(fd, 0, offset, length)``; raises OSError with the call's errno (the os boundary)."""
    if _c().fallocate(fd, 0, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def no_space(what: str, nbytes: int, exc: OSError) -> HwtuiError:
    """The one line a full disk (or quota) reads as, wherever it is met."""
    return HwtuiError(f"no space left on device for {what} ({nbytes:,} bytes): {exc.strerror or exc}; "
                      "free space there (or choose another --out) and run it again")


def preallocate(fd: int, nbytes: int, what: str) -> bool:
    """Reserve ``nbytes`` for the file at ``fd``; False where the filesystem cannot (it stays sparse).

    A full disk or quota raises :class:`HwtuiError` naming ``what``; any other error is the caller's.
    """
    if nbytes <= 0:
        return False
    return reserve_range(fd, 0, nbytes, what)


def reserve_range(fd: int, offset: int, length: int, what: str, room_for: int | None = None) -> bool:
    """:func:`preallocate` for ``length`` bytes at ``offset`` (a file reserved piece by piece, so
    that a caller can stop between pieces). Where nothing can be reserved, the disk must have
    ``room_for`` bytes free (default ``length``), and False says so."""
    try:
        fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise no_space(what, length, exc) from None
        if exc.errno in _UNSUPPORTED:
            _room_for(fd, room_for if room_for is not None else length, what)
            return False
        raise
    except AttributeError:  # a libc without fallocate
        _room_for(fd, room_for if room_for is not None else length, what)
        return False
    return True


def _room_for(fd: int, nbytes: int, what: str) -> None:
    """Where nothing can be reserved (ext2, some network filesystems), a disk that already lacks
    the room is still one clear line before the transfer: the free space is checked. Without it a
    receiver met the full disk through its mapping mid-transfer, and the run said "rank 2 hung".
    A disk that another writer fills during the transfer is not covered (only a reservation is)."""
    try:
        st = os.fstatvfs(fd)
        held = os.fstat(fd).st_blocks * 512  # blocks the file already has (a reused spare)
    except OSError:
        return
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize  # root may use the reserve
    if free + held < nbytes:
        raise no_space(what, nbytes, OSError(errno.ENOSPC, f"{free:,} bytes free there"))


def start_write_out(fd: int, offset: int, nbytes: int) -> None:
    """Start write-out of the dirty pages of ``fd`` in the range not under write-out yet; never waits."""
    with contextlib.suppress(OSError, AttributeError):
        _c().sync_file_range(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE)
        # A filesystem that cannot: the fsync before the vote does it all, as before.


class WriteBehind:
    """Starts write-out of a file's landed byte ranges on a thread, a kick per ``step`` bytes landed.

    A kick covers the span of what landed since the last one (from its lowest to its highest
    byte): a bucket whose pieces land apart is covered whole, and the kernel skips pages that are
    clean or under write-out already. Pages still being written are never in a span, so they are
    not written out twice. Bytes stored through a mapping are dirty pages like any other.
    """

    def __init__(self, fd: int, step: int | None = None):
        self.fd = fd
        self.step = step or WRITE_BEHIND_BYTES
        self.kicks = 0
        self._span: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future[None] | None = None

    def landed(self, offset: int, nbytes: int) -> None:
        """File bytes ``[offset, offset + nbytes)`` hold their final contents in the page cache."""
        if nbytes <= 0:
            return
        with self._lock:
            lo, hi = self._span or (offset, offset + nbytes)
            lo, hi = min(lo, offset), max(hi, offset + nbytes)
            if hi - lo < self.step:
                self._span = (lo, hi)
                return
            self._span = None
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="write-behind")
            self.kicks += 1
            self._last = self._pool.submit(start_write_out, self.fd, lo, hi - lo)

    def drain(self) -> None:
        """Wait for the kicks queued so far (before an fsync, or before the fd is closed)."""
        with self._lock:
            last, self._last = self._last, None
        if last is not None:
            last.result()  # the pool runs kicks in order: the last one done means all are

    def close(self) -> None:
        self.drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
