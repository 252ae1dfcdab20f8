"""The host seam: every probe reads /sys, /dev, /proc, /etc and the environment through here.

Three implementations share one interface:

* :class:`FsHost` reads a directory tree: ``/`` on a live machine, or a recorded tree given with
  ``--sysroot``. Runtime facts (a child process importing torch, psutil figures, statvfs) are
  produced live when the root is ``/``; under another root they come from ``.hwtui-facts.json``
  at the top of the tree, so a recorded tree carries the child-process answers it was taken with.
* :class:`RecordingHost` wraps another host and remembers every answer; ``hwtui snapshot`` dumps
  that record (redacted) as JSON.
* :class:`ReplayHost` answers from such a JSON record, so ``--replay host.json`` reproduces a
  colleague's machine for ``--check``, ``list-gpus`` and the TUI.

Paths are always given as absolute machine paths (``/sys/bus/pci/devices``); the host maps them.
"""

from __future__ import annotations

import json
import os
import stat as stat_mod
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from hwtui.core.bounded_read import HOST_FILE_CAP, RECORD_CAP, decode_text, read_bounded, read_capped
from hwtui.core.redact import redact, redact_env
from hwtui.probes.envnames import probe_reads
from hwtui.probes.fact_schema import BadFact, check_facts

# A fact is whatever its producer returns; a recorded one was checked against the producer's shape
# (probes.fact_schema) when the recording was loaded, so replay hands back the same type.
T = TypeVar("T")

SNAPSHOT_SCHEMA = "hwtui.snapshot/1"
FACTS_FILE = ".hwtui-facts.json"


class FactUnavailable(Exception):
    """A runtime fact cannot be produced here (recorded tree without it, replay without it)."""


@dataclass(frozen=True)
class StatInfo:
    mode: int
    uid: int
    gid: int

    @property
    def is_dir(self) -> bool:
        return stat_mod.S_ISDIR(self.mode)


@dataclass(frozen=True)
class UserInfo:
    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "gid": self.gid, "groups": list(self.groups), "name": self.name}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> UserInfo:
        return cls(int(raw["uid"]), int(raw["gid"]), tuple(int(g) for g in raw.get("groups", ())), raw.get("name", ""))


def _live_user() -> dict[str, Any]:
    import getpass

    try:
        name = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        name = str(os.getuid())
    return {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(set(os.getgroups())), "name": name}


def _valid_text(text: str) -> str:
    """``text`` as valid Unicode: invalid UTF-8 in the environment reaches Python as lone surrogates
    (surrogateescape), which no UTF-8 writer (JUnit file, terminal, snapshot) accepts; they become
    U+FFFD here, once, so every report downstream can be written."""
    if text.isascii():
        return text
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that did not come from a byte (JSON "\ud800")
        raw = text.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "replace")


class Host:
    """Interface every probe uses. Subclasses implement the ``_op`` methods."""

    description = "host"

    def __init__(self, env: Mapping[str, str]):
        self.env: dict[str, str] = {_valid_text(k): _valid_text(v) for k, v in env.items()}

    # -- filesystem -------------------------------------------------------------------------
    def read_text(self, path: str) -> str | None:
        """File content, or None when the file is missing, unreadable or not a regular file.

        At most ``HOST_FILE_CAP`` bytes (4 MiB) of a file are read; a longer one is cut there.
        """
        raise NotImplementedError

    def listdir(self, path: str) -> list[str]:
        """Sorted entries of a directory; empty when it does not exist."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def readlink(self, path: str) -> str | None:
        """Target of a symlink as written (``../../../bus/pci/drivers/nvidia``), or None."""
        raise NotImplementedError

    def stat(self, path: str) -> StatInfo | None:
        raise NotImplementedError

    # -- runtime facts ----------------------------------------------------------------------
    def fact(self, key: str, producer: Callable[[], T]) -> T:
        """A JSON-able fact that only a live machine can produce (child process, psutil...)."""
        raise NotImplementedError

    @property
    def is_live(self) -> bool:
        return False

    # -- helpers built on the primitives --------------------------------------------------
    def is_dir(self, path: str) -> bool:
        st = self.stat(path)
        return bool(st and st.is_dir)

    def read_int(self, path: str, base: int = 10) -> int | None:
        text = self.read_text(path)
        if text is None:
            return None
        try:
            return int(text.strip(), base)
        except ValueError:
            return None

    def link_name(self, path: str) -> str | None:
        """Basename of a symlink's target: the bound driver of a PCI device, for example."""
        target = self.readlink(path)
        return os.path.basename(target.rstrip("/")) if target else None

    def user(self) -> UserInfo:
        return UserInfo.from_dict(self.fact("user", _live_user))

    def can_access(self, path: str, want_write: bool = True) -> bool:
        """Whether the probing user may open ``path`` for read (and write), from its mode bits."""
        st = self.stat(path)
        if st is None:
            return False
        user = self.user()
        if user.uid == 0:
            return True
        need = stat_mod.S_IROTH | (stat_mod.S_IWOTH if want_write else 0)
        if st.uid == user.uid:
            bits = (st.mode >> 6) & 0o7
        elif st.gid == user.gid or st.gid in user.groups:
            bits = (st.mode >> 3) & 0o7
        else:
            bits = st.mode & 0o7
        return bits & need == need

    def group_name(self, gid: int) -> str | None:
        for line in (self.read_text("/etc/group") or "").splitlines():
            parts = line.split(":")
            if len(parts) >= 3 and parts[2].strip() == str(gid):
                return parts[0]
        return None

    def group_id(self, name: str) -> int | None:
        for line in (self.read_text("/etc/group") or "").splitlines():
            parts = line.split(":")
            if len(parts) >= 3 and parts[0] == name:
                try:
                    return int(parts[2])
                except ValueError:
                    return None
        return None

    def which(self, name: str) -> str | None:
        """Find an executable on the host's PATH (mapped through the host)."""
        for d in self.env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep):
            if d and self.exists(os.path.join(d, name)):
                return os.path.join(d, name)
        return None


class FsHost(Host):
    """A directory tree: the live machine at ``/`` or a recorded tree."""

    def __init__(self, root: str | os.PathLike[str] = "/", env: Mapping[str, str] | None = None):
        super().__init__(os.environ if env is None else env)
        self.root = Path(root).resolve()
        self.description = "this machine" if self.is_live else f"sysroot {self.root}"
        self._facts: dict[str, Any] | None = None
        self._facts_lock = threading.Lock()

    @property
    def is_live(self) -> bool:
        return str(self.root) == "/"

    def _p(self, path: str) -> str:
        if self.is_live:
            return path
        return os.path.join(str(self.root), path.lstrip("/"))

    def read_text(self, path: str) -> str | None:
        # Bounded and non-blocking: a recorded tree whose proc/cpuinfo links to /dev/zero, or a FIFO
        # in its place, must not fill memory or hang the check.
        try:
            data, _cut = read_bounded(self._p(path), HOST_FILE_CAP)
        except (OSError, ValueError):  # ValueError: a NUL byte in a path taken from the environment
            return None
        return decode_text(data)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._p(path)))
        except (OSError, ValueError):  # ValueError: a NUL byte in a path taken from the environment
            return []

    def exists(self, path: str) -> bool:
        try:
            return os.path.lexists(self._p(path))
        except ValueError:
            return False

    def readlink(self, path: str) -> str | None:
        try:
            return os.readlink(self._p(path))
        except (OSError, ValueError):
            return None

    def stat(self, path: str) -> StatInfo | None:
        try:
            st = os.stat(self._p(path))
        except (OSError, ValueError):
            return None
        return StatInfo(st.st_mode, st.st_uid, st.st_gid)

    def _recorded_facts(self) -> dict[str, Any]:
        with self._facts_lock:
            if self._facts is None:
                try:
                    raw = json.loads(read_capped(self.root / FACTS_FILE, RECORD_CAP))
                except (OSError, ValueError, RecursionError):
                    raw = {}
                self._facts = raw if isinstance(raw, dict) else {}
            return self._facts

    def fact(self, key: str, producer: Callable[[], T]) -> T:
        if self.is_live:
            return producer()
        facts = self._recorded_facts()
        if key not in facts:
            raise FactUnavailable(f"{key} is not recorded in {self.root / FACTS_FILE}")
        return cast(T, facts[key])

    def check_recorded_facts(self) -> None:
        """ValueError naming the first recorded fact whose shape is wrong (make_host calls it once)."""
        try:
            check_facts(self._recorded_facts())
        except BadFact as exc:
            raise ValueError(f"{self.root / FACTS_FILE}: {exc}") from None


class LookupRecordingEnv(dict[str, str]):
    """The environment as a dict that remembers every name looked up by get, [] or ``in``.

    ``dict(env)`` copies take CPython's fast path and are not seen: the names read from such a copy
    are covered by the static allow-list in :mod:`hwtui.probes.envnames`.
    """

    def __init__(self, env: Mapping[str, str]):
        super().__init__(env)
        self.looked_up: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.looked_up.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.looked_up.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.looked_up.add(key)
        return super().__contains__(key)


class RecordingHost(Host):
    """Wraps a host and remembers every answer so the machine can be replayed later."""

    def __init__(self, inner: Host):
        super().__init__(inner.env)
        self.env = LookupRecordingEnv(inner.env)
        self.inner = inner
        self.description = inner.description
        self._lock = threading.Lock()
        self.record: dict[str, dict[str, Any]] = {"files": {}, "dirs": {}, "exists": {}, "links": {}, "stat": {}, "facts": {}}

    @property
    def is_live(self) -> bool:
        return self.inner.is_live

    def _keep(self, table: str, key: str, value: T) -> T:
        with self._lock:
            self.record[table][key] = value
        return value

    def read_text(self, path: str) -> str | None:
        return self._keep("files", path, self.inner.read_text(path))

    def listdir(self, path: str) -> list[str]:
        return self._keep("dirs", path, self.inner.listdir(path))

    def exists(self, path: str) -> bool:
        return self._keep("exists", path, self.inner.exists(path))

    def readlink(self, path: str) -> str | None:
        return self._keep("links", path, self.inner.readlink(path))

    def stat(self, path: str) -> StatInfo | None:
        st = self.inner.stat(path)
        self._keep("stat", path, None if st is None else [st.mode, st.uid, st.gid])
        return st

    def fact(self, key: str, producer: Callable[[], T]) -> T:
        value = self.inner.fact(key, producer)
        return self._keep("facts", key, value)

    def recorded_env(self) -> dict[str, str]:
        """The variables a snapshot keeps: the allow-list plus any name a probe looked up."""
        looked_up = self.env.looked_up if isinstance(self.env, LookupRecordingEnv) else set()
        return {k: v for k, v in self.env.items() if probe_reads(k) or k in looked_up}

    def snapshot(self) -> dict[str, Any]:
        """The JSON document ``hwtui snapshot`` writes: everything read, secrets masked."""
        import platform
        import time

        with self._lock:
            record = json.loads(json.dumps(self.record))
        files = record["files"]
        # File contents can hold secrets too (a command line in /proc, a config file).
        record["files"] = {k: (redact(v) if isinstance(v, str) else v) for k, v in files.items()}
        record["facts"] = redact(record["facts"])
        return {
            "schema": SNAPSHOT_SCHEMA,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "source": {"host": platform.node(), "description": self.description},
            # Only what the probes read: an environment holds secrets under names no rule can guess.
            "env": redact_env(self.recorded_env()),
            **record,
        }


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_stat(v: Any) -> bool:
    # mode, uid, gid as the C stat functions take them: plain ints below 2**32.
    return v is None or (isinstance(v, list) and len(v) == 3
                         and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32 for x in v))


# Snapshot table -> (what each value must be, how the message says it).
_TABLES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "env": (_is_str, "a string"),
    "files": (_is_opt_str, "a string or null"),
    "dirs": (_is_str_list, "a list of strings"),
    "exists": (lambda v: isinstance(v, bool), "true or false"),
    "links": (_is_opt_str, "a string or null"),
    "stat": (_is_stat, "null or [mode, uid, gid] (integers)"),
}


def validate_snapshot(raw: Any) -> dict[str, Any]:
    """The snapshot with every table checked for type, or ValueError naming the first bad field.

    Checked once here so no probe meets a list where it expects a dict (that was an internal
    error, exit 3, instead of a one-line "bad snapshot" with exit 2).
    """
    if not isinstance(raw, dict):
        raise ValueError("is not a JSON object")
    if raw.get("schema") != SNAPSHOT_SCHEMA:
        raise ValueError(f"is not a hwtui snapshot (schema {_short(raw.get('schema'))}, expected {SNAPSHOT_SCHEMA})")
    for table, (ok, what) in _TABLES.items():
        value = raw.get(table, {})
        if not isinstance(value, dict):
            raise ValueError(f"field {table!r} must be an object, not {type(value).__name__}")
        for key, item in value.items():
            if not ok(item):
                raise ValueError(f"field {table}[{_short(key)}] must be {what}, not {_short(item)}")
    for table in ("facts", "source"):
        if not isinstance(raw.get(table, {}), dict):
            raise ValueError(f"field {table!r} must be an object, not {type(raw[table]).__name__}")
    # Recorded facts are read as their producers wrote them: a wrong shape is refused here, once,
    # naming the field, instead of surfacing as an internal error in whichever probe reads it.
    check_facts(raw.get("facts", {}))
    return raw


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _host_label(value: Any) -> str:
    """The recorded host name for a status line: a string, capped, control characters as '?'."""
    if not isinstance(value, str) or not value:
        return "?"
    return "".join(c if c.isprintable() else "?" for c in value[:64])


class ReplayHost(Host):
    """Answers exactly what a recorded machine answered; anything unrecorded is absent."""

    def __init__(self, snapshot: Mapping[str, Any], origin: str = "snapshot"):
        try:
            snap = validate_snapshot(snapshot)
        except ValueError as exc:
            raise ValueError(f"snapshot {origin} {exc}") from None
        super().__init__(snap.get("env", {}))
        self.snap = snap
        self.description = f"replay of {_host_label(snap.get('source', {}).get('host'))} ({origin})"

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ReplayHost:
        """Read a snapshot file: regular files only, at most RECORD_CAP (64 MiB), any nesting depth."""
        try:
            data = read_capped(path, RECORD_CAP)
        except OSError as exc:
            raise ValueError(f"cannot read snapshot {path}: {exc.strerror or exc}") from None
        try:
            raw = json.loads(data)
        except RecursionError:
            raise ValueError(f"snapshot {path} is nested too deeply to be a hwtui snapshot") from None
        except ValueError as exc:  # includes UnicodeDecodeError
            raise ValueError(f"snapshot {path} is not valid JSON: {_short(str(exc), 120)}") from None
        return cls(raw, origin=str(path))

    def read_text(self, path: str) -> str | None:
        return cast("str | None", self.snap.get("files", {}).get(path))

    def listdir(self, path: str) -> list[str]:
        return list(self.snap.get("dirs", {}).get(path, []))

    def exists(self, path: str) -> bool:
        table = self.snap.get("exists", {})
        if path in table:
            return bool(table[path])
        # Anything read successfully in another way existed.
        return (
            self.snap.get("files", {}).get(path) is not None
            or path in self.snap.get("dirs", {})
            or self.snap.get("links", {}).get(path) is not None
            or self.snap.get("stat", {}).get(path) is not None
        )

    def readlink(self, path: str) -> str | None:
        return cast("str | None", self.snap.get("links", {}).get(path))

    def stat(self, path: str) -> StatInfo | None:
        raw = self.snap.get("stat", {}).get(path)
        return None if raw is None else StatInfo(*raw)

    def fact(self, key: str, producer: Callable[[], T]) -> T:
        facts = self.snap.get("facts", {})
        if key not in facts:
            raise FactUnavailable(f"{key} was not recorded in the snapshot")
        return cast(T, facts[key])


def make_host(sysroot: str | None = None, replay: str | None = None, env: Mapping[str, str] | None = None) -> Host:
    """The host the CLI and TUI use, from ``--sysroot`` / ``--replay``."""
    if replay:
        return ReplayHost.load(replay)
    root = sysroot or "/"
    if not os.path.isdir(root):
        raise ValueError(f"--sysroot {root}: not a directory")
    host = FsHost(root, env)
    if not host.is_live:
        host.check_recorded_facts()
    return host
