"""The served version on a receiver, and its two-phase commit.

Directory of one rank (``--out DIR`` -> ``DIR/rank<R>/``)::

    CURRENT                      {"version", "plan_digest", "file", "manifest"}: what this rank serves
    versions/<v>/model.safetensors, versions/<v>/manifest.json
    staging/<v>/...              the next version while it is being received (never served; 0700)
    .CURRENT.<v>.pending         the CURRENT that serves <v>, written before the vote (the switch renames it)

Beside the rank directories::

    decisions/<v>.json           the coordinator's durable decision: version <v> (plan digest) commits
    .lock.rank<R>                flock held by the run that owns rank R's directory (it holds its pid)

Phase 1 (prepare): every receiver has verified every bucket and every tensor of its staging copy,
made it durable (fsync), written its manifest, given the copy its final modes, proved it can
switch (the same cross-directory rename into ``versions/`` the switch makes, on a probe directory;
no immutable or append-only flag in the way) and written the new CURRENT beside the old one
(``.CURRENT.<v>.pending``, fsynced); it votes yes. Every write the switch needs has happened:
what is left after the vote is two renames, so a full disk can only make a rank vote no.
Phase 2: only if *every* rank voted yes (an all-reduce MIN over the process group) does the
coordinator (rank 0) write ``decisions/<v>.json`` atomically and durably, and only after that
record exists does any rank switch: move staging/<v> to versions/<v> and atomically replace
CURRENT. Any failure, timeout or signal before the decision removes staging/<v> and leaves
CURRENT -- the served version -- exactly as it was on every rank.

After the decision a rank can still fail to switch (SIGKILL, a disk made immutable or read-only
between the vote and the rename, an I/O error). Its prepared, verified staging copy and its
pending CURRENT are then kept, and re-running the same command finishes the switch
(:meth:`ServedDir.finish`) without moving a byte: the decision record says the version is
committed, so rolling forward is the only correct outcome. Re-running a version every rank
already serves is a no-op success.

Modes: everything here is owner-only (files 0600, directories 0700) unless the run names a
serving group (:class:`ServeModes`): then what a server reads -- the rank directory, ``versions/``,
``versions/<v>/`` and its files, CURRENT -- is group-owned, files 0640 and directories 0750.
Modes are given to the staging copy before the rename that publishes it, never after: a
published file never has any other mode. The decision record, the lock files and ``staging/``
stay owner-only whatever the group.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwtui.core.atomic import atomic_write_text
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.checksum import tensor_hex
from hwtui.engine.replication.plan import write_json_atomic
from hwtui.engine.replication.served_files import (
    PRIVATE_DIR,
    PRIVATE_FILE,
    ServeModes,
    fsync_dir,
    make_dir,
    own,
    refuse_frozen,
    write_new_file,
)
from hwtui.engine.replication.weights import MappedFile, read_safetensors_header

DECISION_SCHEMA = "hwtui.replication-decision/1"
def decision_path(out: str | os.PathLike[str], version: str) -> Path:
    return Path(out) / "decisions" / f"{version}.json"


def write_decision(out: str | os.PathLike[str], version: str, plan_digest: str, ranks: list[int]) -> None:
    """The commit point: once this file exists (fsynced, with its directory), version commits everywhere."""
    Path(out).mkdir(parents=True, exist_ok=True)  # an agent's ranks/ may not exist yet on a restart
    make_dir(decision_path(out, version).parent, PRIVATE_DIR)
    atomic_write_text(decision_path(out, version), perms=PRIVATE_FILE, text=json.dumps({
        "schema": DECISION_SCHEMA, "version": version, "plan_digest": plan_digest, "decision": "commit",
        "ranks": ranks, "time": time.time()}) + "\n")


def read_decision(out: str | os.PathLike[str], version: str) -> dict[str, Any] | None:
    path = decision_path(out, version)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise HwtuiError(f"{path} is unreadable: {exc}") from None
    if not isinstance(raw, dict) or raw.get("schema") != DECISION_SCHEMA or raw.get("decision") != "commit":
        raise HwtuiError(f"{path} is not a replication decision record")
    return raw


class LockHeld(Exception):
    """Another process holds the lock; ``holder`` is the pid it wrote ("unknown" if none)."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def flock_with_pid(path: Path) -> int:
    """An exclusive flock on ``path`` (created owner-only, never through a symlink) holding our pid,
    as its descriptor; LockHeld when another process has it, OSError when it cannot be opened.
    The kernel drops a flock when its holder dies: a crashed holder never leaves a stale lock."""
    # O_NONBLOCK: a FIFO planted at the name must not hold the open (it is refused below).
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, PRIVATE_FILE)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise LockHeld(os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown") from None
        with contextlib.suppress(OSError):
            os.fchmod(fd, PRIVATE_FILE)  # a lock file left by an older hwtui is 0644
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)  # never a descriptor (or a flock) left behind by a refusal
        raise
    return fd


class OutLock:
    """An exclusive flock per rank directory, so two runs never write one ``--out`` at once.

    The lock file holds the owner's pid, so the loser can say who holds it. The kernel drops a
    flock when its holder dies, so a crashed run never leaves a stale lock behind.
    """

    def __init__(self, out: str | os.PathLike[str], ranks: list[int], modes: ServeModes | None = None):
        self.out = Path(out)
        self.ranks = ranks
        self.modes = modes or ServeModes()
        self._fds: list[int] = []

    def acquire(self) -> OutLock:
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            if not self.out.exists():
                # Created here: owner-only, or passable by the serving group (an existing --out keeps its mode).
                make_dir(self.out, self.modes.dir_mode, self.modes.gid)
        except OSError as exc:
            raise HwtuiError(f"--out {self.out} cannot be created: {exc.strerror or exc}") from None
        if not self.out.is_dir():
            raise HwtuiError(f"--out {self.out} is not a directory")
        for r in self.ranks:
            try:
                self._fds.append(flock_with_pid(self.out / f".lock.rank{r}"))
            except LockHeld as held:
                self.release()
                raise HwtuiError(f"--out {self.out} is in use by pid {held.holder} (another replication owns rank {r}); "
                                 "wait for it or choose another --out") from None
            except OSError as exc:
                self.release()
                raise HwtuiError(f"--out {self.out} is not writable: {exc.strerror or exc}") from None
        return self

    def release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the last descriptor drops the flock
        self._fds.clear()

    def __enter__(self) -> OutLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class ServedDir:
    """One rank's served versions. ``hook`` is the test-only fault injector's ``at_phase`` (faults.py)."""

    def __init__(self, out: str | os.PathLike[str], rank: int, modes: ServeModes | None = None,
                 hook: Callable[[str], None] | None = None):
        self.root = Path(out) / f"rank{rank}"
        self.modes = modes or ServeModes()
        self._hook = hook or (lambda phase: None)

    def current(self) -> dict[str, Any] | None:
        try:
            raw = json.loads((self.root / "CURRENT").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise HwtuiError(f"{self.root / 'CURRENT'} is unreadable: {exc}") from None
        return raw if isinstance(raw, dict) else None

    def current_version(self) -> str | None:
        cur = self.current()
        return cur.get("version") if cur else None

    def staging_dir(self, version: str) -> Path:
        return self.root / "staging" / version

    def staging_file(self, version: str) -> Path:
        return self.staging_dir(version) / "model.safetensors"

    def pending_current(self, version: str) -> Path:
        return self.root / f".CURRENT.{version}.pending"

    def _probes(self, version: str) -> tuple[Path, Path]:
        # Never named <v>: a probe left by a kill must not pass for a moved version.
        return self.root / "staging" / f".probe-{version}", self.root / "versions" / f".probe-{version}"

    def ensure_root(self) -> None:
        """The rank directory, created if missing, with the run's directory mode and group."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        make_dir(self.root, self.modes.dir_mode, self.modes.gid, follow=True)

    def begin(self, version: str) -> None:
        if (self.root / "versions" / version).exists():
            raise HwtuiError(f"{self.root} already holds version {version!r}; plan a new version")
        self.ensure_root()
        make_dir(self.root / "staging", PRIVATE_DIR)  # never served: owner-only whatever the group
        self._sweep(version)
        os.mkdir(self.staging_dir(version), PRIVATE_DIR)
        own(self.staging_dir(version), PRIVATE_DIR, directory=True)  # until prepare gives it its final mode

    def _sweep(self, version: str) -> None:
        """Leftovers of an aborted run of ``version`` (never a decided one: that is finished, not begun)."""
        for path in (self.staging_dir(version), *self._probes(version)):
            _remove(path)
        for leftover in (self.pending_current(version), self.pending_current(version).with_suffix(".tmp")):
            with contextlib.suppress(OSError):  # what cannot go makes prepare fail, before the vote
                leftover.unlink()

    def prepare(self, version: str, manifest: dict[str, Any]) -> None:
        """Last step before a yes vote: every write the switch needs, so that only renames are left.

        Anything that would make the switch fail -- a file where ``versions/`` or ``versions/<v>``
        should be, a ``versions/`` that is immutable, read-only or another mount, no space for the
        manifest or the new CURRENT -- fails here: the rank votes no and every rank aborts.
        """
        versions = self.root / "versions"
        make_dir(self.root, self.modes.dir_mode, self.modes.gid, follow=True)
        make_dir(versions, self.modes.dir_mode, self.modes.gid)
        if (versions / version).exists() or (versions / version).is_symlink():
            raise HwtuiError(f"{versions / version} is in the way of the switch")
        staged = self.staging_dir(version)
        # write_json_atomic streams a plan's manifest from its tables: at 1M tensors, building the
        # list of dicts first cost every rank seconds and half a GB.
        write_json_atomic(staged / "manifest.json", manifest)
        self._seal(version)
        refuse_frozen([self.root.resolve(), versions, self.root / "staging", staged, staged / "model.safetensors",
                       staged / "manifest.json", self.root / "CURRENT"])
        self._probe_switch(version)
        self._hook("current")
        self._write_pending_current(version, self._current_text(version, manifest["plan_digest"]))

    def _seal(self, version: str) -> None:
        """The staging copy's final modes and group, given before the rename that publishes it."""
        staged = self.staging_dir(version)
        for name in ("model.safetensors", "manifest.json"):
            own(staged / name, self.modes.file_mode, self.modes.gid)
        own(staged, self.modes.dir_mode, self.modes.gid, directory=True)

    def _probe_switch(self, version: str) -> None:
        """The switch's own rename, staging/ -> versions/, made once on an empty probe directory.

        A ``versions/`` that is immutable, append-only, read-only (a ro bind mount, a remounted
        tmpfs), on another mount (EXDEV), not writable, or whose directory cannot grow fails here.
        """
        src, dst = self._probes(version)
        os.mkdir(src, PRIVATE_DIR)  # exclusive: _sweep removed any leftover
        try:
            os.rename(src, dst)
            os.rmdir(dst)
        finally:
            for leftover in (src, dst):
                with contextlib.suppress(OSError):
                    os.rmdir(leftover)

    @staticmethod
    def _current_text(version: str, plan_digest: str) -> str:
        return json.dumps({"version": version, "plan_digest": plan_digest,
                           "file": f"versions/{version}/model.safetensors",
                           "manifest": f"versions/{version}/manifest.json"}) + "\n"

    def _write_pending_current(self, version: str, text: str) -> None:
        """The new CURRENT, complete and durable beside the old one; written then renamed into place.

        The rename proves the rank directory takes renames (an append-only one creates files but
        refuses them); the switch then replaces CURRENT with this file by one more rename.
        """
        pending = self.pending_current(version)
        tmp = pending.with_suffix(".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        write_new_file(tmp, text.encode(), self.modes.file_mode, self.modes.gid)
        os.replace(tmp, pending)
        fsync_dir(self.root)

    def prepared(self, version: str) -> bool:
        staged = self.staging_dir(version)
        return (staged / "manifest.json").is_file() and (staged / "model.safetensors").is_file()

    def commit(self, version: str, plan_digest: str) -> None:
        """The switch, after the decision: renames only (everything was written before the vote)."""
        target = self.root / "versions" / version
        if not target.is_dir():  # a re-run after a kill between the two renames finds it moved already
            os.replace(self.staging_dir(version), target)
            fsync_dir(target.parent)
        with contextlib.suppress(OSError):
            (self.root / "staging").rmdir()  # only when empty: other versions' leftovers stay visible
        self._hook("switched")  # between the two renames: versions/<v> is there, CURRENT not yet
        pending = self.pending_current(version)
        if pending.is_symlink() or not pending.is_file():
            # Prepared by an older hwtui (or something else stands there): write it now; a re-run may repeat it.
            self._write_pending_current(version, self._current_text(version, plan_digest))
        os.replace(pending, self.root / "CURRENT")
        fsync_dir(self.root)

    def finish(self, version: str, plan_digest: str, tensors: list[dict[str, Any]]) -> str:
        """Roll a decided commit forward on this rank; returns what was done, in words.

        Called only when the decision record says ``version`` commits. The staging copy was
        verified and fsynced before the vote; it is hashed again here (tensor by tensor, against
        the plan) because it has sat on disk since, and serving a corrupted copy is worse than failing.
        """
        if self.current_version() == version:
            return "already serves it"
        target = self.root / "versions" / version
        if not target.is_dir():
            if not self.prepared(version):
                raise HwtuiError(f"{self.root} holds no prepared copy of {version!r}; it cannot finish the commit "
                                 "(replicate it again under a new version)")
            bad = verify_file(self.staging_file(version), tensors)
            if bad:
                raise HwtuiError(f"{self.staging_file(version)} no longer matches the plan (first: {bad[0]!r}); "
                                 "replicate it again under a new version")
        self.publish_verified(version, plan_digest)
        return "finished the switch"

    def publish_verified(self, version: str, plan_digest: str) -> None:
        """Switch to a decided ``version`` whose staged copy the caller has just verified (or that
        was moved into ``versions/`` already): the writes ``prepare`` would have made, then the
        renames. Shared by a re-run of ``replicate`` and a restarted agent (engine/resident/recovery.py)."""
        if not (self.root / "versions" / version).is_dir():
            make_dir(self.root / "versions", self.modes.dir_mode, self.modes.gid)
            self._seal(version)  # still unpublished: this run's modes, before its rename
            self._write_pending_current(version, self._current_text(version, plan_digest))
        self.commit(version, plan_digest)

    def abort(self, version: str) -> None:
        _remove(self.staging_dir(version))
        with contextlib.suppress(FileNotFoundError):
            self.pending_current(version).unlink()
        with contextlib.suppress(OSError):
            (self.root / "staging").rmdir()

    def open_current(self) -> tuple[MappedFile, dict[str, tuple[int, int]]]:
        """The served file, mapped, with {name: (absolute offset, nbytes)} (delta plans copy from it)."""
        cur = self.current()
        if not cur:
            raise HwtuiError(f"{self.root} serves no version yet")
        path = self.root / cur["file"]
        infos, _, _ = read_safetensors_header(path)
        return MappedFile(path), {i.name: (i.file_offset, i.nbytes) for i in infos}


def _remove(path: Path) -> None:
    """Best effort: a symlink (never followed) or a file is unlinked, a directory removed with its contents."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        with contextlib.suppress(OSError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def verify_file(path: str | os.PathLike[str], tensors: list[dict[str, Any]]) -> list[str]:
    """Names of ``tensors`` (plan entries) whose bytes in the safetensors file ``path`` do not hash to the plan."""
    infos, _, _ = read_safetensors_header(path)
    where = {i.name: (i.file_offset, i.nbytes) for i in infos}
    mapped = MappedFile(path)
    try:
        bad = []
        for t in tensors:
            loc = where.get(t["name"])
            if loc is None or loc[1] != t["nbytes"] or tensor_hex(mapped.tensor[loc[0]:loc[0] + loc[1]]) != t["checksum"]:
                bad.append(t["name"])
        return bad
    finally:
        mapped.close()
