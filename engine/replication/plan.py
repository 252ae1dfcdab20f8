"""Replication plans: the planner, deltas, validation and the :class:`Plan` every rank reads.

A plan is everything a rank needs to move one version of a model, decided once, up front:

- tensors: the complete next version (name, dtype, shape, nbytes, xxh3 checksum, ``send``, and
  where it lies in its source file), so a receiver can lay out its copy and copy unchanged tensors
  from what it serves now;
- buckets: size and xxh3 of the packed bytes;
- items: the pieces inside buckets (tensor, offset inside the tensor, nbytes, bucket, offset
  inside the bucket). A tensor larger than the room left in a bucket is split at the boundary;
- deleted: tensors of the previous version that the next one drops;
- the source files, with each safetensors file's exact header bytes (so a replica can be
  byte-identical to its source);
- digest: over all of it (see plan_format.py), so a truncated or edited plan, or two ranks holding
  different plans, is caught before a byte moves.

Layout: the tensors to send are sorted by (file, offset in file) and laid end to end (with
``align`` padding) as one stream cut into buckets of exactly ``bucket_bytes``. Every bucket but the
last is full, so the window bounds memory tightly, and with ``--align 1`` (or tensors already
aligned in the file) a bucket is one contiguous range of a safetensors file, which the source
broadcasts from the page cache without packing. Sorting is the only super-linear step.

Safetensors headers are read by ``st_header.py``: the regular form every writer produces is scanned
as a byte array (no dict, no str per tensor; names sort as fixed-width byte rows), anything else goes
to the general reader in ``weights.py``, which words every error. Tensors of at most 16 bytes are
hashed column-wise (``xxh3_small.py``).

Tables are numpy columns, not a million dicts: the planner fills them in one pass, the
coordinator validates them with vectorised checks, a rank maps them and checks the digest. The
dict views (``plan["tensors"]``, ``plan.bucket_items[b]``) are built on first use.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from hwtui.core.atomic import atomic_open, atomic_write_text
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication import plan_format, st_header, xxh3_small
from hwtui.engine.replication.checksum import Streaming, xxh3_hex
from hwtui.engine.replication.plan_legacy import PLAN_SCHEMA as PLAN_SCHEMA_V1
from hwtui.engine.replication.plan_legacy import canonical, check_version, validate_v1
from hwtui.engine.replication.plan_legacy import plan_digest as _v1_digest
from hwtui.engine.replication.weights import (
    DTYPE_NAMES,
    DTYPES,
    TensorInfo,
    file_format,
    load_torch_state,
    open_regular,
    read_capped,
    strict_json,
    tensor_bytes,
    torch_tensor_infos,
)

PLAN_SCHEMA = plan_format.PLAN_SCHEMA_V2
MANIFEST_SCHEMA = "hwtui.manifest/1"
MAX_JSON_BYTES = 2 << 30  # a JSON plan of 1M tensors is ~250 MB; refuse to read anything far beyond that
MAX_DIMS = 64
_DTYPE_NAMES = DTYPE_NAMES  # a tensor's dtype code indexes this list; the plan header carries it
_DTYPE_CODE = {d: i for i, d in enumerate(_DTYPE_NAMES)}

__all__ = ["MANIFEST_SCHEMA", "PLAN_SCHEMA", "Plan", "PlanInputs", "SourceTensor", "build_plan", "build_plan_from_files",
           "canonical", "check_version", "load_plan", "load_previous", "manifest_of", "open_weight_files",
           "plan_digest", "preflight_sources", "validate_plan", "write_json_atomic", "write_plan"]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Building a million small objects triggers the cyclic GC thousands of times, each pass walking
    everything made so far; none of them are cyclic."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---------------------------------------------------------------- the tables


@dataclass
class Tables:
    """The plan's columns. Tensors are sorted by name; items by (bucket, offset)."""

    names: list[str]
    dtype: np.ndarray  # u1: index into the plan's dtype list
    shape_end: np.ndarray  # i8: dims[shape_end[k-1]:shape_end[k]] is tensor k's shape
    dims: np.ndarray  # i8
    nbytes: np.ndarray  # i8
    checksum: np.ndarray  # u8: xxh3-64 of the tensor's bytes
    send: np.ndarray  # u1
    file: np.ndarray  # i4: source file index (-1: unknown, plans converted from hwtui.plan/1)
    file_offset: np.ndarray  # i8: absolute byte offset in a safetensors source file, else -1
    b_size: np.ndarray  # i8
    b_checksum: np.ndarray  # u8
    i_tensor: np.ndarray  # i8: index into the tensors
    i_tensor_offset: np.ndarray  # i8
    i_nbytes: np.ndarray  # i8
    i_bucket: np.ndarray  # i8
    i_offset: np.ndarray  # i8: offset inside the bucket

    def shape(self, k: int) -> list[int]:
        dims: list[int] = self.dims[(self.shape_end[k - 1] if k else 0):self.shape_end[k]].tolist()
        return dims


_TENSOR_SECTIONS = ("dtype", "shape_end", "nbytes", "checksum", "send", "file", "file_offset")
_ITEM_SECTIONS = ("i_tensor", "i_tensor_offset", "i_nbytes", "i_bucket", "i_offset")
_SECTION_DTYPES = {"dtype": np.uint8, "shape_end": np.int64, "dims": np.int64, "nbytes": np.int64,
                   "checksum": np.uint64, "send": np.uint8, "file": np.int32, "file_offset": np.int64,
                   "b_size": np.int64, "b_checksum": np.uint64, "i_tensor": np.int64, "i_tensor_offset": np.int64,
                   "i_nbytes": np.int64, "i_bucket": np.int64, "i_offset": np.int64}


def _hex(v: int) -> str:
    return f"{v:016x}"


class _BucketItems(Sequence[list[dict[str, Any]]]):
    """``plan.bucket_items[b]``: the item dicts of bucket b, by offset, built the first time b is read."""

    def __init__(self, plan: Plan):
        self._plan = plan
        t = plan.tables
        self._bounds = np.searchsorted(t.i_bucket, np.arange(len(t.b_size) + 1)).tolist()
        self._cache: dict[int, list[dict[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def __getitem__(self, b: Any) -> Any:
        if isinstance(b, slice):
            return [self[i] for i in range(*b.indices(len(self)))]
        if b < 0:
            b += len(self)
        if not 0 <= b < len(self):
            raise IndexError(b)
        got = self._cache.get(b)
        if got is None:
            got = self._cache[b] = self._plan._items(self._bounds[b], self._bounds[b + 1])
        return got


class _LazyRaw(dict[str, Any]):
    def __init__(self, plan: Plan):
        super().__init__(schema=PLAN_SCHEMA, **plan.meta, digest=plan.digest)
        self._plan = plan

    def __missing__(self, key: str) -> Any:
        if key in ("tensors", "buckets", "items"):
            self[key] = self._plan[key]
            return self[key]
        raise KeyError(key)


class Plan:
    """A plan: header facts, the tables, the digest, and dict views built on demand.

    ``plan[key]`` answers the header fields (model, version, prev_version, bucket_bytes, align,
    total_bytes, model_bytes, files, deleted, digest, schema) and, built once on first use,
    ``tensors`` / ``buckets`` / ``items`` as lists of dicts in the ``hwtui.plan/1`` shape.
    """

    def __init__(self, meta: dict[str, Any], tables: Tables, digest: str, path: str = "<plan>",
                 source_headers: dict[int, Any] | None = None):
        self.meta, self.tables, self._digest, self.path = meta, tables, digest, path
        self.source_headers = source_headers or {}
        self._views: dict[str, Any] = {}
        self._bucket_items: _BucketItems | None = None
        self._encoded: tuple[list[Any], str] | None = None
        self._name_sections: tuple[np.ndarray, np.ndarray] | None = None  # (name_text, name_end) when known

    # -- the API the worker and launcher use
    @property
    def digest(self) -> str:
        return self._digest

    @property
    def raw(self) -> dict[str, Any]:
        """The plan as a dict, for callers of the old dict-backed Plan (reports, manifests): the header
        fields are in it; ``tensors`` / ``buckets`` / ``items`` are built when first indexed."""
        return _LazyRaw(self)

    @property
    def buckets(self) -> list[dict[str, Any]]:
        buckets: list[dict[str, Any]] = self["buckets"]
        return buckets

    @property
    def bucket_items(self) -> _BucketItems:
        if self._bucket_items is None:
            self._bucket_items = _BucketItems(self)
        return self._bucket_items

    def __getitem__(self, key: str) -> Any:
        if key == "digest":
            return self._digest
        if key == "schema":
            return PLAN_SCHEMA
        if key in ("tensors", "buckets", "items"):
            if key not in self._views:
                with _gc_paused():
                    self._views[key] = getattr(self, f"_build_{key}")()
            return self._views[key]
        return self.meta[key]

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return key in ("digest", "schema", "tensors", "buckets", "items") or key in self.meta

    # -- faithful replicas
    def source_header(self, file: int) -> bytes:
        """The exact header bytes (without the 8-byte length) of safetensors source file ``file``."""
        raw = self.source_headers.get(file)
        if raw is None:
            raise HwtuiError(f"plan {self.path}: file {file} is not a safetensors file with a recorded header")
        return bytes(raw)

    def replica_layout(self, file: int) -> tuple[bytes, dict[str, tuple[int, int]]]:
        """(8-byte length + exact header, {tensor name: (absolute offset, nbytes)}) of source file
        ``file``: writing each tensor's bytes at its offset after that prefix gives a file
        byte-identical to the source (same header, same ``__metadata__``, same data offsets)."""
        raw = self.source_header(file)
        t = self.tables
        mine = np.nonzero(t.file == file)[0]
        offs, sizes = t.file_offset[mine].tolist(), t.nbytes[mine].tolist()
        layout = {t.names[k]: (offs[j], sizes[j]) for j, k in enumerate(mine.tolist())}
        return len(raw).to_bytes(8, "little") + raw, layout

    # -- dict views
    def _build_tensors(self) -> list[dict[str, Any]]:
        t, names = self.tables, self.tables.names
        dn = self.meta["dtypes"]
        dtypes, nbytes, cks, send = t.dtype.tolist(), t.nbytes.tolist(), t.checksum.tolist(), t.send.tolist()
        ends, dims = t.shape_end.tolist(), t.dims.tolist()
        out, start = [], 0
        for k in range(len(names)):
            out.append({"name": names[k], "dtype": dn[dtypes[k]], "shape": dims[start:ends[k]], "nbytes": nbytes[k],
                        "checksum": _hex(cks[k]), "send": bool(send[k])})
            start = ends[k]
        return out

    def _build_buckets(self) -> list[dict[str, Any]]:
        return [{"id": b, "size": size, "checksum": _hex(ck), "consumer_ranks": None}
                for b, (size, ck) in enumerate(zip(self.tables.b_size.tolist(), self.tables.b_checksum.tolist(),
                                                   strict=True))]

    def _build_items(self) -> list[dict[str, Any]]:
        return self._items(0, len(self.tables.i_tensor))

    def _items(self, lo: int, hi: int) -> list[dict[str, Any]]:
        t, dn, files = self.tables, self.meta["dtypes"], self.meta["files"]
        out = []
        for k, toff, n, b, off in zip(t.i_tensor[lo:hi].tolist(), t.i_tensor_offset[lo:hi].tolist(),
                                      t.i_nbytes[lo:hi].tolist(), t.i_bucket[lo:hi].tolist(),
                                      t.i_offset[lo:hi].tolist(), strict=True):
            f = int(t.file[k])
            fo = int(t.file_offset[k])
            st = f >= 0 and files[f]["format"] == "safetensors" and fo >= 0
            out.append({"name": t.names[k], "dtype": dn[int(t.dtype[k])], "shape": t.shape(k), "file": f,
                        "file_offset": fo + toff if st else None, "tensor_offset": toff, "nbytes": n, "bucket": b,
                        "offset": off})
        return out

    # -- serialisation
    def to_v1(self) -> dict[str, Any]:
        """The plan as an ``hwtui.plan/1`` object (with its v1 digest): for tools and tests that edit plans."""
        raw: dict[str, Any] = {"schema": PLAN_SCHEMA_V1}
        raw.update({k: self.meta[k] for k in ("model", "version", "prev_version", "bucket_bytes", "align",
                                               "total_bytes", "model_bytes", "files")})
        raw.update(tensors=self["tensors"], deleted=self.meta["deleted"], buckets=self["buckets"], items=self["items"])
        raw["digest"] = _v1_digest(raw)
        return raw

    def sections(self) -> dict[str, np.ndarray]:
        t = self.tables
        if self._name_sections is not None:
            name_text, name_end = self._name_sections
        else:
            text = "".join(t.names).encode("utf-8", "surrogatepass")
            name_text = np.frombuffer(text, dtype=np.uint8)
            name_end = np.cumsum(np.fromiter(map(len, t.names), dtype=np.int64, count=len(t.names)))
        out: dict[str, np.ndarray] = {"name_text": name_text, "name_end": name_end}
        for key in _SECTION_DTYPES:
            out[key] = getattr(t, key)
        for f, raw in sorted(self.source_headers.items()):
            out[f"header.{f}"] = np.frombuffer(bytes(raw), dtype=np.uint8)
        return out


def _meta_for_file(meta: dict[str, Any]) -> dict[str, Any]:
    return {"schema": PLAN_SCHEMA, **meta}


# ---------------------------------------------------------------- digest and I/O


def plan_digest(plan: Plan | dict[str, Any]) -> str:
    """The digest of a plan (a Plan's own, or that of an ``hwtui.plan/1`` dict)."""
    if isinstance(plan, Plan):
        return plan.digest
    return _v1_digest(plan)


def _encode(plan: Plan) -> tuple[list[Any], str]:
    return plan_format.encode(_meta_for_file(plan.meta), plan.sections())


def write_plan(path: str | os.PathLike[str], plan: Plan) -> None:
    """Write a plan file (``hwtui.plan/2``) atomically."""
    # A freshly built plan keeps the parts its digest was computed over (views of its tables, not
    # copies): writing them needs no second encoding pass.
    parts, digest = plan._encoded or _encode(plan)
    plan_format.write_parts(path, parts)
    if digest != plan.digest:  # the digest is a function of exactly these bytes; anything else is a bug
        raise HwtuiError(f"internal: plan digest changed while writing {path}", exit_code=3)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write a manifest (or any JSON object) atomically; a :class:`Plan` is written as a plan file."""
    if isinstance(obj, Plan):
        write_plan(path, obj)
        return
    if isinstance(obj, _PlanManifest) and not obj.materialised:
        with atomic_open(path, "wb") as fh:
            obj.write(fh)
        return
    atomic_write_text(path, json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n")


def _read_json(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    raw = strict_json(read_capped(path, MAX_JSON_BYTES, what), f"{what} {path}")
    if not isinstance(raw, dict):
        raise HwtuiError(f"{what} {path} is not a JSON object")
    return raw


# ---------------------------------------------------------------- previous manifests


def load_previous(path: str | os.PathLike[str]) -> tuple[str | None, dict[str, tuple[str, list[int], str]]]:
    """Read a manifest (or a previous plan) -> (version, {name: (dtype, shape, checksum)}).

    A manifest with no tensors is the explicit "nothing deployed yet": the plan is a full push.
    """
    if plan_format.is_v2(path):
        plan = load_plan(path)
        return plan["version"], {t["name"]: (t["dtype"], t["shape"], t["checksum"]) for t in plan["tensors"]}
    raw = _read_json(path, "previous manifest")
    schema = raw.get("schema")
    if schema not in (MANIFEST_SCHEMA, PLAN_SCHEMA_V1):
        raise HwtuiError(f"{path}: not an hwtui manifest or plan (schema {str(schema)[:40]!r})")
    tensors = raw.get("tensors")
    if not isinstance(tensors, list):
        raise HwtuiError(f"{path}: 'tensors' must be a list")
    out: dict[str, tuple[str, list[int], str]] = {}
    for t in tensors:
        name = t.get("name") if isinstance(t, dict) else None
        if not (isinstance(name, str) and isinstance(t.get("dtype"), str) and isinstance(t.get("shape"), list)
                and all(type(d) is int and d >= 0 for d in t["shape"]) and isinstance(t.get("checksum"), str)):
            raise HwtuiError(f"{path}: malformed tensor entry {str(t)[:80]}")
        out[name] = (t["dtype"], list(t["shape"]), t["checksum"])
    version = raw.get("version")
    if out:
        check_version(version, f"{path}: version")
    return (version if out else None), out


# ---------------------------------------------------------------- the planner


@dataclass
class SourceTensor:
    file: int
    info: TensorInfo


@dataclass
class Columns:
    """Source tensors as columns (what the planner reads; no Python object per tensor but its name)."""

    name: list[str] | None = field(default_factory=list)  # None: the names are the rows of sort_keys
    file: Any = None  # np.int64
    dtype: Any = None  # np.uint8 codes into DTYPE_NAMES
    ndims: Any = None  # np.int64
    dims: Any = None  # np.int64, all shapes end to end
    nbytes: Any = None  # np.int64
    offset: Any = None  # np.int64: absolute offset in a safetensors file; 0 for torch files
    sort_keys: Any = None  # (n, 8k) uint8: each name's UTF-8 bytes zero-padded (st_header.name_keys), or None
    name_order: Any = None  # the order that sorts sort_keys, when known

    @staticmethod
    def of(file: int, infos: Iterable[TensorInfo]) -> Columns:
        infos = list(infos)
        return Columns(
            name=[i.name for i in infos], file=np.full(len(infos), file, dtype=np.int64),
            dtype=np.asarray([_DTYPE_CODE[i.dtype] for i in infos], dtype=np.uint8),
            ndims=np.asarray([len(i.shape) for i in infos], dtype=np.int64),
            dims=np.asarray([d for i in infos for d in i.shape], dtype=np.int64),
            nbytes=np.asarray([i.nbytes for i in infos], dtype=np.int64),
            offset=np.asarray([i.file_offset for i in infos], dtype=np.int64))

    def names(self) -> list[str]:
        """The names in source order (decoded from the key rows when only those were read)."""
        if self.name is None:
            self.name = st_header.sorted_names(self.sort_keys, np.arange(len(self.sort_keys)))[0]
        return self.name

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        if not parts:
            return Columns.of(0, [])
        cat = np.concatenate
        keys = None
        if all(p.sort_keys is not None for p in parts):
            width = max(p.sort_keys.shape[1] for p in parts)
            keys = cat([np.pad(p.sort_keys, ((0, 0), (0, width - p.sort_keys.shape[1]))) for p in parts])
        return Columns(name=[n for p in parts for n in p.names()], file=cat([p.file for p in parts]),
                       dtype=cat([p.dtype for p in parts]), ndims=cat([p.ndims for p in parts]),
                       dims=cat([p.dims for p in parts]), nbytes=cat([p.nbytes for p in parts]),
                       offset=cat([p.offset for p in parts]), sort_keys=keys)


@dataclass
class PlanInputs:
    files: list[dict[str, Any]]
    tensors: list[SourceTensor]
    reader: Callable[[SourceTensor], Any]  # -> a flat uint8 buffer of the whole tensor
    closers: list[Callable[[], None]] = field(default_factory=list)
    columns: Columns | None = None  # the fast path: set by open_weight_files, tensors then stays empty
    buffers: dict[int, Any] = field(default_factory=dict)  # file -> memoryview of the whole file (safetensors)
    by_name: dict[int, dict[str, Any]] = field(default_factory=dict)  # file -> {name: uint8 buffer} (torch)
    source_headers: dict[int, bytes] = field(default_factory=dict)  # file -> exact safetensors header bytes


# Planning reports its hashing about every 64 MiB: often enough for a bar to move several times a
# second, rarely enough that the event costs nothing beside the hashing (~1 per 20 ms at 3 GB/s).
PROGRESS_STEP = 64 << 20


class _Meter:
    """Bytes hashed so far, as :class:`PlanProgress` events (none without a sink): over both
    passes, and within the pass under way (which starts where the one before it ended)."""

    def __init__(self, on_event: Callable[[Any], None] | None, total: int, first_pass: int):
        self.on_event, self.total, self.done = on_event, total, 0
        self.t0 = time.perf_counter()
        self._next = 0
        self.phase: str | None = None
        self.pass_at, self.pass_bytes = 0, first_pass

    def add(self, phase: str, nbytes: int, total: int | None = None) -> None:
        if self.on_event is None:
            return
        from hwtui.engine.replication.events import PlanProgress

        if phase != self.phase:
            if self.phase is not None:
                self.pass_at = self.done
            self.phase = phase
        self.done += nbytes
        if total is not None:
            self.total = total
            self.pass_bytes = total - self.pass_at
        done_here = self.done - self.pass_at
        # Also when a pass ends: its line then says all of it ("268.4 MB/268.4 MB"), not the last step.
        if self.done >= self._next or self.done >= self.total or (nbytes and done_here >= self.pass_bytes):
            self._next = self.done + PROGRESS_STEP
            self.on_event(PlanProgress(phase=phase, bytes_done=self.done, total_bytes=max(self.total, self.done),
                                       elapsed_s=round(time.perf_counter() - self.t0, 6), pass_done=done_here,
                                       pass_bytes=max(self.pass_bytes, done_here)))


def _steps(nbytes: np.ndarray) -> list[tuple[int, int]]:
    """Cut a run of tensors into [lo, hi) slices of about PROGRESS_STEP bytes each (a big tensor is one slice)."""
    if not len(nbytes):
        return []
    ends = np.cumsum(nbytes)
    cuts = np.searchsorted(ends, np.arange(PROGRESS_STEP, int(ends[-1]), PROGRESS_STEP), side="right")
    bounds = [0, *dict.fromkeys(int(c) for c in cuts if 0 < c < len(nbytes)), len(nbytes)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def build_plan(inputs: PlanInputs, **kw: Any) -> Plan:
    """Lay out the next version into buckets. O(n log n) in the number of tensors."""
    with _gc_paused():
        return _build_plan(inputs, **kw)


def _columns(inputs: PlanInputs) -> tuple[Columns, Callable[[int], Any]]:
    if inputs.columns is not None:
        cols = inputs.columns
        files = cols.file

        def fetch(k: int) -> Any:  # torch files only, whose names are always read
            return inputs.by_name[int(files[k])][cols.names()[k]]

        return cols, fetch
    by_file: dict[int, list[TensorInfo]] = {}
    for s in inputs.tensors:
        by_file.setdefault(s.file, []).append(s.info)
    srcs, reader = inputs.tensors, inputs.reader
    cols = Columns.concat([Columns.of(f, infos) for f, infos in by_file.items()])
    # keep the callers' SourceTensor order behind the concatenated columns
    flat = [s for f in by_file for s in inputs.tensors if s.file == f] if len(by_file) > 1 else srcs
    return cols, lambda k: reader(flat[k])


def _sort_names(cols: Columns) -> tuple[np.ndarray, list[str], tuple[np.ndarray, np.ndarray] | None]:
    """(source indexes in name order, the names in that order, their name_text / name_end sections
    when known); a name twice is refused."""
    keys = cols.sort_keys if cols.sort_keys is not None else st_header.name_keys(cols.names())
    if keys is None:  # a name over 256 bytes or with a NUL: compare the strings themselves
        names = cols.names()
        perm = np.asarray(sorted(range(len(names)), key=names.__getitem__), dtype=np.int64)
        ordered = list(map(names.__getitem__, perm.tolist()))
        dup = next((i for i in range(1, len(ordered)) if ordered[i] == ordered[i - 1]), None)
        if dup is not None:
            raise HwtuiError(f"tensor {ordered[dup][:80]!r} appears in more than one weight file")
        return perm, ordered, None
    # Fixed-width byte rows sort without touching a million scattered str objects.
    if cols.name_order is not None:  # one safetensors file read the fast way: sorted, no name twice
        perm, dup = cols.name_order, None
    else:
        perm = st_header.sort_order(keys)
        dup = st_header.first_duplicate(keys, perm)
    if dup is not None:
        name = st_header.sorted_names(keys, np.asarray([dup]))[0][0]
        raise HwtuiError(f"tensor {name[:80]!r} appears in more than one weight file")
    ordered, text, ends = st_header.sorted_names(keys, perm)
    return perm, ordered, (text, ends)


def _build_plan(inputs: PlanInputs, *, model: str, version: str | None, bucket_bytes: int, align: int = 1,
                prev: tuple[str | None, dict[str, tuple[str, list[int], str]]] | None = None,
                on_event: Callable[[Any], None] | None = None) -> Plan:
    _check_build_args(version, bucket_bytes, align)
    prev_version, prev_tensors = prev if prev is not None else (None, {})
    cols, fetch = _columns(inputs)
    n_tensors = len(cols.nbytes)

    perm, sorted_names, name_sections = _sort_names(cols)
    rank = np.empty(n_tensors, dtype=np.int64)
    rank[perm] = np.arange(n_tensors, dtype=np.int64)
    file_arr, off_arr, nb_arr = cols.file, cols.offset, cols.nbytes
    if n_tensors and (file_arr[1:] == file_arr[0]).all() and (off_arr[1:] > off_arr[:-1]).all():
        order = np.arange(n_tensors, dtype=np.int64)  # one file, already by offset: the usual header order
    else:
        order = np.lexsort((rank, off_arr, file_arr))  # stream order: (file, offset, name)

    # Every tensor's checksum, in stream order (sequential reads of the page cache). Pass two (the
    # buckets) reads what is sent again: until the layout is known, assume everything is.
    meter = _Meter(on_event, 2 * int(nb_arr.sum()), int(nb_arr.sum()))
    meter.add("tensors", 0)
    is_st = [f["format"] == "safetensors" for f in inputs.files]
    checksum = _tensor_checksums(inputs, cols, fetch, order, is_st, meter, progress=on_event is not None)
    send = _to_send(cols, checksum, perm, sorted_names, prev_tensors)
    stream = order[send[order] & (nb_arr[order] > 0)]  # what travels, in order

    if align == 1:
        layout = _layout_contiguous(stream, nb_arr, bucket_bytes)
    else:
        layout = _layout_aligned(stream, nb_arr, bucket_bytes, align)
    i_src, i_toff, i_n, i_b, i_off, b_size = layout
    meter.add("buckets", 0, total=meter.done + int(b_size.sum()))  # now the second pass is known exactly
    b_ck = _bucket_checksums(inputs, fetch, is_st, file_arr, off_arr, i_src, i_toff, i_n, i_b, i_off, b_size, meter)

    tables = Tables(**_tensor_columns(cols, perm, sorted_names, checksum, send, is_st), b_size=b_size, b_checksum=b_ck,
                    i_tensor=rank[i_src], i_tensor_offset=i_toff, i_nbytes=i_n, i_bucket=i_b, i_offset=i_off)
    if version is None:  # content-addressed: the same weights always get the same version
        version = _content_version(tables)
    if prev_version is not None and prev_version == version:
        raise HwtuiError(f"the previous manifest already is version {version!r}; nothing to plan under that name")
    meta = {
        "model": model, "version": version, "prev_version": prev_version, "bucket_bytes": bucket_bytes,
        "align": align, "total_bytes": int(b_size.sum()), "model_bytes": int(nb_arr.sum()),
        "dtypes": _DTYPE_NAMES, "files": inputs.files, "deleted": sorted(set(prev_tensors) - set(sorted_names)) if prev_tensors else [],
        "counts": {"tensors": n_tensors, "buckets": len(b_size), "items": len(i_src)},
    }
    plan = Plan(meta, tables, "", "<new plan>", dict(inputs.source_headers))
    plan._name_sections = name_sections
    plan._encoded = _encode(plan)
    plan._digest = plan._encoded[1]
    return plan


def _check_build_args(version: str | None, bucket_bytes: int, align: int) -> None:
    if version is not None:
        check_version(version, "version")
    if type(bucket_bytes) is not int or bucket_bytes <= 0:
        raise HwtuiError("--bucket-mb must be positive")
    if type(align) is not int or align <= 0 or align & (align - 1) or align > 1 << 30:
        raise HwtuiError(f"--align {align} must be a power of two (at most 1 GiB)")


def _tensor_checksums(inputs: PlanInputs, cols: Columns, fetch: Callable[[int], Any], order: np.ndarray,
                      is_st: list[bool], meter: _Meter, *, progress: bool) -> np.ndarray:
    """xxh3 of every tensor (by source index), read file by file in stream order."""
    file_arr, off_arr, nb_arr = cols.file, cols.offset, cols.nbytes
    checksum = np.zeros(len(nb_arr), dtype=np.uint64)
    digest64 = xxhash.xxh3_64_intdigest
    bounds = np.searchsorted(file_arr[order], np.arange(len(inputs.files) + 1)).tolist()
    for f in range(len(inputs.files)):
        idx = order[bounds[f]:bounds[f + 1]]
        mv = inputs.buffers.get(f) if is_st[f] else None
        if mv is None:
            for a, b in _steps(nb_arr[idx]):
                checksum[idx[a:b]] = [digest64(fetch(k)) for k in idx[a:b].tolist()]
                meter.add("tensors", int(nb_arr[idx[a:b]].sum()))
            continue
        # Tensors of at most 16 bytes: XXH3 column-wise over all of them (xxh3_small.py). The rest
        # through C-level iteration (map over slices): no bytecode per tensor; one run per
        # PROGRESS_STEP of bytes, so a progress event costs nothing per tensor either.
        lo, ns = off_arr[idx], nb_arr[idx]
        short = ns <= xxh3_small.MAX_LEN
        if short.any():
            buf = np.frombuffer(mv, dtype=np.uint8)
            checksum[idx[short]] = xxh3_small.xxh3_64_short(buf, lo[short], ns[short])
            meter.add("tensors", int(ns[short].sum()))
        if not short.all():
            rest, lo = idx[~short], lo[~short]
            sizes = nb_arr[rest]
            for a, b in _steps(sizes) if progress else [(0, len(rest))]:
                slices = map(slice, lo[a:b].tolist(), (lo[a:b] + sizes[a:b]).tolist())
                checksum[rest[a:b]] = np.fromiter(map(digest64, map(mv.__getitem__, slices)), dtype=np.uint64,
                                                  count=b - a)
                meter.add("tensors", int(sizes[a:b].sum()))
    return checksum


def _to_send(cols: Columns, checksum: np.ndarray, perm: np.ndarray, sorted_names: list[str],
             prev_tensors: dict[str, tuple[str, list[int], str]]) -> np.ndarray:
    """Per source tensor: False where the previous version holds the same checksum, dtype and shape."""
    send = np.ones(len(cols.nbytes), dtype=bool)
    if not prev_tensors:
        return send
    ends = np.cumsum(cols.ndims).tolist()
    cks, codes, nds, all_dims = checksum.tolist(), cols.dtype.tolist(), cols.ndims.tolist(), cols.dims.tolist()
    for k, name in zip(perm.tolist(), sorted_names, strict=True):
        old = prev_tensors.get(name)
        if (old is not None and _is_hex16(old[2]) and int(old[2], 16) == cks[k]
                and old[0] == _DTYPE_NAMES[codes[k]] and list(old[1]) == all_dims[ends[k] - nds[k]:ends[k]]):
            send[k] = False
    return send


def _tensor_columns(cols: Columns, perm: np.ndarray, sorted_names: list[str], checksum: np.ndarray, send: np.ndarray,
                    is_st: list[bool]) -> dict[str, Any]:
    """The tensor table's columns, sorted by name; ragged shapes permuted with index arithmetic, not
    a Python loop."""
    file_arr, off_arr = cols.file, cols.offset
    ndims_src, dims_src = cols.ndims, cols.dims
    ndims = ndims_src[perm]
    src_start = np.cumsum(ndims_src) - ndims_src
    new_start = np.cumsum(ndims) - ndims
    dims = dims_src[np.repeat(src_start[perm] - new_start, ndims) + np.arange(int(ndims.sum()), dtype=np.int64)]
    st_arr = np.asarray(is_st, dtype=bool)
    fo = np.where(st_arr[file_arr], off_arr, -1) if len(cols.nbytes) else np.zeros(0, dtype=np.int64)
    return {"names": sorted_names, "dtype": cols.dtype[perm], "shape_end": np.cumsum(ndims), "dims": dims,
            "nbytes": cols.nbytes[perm], "checksum": checksum[perm], "send": send.astype(np.uint8)[perm],
            "file": file_arr.astype(np.int32)[perm], "file_offset": fo[perm]}


def _content_version(tables: Tables) -> str:
    """The version a plan gets when none is named: the same weights always get the same version."""
    h = xxhash.xxh3_64()
    h.update("\0".join(tables.names).encode("utf-8", "surrogatepass"))
    for arr in (tables.dtype, tables.shape_end, tables.dims, tables.checksum):
        h.update(arr.tobytes())
    return "v" + h.hexdigest()[:12]


_Layout = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _layout_contiguous(stream: np.ndarray, nbytes: np.ndarray, bucket: int) -> _Layout:
    """align 1: the stream is the tensors end to end, cut every ``bucket`` bytes. Pure arithmetic."""
    sizes = nbytes[stream]
    ends = np.cumsum(sizes)
    starts = ends - sizes
    total = int(ends[-1]) if len(ends) else 0
    nb = -(-total // bucket)
    b_size = np.full(nb, bucket, dtype=np.int64)
    if nb:
        b_size[-1] = total - bucket * (nb - 1)
    first, last = starts // bucket, (ends - 1) // bucket
    count = last - first + 1
    which = np.repeat(np.arange(len(stream), dtype=np.int64), count)
    j = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    i_b = first[which] + j
    p_start = np.maximum(starts[which], i_b * bucket)
    p_end = np.minimum(ends[which], (i_b + 1) * bucket)
    return stream[which], p_start - starts[which], p_end - p_start, i_b, p_start - i_b * bucket, b_size


def _layout_aligned(stream: np.ndarray, nbytes: np.ndarray, bucket: int, align: int) -> _Layout:
    """align > 1: each tensor starts at a multiple of ``align`` inside its bucket; a bucket closes
    early when the padding would reach its end (then the next tensor starts the next bucket at 0)."""
    i_src: list[int] = []
    i_toff: list[int] = []
    i_n: list[int] = []
    i_b: list[int] = []
    i_off: list[int] = []
    b_size: list[int] = []
    fill = 0
    for k, n in zip(stream.tolist(), nbytes[stream].tolist(), strict=True):
        pad = (-fill) % align
        if fill and fill + pad >= bucket:
            b_size.append(fill)
            fill = 0
        else:
            fill += pad
        toff = 0
        while toff < n:
            if fill == bucket:
                b_size.append(fill)
                fill = 0
            m = min(n - toff, bucket - fill)
            i_src.append(k)
            i_toff.append(toff)
            i_n.append(m)
            i_b.append(len(b_size))
            i_off.append(fill)
            fill += m
            toff += m
    if fill:
        b_size.append(fill)
    as64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return as64(i_src), as64(i_toff), as64(i_n), as64(i_b), as64(i_off), as64(b_size)


def _bucket_checksums(inputs: PlanInputs, fetch: Callable[[int], Any], is_st: list[bool], file_arr: np.ndarray,
                      off_arr: np.ndarray, i_src: np.ndarray, i_toff: np.ndarray, i_n: np.ndarray, i_b: np.ndarray,
                      i_off: np.ndarray, b_size: np.ndarray, meter: _Meter | None = None) -> np.ndarray:
    """xxh3 of each bucket's packed bytes (padding hashed as zeros). A bucket that is one gap-free
    byte range of one mapped safetensors file is hashed in one call; others piece by piece."""
    nb = len(b_size)
    out = np.zeros(nb, dtype=np.uint64)
    if not nb:
        return out
    f = file_arr[i_src]
    fpos = off_arr[i_src] + i_toff
    bounds = np.searchsorted(i_b, np.arange(nb + 1)).tolist()
    mapped = np.asarray([is_st[x] and x in inputs.buffers for x in range(len(is_st))], dtype=bool)
    # a piece continues its predecessor: same bucket and file, next byte in the file and in the bucket
    cont = np.zeros(len(i_src), dtype=bool)
    cont[1:] = ((i_b[1:] == i_b[:-1]) & (f[1:] == f[:-1]) & (fpos[1:] == fpos[:-1] + i_n[:-1])
                & (i_off[1:] == i_off[:-1] + i_n[:-1]))
    first_piece = np.asarray(bounds[:-1], dtype=np.int64)
    breaks = np.cumsum(~cont)  # pieces in a bucket all continuing => breaks constant over the bucket
    flat = ((breaks[np.asarray(bounds[1:]) - 1] - breaks[first_piece]) == 0) & mapped[f[first_piece]] \
        & (i_off[first_piece] == 0)
    flat &= (i_off[np.asarray(bounds[1:]) - 1] + i_n[np.asarray(bounds[1:]) - 1]) == b_size
    digest64 = xxhash.xxh3_64_intdigest
    sizes = b_size.tolist()
    flat_b = np.flatnonzero(flat)
    first = first_piece[flat_b]
    for b, f0, p0 in zip(flat_b.tolist(), f[first].tolist(), fpos[first].tolist(), strict=True):
        out[b] = digest64(inputs.buffers[f0][p0:p0 + sizes[b]])
        if meter is not None:
            meter.add("buckets", sizes[b])
    # The rest piece by piece; only their pieces become Python ints.
    for b in np.flatnonzero(~flat).tolist():
        lo, hi = bounds[b], bounds[b + 1]
        src, toff, ns, offs = (a[lo:hi].tolist() for a in (i_src, i_toff, i_n, i_off))
        fl, fp = f[lo:hi].tolist(), fpos[lo:hi].tolist()
        h, pos = Streaming(), 0
        for i in range(hi - lo):
            h.pad(offs[i] - pos)
            mv = inputs.buffers.get(fl[i]) if is_st[fl[i]] else None
            if mv is not None:
                h.update(mv[fp[i]:fp[i] + ns[i]])
            else:
                data = fetch(src[i])
                h.update(memoryview(data).cast("B")[toff[i]:toff[i] + ns[i]])
            pos = offs[i] + ns[i]
        h.pad(sizes[b] - pos)
        out[b] = int(h.hexdigest(), 16)
        if meter is not None:
            meter.add("buckets", sizes[b])
    return out


def _is_hex16(v: str) -> bool:
    return len(v) == 16 and all(c in "0123456789abcdef" for c in v)


def open_weight_files(paths: Iterable[str | os.PathLike[str]]) -> PlanInputs:
    """Index the weight files (safetensors headers, or torch state dicts) for the planner."""
    from hwtui.engine.replication.weights import MappedArray

    inputs = PlanInputs([], [], lambda s: None)
    parts: list[Columns] = []
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
            c, raw_header, start = st_header.safetensors_header(str(path))
            entry.update(header_xxh3=xxh3_hex(raw_header), data_start=start)
            mapped = MappedArray(path)
            inputs.closers.append(mapped.close)
            inputs.buffers[idx] = memoryview(mapped.array) if mapped.array.size else memoryview(b"")
            inputs.source_headers[idx] = raw_header
            parts.append(Columns(name=c.names, file=np.full(len(c.nbytes), idx, dtype=np.int64), dtype=c.dtype,
                                 ndims=c.ndims, dims=c.dims, nbytes=c.nbytes, offset=c.offset,
                                 sort_keys=c.sort_keys, name_order=c.name_order))
        else:
            state = load_torch_state(path)
            inputs.by_name[idx] = {k: tensor_bytes(v).numpy() for k, v in state.items()}
            parts.append(Columns.of(idx, torch_tensor_infos(state, str(path))))
        inputs.files.append(entry)
    inputs.columns = Columns.concat(parts) if len(parts) != 1 else parts[0]
    return inputs


def build_plan_from_files(paths: list[str], *, model: str | None, version: str | None, bucket_bytes: int, align: int = 1,
                          prev_path: str | None = None, on_event: Callable[[Any], None] | None = None) -> Plan:
    """``on_event`` receives :class:`~hwtui.engine.replication.events.PlanProgress` as the bytes are hashed."""
    prev = load_previous(prev_path) if prev_path else None
    with _gc_paused():
        inputs = open_weight_files(paths)
    try:
        return build_plan(inputs, model=model or Path(paths[0]).stem, version=version, bucket_bytes=bucket_bytes,
                          align=align, prev=prev, on_event=on_event)
    finally:
        inputs.buffers.clear()  # the memoryviews pin the mappings
        for close in inputs.closers:
            close()


def manifest_of(plan: Plan | dict[str, Any], plan_digest_: str | None = None) -> dict[str, Any]:
    """The manifest of the version a plan produces: the input of the next delta plan.

    Of a :class:`Plan`, the tensor list is built only if someone reads it: ``write_json_atomic``
    streams it from the tables (a million dicts cost seconds and half a GB)."""
    if isinstance(plan, Plan):
        return _PlanManifest(plan, plan_digest_ or plan.digest)
    return {"schema": MANIFEST_SCHEMA, "model": plan["model"], "version": plan["version"],
            "plan_digest": plan_digest_ or plan.get("digest"), "tensors": _manifest_tensors(plan)}


def _manifest_tensors(plan: Plan | dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: t[k] for k in ("name", "dtype", "shape", "nbytes", "checksum")} for t in plan["tensors"]]


class _PlanManifest(dict[str, Any]):
    """A manifest dict whose "tensors" is made on first use (every read path materialises it)."""

    def __init__(self, plan: Plan, digest: str):
        super().__init__(schema=MANIFEST_SCHEMA, model=plan["model"], version=plan["version"], plan_digest=digest)
        self.plan = plan

    @property
    def materialised(self) -> bool:
        return dict.__contains__(self, "tensors")

    def _full(self) -> _PlanManifest:
        if not self.materialised:
            dict.__setitem__(self, "tensors", _manifest_tensors(self.plan))
        return self

    def __missing__(self, key: str) -> Any:
        if key == "tensors":
            return dict.__getitem__(self._full(), key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key == "tensors" or dict.__contains__(self, key)

    def __len__(self) -> int:
        return dict.__len__(self._full())

    def __iter__(self) -> Iterator[str]:
        return dict.__iter__(self._full())

    def __eq__(self, other: object) -> bool:
        return dict.__eq__(self._full(), other)

    __hash__ = None

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def keys(self) -> Any:
        return dict.keys(self._full())

    def values(self) -> Any:
        return dict.values(self._full())

    def items(self) -> Any:
        return dict.items(self._full())

    def copy(self) -> dict[str, Any]:
        return dict(self._full())

    def write(self, fh: Any) -> None:
        """The manifest's JSON, byte for byte what ``json.dumps(manifest, separators=(",", ":"))``
        gives, in chunks straight from the plan's tables."""
        head = {k: dict.__getitem__(self, k) for k in ("schema", "model", "version", "plan_digest")}
        fh.write(json.dumps(head, separators=(",", ":"), allow_nan=False)[:-1].encode() + b',"tensors":[')
        t, dn = self.plan.tables, self.plan.meta["dtypes"]
        quote = json.encoder.encode_basestring_ascii  # what json.dumps uses
        ends, dims = t.shape_end.tolist(), t.dims.tolist()
        n, step = len(t.names), 1 << 16
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            names, codes = t.names[lo:hi], t.dtype[lo:hi].tolist()
            nbytes, cks = t.nbytes[lo:hi].tolist(), t.checksum[lo:hi].tolist()
            starts = [ends[lo - 1] if lo else 0, *ends[lo:hi - 1]]
            chunk = ",".join(
                f'{{"name":{quote(name)},"dtype":"{dn[c]}","shape":[{",".join(map(str, dims[a:b]))}],'
                f'"nbytes":{nb},"checksum":"{ck:016x}"}}'
                for name, c, a, b, nb, ck in zip(names, codes, starts, ends[lo:hi], nbytes, cks, strict=True))
            fh.write((b"," if lo else b"") + chunk.encode())
        fh.write(b"]}\n")


# ---------------------------------------------------------------- validation


def _fail(path: str, msg: str) -> None:
    raise HwtuiError(f"plan {path}: {msg}")


def _check_meta(meta: dict[str, Any], path: str) -> None:
    for key, kind in (("model", str), ("version", str), ("bucket_bytes", int), ("align", int), ("total_bytes", int),
                      ("model_bytes", int), ("files", list), ("deleted", list), ("dtypes", list), ("counts", dict)):
        v = meta.get(key)
        if not isinstance(v, kind) or isinstance(v, bool):
            _fail(path, f"missing or mistyped field {key!r} (expected {kind.__name__})")
    check_version(meta["version"], f"plan {path}: version")
    if meta.get("prev_version") is not None:
        check_version(meta["prev_version"], f"plan {path}: prev_version")
    if meta["bucket_bytes"] <= 0 or meta["bucket_bytes"] >= 1 << 62:
        _fail(path, "bucket_bytes must be positive")
    for i, f in enumerate(meta["files"]):
        if not (isinstance(f, dict) and isinstance(f.get("path"), str) and f.get("format") in ("safetensors", "torch")
                and type(f.get("size")) is int):
            _fail(path, f"file entry {i} is malformed")
    if not all(isinstance(d, str) and d in DTYPES for d in meta["dtypes"]):
        _fail(path, "unknown dtype in the dtype list")
    counts = meta["counts"]
    if not all(type(counts.get(k)) is int and 0 <= counts[k] < 1 << 40 for k in ("tensors", "buckets", "items")):
        _fail(path, "bad counts")


def _validate_tables(plan: Plan) -> None:
    """Every invariant a worker relies on, vectorised (a million tensors check in well under a second).

    The steps run in this order, each relying on what the earlier ones proved; the first violation
    is the one reported."""
    meta, t, path = plan.meta, plan.tables, plan.path
    _check_meta(meta, path)
    _check_tensor_table(meta, t, path)
    _check_totals(meta, t, path)
    if not len(t.i_tensor):
        if int((t.send.astype(bool) & (t.nbytes > 0)).sum()):
            _fail(path, "tensors to send but no items")
        return
    _check_item_bounds(meta, t, path)
    _check_item_order_and_coverage(t, path)


def _check_tensor_table(meta: dict[str, Any], t: Tables, path: str) -> None:
    """Names sorted and unique; dtype codes, shapes, sizes, send flags and file indexes in range."""
    n, nfiles = len(t.names), len(meta["files"])
    if any(a >= b for a, b in zip(t.names, t.names[1:], strict=False)):  # sorted => unique
        _fail(path, "tensor names are not sorted and unique")
    if n and (int(t.dtype.max()) >= len(meta["dtypes"])):
        _fail(path, "a tensor has an unknown dtype code")
    ndims = np.diff(t.shape_end, prepend=0)
    if n and (ndims.min() < 0 or ndims.max() > MAX_DIMS or int(t.shape_end[-1]) != len(t.dims)):
        _fail(path, "bad shape table")
    if len(t.dims) and t.dims.min() < 0:
        _fail(path, "a tensor has a negative dimension")
    if not n:
        return
    _check_tensor_sizes(meta, t, ndims, path)
    if t.send.max() > 1:
        _fail(path, "bad send flag")
    if t.file.min() < -1 or t.file.max() >= nfiles:
        _fail(path, "a tensor points at a file the plan does not list")


def _check_tensor_sizes(meta: dict[str, Any], t: Tables, ndims: Any, path: str) -> None:
    """Each tensor's nbytes is its dtype's item size times the product of its dims."""
    n = len(t.names)
    itemsize = np.asarray([DTYPES[d][0] for d in meta["dtypes"]], dtype=np.int64)
    # log2 bound first: an int64 product of the dims must not wrap
    logs = np.zeros(n)
    starts = np.concatenate(([0], t.shape_end[:-1]))
    nz = ndims > 0
    if len(t.dims):
        cum = np.concatenate(([0.0], np.cumsum(np.log2(t.dims.astype(np.float64) + 1))))
        logs = cum[t.shape_end] - cum[starts]
    if logs.max() > 56:
        _fail(path, "a tensor is impossibly large")
    prods = np.ones(n, dtype=np.int64)
    if nz.any():
        prods[nz] = np.multiply.reduceat(t.dims, starts[nz])
    if not np.array_equal(prods * itemsize[t.dtype], t.nbytes):
        bad = int(np.nonzero(prods * itemsize[t.dtype] != t.nbytes)[0][0])
        _fail(path, f"tensor {t.names[bad][:80]!r}: nbytes does not match its dtype and shape")


def _check_totals(meta: dict[str, Any], t: Tables, path: str) -> None:
    """Deleted names, bucket sizes, the header's totals and counts against the tables."""
    names = set(t.names) if meta["deleted"] else set()  # a million-entry set only when there is something to check
    for gone in meta["deleted"]:
        if not isinstance(gone, str) or gone in names:
            _fail(path, f"deleted tensor {str(gone)[:80]!r} is also in the next version (or not a name)")
    nb = len(t.b_size)
    if nb and (t.b_size.min() <= 0 or t.b_size.max() > meta["bucket_bytes"]):
        _fail(path, "a bucket has a bad size")
    if int(t.b_size.sum()) != meta["total_bytes"]:
        _fail(path, "total_bytes is not the sum of the bucket sizes")
    if int(t.nbytes.sum()) != meta["model_bytes"]:
        _fail(path, "model_bytes is not the sum of the tensor sizes")
    if (len(t.names), nb, len(t.i_tensor)) != (meta["counts"]["tensors"], meta["counts"]["buckets"], meta["counts"]["items"]):
        _fail(path, "table sizes differ from the header's counts")


def _check_item_bounds(meta: dict[str, Any], t: Tables, path: str) -> None:
    """Each item inside its tensor's table row, its bucket and its source file."""
    k, toff, m, b, off = t.i_tensor, t.i_tensor_offset, t.i_nbytes, t.i_bucket, t.i_offset
    if k.min() < 0 or k.max() >= len(t.names) or b.min() < 0 or b.max() >= len(t.b_size):
        _fail(path, "an item points at a tensor or bucket the plan does not have")
    if m.min() <= 0 or off.min() < 0 or toff.min() < 0 or (off + m > t.b_size[b]).any():
        _fail(path, "an item lies outside its bucket")
    if not t.send[k].all():
        _fail(path, "an item for a tensor that is not sent")
    if (t.file[k] < 0).any():
        _fail(path, "an item for a tensor with no source file")
    st = np.asarray([f["format"] == "safetensors" for f in meta["files"]], dtype=bool)
    if (st[t.file[k]] & (t.file_offset[k] < 0)).any():
        _fail(path, "an item of a safetensors file has no file offset")
    fo = t.file_offset[k]
    sizes = np.asarray([f["size"] for f in meta["files"]], dtype=object)
    if st.any():
        ends = fo + toff + m
        over = st[t.file[k]] & (ends > np.asarray([min(s, 1 << 62) for s in sizes], dtype=np.int64)[t.file[k]])
        if over.any():
            _fail(path, "an item lies outside its source file")


def _check_item_order_and_coverage(t: Tables, path: str) -> None:
    k, toff, m, b, off = t.i_tensor, t.i_tensor_offset, t.i_nbytes, t.i_bucket, t.i_offset
    # items by (bucket, offset), never overlapping inside a bucket
    same = b[1:] == b[:-1]
    if (b[1:] < b[:-1]).any() or (same & (off[1:] < off[:-1] + m[:-1])).any():
        _fail(path, "items overlap or are out of order inside a bucket")
    # every sent tensor covered exactly once, piece after piece
    o = np.lexsort((toff, k))
    ks, ts, ms = k[o], toff[o], m[o]
    first = np.concatenate(([True], ks[1:] != ks[:-1]))
    if (ts[first] != 0).any():
        _fail(path, "a tensor's pieces leave a gap at its start")
    cont = ~first[1:]
    if (cont & (ts[1:] != ts[:-1] + ms[:-1])).any():
        _fail(path, "a tensor's pieces overlap or leave a gap")
    last = np.concatenate((ks[1:] != ks[:-1], [True]))
    if (ts[last] + ms[last] != t.nbytes[ks[last]]).any():
        _fail(path, "a tensor's pieces do not cover it")
    need = np.nonzero(t.send.astype(bool) & (t.nbytes > 0))[0]
    if not np.array_equal(need, ks[first]):
        _fail(path, "a tensor to send has no items")


def validate_plan(raw: dict[str, Any] | Plan, path: str = "<plan>") -> Plan:
    """Check every invariant a worker relies on; one line naming the first violation."""
    with _gc_paused():
        if isinstance(raw, Plan):
            _validate_tables(raw)
            return raw
        validate_v1(raw, path)
        return _from_v1(raw, path)


def _from_v1(raw: dict[str, Any], path: str) -> Plan:
    """An ``hwtui.plan/1`` dict (already validated) as tables; its digest stays the v1 digest."""
    tensors = sorted(raw["tensors"], key=lambda t: t["name"])
    index = {t["name"]: i for i, t in enumerate(tensors)}
    items = sorted(raw["items"], key=lambda i: (i["bucket"], i["offset"]))
    file = np.full(len(tensors), -1, dtype=np.int32)
    fo = np.full(len(tensors), -1, dtype=np.int64)
    for it in items:
        k = index[it["name"]]
        file[k] = it["file"]
        if it.get("file_offset") is not None:
            fo[k] = it["file_offset"] - it["tensor_offset"]
    ndims = [len(t["shape"]) for t in tensors]
    tables = Tables(
        names=[t["name"] for t in tensors],
        dtype=np.asarray([_DTYPE_CODE[t["dtype"]] for t in tensors], dtype=np.uint8),
        shape_end=np.cumsum(np.asarray(ndims, dtype=np.int64)),
        dims=np.asarray([d for t in tensors for d in t["shape"]], dtype=np.int64),
        nbytes=np.asarray([t["nbytes"] for t in tensors], dtype=np.int64),
        checksum=np.asarray([int(t["checksum"], 16) for t in tensors], dtype=np.uint64),
        send=np.asarray([t["send"] for t in tensors], dtype=np.uint8), file=file, file_offset=fo,
        b_size=np.asarray([b["size"] for b in raw["buckets"]], dtype=np.int64),
        b_checksum=np.asarray([int(b["checksum"], 16) for b in raw["buckets"]], dtype=np.uint64),
        i_tensor=np.asarray([index[i["name"]] for i in items], dtype=np.int64),
        i_tensor_offset=np.asarray([i["tensor_offset"] for i in items], dtype=np.int64),
        i_nbytes=np.asarray([i["nbytes"] for i in items], dtype=np.int64),
        i_bucket=np.asarray([i["bucket"] for i in items], dtype=np.int64),
        i_offset=np.asarray([i["offset"] for i in items], dtype=np.int64),
    )
    meta = {k: raw.get(k) for k in ("model", "version", "prev_version", "bucket_bytes", "align", "total_bytes",
                                    "files", "deleted")}
    meta.update(model_bytes=int(tables.nbytes.sum()), dtypes=_DTYPE_NAMES,
                counts={"tensors": len(tensors), "buckets": len(raw["buckets"]), "items": len(items)})
    return Plan(meta, tables, raw["digest"], path)


def _from_file(pf: plan_format.PlanFile) -> Plan:
    header, path = pf.header, pf.path
    if header.get("schema") != PLAN_SCHEMA:
        _fail(path, f"schema is {str(header.get('schema'))[:40]!r}, expected {PLAN_SCHEMA!r}")
    meta = {k: v for k, v in header.items() if k not in ("schema", "sections")}
    _check_meta(meta, path)
    counts = meta["counts"]
    n, nb, ni = counts["tensors"], counts["buckets"], counts["items"]
    name_end = pf.section("name_end", n)
    try:
        text = pf.section("name_text").tobytes().decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        _fail(path, "tensor names are not UTF-8")
    ends = name_end.tolist()
    if ends and (ends[-1] != len(text) or any(a > b for a, b in zip([0, *ends], ends, strict=False))):
        _fail(path, "bad name table")
    names = [text[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    sec = {key: pf.section(key, n if key in _TENSOR_SECTIONS else nb if key.startswith("b_")
                           else ni if key.startswith("i_") else None) for key in _SECTION_DTYPES}
    for key, dt in _SECTION_DTYPES.items():
        if sec[key].dtype.newbyteorder("=") != np.dtype(dt):
            _fail(path, f"section {key!r} has dtype {sec[key].dtype}")
    tables = Tables(names=names, **sec)
    headers = {}
    for i, f in enumerate(meta["files"]):
        if f["format"] == "safetensors" and f"header.{i}" in pf.sections:
            headers[i] = pf.sections[f"header.{i}"]
    return Plan(meta, tables, pf.digest, path, headers)


def load_plan(path: str | os.PathLike[str], *, validate: bool = True, expect_digest: str | None = None) -> Plan:
    """Load a plan file: ``hwtui.plan/2`` (mapped tables) or an ``hwtui.plan/1`` JSON plan.

    The digest is always checked. ``validate=False`` skips the invariant checks: for ranks, whose
    coordinator validated the same bytes (pass its digest as ``expect_digest``)."""
    with _gc_paused():
        if plan_format.is_v2(path):
            plan = _from_file(plan_format.PlanFile(path))
            if validate:
                _validate_tables(plan)
        else:
            plan = validate_plan(_read_json(path, "plan"), str(path))
    if expect_digest is not None and plan.digest != expect_digest:
        raise HwtuiError(f"plan {path} has digest {plan.digest[:16]}, the coordinator planned {expect_digest[:16]}")
    return plan


def load_plan_for_rank(path: str | os.PathLike[str], digest: str | None = None) -> Plan:
    """A rank's load: digest checked, tables mapped, no re-validation (the coordinator did it)."""
    return load_plan(path, validate=False, expect_digest=digest)


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
            raise HwtuiError(f"{exc} (named by the plan; missing or replaced since planning)") from None
        os.close(fd)
        if st.st_size != f["size"]:
            raise HwtuiError(f"weight file {p} changed since planning: {st.st_size} bytes, plan says {f['size']}")
        if f["format"] == "safetensors":
            raw_header = st_header.header_bytes(str(p))  # compared whole: no need to parse a million entries
            if xxh3_hex(raw_header) != f.get("header_xxh3"):
                raise HwtuiError(f"weight file {p} changed since planning: its safetensors header differs")

