"""Shared-memory staging directories: private to one rank, unpredictable, swept once their owner is gone.

A rank that stages a copy in ``/dev/shm`` for the ranks on its host (the source of a torch pickle,
or a host leader without ``--out``) does so in its own **run directory**:
``/dev/shm/hwtui-staging-<128 random bits, hex>``, made with an exclusive ``mkdir`` (mode 0700), so no
other user can plant a name inside it, and nobody can guess its name ahead of time. The files in it
are created ``O_EXCL|O_NOFOLLOW``, 0600 (``core.private_file``).

The rank keeps an ``flock`` on the directory for as long as it lives (the kernel drops it when the
process dies, SIGKILL included). That is how a sweep tells a dead run's leftovers from a live
concurrent run's: every run (each rank as it starts, the launcher before and after its ranks, a
rank that fails) removes the ``hwtui-staging-<32 hex digits>`` entries that are directories (never symlinks),
owned by this user, 0700, and whose lock it can take. Anything else there (another user's, a
symlink, a planted file, a live run's) is left alone. The sweep never follows a symlink: it works
through directory file descriptors, and ``unlink`` removes a link, not its target.

Creation races a sweep safely: a directory is locked right after its ``mkdir``; a sweep that got
the lock in between removed it, which the creator sees (its directory has no links left) and makes
another one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
from collections.abc import Mapping

SHM_DIR = "/dev/shm"
SHM_DIR_ENV = "HWTUI_SHM_DIR"  # another shared-memory directory (tests, hosts with tmpfs elsewhere)
RUN_PREFIX = "hwtui-staging-"
# Only names hwtui draws: another program's temporary directory that merely starts alike (the TUI's
# own are "hwtui-run-*" under $TMPDIR, which may be /dev/shm) is never swept.
_RUN_NAME = re.compile(r"hwtui-staging-[0-9a-f]{32}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_MAKE_TRIES = 16


def shm_dir(env: Mapping[str, str] | None = None) -> str:
    return (env if env is not None else os.environ).get(SHM_DIR_ENV) or SHM_DIR


def _private_dir(st: os.stat_result) -> bool:
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0


class RunDir:
    """One rank's private staging directory, locked while it is open (see the module docstring)."""

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd: int | None = fd

    def file(self, name: str) -> str:
        """Where a staging file of this directory goes (created by its user with ``create_private``)."""
        return os.path.join(self.path, name)

    def remove(self) -> None:
        """Remove every file in it and the directory itself, then drop the lock (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            with contextlib.suppress(OSError):
                _empty_and_remove(fd, self.path)
        finally:
            os.close(fd)


def make_run_dir(base: str | None = None) -> RunDir:
    """Sweep dead runs' directories, then make this rank's own (exclusive, 0700, locked)."""
    base = base or shm_dir()
    sweep_dead_run_dirs(base)
    for _ in range(_MAKE_TRIES):
        path = os.path.join(base, RUN_PREFIX + secrets.token_hex(16))
        try:
            os.mkdir(path, 0o700)  # exclusive: a name someone planted (anything at all) is EEXIST
        except FileExistsError:
            continue
        try:
            fd = os.open(path, _DIR_FLAGS)
        except FileNotFoundError:
            continue  # a sweep removed it before we could lock it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a sweep holding it only long enough to remove it
            st = os.fstat(fd)
            if st.st_nlink == 0:
                os.close(fd)
                continue  # that sweep removed it: make another
            if not _private_dir(st):
                os.fchmod(fd, 0o700)  # mkdir's mode went through the umask; state it
        except OSError:
            os.close(fd)
            raise
        return RunDir(path, fd)
    raise FileExistsError(f"could not make a private staging directory under {base}")


def sweep_dead_run_dirs(base: str | None = None) -> list[str]:
    """Remove the run directories of this user whose owner is gone (their lock is free); return their paths."""
    base = base or shm_dir()
    try:
        dfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return []
    removed: list[str] = []
    try:
        for name in os.listdir(dfd):
            if not _RUN_NAME.fullmatch(name):
                continue
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)  # a symlink fails here (ELOOP/ENOTDIR)
            except OSError:
                continue
            try:
                if _sweep_one(dfd, name, fd):
                    removed.append(os.path.join(base, name))
            except OSError:
                pass  # gone meanwhile, or not removable: left for the next sweep
            finally:
                os.close(fd)
    finally:
        os.close(dfd)
    return removed


def _sweep_one(dfd: int, name: str, fd: int) -> bool:
    st = os.fstat(fd)
    if not _private_dir(st):
        return False  # another user's, or not one hwtui made: never touched
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its owner is alive
    if os.fstat(fd).st_nlink == 0:
        return False  # another sweep removed it while we waited
    now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        return False
    _empty_and_remove(fd, name, dfd)
    return True


def _empty_and_remove(fd: int, path: str, dfd: int | None = None) -> None:
    """Unlink every entry of the directory ``fd`` (no recursion: hwtui puts only files there), then
    rmdir it; OSError when it cannot (a subdirectory someone put there keeps it, for its owner)."""
    for entry in os.listdir(fd):
        with contextlib.suppress(OSError):
            os.unlink(entry, dir_fd=fd)  # unlink never follows a link
    os.rmdir(path, dir_fd=dfd)
