"""A spare staging file, made between pushes, so a push never waits for pages to be allocated.

Creating a receiver's staging copy means allocating the whole model on disk: the worker no longer
pre-faults it, so the transfer pays for every page it first touches instead (1 GB was 3-13 s on a
loaded node, several times the transfer itself). A resident receiver does that work while it
is idle instead: after each committed push it makes ``<served>/spare/model.safetensors`` the size
of the version it now serves, zero-filled and synced. The next push's staging copy *is* that file
(renamed into ``staging/<v>/``, resized if the model grew or shrank, its header rewritten): writing
over cached pages costs ~0.15 s per GB. Every byte of the data is then written by the transfer or
copied from the served version and verified against the plan, as with a fresh file. The resident
rank hands this class to the worker through its ``staging_factory`` seam.

The staging copy is also written back to disk *while the transfer runs* (``Writeback``): each
bucket, once received and verified, is handed to a background thread that starts its writeback
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which releases the GIL, on that byte range only, so
pages still being received are not written twice). It only starts it: waiting for each range
before starting the next kept one bucket in the device's queue (two receivers of 1 GB writing one
disk: prepare took 0.11-0.21 s after the transfer that way, 0.01-0.15 s now). ``flush`` at
prepare still does the whole fsync before the vote (durability is unchanged: fsync writes what is
left, waits for what is under way and flushes the device's cache), but finds almost nothing left
to write (1 GB was 0.4-0.7 s with no head start).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import queue
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwtui.core.private_file import create_private, open_private
from hwtui.engine.replication.served_files import PRIVATE_DIR, make_dir, own_real_dir, owned_entry
from hwtui.engine.replication.staging import Staging


def spare_path(served_root: str | os.PathLike[str]) -> Path:
    return Path(served_root) / "spare" / "model.safetensors"


# Zeroed and written back per chunk: how soon a waiting push gets the rank. Measured here (1 GiB,
# a stop asked mid-way): 64 MiB chunks answered in 0.09-0.2 s, and once in 1.8-2.1 s (the first
# chunk's pages held up by the kernel's write-back throttling); 16 MiB chunks in 0.04-0.14 s.
SPARE_CHUNK = 16 << 20
DISCARD_PREFIX = ".spare.discard."  # a stopped spare, renamed away and unlinked off the rank's path


class SpareStopped(Exception):
    """Making the spare was given up for something more urgent (a push arrived): nothing is left."""


def make_spare(served_root: str | os.PathLike[str], size: int, stop: Callable[[], bool] | None = None) -> int:
    """Write a zero-filled, synced spare of ``size`` bytes (atomically: a half-made one never counts).

    ``stop`` is asked between chunks: a spare is idle work and must never delay a push, which
    waits in the rank's command channel until this returns (1 GB zero-filled and fsynced whole
    took 0.3-1 s; a warm push's transfer is 0.12 s on a GPU). On True the temporary file goes and
    SpareStopped is raised. Each chunk's write-back is started as it is zeroed and the one before
    it waited for, so the final fsync (which no stop can cut short) finds at most two chunks left.
    A stopped spare's file is renamed away at once and unlinked on a thread (``_discard``).
    """
    import torch

    from hwtui.engine.replication.disk import reserve_range

    final = spare_path(served_root)
    final.parent.parent.mkdir(parents=True, exist_ok=True)  # the served root (the rank's own directory)
    # Owner-only whatever the umask (it was the umask's: 0777 under umask 0, writable by the
    # serving group with --serve-group), and never through a symlink: the spare becomes a staging
    # copy of the weights, and everything in spare/ is created, replaced, moved and unlinked by
    # name. Through a planted link (anyone who can write the served directory can plant one) the
    # spare's zeros replaced a file elsewhere, the next push moved that directory's
    # model.safetensors into its staging, and the agent's start unlinked files there.
    make_dir(final.parent, PRIVATE_DIR)
    if not own_real_dir(final.parent):
        raise OSError(errno.EPERM, f"{final.parent} is not a directory of this user")
    tmp = final.with_name(".spare.tmp")
    # Exclusive, 0600, never through a symlink: it becomes a staging copy of the weights. A
    # leftover of a killed agent at that name is unlinked (not followed) first.
    fd = create_private(tmp, replace=True)
    sync = _sync_file_range()
    try:
        os.ftruncate(fd, size)
        reserving = True
        if size:
            with mmap.mmap(fd, size) as mm:
                data = None  # released before the mapping closes, whatever ends the loop (a signal too)
                try:
                    data = torch.frombuffer(mm, dtype=torch.uint8)
                    for off in range(0, size, SPARE_CHUNK):
                        if stop is not None and stop():
                            raise SpareStopped("a push arrived")
                        n = min(SPARE_CHUNK, size - off)
                        if reserving:
                            # Each chunk's blocks reserved before its pages are written through the
                            # mapping: on a full disk the first store into an unbacked page is
                            # SIGBUS, which killed the rank and left the whole .spare.tmp behind;
                            # here it is one HwtuiError ("no space left ..."). Chunk by chunk, not
                            # all at once: on tmpfs a 1 GiB reservation took 0.9 s no stop could cut.
                            reserving = reserve_range(fd, off, n, f"the spare staging file {tmp}", room_for=size - off)
                        data[off:off + n].zero_()
                        if sync is not None:
                            # Dirty pages of a mapping reach the file's page cache: start this
                            # chunk's write-out, wait for the previous one's (bounded queue).
                            sync(fd, off, n, _SYNC_RANGE_FLAGS)
                            if off:
                                sync(fd, off - SPARE_CHUNK, SPARE_CHUNK, _SYNC_RANGE_WAIT)
                finally:
                    del data
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, final)  # inside: a failed rename (a directory planted there) leaves no tmp
    except BaseException:
        if fd >= 0:
            os.close(fd)
        _discard(tmp)
        raise
    return size


def _discard(tmp: Path) -> None:
    """Remove a half-made spare without making the push that stopped it wait: unlinking a file
    whose pages are still being written back waits for them (0.02-0.12 s measured here), so it is
    renamed to a name of its own at once and unlinked on a thread. A rank killed before that
    thread is done leaves the renamed file; the agent removes it at its next start."""
    away = tmp.with_name(f"{DISCARD_PREFIX}{os.getpid()}.{threading.get_ident()}")
    try:
        os.replace(tmp, away)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return

    def unlink() -> None:
        with contextlib.suppress(OSError):
            os.unlink(away)

    threading.Thread(target=unlink, name="spare-discard", daemon=True).start()


# sync_file_range(2) flags: SYNC_FILE_RANGE_WRITE only (start writeback; the fsync waits for it).
_SYNC_RANGE_FLAGS = 2
# WAIT_BEFORE | WRITE | WAIT_AFTER: the range written back and waited for.
_SYNC_RANGE_WAIT = 1 | 2 | 4
_WRITEBACK_JOIN_S = 60.0  # bounded: a device this slow makes the prepare slow, never hangs it


def _sync_file_range() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None  # not Linux: flush() does all the work at prepare, as before
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


class Writeback:
    """Writes finished byte ranges of a file back to disk on a thread, while the rest still arrives.

    Only a head start: it never replaces the fsync (``Staging.flush``) that makes the copy durable
    before the vote. A failure here is kept and the work stops; the fsync then does it all and
    reports any real I/O error itself.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self._sync = _sync_file_range()
        self._ranges: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self.error: str | None = None
        self.bytes = 0
        self._fd = open_private(path, os.O_RDONLY) if self._sync is not None else -1
        self._thread = threading.Thread(target=self._run, name="staging-writeback", daemon=True)
        if self._sync is not None:
            self._thread.start()

    def add(self, offset: int, nbytes: int) -> None:
        if nbytes > 0 and self._thread.is_alive():
            self._ranges.put((offset, nbytes))

    def _run(self) -> None:
        try:
            while (item := self._ranges.get()) is not None:
                if self.error is None and self._sync(self._fd, item[0], item[1], _SYNC_RANGE_FLAGS) != 0:
                    self.error = os.strerror(ctypes.get_errno())
                self.bytes += item[1]
        finally:
            os.close(self._fd)

    def finish(self, wait: bool = True) -> None:
        """Stop after what is queued (``wait``: and wait for it, bounded)."""
        if not self._thread.is_alive():
            return
        self._ranges.put(None)
        if wait:
            self._thread.join(_WRITEBACK_JOIN_S)


class SpareStaging(Staging):
    """``Staging`` that takes the spare file when there is one (host memory, file-backed only), and
    writes finished buckets back to disk while the transfer runs (``written``)."""

    writeback: Writeback | None = None
    write_behind = False  # Writeback below starts the write-out, by verified bucket

    def __init__(self, tensors: list[dict[str, Any]], metadata: dict[str, str], device: str = "cpu",
                 file: str | os.PathLike[str] | None = None, first: list[str] | None = None,
                 header: bytes | None = None):
        self._init(tensors, metadata, device, file, first, header)
        if self._mm is not None and self.file is not None:
            self.writeback = Writeback(self.file)

    def written(self, ranges: list[tuple[int, int]]) -> None:
        """These (data offset, nbytes) ranges hold their final, verified bytes: write them back now."""
        if self.writeback is not None:
            hlen = len(self.header)
            for off, n in ranges:
                self.writeback.add(hlen + off, n)

    def flush(self, should_stop: Callable[[], bool] | None = None) -> None:
        if self.writeback is not None:
            self.writeback.finish(wait=True)
        super().flush(should_stop)  # the fsync that makes it durable: only what is left to write

    def close(self) -> None:
        if self.writeback is not None:
            self.writeback.finish(wait=False)
        super().close()

    def _init(self, tensors: list[dict[str, Any]], metadata: dict[str, str], device: str,
              file: str | os.PathLike[str] | None, first: list[str] | None, header: bytes | None) -> None:
        spare = spare_path(Path(file).parent.parent.parent) if file is not None else None
        reuse = (device == "cpu" and file is not None and spare is not None and own_real_dir(spare.parent)
                 and _own_regular_file(spare))
        if reuse:
            assert file is not None and spare is not None
            Path(file).parent.mkdir(parents=True, exist_ok=True)
            os.replace(spare, file)
        super().__init__(tensors, metadata, device=device, file=file, first=first, header=header, reuse_file=reuse)
        self.used_spare = reuse


def _own_regular_file(path: Path) -> bool:
    """A spare hwtui made: a regular file of this user, not a symlink (never followed)."""
    return owned_entry(path, stat.S_ISREG)

