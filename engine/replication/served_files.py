"""Files of a served version: who may read them (``--serve-group``) and how they are written.

Everything the commit writes goes through here: created exclusively and never through a
symlink, given its mode and group through a descriptor (so the umask never decides, and a
published file never had another mode), made durable with its directory. ``refuse_frozen``
reads the inode flags that would make a later rename fail, so the commit can find them before
its vote instead of after its decision.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hwtui.core.atomic import fsync_path
from hwtui.core.errors import HwtuiError
from hwtui.core.private_file import PRIVATE_MODE, create_private

PRIVATE_FILE, PRIVATE_DIR = PRIVATE_MODE, 0o700


@dataclass(frozen=True)
class ServeModes:
    """Who may read what a rank serves: the owner only, or also one serving group (``--serve-group``)."""

    gid: int | None = None

    @property
    def file_mode(self) -> int:
        return PRIVATE_FILE if self.gid is None else 0o640

    @property
    def dir_mode(self) -> int:
        return PRIVATE_DIR if self.gid is None else 0o750


def serve_modes(group: str | None) -> ServeModes:
    """``--serve-group NAME`` (or a numeric gid) -> :class:`ServeModes`, checked on this host.

    Resolved where the files are written (each rank resolves the name itself: gids differ
    between hosts, names are what an operator configures). A group this process cannot give
    files to (not root and not a member) is refused here rather than by a chown mid-prepare.
    """
    if group is None:
        return ServeModes()
    if not group or len(group) > 64 or not group.isprintable():
        raise HwtuiError(f"--serve-group {group[:64]!r} is not a group name")
    try:
        gid = grp.getgrgid(int(group)).gr_gid if group.isdigit() else grp.getgrnam(group).gr_gid
    except (KeyError, OverflowError, ValueError):
        raise HwtuiError(f"--serve-group {group!r}: no such group on this host") from None
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise HwtuiError(f"--serve-group {group!r}: this user is not a member, so it cannot give files to that group")
    return ServeModes(gid)


def own(path: Path, mode: int, gid: int | None = None, directory: bool = False, follow: bool = False) -> None:
    """Give ``path`` its mode (and group) through a descriptor opened without following a symlink.

    ``follow``: only for a rank directory itself, which the node agent links (``ranks/rank<R>``
    -> ``../served``); nothing below it is ever reached through a symlink.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0) | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def owned_entry(path: Path, is_kind: Callable[[int], bool]) -> bool:
    """``path`` is an entry of this user of that kind (``stat.S_ISDIR``, ``stat.S_ISREG``), by lstat:
    a symlink to one is not."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return is_kind(st.st_mode) and st.st_uid == os.geteuid()


def own_real_dir(path: Path) -> bool:
    """``path`` is a real directory of this user, not a symlink to one."""
    return owned_entry(path, stat.S_ISDIR)


def make_dir(path: Path, mode: int, gid: int | None = None, follow: bool = False) -> None:
    """``path`` as a directory (created if missing; its parent must exist) with exactly this mode and group."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, PRIVATE_DIR)  # owner-only until own() below: the umask never widens it
    own(path, mode, gid, directory=True, follow=follow)


_FS_IOC_GETFLAGS = 0x80086601  # _IOR('f', 1, long) on 64-bit Linux
_IMMUTABLE_FL, _APPEND_FL = 0x10, 0x20


def refuse_frozen(paths: list[Path]) -> None:
    """Raise the error a rename would meet later if any of ``paths`` is immutable or append-only.

    The probe rename proves ``versions/`` and the staging directory accept the switch, but a flag
    on the moved directory itself or on CURRENT only shows when that very rename runs: read it.
    """
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                continue  # a symlink has no flags; the rename replaces the link itself
            raise
        try:
            flags = struct.unpack_from("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 8))[0]  # the kernel writes an int
        except OSError:
            continue  # a filesystem without inode flags has none in the way
        finally:
            os.close(fd)
        if flags & (_IMMUTABLE_FL | _APPEND_FL):
            what = "immutable" if flags & _IMMUTABLE_FL else "append-only"
            raise OSError(errno.EPERM, f"{path} is {what} (chattr); the switch cannot rename it")


def write_new_file(path: Path, data: bytes, mode: int, gid: int | None = None) -> None:
    """Create ``path`` exclusively (never through a symlink), give it its mode, write and fsync it."""
    fd = create_private(path)  # the one exclusive, no-symlink create (core/private_file.py)
    try:
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)


def fsync_dir(path: Path) -> None:
    """A directory's entries made durable (a rename into it, a new file in it)."""
    fsync_path(path, directory=True)
