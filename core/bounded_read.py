"""Reading a file that someone else named, without trusting it.

Two rules, for every file hwtui reads from a user-given place (``--sysroot``, ``--replay``, a
cache, /proc and /sys): refuse anything that is not a regular file *before* opening it (a FIFO
would block, ``/dev/zero`` never ends, opening some devices has side effects), and never read
more than a stated cap. The open itself is ``O_NONBLOCK`` and the kind is checked again on the
open descriptor, so a regular file swapped for a FIFO between the two checks cannot block either.

Caps used across hwtui (documented in docs/trust.md):

* ``HOST_FILE_CAP``: one file a probe reads through the host seam (/proc, /sys, /etc, pci.ids).
* ``RECORD_CAP``: a whole snapshot for ``--replay``, or a recorded tree's facts file.
* ``SMALL_FILE_CAP``: small configuration files (torch's version.py, the torch-facts cache).
"""

from __future__ import annotations

import errno
import os
import stat

MIB = 1024 * 1024
HOST_FILE_CAP = 4 * MIB
RECORD_CAP = 64 * MIB
SMALL_FILE_CAP = 1 * MIB
_CHUNK = 1 * MIB


class NotRegularFile(OSError):
    """The path names a FIFO, socket, device or directory."""


class FileTooLarge(OSError):
    """The file holds more than the cap allows."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: str | os.PathLike[str], mode: int) -> NotRegularFile:
    return NotRegularFile(errno.EINVAL, f"{_kind(mode)}, not a regular file", os.fspath(path))


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """Open a regular file for reading -> (fd, its fstat); the caller closes the fd.

    The one place hwtui opens a file someone else named (weights, plans, snapshots, cluster
    specs, /proc and /sys): the name is checked without opening it, the open is ``O_NONBLOCK``
    (a FIFO would otherwise wait for a writer) and the *opened* descriptor is checked again, so a
    file swapped for a FIFO or a device in between is still refused. The fd is left blocking, as a
    regular file's reads expect. Raises NotRegularFile or another OSError (ValueError: a NUL byte).
    """
    mode = os.stat(path).st_mode  # follows symlinks, opens nothing
    if not stat.S_ISREG(mode):
        raise _refuse(path, mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bounded(path: str | os.PathLike[str], cap: int) -> tuple[bytes, bool]:
    """(at most ``cap`` bytes of the file, whether there was more). Raises OSError (incl. NotRegularFile)."""
    fd, _ = open_regular(path)
    try:
        chunks: list[bytes] = []
        total = 0
        while total <= cap:
            block = os.read(fd, min(_CHUNK, cap + 1 - total))
            if not block:
                break
            chunks.append(block)
            total += len(block)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return data[:cap], len(data) > cap


def decode_text(data: bytes) -> str:
    """Bytes as text the way ``open(path, encoding="utf-8", errors="replace")`` reads them,
    universal newlines included, so switching a reader to bounded reads changes nothing else."""
    text = data.decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def read_capped(path: str | os.PathLike[str], cap: int) -> bytes:
    """The whole file, or FileTooLarge when it holds more than ``cap`` bytes."""
    data, more = read_bounded(path, cap)
    if more:
        raise FileTooLarge(errno.EFBIG, f"larger than {cap // MIB} MiB", os.fspath(path))
    return data
