"""Checkpoints: safetensors weights plus a JSON manifest, committed atomically, resumable.

Layout under ``--checkpoint-dir``::

    ckpt-00000040/model.safetensors       merged weights
    ckpt-00000040/optimizer.safetensors   merged optimizer state (policy "average" only)
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
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from hwtui.core.atomic import atomic_write_text
from hwtui.engine.training import knobs

SCHEMA = "hwtui.train-checkpoint/1"
LATEST = "latest.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    pass


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
         manifest: dict[str, Any], keep: int = 3) -> Path:
    """Write and commit one checkpoint; returns its directory. Keeps the newest ``keep``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    try:
        files = {MODEL_FILE: model} | ({OPTIMIZER_FILE: optimizer} if optimizer else {})
        hashes = {}
        for fname, tensors in files.items():
            _write_tensors(tmp / fname, tensors)
            hashes[fname] = _sha256(tmp / fname)
        delay = knobs.checkpoint_delay()
        if delay:
            time.sleep(delay)  # test-only: lets a test kill us mid-checkpoint
        doc = {"schema": SCHEMA, "step": step, **manifest, "files": hashes, "written": time.time()}
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_path(tmp)
        final = root / name
        if final.exists():  # a resumed run reached the same step again: replace it
            old = Path(tempfile.mkdtemp(prefix=f".old-{name}-", dir=root))
            os.replace(final, old / name)
        os.replace(tmp, final)
        _fsync_path(root)
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
    """The manifest of a complete, unmodified checkpoint; CheckpointError otherwise."""
    try:
        doc = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: no readable manifest ({exc})") from None
    if doc.get("schema") != SCHEMA:
        raise CheckpointError(f"{path}: unknown checkpoint schema {doc.get('schema')!r}")
    for fname, digest in doc.get("files", {}).items():
        if not (path / fname).is_file() or _sha256(path / fname) != digest:
            raise CheckpointError(f"{path}: {fname} is missing or does not match its sha256")
    return doc


def latest(root: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]] | None:
    """The newest good checkpoint: the one ``latest.json`` names if it verifies, else the newest that does."""
    root = Path(root)
    candidates: list[Path] = []
    with contextlib.suppress(OSError, ValueError, KeyError):
        candidates.append(root / json.loads((root / LATEST).read_text())["dir"])
    candidates += sorted((p for p in root.glob("ckpt-*") if p.is_dir()), reverse=True)
    for path in candidates:
        with contextlib.suppress(CheckpointError):
            return path, verify(path)
    return None


def load_tensors(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from safetensors.torch import load_file

    model = load_file(str(path / MODEL_FILE))
    opt = load_file(str(path / OPTIMIZER_FILE)) if (path / OPTIMIZER_FILE).is_file() else None
    return model, opt
