"""Replication plans: schema ``hwtui.plan/1``, the planner, deltas and validation.

A plan is everything a rank needs to move one version of a model, decided once, up front:

- ``tensors``: the complete next version (name, dtype, shape, nbytes, xxh3 checksum, ``send``),
  so a receiver can lay out its staging copy and copy unchanged tensors from what it serves now;
- ``buckets``: id, size, xxh3 of the packed bytes, consumer ranks (``null``: every receiver);
- ``items``: the pieces inside buckets (name, dtype, shape, file, file offset, offset inside the
  tensor, nbytes, bucket, offset inside the bucket). A tensor larger than the room left in a
  bucket is split at the bucket boundary;
- ``deleted``: tensors of the previous version that the next one drops;
- ``digest``: xxh3-128 of the canonical JSON of everything else, so a truncated or edited plan,
  or two ranks holding different plans, is caught before a byte moves.

Layout: the tensors to send are sorted by (file, offset in file) and laid end to end (with
``align`` padding) as one stream cut into buckets of exactly ``bucket_bytes``. Every bucket but the
last is full, so the window bounds memory tightly, and with ``--align 1`` (or tensors already
aligned in the file) a bucket is one contiguous range of a safetensors file, which the source
broadcasts from the page cache without packing. Sorting is the only super-linear step: O(n log n).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from hwtui.core.atomic import atomic_write_text
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.checksum import Streaming, xxh3_hex
from hwtui.engine.replication.weights import (
    DTYPES,
    TensorInfo,
    expected_nbytes,
    file_format,
    load_torch_state,
    open_regular,
    read_capped,
    read_safetensors_header,
    strict_json,
    tensor_bytes,
    torch_tensor_infos,
)

PLAN_SCHEMA = "hwtui.plan/1"
MANIFEST_SCHEMA = "hwtui.manifest/1"
_SAFE_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


# ---------------------------------------------------------------- digest and I/O


def canonical(obj: Any) -> bytes:
    """Compact JSON in the objects' own key order (json.loads keeps it), so re-indenting a plan keeps
    its digest while reordering or editing anything changes it. Sorting keys would cost 1.5x on a
    million items for no gain: hwtui writes every plan in one fixed order."""
    # surrogatepass: a hostile plan may carry a lone surrogate; it must reach validation, not crash here
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def _body_text(plan: dict[str, Any]) -> bytes:
    return canonical({k: v for k, v in plan.items() if k != "digest"})


def plan_digest(plan: dict[str, Any]) -> str:
    try:
        return xxhash.xxh3_128_hexdigest(_body_text(plan))
    except (RecursionError, ValueError, TypeError):
        raise HwtuiError("the plan holds values nested too deeply or not JSON") from None


class PlanDict(dict):
    """A freshly built plan that remembers its JSON text: a million items are encoded once, for
    the digest, and that same text is what gets written."""

    text: str | None = None


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    if isinstance(obj, PlanDict) and obj.text is not None and list(obj)[-1:] == ["digest"]:
        text = obj.text
    elif isinstance(obj, dict) and obj.get("schema") == PLAN_SCHEMA and list(obj)[-1:] == ["digest"]:
        # A plan: its text is the digested body plus the digest; encode the million items once, not twice.
        body = _body_text(obj)
        text = body[:-1].decode() + f',"digest":{json.dumps(obj["digest"])}}}'
    else:
        text = json.dumps(obj, separators=(",", ":"))
    atomic_write_text(path, text + "\n")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_version(v: Any, what: str) -> str:
    if not isinstance(v, str) or not _SAFE_VERSION.match(v):
        raise HwtuiError(f"{what} {v!r} is not a valid version (letters, digits, . _ + -; it names a directory)")
    return v


@contextlib.contextmanager
def _gc_paused():
    """Building or checking a million small dicts triggers the cyclic GC thousands of times, each
    pass walking every dict made so far (a third of the planner's time); none of them are cyclic."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---------------------------------------------------------------- previous manifests


def load_previous(path: str | os.PathLike[str]) -> tuple[str | None, dict[str, tuple[str, list[int], str]]]:
    """Read a manifest (or a previous plan) -> (version, {name: (dtype, shape, checksum)}).

    A manifest with no tensors is the explicit "nothing deployed yet": the plan is a full push.
    """
    raw = _read_json(path, "previous manifest")
    schema = raw.get("schema")
    if schema not in (MANIFEST_SCHEMA, PLAN_SCHEMA):
        raise HwtuiError(f"{path}: not an hwtui manifest or plan (schema {schema!r})")
    tensors = raw.get("tensors")
    if not isinstance(tensors, list):
        raise HwtuiError(f"{path}: 'tensors' must be a list")
    out: dict[str, tuple[str, list[int], str]] = {}
    for t in tensors:
        name = t.get("name") if isinstance(t, dict) else None
        if not (isinstance(name, str) and isinstance(t.get("dtype"), str) and isinstance(t.get("shape"), list)
                and all(_is_int(d) and d >= 0 for d in t["shape"]) and isinstance(t.get("checksum"), str)):
            raise HwtuiError(f"{path}: malformed tensor entry {str(t)[:80]}")
        out[name] = (t["dtype"], list(t["shape"]), t["checksum"])
    version = raw.get("version")
    if out:
        check_version(version, f"{path}: version")
    return (version if out else None), out


MAX_PLAN_BYTES = 2 << 30  # a JSON plan of 1M tensors is ~250 MB; refuse to read anything far beyond that


def _read_json(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    raw = strict_json(read_capped(path, MAX_PLAN_BYTES, what), f"{what} {path}")
    if not isinstance(raw, dict):
        raise HwtuiError(f"{what} {path} is not a JSON object")
    return raw


# ---------------------------------------------------------------- the planner


@dataclass
class SourceTensor:
    file: int
    info: TensorInfo


@dataclass
class PlanInputs:
    files: list[dict[str, Any]]
    tensors: list[SourceTensor]
    reader: Callable[[SourceTensor], Any]  # -> a flat uint8 buffer of the whole tensor
    closers: list[Callable[[], None]] = field(default_factory=list)


def build_plan(inputs: PlanInputs, **kw: Any) -> dict[str, Any]:
    """Lay out the next version into buckets. O(n log n) in the number of tensors."""
    with _gc_paused():
        return _build_plan(inputs, **kw)


def _build_plan(inputs: PlanInputs, *, model: str, version: str | None, bucket_bytes: int, align: int = 1,
               prev: tuple[str | None, dict[str, tuple[str, list[int], str]]] | None = None) -> dict[str, Any]:
    """Lay out the next version into buckets. O(n log n) in the number of tensors."""
    if version is not None:
        check_version(version, "version")
    if bucket_bytes <= 0:
        raise HwtuiError("--bucket-mb must be positive")
    if align <= 0 or align & (align - 1):
        raise HwtuiError(f"--align {align} must be a power of two")
    prev_version, prev_tensors = prev if prev is not None else (None, {})

    order = sorted(inputs.tensors, key=lambda s: (s.file, s.info.file_offset, s.info.name))
    seen: set[str] = set()
    tensors: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    buckets: list[dict[str, Any]] = []
    hasher, fill = Streaming(), 0
    update = hasher.update_fn()

    def close_bucket() -> None:
        nonlocal hasher, fill, update
        buckets.append({"id": len(buckets), "size": fill, "checksum": hasher.hexdigest(), "consumer_ranks": None})
        hasher, fill = Streaming(), 0
        update = hasher.update_fn()

    is_st = [f["format"] == "safetensors" for f in inputs.files]
    reader, hexdigest = inputs.reader, xxhash.xxh3_64_hexdigest
    for src in order:
        info = src.info
        name, nbytes = info.name, info.nbytes
        if name in seen:
            raise HwtuiError(f"tensor {name!r} appears in more than one weight file")
        seen.add(name)
        data = reader(src)
        checksum = hexdigest(data)
        shape = list(info.shape)  # one list shared by the tensor and its items
        old = prev_tensors.get(name)
        send = old is None or old[2] != checksum or old[0] != info.dtype or list(old[1]) != shape
        tensors.append({"name": name, "dtype": info.dtype, "shape": shape, "nbytes": nbytes, "checksum": checksum,
                        "send": send})
        if not send or nbytes == 0:
            continue
        pad = (-fill) % align
        if fill and fill + pad >= bucket_bytes:
            close_bucket()
        elif pad:
            hasher.pad(pad)
            fill += pad
        st_offset = info.file_offset if is_st[src.file] else None
        if fill + nbytes <= bucket_bytes:  # the common case: the whole tensor fits
            items.append({"name": name, "dtype": info.dtype, "shape": shape, "file": src.file, "file_offset": st_offset,
                          "tensor_offset": 0, "nbytes": nbytes, "bucket": len(buckets), "offset": fill})
            update(data)
            fill += nbytes
            continue
        toff = 0
        mv = memoryview(data)
        while toff < nbytes:
            if fill == bucket_bytes:
                close_bucket()
            n = min(nbytes - toff, bucket_bytes - fill)
            items.append({"name": name, "dtype": info.dtype, "shape": shape, "file": src.file,
                          "file_offset": None if st_offset is None else st_offset + toff,
                          "tensor_offset": toff, "nbytes": n, "bucket": len(buckets), "offset": fill})
            update(mv[toff:toff + n])
            fill += n
            toff += n
    if fill:
        close_bucket()
    tensors.sort(key=lambda t: t["name"])
    if version is None:  # content-addressed: the same weights always get the same version
        version = "v" + xxhash.xxh3_64_hexdigest(canonical([[t["name"], t["dtype"], t["shape"], t["checksum"]] for t in tensors]))[:12]
    if prev_version is not None and prev_version == version:
        raise HwtuiError(f"the previous manifest already is version {version!r}; nothing to plan under that name")
    plan = PlanDict({
        "schema": PLAN_SCHEMA,
        "model": model,
        "version": version,
        "prev_version": prev_version,
        "bucket_bytes": bucket_bytes,
        "align": align,
        "total_bytes": sum(b["size"] for b in buckets),
        "model_bytes": sum(t["nbytes"] for t in tensors),
        "files": inputs.files,
        "tensors": tensors,
        "deleted": sorted(set(prev_tensors) - seen),
        "buckets": buckets,
        "items": items,
    })
    body = canonical(plan)
    plan["digest"] = xxhash.xxh3_128_hexdigest(body)
    plan.text = body[:-1].decode() + f',"digest":{json.dumps(plan["digest"])}}}'
    return plan


def open_weight_files(paths: Iterable[str | os.PathLike[str]]) -> PlanInputs:
    """Index the weight files (safetensors headers, or torch state dicts) for the planner."""
    from hwtui.engine.replication.weights import MappedArray

    files: list[dict[str, Any]] = []
    tensors: list[SourceTensor] = []
    views: dict[int, Any] = {}
    closers: list[Callable[[], None]] = []
    for idx, p in enumerate(paths):
        try:
            path = Path(p).resolve()
        except (OSError, ValueError, RuntimeError):
            raise HwtuiError(f"weight file {str(p)[:200]!r} is not a valid path") from None
        fd, st = open_regular(path)  # refuses FIFOs, devices and directories without blocking
        os.close(fd)
        fmt = file_format(path)
        entry: dict[str, Any] = {"path": str(path), "format": fmt, "size": st.st_size}
        if fmt == "safetensors":
            infos, raw_header, _ = read_safetensors_header(path)
            entry["header_xxh3"] = xxh3_hex(raw_header)
            mapped = MappedArray(path)
            closers.append(mapped.close)
            views[idx] = ("mmap", mapped)
        else:
            state = load_torch_state(path)
            infos = torch_tensor_infos(state, str(path))
            views[idx] = ("state", {k: tensor_bytes(v) for k, v in state.items()})
        files.append(entry)
        tensors.extend(SourceTensor(idx, info) for info in infos)

    def reader(src: SourceTensor) -> Any:
        kind, obj = views[src.file]
        if kind == "mmap":
            return obj.array[src.info.file_offset:src.info.file_offset + src.info.nbytes]
        return obj[src.info.name].numpy()

    return PlanInputs(files, tensors, reader, closers)


def build_plan_from_files(paths: list[str], *, model: str | None, version: str | None, bucket_bytes: int, align: int = 1,
                          prev_path: str | None = None) -> dict[str, Any]:
    prev = load_previous(prev_path) if prev_path else None
    inputs = open_weight_files(paths)
    try:
        return build_plan(inputs, model=model or Path(paths[0]).stem, version=version, bucket_bytes=bucket_bytes,
                          align=align, prev=prev)
    finally:
        for close in inputs.closers:
            close()


def manifest_of(plan: dict[str, Any], plan_digest_: str | None = None) -> dict[str, Any]:
    """The manifest of the version a plan produces: the input of the next delta plan."""
    return {"schema": MANIFEST_SCHEMA, "model": plan["model"], "version": plan["version"],
            "plan_digest": plan_digest_ or plan.get("digest"),
            "tensors": [{k: t[k] for k in ("name", "dtype", "shape", "nbytes", "checksum")} for t in plan["tensors"]]}


# ---------------------------------------------------------------- validation


@dataclass
class Plan:
    """A validated plan plus the indexes the workers need."""

    raw: dict[str, Any]
    path: str
    bucket_items: list[list[dict[str, Any]]]  # items per bucket, by offset

    @property
    def digest(self) -> str:
        return self.raw["digest"]

    @property
    def buckets(self) -> list[dict[str, Any]]:
        return self.raw["buckets"]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]


def _need(cond: bool, path: str, msg: str) -> None:
    if not cond:
        raise HwtuiError(f"plan {path}: {msg}")


def _fail(path: str, msg: str) -> None:
    raise HwtuiError(f"plan {path}: {msg}")


def validate_plan(raw: dict[str, Any], path: str = "<plan>") -> Plan:
    with _gc_paused():
        return _validate_plan(raw, path)


def _validate_plan(raw: dict[str, Any], path: str = "<plan>") -> Plan:
    """Check every invariant a worker relies on; one line naming the first violation.

    Linear in the number of items plus a sort per bucket; the hot loops test conditions inline and
    only format a message on failure (a million items validate in seconds).
    """
    _need(raw.get("schema") == PLAN_SCHEMA, path, f"schema is {raw.get('schema')!r}, expected {PLAN_SCHEMA!r}")
    for key, kind in (("model", str), ("version", str), ("bucket_bytes", int), ("align", int), ("total_bytes", int),
                      ("files", list), ("tensors", list), ("deleted", list), ("buckets", list), ("items", list),
                      ("digest", str)):
        _need(isinstance(raw.get(key), kind) and not isinstance(raw.get(key), bool), path,
              f"missing or mistyped field {key!r} (expected {kind.__name__})")
    check_version(raw["version"], f"plan {path}: version")
    if raw.get("prev_version") is not None:
        check_version(raw["prev_version"], f"plan {path}: prev_version")
    _need(raw["bucket_bytes"] > 0, path, "bucket_bytes must be positive")
    for i, f in enumerate(raw["files"]):
        _need(isinstance(f, dict) and isinstance(f.get("path"), str) and f.get("format") in ("safetensors", "torch")
              and _is_int(f.get("size")), path, f"file entry {i} is malformed")

    tensors: dict[str, dict[str, Any]] = {}
    hex16 = _HEX16.match
    for t in raw["tensors"]:
        if not (isinstance(t, dict) and isinstance(t.get("name"), str)):
            _fail(path, f"malformed tensor entry {str(t)[:60]}")
        name, dtype, shape = t["name"], t.get("dtype"), t.get("shape")
        if name in tensors:
            _fail(path, f"tensor {name!r} listed twice")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            _fail(path, f"tensor {name[:80]!r} has unknown dtype {str(dtype)[:40]!r}")
        if not (isinstance(shape, list) and len(shape) <= 64 and all(_is_int(d) and d >= 0 for d in shape)):
            _fail(path, f"tensor {name!r} has a bad shape")
        if t.get("nbytes") != expected_nbytes(dtype, shape):
            _fail(path, f"tensor {name!r}: nbytes {t.get('nbytes')} does not match {dtype}{shape}")
        ck = t.get("checksum")
        if not (isinstance(ck, str) and hex16(ck)):
            _fail(path, f"tensor {name!r} has a bad checksum")
        if not isinstance(t.get("send"), bool):
            _fail(path, f"tensor {name!r} lacks 'send'")
        tensors[name] = t
    for name in raw["deleted"]:
        _need(isinstance(name, str) and name not in tensors, path, f"deleted tensor {name!r} is also in the next version")

    nb = len(raw["buckets"])
    for i, b in enumerate(raw["buckets"]):
        _need(isinstance(b, dict) and b.get("id") == i, path, f"bucket ids must be 0..{nb - 1} in order (entry {i})")
        _need(_is_int(b.get("size")) and 0 < b["size"] <= raw["bucket_bytes"], path, f"bucket {i} has a bad size")
        _need(isinstance(b.get("checksum"), str) and bool(_HEX16.match(b["checksum"])), path, f"bucket {i} has a bad checksum")
        cr = b.get("consumer_ranks")
        _need(cr is None or (isinstance(cr, list) and all(_is_int(r) and r >= 0 for r in cr)), path,
              f"bucket {i} has bad consumer_ranks")
    _need(raw["total_bytes"] == sum(b["size"] for b in raw["buckets"]), path, "total_bytes is not the sum of the bucket sizes")

    per_bucket: list[list[dict[str, Any]]] = [[] for _ in range(nb)]
    whole: dict[str, int] = {}  # tensors sent as one piece: how many such pieces (must be 1)
    parts: dict[str, list[tuple[int, int]]] = {}  # tensors split across buckets: their pieces
    sizes = [b["size"] for b in raw["buckets"]]
    safetensors_file = [f["format"] == "safetensors" for f in raw["files"]]
    nfiles = len(safetensors_file)
    for it in raw["items"]:
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
        if b >= nb:
            _fail(path, f"item for {name!r} points at bucket {b} of {nb}")
        if f >= nfiles:
            _fail(path, f"item for {name!r} points at file {f} of {nfiles}")
        if n <= 0 or off + n > sizes[b]:
            _fail(path, f"item for {name!r} lies outside bucket {b} (offset {off} + {n} > {sizes[b]})")
        if safetensors_file[f]:
            fo = it.get("file_offset")
            if type(fo) is not int or fo < 0:
                _fail(path, f"item for {name!r}: bad file_offset")
        per_bucket[b].append(it)
        if toff == 0 and n == t["nbytes"]:
            whole[name] = whole.get(name, 0) + 1
        else:
            parts.setdefault(name, []).append((toff, n))
    for b, its in enumerate(per_bucket):
        if any(its[i]["offset"] > its[i + 1]["offset"] for i in range(len(its) - 1)):
            its.sort(key=lambda i: i["offset"])
        end = 0
        for i, it in enumerate(its):
            if it["offset"] < end:
                _fail(path, f"bucket {b}: items {its[i - 1]['name']!r} and {it['name']!r} overlap at offset {it['offset']}")
            end = it["offset"] + it["nbytes"]
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
    _need(plan_digest(raw) == raw["digest"], path, "digest mismatch: the plan was edited or truncated after planning")
    return Plan(raw, path, per_bucket)


def load_plan(path: str | os.PathLike[str]) -> Plan:
    with _gc_paused():
        return validate_plan(_read_json(path, "plan"), str(path))


def preflight_sources(plan: Plan) -> None:
    """The source's weight files must be the ones planned: present, same size, same header.

    Content changes that keep size and header are caught when the source hashes each bucket
    before sending it (a mismatch names the bucket and stops the run before any commit).
    """
    for f in plan["files"]:
        p = Path(f["path"])
        try:
            fd, st = open_regular(p)
        except HwtuiError as exc:
            raise HwtuiError(f"{exc} (named by the plan)") from None
        os.close(fd)
        size = st.st_size
        if size != f["size"]:
            raise HwtuiError(f"weight file {p} changed since planning: {size} bytes, plan says {f['size']}")
        if f["format"] == "safetensors":
            _, raw_header, _ = read_safetensors_header(p)
            if xxh3_hex(raw_header) != f.get("header_xxh3"):
                raise HwtuiError(f"weight file {p} changed since planning: its safetensors header differs")
