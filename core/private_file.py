"""Files only their owner can reach, never opened through a symlink.

hwtui runs as root and writes whole models; a path it writes to may sit where another local user
can plant things (``/dev/shm``, a staging directory under a shared ``--out``). So a file hwtui
makes is created with ``O_CREAT|O_EXCL|O_NOFOLLOW``: a planted symlink or file at that name makes
the call fail instead of being followed or written, and the new inode is this process's own,
mode 0600 whatever the umask. A file hwtui made earlier is reopened with ``O_NOFOLLOW`` and must
still be a regular file owned by this user.
"""

from __future__ import annotations

import contextlib
import os
import stat

PRIVATE_MODE = 0o600
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def create_private(path: str | os.PathLike[str], *, replace: bool = False) -> int:
    """A new, empty file at ``path`` (0600, owned by this user), open read-write; returns its fd.

    ``replace``: an entry already at ``path`` is unlinked first (unlink never follows a symlink:
    a planted link goes, its target is untouched), then the name is created exclusively. Only for
    names in a directory that only this user can write (a stale leftover of an earlier run);
    elsewhere an existing name is an error (FileExistsError).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(path, flags, PRIVATE_MODE)
    except FileExistsError:
        if not replace:
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, flags, PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)  # the umask can only have taken bits away; this states the mode
    except OSError:
        os.close(fd)
        raise
    return fd


def open_private(path: str | os.PathLike[str], flags: int = os.O_RDWR) -> int:
    """Reopen a file hwtui made (never through a symlink); it must be a regular file of this user.

    Opened read-write, it is (re)set to 0600: a file that outlived a run under an older hwtui
    (0644) is owner-only from here on.
    """
    fd = os.open(path, flags | os.O_NOFOLLOW | _CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(f"{os.fspath(path)} is not a regular file of this user")
        if flags & (os.O_RDWR | os.O_WRONLY) and stat.S_IMODE(st.st_mode) != PRIVATE_MODE:
            os.fchmod(fd, PRIVATE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd
