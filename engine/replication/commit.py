"""The served version on a receiver, and its two-phase commit.

Directory of one rank (``--out DIR`` -> ``DIR/rank<R>/``)::

    CURRENT                      {"version", "plan_digest", "file", "manifest"}: what this rank serves
    versions/<v>/model.safetensors, versions/<v>/manifest.json
    staging/<v>/...              the next version while it is being received (never served)

Phase 1 (prepare): every receiver has verified every bucket and every tensor of its staging copy,
made it durable (fsync) and written its manifest; it votes yes. Phase 2: only if *every* rank
voted yes (an all-reduce MIN over the process group) does each rank move staging/<v> to
versions/<v> and atomically replace CURRENT. Any failure, timeout or signal before the decision
removes staging/<v> and leaves CURRENT -- the served version -- exactly as it was on every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from hwtui.core.atomic import atomic_write_text
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.weights import MappedFile, read_safetensors_header


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
        atomic_write_text(self.staging_dir(version) / "manifest.json", json.dumps(manifest, separators=(",", ":")) + "\n")

    def commit(self, version: str, plan_digest: str) -> None:
        target = self.root / "versions" / version
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.staging_dir(version), target)
        with contextlib.suppress(OSError):
            (self.root / "staging").rmdir()  # only when empty: other versions' leftovers stay visible
        atomic_write_text(self.root / "CURRENT", json.dumps({
            "version": version, "plan_digest": plan_digest,
            "file": f"versions/{version}/model.safetensors", "manifest": f"versions/{version}/manifest.json"}) + "\n")

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
