"""The plan file, schema ``hwtui.plan/2``: a compact JSON header plus columnar binary tables.

Layout (all integers little-endian)::

    b"HWTPLAN2"                  8-byte magic
    u64 header_len               length of the JSON header (padded with spaces to a multiple of 8)
    header                       {"schema", "model", "version", ..., "sections": [[name, dtype, offset, count]...],
                                  "digest"}
    data                         the sections back to back, each starting at a multiple of 8

``digest`` is xxh3-128 of the canonical header without it, followed by every data byte, so a
truncated or edited file, or two ranks holding different plans, is caught before a byte moves.
A rank checks the digest (one pass at memory speed) and maps the tables: no JSON of a million
objects to parse, nothing to re-validate (the coordinator validated the same bytes).

Sections are numpy arrays of fixed dtypes (never pickle): a reader accepts only the dtypes
listed in ``SECTION_DTYPES`` and only sections that lie inside the file.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from typing import Any

import numpy as np
import xxhash

from hwtui.core.atomic import atomic_open
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.weights import open_regular, strict_json

MAGIC = b"HWTPLAN2"
PLAN_SCHEMA_V2 = "hwtui.plan/2"
MAX_HEADER = 1 << 30  # the header holds files, deleted names and scalars; the tables are sections
SECTION_DTYPES = {"u1": np.uint8, "i4": np.int32, "i8": np.int64, "u8": np.uint64}
_DTYPE_NAME = {np.dtype(v).str[1:]: k for k, v in SECTION_DTYPES.items()}


def canonical(obj: Any) -> bytes:
    # surrogatepass: a hostile file may carry a lone surrogate; it must reach validation, not crash here
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def _pad8(n: int) -> int:
    return -n % 8


def encode(header: dict[str, Any], sections: dict[str, np.ndarray]) -> tuple[list[Any], str]:
    """-> (the file as a list of buffers, its digest). ``header`` must not hold "sections" or "digest".

    The sections are hashed and written from the arrays' own memory: no copy of a 200 MB table."""
    table, parts, pos = [], [], 0
    for name, arr in sections.items():
        kind = _DTYPE_NAME.get(arr.dtype.str[1:])
        if kind is None:
            raise TypeError(f"section {name}: dtype {arr.dtype} is not a plan section dtype")
        data = np.ascontiguousarray(arr, dtype=np.dtype(SECTION_DTYPES[kind]).newbyteorder("<")).reshape(-1)
        table.append([name, kind, pos, int(data.size)])
        parts.append(data.data.cast("B") if data.size else b"")
        parts.append(b"\0" * _pad8(data.nbytes))
        pos += data.nbytes + _pad8(data.nbytes)
    body = dict(header, sections=table)
    h = xxhash.xxh3_128()
    h.update(canonical(body))
    for part in parts:
        h.update(part)
    digest = h.hexdigest()
    raw = canonical(dict(body, digest=digest))
    raw += b" " * _pad8(len(raw))
    return [MAGIC + struct.pack("<Q", len(raw)) + raw, *parts], digest


def write(path: str | os.PathLike[str], header: dict[str, Any], sections: dict[str, np.ndarray]) -> str:
    """Write a plan file atomically (a reader sees the old file or the whole new one) -> its digest."""
    parts, digest = encode(header, sections)
    write_parts(path, parts)
    return digest


def write_parts(path: str | os.PathLike[str], parts: list[Any]) -> None:
    """Write an encoded plan atomically (a reader sees the old file or the whole new one)."""
    with atomic_open(path, "wb") as fh:
        for part in parts:
            fh.write(part)


def is_v2(path: str | os.PathLike[str]) -> bool:
    fd, _ = open_regular(path, "plan")
    try:
        return os.pread(fd, len(MAGIC), 0) == MAGIC
    except OSError as exc:
        raise HwtuiError(f"cannot read plan {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


class PlanFile:
    """A mapped v2 plan: its header and zero-copy numpy views of its sections (digest checked)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = str(path)
        fd, st = open_regular(path, "plan")
        try:
            size = st.st_size
            if size < 16:
                raise HwtuiError(f"plan {path} is truncated ({size} bytes)")
            self._mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        except OSError as exc:
            raise HwtuiError(f"cannot map plan {path}: {exc.strerror}") from None
        finally:
            os.close(fd)
        mm = self._mm
        if mm[:8] != MAGIC:
            raise HwtuiError(f"plan {path} is not an hwtui plan file")
        (hlen,) = struct.unpack("<Q", mm[8:16])
        if hlen > MAX_HEADER or 16 + hlen > size:
            raise HwtuiError(f"plan {path} is truncated or corrupt (header length {hlen}, file {size} bytes)")
        header = strict_json(mm[16:16 + hlen], f"plan {path}")
        if not isinstance(header, dict):
            raise HwtuiError(f"plan {path}: header is not a JSON object")
        digest = header.pop("digest", None)
        if not isinstance(digest, str):
            raise HwtuiError(f"plan {path}: header has no digest")
        data_start = 16 + hlen
        h = xxhash.xxh3_128()
        h.update(canonical(header))
        h.update(memoryview(mm)[data_start:])
        if h.hexdigest() != digest:
            raise HwtuiError(f"plan {path}: digest mismatch: the plan was edited or truncated after planning")
        self.header, self.digest = header, digest
        self.sections: dict[str, np.ndarray] = {}
        table = header.get("sections")
        if not isinstance(table, list):
            raise HwtuiError(f"plan {path}: header has no section table")
        data_len = size - data_start
        for entry in table:
            if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)
                    and entry[1] in SECTION_DTYPES and type(entry[2]) is int and type(entry[3]) is int):
                raise HwtuiError(f"plan {path}: malformed section entry {str(entry)[:80]}")
            name, kind, off, count = entry
            dt = np.dtype(SECTION_DTYPES[kind]).newbyteorder("<")
            if off < 0 or count < 0 or off % 8 or off + count * dt.itemsize > data_len:
                raise HwtuiError(f"plan {path}: section {name[:40]!r} lies outside the file")
            self.sections[name] = np.frombuffer(mm, dtype=dt, count=count, offset=data_start + off)

    def section(self, name: str, n: int | None = None) -> np.ndarray:
        arr = self.sections.get(name)
        if arr is None:
            raise HwtuiError(f"plan {self.path}: section {name!r} is missing")
        if n is not None and arr.size != n:
            raise HwtuiError(f"plan {self.path}: section {name!r} has {arr.size} entries, expected {n}")
        return arr
