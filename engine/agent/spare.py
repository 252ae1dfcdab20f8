"""A spare staging file, made between pushes, so a push never waits for pages to be allocated.

Creating a receiver's staging copy means allocating the whole model on disk: the worker no longer
pre-faults it, so the transfer pays for every page it first touches instead (1 GB was 3-13 s on a
loaded node, several times the transfer itself). A resident receiver does that work while it
is idle instead: after each committed push it makes ``<served>/spare/model.safetensors`` the size
of the version it now serves, zero-filled and synced. The next push's staging copy *is* that file
(renamed into ``staging/<v>/``, resized if the model grew or shrank, its header rewritten): writing
over cached pages costs ~0.15 s per GB. Every byte of the data is then written by the transfer or
copied from the served version and verified against the plan, as with a fresh file. The resident
rank hands this class to the worker through its ``staging_factory`` seam.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path
from typing import Any

from hwtui.engine.replication.staging import Staging, header_layout, safetensors_layout


def spare_path(served_root: str | os.PathLike[str]) -> Path:
    return Path(served_root) / "spare" / "model.safetensors"


def make_spare(served_root: str | os.PathLike[str], size: int) -> int:
    """Write a zero-filled, synced spare of ``size`` bytes (atomically: a half-made one never counts)."""
    import torch

    final = spare_path(served_root)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(".spare.tmp")
    with open(tmp, "w+b") as fh:
        fh.truncate(size)
        if size:
            with mmap.mmap(fh.fileno(), size) as mm:
                data = torch.frombuffer(mm, dtype=torch.uint8)
                data.zero_()
                del data
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return size


class SpareStaging(Staging):
    """``Staging`` that takes the spare file when there is one (host memory, file-backed only)."""

    def __init__(self, tensors: list[dict[str, Any]], metadata: dict[str, str], device: str = "cpu",
                 file: str | os.PathLike[str] | None = None, first: list[str] | None = None,
                 header: bytes | None = None):
        spare = spare_path(Path(file).parent.parent.parent) if file is not None else None
        if device != "cpu" or file is None or spare is None or not spare.is_file():
            super().__init__(tensors, metadata, device=device, file=file, first=first, header=header)
            return
        import torch

        self.tensors = {t["name"]: t for t in tensors}
        if header is not None:  # the source's own header: the replica is the source file, byte for byte
            self.header, self.layout = header, header_layout(header)
        else:
            self.header, self.layout = safetensors_layout(tensors, metadata, first)
        # As Staging: the data runs to the end of the last tensor (a source header may leave gaps).
        self.data_bytes = max((off + n for off, n in self.layout.values()), default=0)
        self.device = device
        self.file = Path(file)
        self.file.parent.mkdir(parents=True, exist_ok=True)
        os.replace(spare, self.file)
        total = len(self.header) + self.data_bytes
        self._mm: mmap.mmap | None = None
        with open(self.file, "r+b") as fh:
            if os.fstat(fh.fileno()).st_size != total:
                fh.truncate(total)
            fh.write(self.header)
            self._mm = mmap.mmap(fh.fileno(), total) if total else None
        whole = torch.frombuffer(self._mm, dtype=torch.uint8) if self._mm else torch.empty(0, dtype=torch.uint8)
        self.data = whole[len(self.header):]
        self.used_spare = True


def remove_spare(served_root: str | os.PathLike[str]) -> None:
    with contextlib.suppress(OSError):
        spare_path(served_root).unlink()
