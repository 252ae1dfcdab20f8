"""Your own training text (``--data``): a text file, a directory of ``.txt`` files, or ``.jsonl``
with a ``text`` field in each line, tokenised by the model directory's tokenizer or as UTF-8 bytes.

Reading is checked like any file a user names (``core.bounded_read``: regular files only, capped):
empty, binary (a NUL byte, or bytes that are not UTF-8) and unreadable input is refused in one
line naming the file, before any worker starts. The documents are joined in a fixed order (a
directory's files sorted by relative name; a ``.jsonl`` file's lines as they come) with a blank
line (bytes) or the tokenizer's end-of-sequence token between them.

The held-out split: the last tenth of the tokens, which no training batch ever touches (batches
are windows of the first nine tenths). A fixed fraction of one ordered stream keeps the split the
same on every run and every worker, however many documents there are -- one file included.
The fingerprint is the sha256 of the token stream: another text, or another tokenizer, is another
corpus, and ``--resume`` refuses it.

This module imports torch only inside :func:`tokenize` (the CLI checks the text without it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwtui.core.bounded_read import MIB, read_capped

MAX_DATA_BYTES = 1024 * MIB  # all of --data together; far beyond a box's worth of held text for one run
HELDOUT_FRACTION = 10  # the last 1/10 of the tokens
NUL = b"\0"


class DataError(ValueError):
    """``--data`` cannot be used: one line for the user."""


@dataclass(frozen=True)
class Documents:
    texts: tuple[str, ...]
    files: int
    label: str  # what the corpus line says it is


def _text_of(path: Path, shown: str, budget: int) -> str:
    try:
        raw = read_capped(path, budget)
    except OSError as exc:
        raise DataError(f"--data {shown}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise DataError(f"--data {shown}: cannot read it ({exc})") from None
    if NUL in raw:
        raise DataError(f"--data {shown}: binary data (a NUL byte at offset {raw.index(NUL)}), not text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"--data {shown}: not UTF-8 text (byte {exc.start})") from None


def _jsonl(path: Path, text: str) -> list[str]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            raise DataError(f"--data {path}: line {n} is not JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
            raise DataError(f"--data {path}: line {n} has no \"text\" string")
        out.append(doc["text"])
    return out


def read_documents(where: str) -> Documents:
    """The documents ``--data`` names, checked; DataError (one line) for anything unusable."""
    path = Path(where).expanduser()
    try:
        is_dir = path.is_dir()
        exists = path.exists()
    except OSError as exc:
        raise DataError(f"--data {where}: cannot read it ({exc.strerror or exc})") from None
    if not exists:
        raise DataError(f"--data {where}: no such file or directory")
    if is_dir:
        try:
            files = sorted((p for p in path.rglob("*.txt") if p.is_file()), key=lambda p: p.relative_to(path).as_posix())
        except OSError as exc:
            raise DataError(f"--data {where}: cannot list it ({exc.strerror or exc})") from None
        if not files:
            raise DataError(f"--data {where}: no .txt files in it")
        texts, budget = [], MAX_DATA_BYTES
        for f in files:
            text = _text_of(f, str(f), budget)
            budget -= len(text.encode())
            texts.append(text)
        docs = Documents(tuple(texts), len(files), f"{len(files)} .txt files in {where}")
    else:
        text = _text_of(path, where, MAX_DATA_BYTES)
        texts = _jsonl(path, text) if path.suffix == ".jsonl" else [text]
        what = f"{len(texts)} records of {where}" if path.suffix == ".jsonl" else where
        docs = Documents(tuple(texts), 1, what)
    if not any(t.strip() for t in docs.texts):
        raise DataError(f"--data {where}: no text in it (empty)")
    return docs


def tokenize(docs: Documents, tokenizer: Any, context: int, vocab: int | None) -> Any:
    """The Corpus of ``docs``: tokens (or bytes), split train / held-out, fingerprinted."""
    from hwtui.engine.rank_fork import no_intra_op_pool

    with no_intra_op_pool():  # the launcher forks its CPU workers after this
        return _tokenize(docs, tokenizer, context, vocab)


def _tokenize(docs: Documents, tokenizer: Any, context: int, vocab: int | None) -> Any:
    import torch

    from hwtui.engine.training.data import Corpus

    if tokenizer is None:
        if vocab is not None and vocab < 256:
            raise DataError(f"the model's vocabulary holds {vocab} ids; bytes need 256 (give the model a tokenizer "
                            f"or a vocabulary of at least 256)")
        stream = b"\n\n".join(t.encode("utf-8") for t in docs.texts)
        tokens = torch.frombuffer(bytearray(stream), dtype=torch.uint8) if stream else torch.zeros(0, dtype=torch.uint8)
    else:
        size = len(tokenizer)
        if vocab is not None and size > vocab:
            raise DataError(f"the tokenizer has {size} tokens but the model's vocabulary only {vocab}")
        eos = getattr(tokenizer, "eos_token_id", None)
        ids: list[int] = []
        for i, text in enumerate(docs.texts):
            if i and isinstance(eos, int):
                ids.append(eos)
            ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        tokens = torch.tensor(ids, dtype=torch.int32 if size < 2**31 else torch.int64)
    n = tokens.numel()
    held = n // HELDOUT_FRACTION
    need = context + 2
    if held < need or n - held < need:
        raise DataError(f"--data {docs.label}: {n} tokens, too little for windows of {context} "
                        f"(needs at least {need * HELDOUT_FRACTION})")
    digest = hashlib.sha256(str(tokens.dtype).encode() + tokens.numpy().tobytes()).hexdigest()[:16]
    return Corpus(train=tokens[: n - held].clone(), heldout=tokens[n - held:].clone(), fingerprint=digest,
                  files=docs.files, label=docs.label)
