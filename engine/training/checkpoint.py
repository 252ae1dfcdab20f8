"""Checkpoints: safetensors weights plus a JSON manifest, committed atomically, resumable.

Layout under ``--checkpoint-dir``::

    ckpt-00000040/model.safetensors       merged weights
    ckpt-00000040/optimizer.safetensors   merged optimizer state (policy "average" only)
    ckpt-00000040/outer.safetensors       outer Nesterov momentum (--merge outer-nesterov only)
    ckpt-00000040/manifest.json           step, round, next chunk, which device/vendor trained
                                          what, sha256 of each file -- written last
    latest.json                           {"dir": "ckpt-00000040", ...}, replaced atomically

Commit protocol: every file goes into a hidden ``.tmp-*`` directory and is fsynced; the directory
is renamed into place and the parent fsynced; only then is ``latest.json`` replaced (temp file,
fsync, rename). A crash at any point leaves the previous checkpoint and ``latest.json`` intact;
a leftover ``.tmp-*`` directory is ignored and cleaned by the next save. Loading verifies the
hashes, and :func:`latest` falls back to the newest checkpoint that verifies.

No pickle anywhere: tensors through safetensors, everything else JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from hwtui.core.atomic import atomic_write_text, fsync_path
from hwtui.core.bounded_read import read_bounded
from hwtui.engine.training import knobs

SCHEMA = "hwtui.train-checkpoint/1"
LATEST = "latest.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OUTER_FILE = "outer.safetensors"  # the outer optimizer's momentum (--merge outer-nesterov only)
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 4 << 20  # a real manifest is a few KB; anything near this is not ours
_CKPT_NAME = re.compile(r"ckpt-\d{8,}")


class CheckpointError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_tensors(path: Path, tensors: dict[str, Any]) -> None:
    from safetensors.torch import save

    data = save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()})
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def save(root: str | os.PathLike[str], step: int, model: dict[str, Any], optimizer: dict[str, Any] | None,
         manifest: dict[str, Any], keep: int = 3, outer: dict[str, Any] | None = None) -> Path:
    """Write and commit one checkpoint; returns its directory. Keeps the newest ``keep``."""
    for part in (model, optimizer or {}, outer or {}):
        for key, t in part.items():
            if t.is_floating_point() and not bool(t.isfinite().all()):
                # Last line of defence: a diverged model must never become "the last good checkpoint".
                raise CheckpointError(f"refusing to save step {step}: {key} holds NaN or infinity")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    try:
        files = {MODEL_FILE: model} | ({OPTIMIZER_FILE: optimizer} if optimizer else {}) | ({OUTER_FILE: outer} if outer else {})
        hashes = {}
        for fname, tensors in files.items():
            _write_tensors(tmp / fname, tensors)
            hashes[fname] = _sha256(tmp / fname)
        delay = knobs.checkpoint_delay()
        if delay:
            time.sleep(delay)  # test-only: lets a test kill us mid-checkpoint
        doc = {"schema": SCHEMA, "step": step, **manifest, "files": hashes, "written": time.time()}
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, default=str, allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_path(tmp)
        final = root / name
        if final.exists():  # a resumed run reached the same step again: replace it
            old = Path(tempfile.mkdtemp(prefix=f".old-{name}-", dir=root))
            os.replace(final, old / name)
        os.replace(tmp, final)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST, json.dumps({"dir": name, "step": step}) + "\n")
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    for stale in root.glob(".old-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in root.glob(".tmp-*"):
        # Another writer never runs concurrently (one writer per run); leftovers are from a crash.
        if time.time() - stale.stat().st_mtime > 60:
            shutil.rmtree(stale, ignore_errors=True)
    dirs = sorted(p for p in root.glob("ckpt-*") if p.is_dir())
    for old in dirs[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def verify(path: Path) -> dict[str, Any]:
    """The manifest of a complete, unmodified checkpoint; CheckpointError otherwise (never anything else).

    The manifest is input like any file on disk: it must be a JSON object of the known schema, at
    most ``MAX_MANIFEST_BYTES``, with an integer ``step`` and a ``files`` table that names only the
    files a checkpoint holds (so a hostile manifest cannot make us hash ``../../etc/shadow``)."""
    manifest = path / MANIFEST
    try:
        if not manifest.is_file():
            raise CheckpointError(f"{path}: no manifest")
        # The bounded reader opens without following a FIFO into a blocking open and refuses
        # anything but a regular file, which a planted manifest.json could otherwise be.
        raw, more = read_bounded(manifest, MAX_MANIFEST_BYTES)
        if more:
            raise CheckpointError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
        doc = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: no readable manifest ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise CheckpointError(f"{path}: not a {SCHEMA} manifest")
    step, files = doc.get("step"), doc.get("files")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{path}: manifest step {step!r} is not a step number")
    if not isinstance(files, dict) or MODEL_FILE not in files or not set(files) <= {MODEL_FILE, OPTIMIZER_FILE, OUTER_FILE}:
        raise CheckpointError(f"{path}: manifest must list {MODEL_FILE} (and optionally {OPTIMIZER_FILE}, "
                              f"{OUTER_FILE}) only")
    for fname, digest in files.items():
        target = path / fname
        if not isinstance(digest, str) or not target.is_file() or _sha256(target) != digest:
            raise CheckpointError(f"{path}: {fname} is missing or does not match its sha256")
    return doc


def latest(root: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]] | None:
    """The newest good checkpoint: the one ``latest.json`` names if it verifies, else the newest that does."""
    root = Path(root)
    candidates: list[Path] = []
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        pointer = root / LATEST
        if pointer.is_file() and pointer.stat().st_size <= MAX_MANIFEST_BYTES:
            name = json.loads(pointer.read_text(encoding="utf-8"))["dir"]
            if isinstance(name, str) and _CKPT_NAME.fullmatch(name):  # a name, never a path elsewhere
                candidates.append(root / name)
    candidates += sorted((p for p in root.glob("ckpt-*") if p.is_dir() and _CKPT_NAME.fullmatch(p.name)), reverse=True)
    for path in candidates:
        with contextlib.suppress(CheckpointError):
            return path, verify(path)
    return None


def load_tensors(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from safetensors.torch import load_file

    model = load_file(str(path / MODEL_FILE))
    opt = load_file(str(path / OPTIMIZER_FILE)) if (path / OPTIMIZER_FILE).is_file() else None
    return model, opt


def load_outer(path: Path) -> dict[str, Any] | None:
    """The outer optimizer's momentum, if the checkpoint has one."""
    from safetensors.torch import load_file

    return load_file(str(path / OUTER_FILE)) if (path / OUTER_FILE).is_file() else None
