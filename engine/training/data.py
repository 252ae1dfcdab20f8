"""Training text every machine has: the Python standard library's own source files.

Nothing is downloaded. The corpus is the sorted ``*.py`` files next to ``os.py``; a file goes to the
held-out set when the CRC32 of its name is 0 mod 10, so the split is the same on every run and
does not depend on file order or sizes. Different Python versions ship different files, so the
corpus carries a fingerprint that checkpoints record and ``--resume`` compares.

Batches are a pure function of (seed, chunk id): any worker can train any chunk, and a chunk
given back after a worker died is trained on exactly the same text by its new owner.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

HELDOUT_MOD = 10
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


def stdlib_dir() -> Path:
    return Path(os.path.dirname(os.__file__))


def is_heldout(name: str) -> bool:
    return zlib.crc32(name.encode()) % HELDOUT_MOD == 0


@dataclass
class Corpus:
    train: torch.Tensor  # uint8 bytes, or int32 token ids (--data with a tokenizer)
    heldout: torch.Tensor
    fingerprint: str
    files: int
    label: str | None = None  # --data: what it was read from (None: the standard library, as bytes)

    def describe(self) -> str:
        if self.label is not None:
            return (f"{self.label}: {self.train.numel():,} train / {self.heldout.numel():,} held-out tokens, "
                    f"fingerprint {self.fingerprint}")
        return (f"{self.files} stdlib files, {self.train.numel() / 1e6:.1f} MB train / "
                f"{self.heldout.numel() / 1e6:.2f} MB held-out, fingerprint {self.fingerprint}")


def load_corpus(root: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> Corpus:
    root = root or stdlib_dir()
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no Python source files in {root}")
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    sizes = {False: 0, True: 0}
    digest = hashlib.sha256()
    for path in files:
        held = is_heldout(path.name)
        if sizes[held] >= max_bytes // (HELDOUT_MOD if held else 1):
            continue
        data = path.read_bytes() + b"\n\n"
        parts[held].append(data)
        sizes[held] += len(data)
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(data).digest())
    train_text, held_text = b"".join(parts[False]), b"".join(parts[True])
    return Corpus(
        train=torch.frombuffer(bytearray(train_text), dtype=torch.uint8),
        heldout=torch.frombuffer(bytearray(held_text), dtype=torch.uint8),
        fingerprint=digest.hexdigest()[:16], files=len(parts[False]) + len(parts[True]),
    )


def _windows(text: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + torch.arange(context + 1)[None, :]
    seq = text[idx].long()
    return seq[:, :-1], seq[:, 1:]


def chunk_batch(corpus: Corpus, chunk_id: int, batch_size: int, context: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of chunk ``chunk_id``: the same bytes whoever trains it."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + chunk_id) & 0x7FFF_FFFF_FFFF_FFFF)
    starts = torch.randint(0, corpus.train.numel() - context - 1, (batch_size,), generator=gen)
    return _windows(corpus.train, starts, context)


def heldout_batch(corpus: Corpus, windows: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed evaluation set spread evenly over the held-out text."""
    span = corpus.heldout.numel() - context - 1
    starts = torch.linspace(0, span, windows).long()
    return _windows(corpus.heldout, starts, context)
