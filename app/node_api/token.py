"""The agent's bearer token: generated once, stored 0600, compared in constant time."""

from __future__ import annotations

import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path

from hwtui.core.errors import HwtuiError

ENV_TOKEN = "HWTUI_AGENT_TOKEN"
MAX_TOKEN_FILE = 4096


def default_token_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "hwtui" / "agent.token"


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in ``path``; refuses a file that is not a secret of this user's.

    Refused, each in one line: not a regular file (checked on the opened descriptor, which the
    non-blocking, no-follow open makes safe for a FIFO, a device or a directory); readable by
    group or others; owned by anyone but the running user or root (its owner could read it, or
    swap in a token of their choosing).
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise HwtuiError(f"token file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HwtuiError(f"token file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise HwtuiError(f"token file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                             f"chmod 600 {path}")
        if st.st_uid not in (os.geteuid(), 0):
            raise HwtuiError(f"token file {path} is owned by uid {st.st_uid}, not by this user "
                             f"(uid {os.geteuid()}) or root; chown it or use another file")
        raw = os.read(fd, MAX_TOKEN_FILE + 1)
    except OSError as exc:
        raise HwtuiError(f"token file {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    token = raw.decode("utf-8", errors="replace").strip()
    if (not token or len(raw) > MAX_TOKEN_FILE or any(c.isspace() for c in token)
            or not (token.isascii() and token.isprintable())):
        raise HwtuiError(f"token file {path} does not hold one token (a single line without spaces)")
    return token


def load_or_create(path: str | os.PathLike[str]) -> tuple[str, bool]:
    """(token, created): read ``path`` or write a fresh random token there with mode 0600.

    Race-free: the new file is written aside and *linked* into place, which fails if another agent
    (a second one started at the same moment) made it first; then both read the one that won.
    """
    path = Path(path)
    try:
        return read_token_file(path), False
    except FileNotFoundError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, (secrets.token_urlsafe(32) + "\n").encode())
            os.fsync(fd)
            os.close(fd)
            try:
                os.link(tmp, path)
                created = True
            except FileExistsError:
                created = False
        finally:
            os.unlink(tmp)
    except OSError as exc:
        raise HwtuiError(f"cannot write the token file {path}: {exc.strerror or exc}") from None
    return read_token_file(path), created


def client_token(token_file: str | None, env: dict[str, str] | None = None) -> str | None:
    """The token a client sends: $HWTUI_AGENT_TOKEN, else --token-file, else the default file if any."""
    env = dict(os.environ) if env is None else env
    if env.get(ENV_TOKEN):
        return env[ENV_TOKEN].strip()
    if token_file:
        try:
            return read_token_file(token_file)
        except FileNotFoundError:
            raise HwtuiError(f"--token-file {token_file}: no such file") from None
    try:
        return read_token_file(default_token_file())
    except FileNotFoundError:
        return None


def matches(expected: str, header: str | None) -> bool:
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), expected.encode())
