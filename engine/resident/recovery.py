"""What a node holds of each version, and how a push a node missed is finished or discarded.

The decision record (``engine.replication.commit``: ``decisions/<v>.json``, written by the source
before any rank switches, and by each receiver when it learns the decision, before its own
switch) is the only authority on whether version ``v`` commits. A receiver whose switch did not
happen (its agent SIGKILLed after the decision, a switch that failed) keeps its staged copy,
prepared (fsynced, with its manifest) before it voted; that copy is hashed again against its
manifest, tensor by tensor, before it is switched to, because it has sat on disk since.

Everything else under ``staging/`` is a leftover of a push that can never commit (no decision,
not even prepared) and is removed, so a node holds its served version, the other slot, and at
most one staged copy (which took the spare's place).

No torch here: the agent process verifies with mmap and xxh3 (engine.replication.checksum).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from hwtui.core.atomic import fsync_path
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.checksum import xxh3_hex
from hwtui.engine.replication.commit import ServedDir, read_decision
from hwtui.engine.replication.served_files import ServeModes
from hwtui.engine.replication.weights import read_safetensors_header

MAX_MANIFEST_BYTES = 1 << 30  # a manifest of millions of tensors is a few hundred MB at most


def served_dir(served: Path, modes: ServeModes | None = None) -> ServedDir:
    """The commit module's view of an agent's ``served/`` directory (a rank's directory, whatever rank).

    ``modes``: the agent's ``--serve-group`` (default owner-only): a switch finished here publishes
    the version with the same modes and group as one its rank commits, so a server of that group
    can read a version whichever path put it in place."""
    sd = ServedDir(served.parent, 0, modes)
    sd.root = served
    return sd


def decision(ranks_out: Path, version: str) -> dict[str, Any] | None:
    """The decision record this node holds for ``version`` (None: none, or one that cannot be read)."""
    try:
        return read_decision(ranks_out, version)
    except HwtuiError:
        return None


def manifest(staged: Path) -> dict[str, Any] | None:
    try:
        with open(staged / "manifest.json", "rb") as fh:
            raw = json.loads(fh.read(MAX_MANIFEST_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    return raw if isinstance(raw, dict) and isinstance(raw.get("tensors"), list) else None


def staged(served: Path, ranks_out: Path) -> list[dict[str, Any]]:
    """Every version under ``staging/``: prepared (fsynced with its manifest) or not, decided here or not."""
    out: list[dict[str, Any]] = []
    try:
        names = sorted(os.listdir(served / "staging"))
    except OSError:
        return out
    for name in names[:16]:
        root = served / "staging" / name
        prepared = (root / "manifest.json").is_file() and (root / "model.safetensors").is_file()
        out.append({"version": name, "prepared": prepared, "decided": decision(ranks_out, name) is not None})
    return out


def verify_staged(staged_dir: Path, plan_digest: str) -> str | None:
    """Why the prepared copy in ``staged_dir`` cannot be switched to as plan ``plan_digest`` (None: it can)."""
    man = manifest(staged_dir)
    if man is None:
        return "it has no readable manifest"
    if man.get("plan_digest") != plan_digest:
        return f"it is of another plan ({str(man.get('plan_digest'))[:16]})"
    path = staged_dir / "model.safetensors"
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):  # a link (or anything else) planted there is never published
            return "its weights file is not a regular file"
        infos, _, _ = read_safetensors_header(path)
        where = {i.name: (i.file_offset, i.nbytes) for i in infos}
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return "its weights file is empty"
            with mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ) as mm:
                view = memoryview(mm)
                try:
                    for t in man["tensors"]:
                        if not isinstance(t, dict):
                            return "its manifest is malformed"
                        loc = where.get(str(t.get("name")))
                        if loc is None or loc[1] != t.get("nbytes") or loc[0] + loc[1] > size \
                                or xxh3_hex(view[loc[0]:loc[0] + loc[1]]) != t.get("checksum"):
                            return f"tensor {t.get('name')!r} no longer matches the plan"
                finally:
                    view.release()
    except (OSError, ValueError, HwtuiError) as exc:
        return f"it cannot be read ({getattr(exc, 'strerror', None) or exc})"
    return None


def finish(served: Path, ranks_out: Path, version: str, plan_digest: str,
           modes: ServeModes | None = None) -> tuple[bool, str]:
    """Roll a decided ``version`` forward on this node: (switched or already serving it, what happened).

    The caller has established the decision (its own record, or the source's read by the pusher);
    it is recorded here first, so an agent killed half-way finishes at its next start."""
    from hwtui.engine.replication.commit import write_decision

    sd = served_dir(served, modes)
    try:
        cur = sd.current() or {}
    except HwtuiError:
        cur = {}
    if cur.get("version") == version:
        return True, "already serves it"
    moved = (served / "versions" / version).is_dir()
    if not moved:
        if not sd.prepared(version):
            return False, "it holds no prepared copy: it needs the bytes again"
        why = verify_staged(sd.staging_dir(version), plan_digest)
        if why is not None:
            discard(served, version)
            return False, f"its staged copy was discarded ({why}): it needs the bytes again"
        try:
            # A GPU-resident receiver's copy is fsynced after the commit (``hwtui agent --persist
            # after-commit``): one whose rank died before that may be whole only in the page cache.
            # Durable before it is published; a copy fsynced before its vote costs nothing here.
            fsync_path(sd.staging_dir(version) / "model.safetensors")
        except OSError as exc:
            return False, f"its staged copy could not be made durable: {exc.strerror or exc}"
    try:
        if decision(ranks_out, version) is None:
            write_decision(ranks_out, version, plan_digest, [])
        sd.publish_verified(version, plan_digest)
    except (OSError, HwtuiError) as exc:
        return False, f"the switch failed: {getattr(exc, 'strerror', None) or exc}"
    return True, "finished the switch from its verified staged copy" if not moved else "finished the switch"


def discard(served: Path, version: str) -> None:
    shutil.rmtree(served / "staging" / version, ignore_errors=True)
    with contextlib.suppress(OSError):
        (served / "staging").rmdir()
