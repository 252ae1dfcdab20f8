"""Atomic file writes: temporary file in the same directory, fsync, rename, fsync the directory.

A reader (or a crash) sees either the old file or the new one, never half of either.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def _umask() -> int:
    # /proc/self/status avoids the set-and-restore dance of os.umask, which races with threads.
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8",
                perms: int | None = None) -> Iterator[IO]:
    """Open a temporary sibling of ``path``; on a clean exit it replaces ``path`` in one rename.

    ``perms`` defaults to what a plain ``open()`` would give (0o666 minus the umask), not
    mkstemp's 0o600; pass 0o600 for files that hold secrets.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, (0o666 & ~_umask()) if perms is None else perms)
    binary = "b" in mode
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def fsync_path(path: str | os.PathLike[str], *, directory: bool = False) -> None:
    """fsync a file or a directory by its path: what makes a written file, or a rename in a
    directory, durable. The one helper for it (replication's switches, checkpoints, recovery).
    ``directory``: refuse anything else (ENOTDIR), in the same open."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # best effort here: the file itself was fsynced already
        fsync_path(directory)


def atomic_write_text(path: str | os.PathLike[str], text: str, perms: int | None = None) -> None:
    with atomic_open(path, "w", perms=perms) as fh:
        fh.write(text)
