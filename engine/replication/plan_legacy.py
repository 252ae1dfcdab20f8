"""The first plan format, schema ``hwtui.plan/1``: one JSON object (kept readable, not written).

A million-tensor JSON plan is ~250 MB and takes 13-20 s and 1.8 GB to parse on every rank, which is
why ``hwtui.plan/2`` (plan_format.py) replaced it. Plans written by earlier hwtui versions still
load: this module checks every invariant of the old object; ``plan.py`` turns it into tables.
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

import xxhash

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.weights import DTYPES, expected_nbytes

PLAN_SCHEMA = "hwtui.plan/1"
_SAFE_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


def canonical(obj: Any) -> bytes:
    """Compact JSON in the objects' own key order (json.loads keeps it), so re-indenting a plan keeps
    its digest while reordering or editing anything changes it."""
    # surrogatepass: a hostile plan may carry a lone surrogate; it must reach validation, not crash here
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def plan_digest(plan: dict[str, Any]) -> str:
    try:
        return xxhash.xxh3_128_hexdigest(canonical({k: v for k, v in plan.items() if k != "digest"}))
    except (RecursionError, ValueError, TypeError):
        raise HwtuiError("the plan holds values nested too deeply or not JSON") from None


def check_version(v: Any, what: str) -> str:
    if not isinstance(v, str) or not _SAFE_VERSION.match(v):
        raise HwtuiError(f"{what} {str(v)[:60]!r} is not a valid version (letters, digits, . _ + -; it names a directory)")
    return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _need(cond: bool, path: str, msg: str) -> None:
    if not cond:
        raise HwtuiError(f"plan {path}: {msg}")


def _fail(path: str, msg: str) -> NoReturn:
    raise HwtuiError(f"plan {path}: {msg}")


# The top-level fields and their types: (key, type); bool is refused where int is asked.
_FIELDS: tuple[tuple[str, type], ...] = (
    ("model", str), ("version", str), ("bucket_bytes", int), ("align", int), ("total_bytes", int),
    ("files", list), ("tensors", list), ("deleted", list), ("buckets", list), ("items", list), ("digest", str))


def validate_v1(raw: dict[str, Any], path: str = "<plan>") -> None:
    """Check every invariant a worker relies on; one line naming the first violation.

    Linear in the number of items plus a sort per bucket; the hot loops test conditions inline and
    only format a message on failure (a million items validate in seconds). The checks run in the
    order below, each step relying on what the earlier ones proved.
    """
    _check_header(raw, path)
    tensors = _check_tensors(raw, path)
    _check_buckets(raw, path)
    per_bucket, whole, parts = _check_items(raw, tensors, path)
    _check_no_overlap(per_bucket, path)
    _check_coverage(tensors, whole, parts, path)
    _need(plan_digest(raw) == raw["digest"], path, "digest mismatch: the plan was edited or truncated after planning")


def _check_header(raw: dict[str, Any], path: str) -> None:
    _need(raw.get("schema") == PLAN_SCHEMA, path, f"schema is {raw.get('schema')!r}, expected {PLAN_SCHEMA!r}")
    for key, kind in _FIELDS:
        _need(isinstance(raw.get(key), kind) and not isinstance(raw.get(key), bool), path,
              f"missing or mistyped field {key!r} (expected {kind.__name__})")
    check_version(raw["version"], f"plan {path}: version")
    if raw.get("prev_version") is not None:
        check_version(raw["prev_version"], f"plan {path}: prev_version")
    _need(raw["bucket_bytes"] > 0, path, "bucket_bytes must be positive")
    for i, f in enumerate(raw["files"]):
        _need(isinstance(f, dict) and isinstance(f.get("path"), str) and f.get("format") in ("safetensors", "torch")
              and _is_int(f.get("size")), path, f"file entry {i} is malformed")


def _check_tensors(raw: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
    """The tensors by name, each checked; the deleted names checked against them."""
    tensors: dict[str, dict[str, Any]] = {}
    for t in raw["tensors"]:
        _check_tensor(t, tensors, path)
        tensors[t["name"]] = t
    for name in raw["deleted"]:
        _need(isinstance(name, str) and name not in tensors, path, f"deleted tensor {name!r} is also in the next version")
    return tensors


def _check_tensor(t: Any, seen: dict[str, dict[str, Any]], path: str) -> None:
    if not (isinstance(t, dict) and isinstance(t.get("name"), str)):
        _fail(path, f"malformed tensor entry {str(t)[:60]}")
    name, dtype, shape = t["name"], t.get("dtype"), t.get("shape")
    if name in seen:
        _fail(path, f"tensor {name!r} listed twice")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        _fail(path, f"tensor {name[:80]!r} has unknown dtype {str(dtype)[:40]!r}")
    if not (isinstance(shape, list) and len(shape) <= 64 and all(_is_int(d) and d >= 0 for d in shape)):
        _fail(path, f"tensor {name!r} has a bad shape")
    if t.get("nbytes") != expected_nbytes(dtype, shape):
        _fail(path, f"tensor {name!r}: nbytes {t.get('nbytes')} does not match {dtype}{shape}")
    ck = t.get("checksum")
    if not (isinstance(ck, str) and _HEX16.match(ck)):
        _fail(path, f"tensor {name!r} has a bad checksum")
    if not isinstance(t.get("send"), bool):
        _fail(path, f"tensor {name!r} lacks 'send'")


def _check_buckets(raw: dict[str, Any], path: str) -> None:
    nb = len(raw["buckets"])
    for i, b in enumerate(raw["buckets"]):
        _need(isinstance(b, dict) and b.get("id") == i, path, f"bucket ids must be 0..{nb - 1} in order (entry {i})")
        _need(_is_int(b.get("size")) and 0 < b["size"] <= raw["bucket_bytes"], path, f"bucket {i} has a bad size")
        _need(isinstance(b.get("checksum"), str) and bool(_HEX16.match(b["checksum"])), path, f"bucket {i} has a bad checksum")
        cr = b.get("consumer_ranks")
        _need(cr is None or (isinstance(cr, list) and all(_is_int(r) and r >= 0 for r in cr)), path,
              f"bucket {i} has bad consumer_ranks")
    _need(raw["total_bytes"] == sum(b["size"] for b in raw["buckets"]), path, "total_bytes is not the sum of the bucket sizes")


_Pieces = tuple[list[list[dict[str, Any]]], dict[str, int], dict[str, list[tuple[int, int]]]]


def _check_items(raw: dict[str, Any], tensors: dict[str, dict[str, Any]], path: str) -> _Pieces:
    """Each item checked alone; returns the items per bucket, how many whole pieces each tensor sent
    in one piece has (must be 1), and the (tensor offset, nbytes) pieces of tensors split across buckets."""
    nb = len(raw["buckets"])
    per_bucket: list[list[dict[str, Any]]] = [[] for _ in range(nb)]
    whole: dict[str, int] = {}
    parts: dict[str, list[tuple[int, int]]] = {}
    sizes = [b["size"] for b in raw["buckets"]]
    safetensors_file = [f["format"] == "safetensors" for f in raw["files"]]
    for it in raw["items"]:
        name, t, b, toff, n = _check_item(it, tensors, sizes, safetensors_file, path)
        per_bucket[b].append(it)
        if toff == 0 and n == t["nbytes"]:
            whole[name] = whole.get(name, 0) + 1
        else:
            parts.setdefault(name, []).append((toff, n))
    return per_bucket, whole, parts


def _check_item(it: Any, tensors: dict[str, dict[str, Any]], sizes: list[int], safetensors_file: list[bool],
                path: str) -> tuple[str, dict[str, Any], int, int, int]:
    """One item's own invariants; (tensor name, tensor, bucket, tensor offset, nbytes)."""
    if type(it) is not dict:
        _fail(path, "malformed item")
    name = it.get("name")
    t = tensors.get(name) if type(name) is str else None
    if t is None or not t["send"]:
        _fail(path, f"item for {name!r} which is not a tensor to send")
    if it.get("dtype") != t["dtype"] or it.get("shape") != t["shape"]:
        _fail(path, f"item for {name!r}: dtype/shape differ from its tensor")
    b, off, n, toff, f = it.get("bucket"), it.get("offset"), it.get("nbytes"), it.get("tensor_offset"), it.get("file")
    if not (type(b) is int and type(off) is int and type(n) is int and type(toff) is int and type(f) is int
            and b >= 0 and off >= 0 and toff >= 0 and f >= 0):
        _fail(path, f"item for {name!r}: bad bucket/offset/nbytes/tensor_offset/file")
    if b >= len(sizes):
        _fail(path, f"item for {name!r} points at bucket {b} of {len(sizes)}")
    if f >= len(safetensors_file):
        _fail(path, f"item for {name!r} points at file {f} of {len(safetensors_file)}")
    if n <= 0 or off + n > sizes[b]:
        _fail(path, f"item for {name!r} lies outside bucket {b} (offset {off} + {n} > {sizes[b]})")
    if safetensors_file[f]:
        fo = it.get("file_offset")
        if type(fo) is not int or fo < 0:
            _fail(path, f"item for {name!r}: bad file_offset")
    return t["name"], t, b, toff, n


def _check_no_overlap(per_bucket: list[list[dict[str, Any]]], path: str) -> None:
    for b, its in enumerate(per_bucket):
        if any(its[i]["offset"] > its[i + 1]["offset"] for i in range(len(its) - 1)):
            its.sort(key=lambda i: i["offset"])
        end = 0
        for i, it in enumerate(its):
            if it["offset"] < end:
                _fail(path, f"bucket {b}: items {its[i - 1]['name']!r} and {it['name']!r} overlap at offset {it['offset']}")
            end = it["offset"] + it["nbytes"]


def _check_coverage(tensors: dict[str, dict[str, Any]], whole: dict[str, int],
                    parts: dict[str, list[tuple[int, int]]], path: str) -> None:
    """Every tensor to send is covered exactly once: one whole piece, or parts without gap or overlap."""
    for name, t in tensors.items():
        if not t["send"] or t["nbytes"] == 0:
            continue
        w, pieces = whole.get(name, 0), parts.get(name)
        if w == 1 and not pieces:
            continue
        if w:
            _fail(path, f"tensor {name!r}: pieces overlap (sent whole and in parts, or twice)")
        pos = 0
        for off, n in sorted(pieces or []):
            if off != pos:
                _fail(path, f"tensor {name!r}: pieces overlap or leave a gap at byte {pos}")
            pos += n
        if pos != t["nbytes"]:
            _fail(path, f"tensor {name!r}: pieces cover {pos} of {t['nbytes']} bytes")
