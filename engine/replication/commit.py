"""The served version on a receiver, and its two-phase commit.

Directory of one rank (``--out DIR`` -> ``DIR/rank<R>/``)::

    CURRENT                      {"version", "plan_digest", "file", "manifest"}: what this rank serves
    versions/<v>/model.safetensors, versions/<v>/manifest.json
    staging/<v>/...              the next version while it is being received (never served)

Beside the rank directories::

    decisions/<v>.json           the coordinator's durable decision: version <v> (plan digest) commits
    .lock.rank<R>                flock held by the run that owns rank R's directory (it holds its pid)

Phase 1 (prepare): every receiver has verified every bucket and every tensor of its staging copy,
made it durable (fsync), checked that it can switch, and written its manifest; it votes yes.
Phase 2: only if *every* rank voted yes (an all-reduce MIN over the process group) does the
coordinator (rank 0) write ``decisions/<v>.json`` atomically and durably, and only after that
record exists does any rank switch: move staging/<v> to versions/<v> and atomically replace
CURRENT. Any failure, timeout or signal before the decision removes staging/<v> and leaves
CURRENT -- the served version -- exactly as it was on every rank.

After the decision a rank can still fail to switch (SIGKILL, a full or immutable disk). Its
prepared, verified staging copy is then kept, and re-running the same command finishes the switch
(:meth:`ServedDir.finish`) without moving a byte: the decision record says the version is
committed, so rolling forward is the only correct outcome. Re-running a version every rank
already serves is a no-op success.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from hwtui.core.atomic import atomic_write_text
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.checksum import tensor_hex
from hwtui.engine.replication.plan import write_json_atomic
from hwtui.engine.replication.weights import MappedFile, read_safetensors_header

DECISION_SCHEMA = "hwtui.replication-decision/1"


def decision_path(out: str | os.PathLike[str], version: str) -> Path:
    return Path(out) / "decisions" / f"{version}.json"


def write_decision(out: str | os.PathLike[str], version: str, plan_digest: str, ranks: list[int]) -> None:
    """The commit point: once this file exists (fsynced, with its directory), version commits everywhere."""
    atomic_write_text(decision_path(out, version), json.dumps({
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


class OutLock:
    """An exclusive flock per rank directory, so two runs never write one ``--out`` at once.

    The lock file holds the owner's pid, so the loser can say who holds it. The kernel drops a
    flock when its holder dies, so a crashed run never leaves a stale lock behind.
    """

    def __init__(self, out: str | os.PathLike[str], ranks: list[int]):
        self.out = Path(out)
        self.ranks = ranks
        self._fds: list[int] = []

    def acquire(self) -> OutLock:
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HwtuiError(f"--out {self.out} cannot be created: {exc.strerror or exc}") from None
        if not self.out.is_dir():
            raise HwtuiError(f"--out {self.out} is not a directory")
        for r in self.ranks:
            path = self.out / f".lock.rank{r}"
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                self.release()
                raise HwtuiError(f"--out {self.out} is not writable: {exc.strerror or exc}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                self.release()
                raise HwtuiError(f"--out {self.out} is in use by pid {holder} (another replication owns rank {r}); "
                                 "wait for it or choose another --out") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._fds.append(fd)
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
    def __init__(self, out: str | os.PathLike[str], rank: int):
        self.root = Path(out) / f"rank{rank}"

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

    def begin(self, version: str) -> None:
        if (self.root / "versions" / version).exists():
            raise HwtuiError(f"{self.root} already holds version {version!r}; plan a new version")
        shutil.rmtree(self.staging_dir(version), ignore_errors=True)  # leftovers of an aborted run
        self.staging_dir(version).mkdir(parents=True)

    def prepare(self, version: str, manifest: dict[str, Any]) -> None:
        """Last step before a yes vote: the switch must be possible, then the manifest marks the copy prepared.

        A file where ``versions/`` or ``versions/<v>`` should be, or a directory that cannot be
        written, fails here (the rank votes no and every rank aborts) instead of after the decision.
        """
        versions = self.root / "versions"
        versions.mkdir(parents=True, exist_ok=True)
        if (versions / version).exists() or (versions / version).is_symlink():
            raise HwtuiError(f"{versions / version} is in the way of the switch")
        probe = self.root / ".switch-probe"
        probe.write_bytes(b"")
        probe.unlink()
        # write_json_atomic streams a plan's manifest from its tables: at 1M tensors, building the
        # list of dicts first cost every rank seconds and half a GB.
        write_json_atomic(self.staging_dir(version) / "manifest.json", manifest)

    def prepared(self, version: str) -> bool:
        staged = self.staging_dir(version)
        return (staged / "manifest.json").is_file() and (staged / "model.safetensors").is_file()

    def commit(self, version: str, plan_digest: str) -> None:
        target = self.root / "versions" / version
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_dir():  # a re-run after a kill between the two renames finds it moved already
            os.replace(self.staging_dir(version), target)
        with contextlib.suppress(OSError):
            (self.root / "staging").rmdir()  # only when empty: other versions' leftovers stay visible
        atomic_write_text(self.root / "CURRENT", json.dumps({
            "version": version, "plan_digest": plan_digest,
            "file": f"versions/{version}/model.safetensors", "manifest": f"versions/{version}/manifest.json"}) + "\n")

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
        self.commit(version, plan_digest)
        return "finished the switch"

    def abort(self, version: str) -> None:
        shutil.rmtree(self.staging_dir(version), ignore_errors=True)
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
