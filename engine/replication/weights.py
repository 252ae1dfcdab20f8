"""Zero-copy weight readers.

safetensors: we parse the 8-byte header length and the JSON header ourselves and memory-map the
file, so a tensor's bytes are a slice of the page cache: nothing is read until it is sent, and a
bucket that is one contiguous range of the file is broadcast straight from the mapping.

torch state dicts (``.pt``/``.bin``): ``torch.load(weights_only=True, mmap=True)``; never the
pickle-executing default. Nested dicts are flattened with dotted names.
"""

from __future__ import annotations

import gc
import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

from hwtui.core import bounded_read
from hwtui.core.errors import HwtuiError

# safetensors dtype name -> (itemsize, torch dtype attribute)
DTYPES: dict[str, tuple[int, str]] = {
    "F64": (8, "float64"), "F32": (4, "float32"), "F16": (2, "float16"), "BF16": (2, "bfloat16"),
    "I64": (8, "int64"), "I32": (4, "int32"), "I16": (2, "int16"), "I8": (1, "int8"),
    "U64": (8, "uint64"), "U32": (4, "uint32"), "U16": (2, "uint16"), "U8": (1, "uint8"),
    "BOOL": (1, "bool"), "F8_E4M3": (1, "float8_e4m3fn"), "F8_E5M2": (1, "float8_e5m2"),
    "C64": (8, "complex64"),
}
_TORCH_TO_ST = {v[1]: k for k, v in DTYPES.items()}
MAX_HEADER = 100 << 20  # the safetensors reference implementation refuses headers above 100 MB
_MAX_DIMS = 64  # no real tensor has more; bounds the work one header entry can ask for


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors name
    shape: tuple[int, ...]
    nbytes: int
    file_offset: int  # absolute byte offset in the file (safetensors); 0 for torch files


def numel(shape: tuple[int, ...] | list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def expected_nbytes(dtype: Any, shape: Any) -> int:
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise HwtuiError(f"unknown dtype {str(dtype)[:40]!r} (known: {', '.join(DTYPES)})")
    return DTYPES[dtype][0] * numel(shape)


def file_format(path: str | os.PathLike[str]) -> str:
    return "safetensors" if str(path).endswith(".safetensors") else "torch"


def open_regular(path: str | os.PathLike[str], what: str = "weight file") -> tuple[int, os.stat_result]:
    """Open a user-named file for reading -> (fd, its fstat): core.bounded_read's rules, our words."""
    try:
        return bounded_read.open_regular(path)
    except FileNotFoundError:
        raise HwtuiError(f"{what} {path} does not exist") from None
    except bounded_read.NotRegularFile as exc:
        raise HwtuiError(f"{what} {path} is {(exc.strerror or '').split(',')[0]}; only regular files are read") from None
    except OSError as exc:
        raise HwtuiError(f"cannot open {what} {path}: {exc.strerror}") from None
    except ValueError:  # an embedded NUL byte
        raise HwtuiError(f"{what} {str(path)[:80]!r} is not a valid path") from None


def read_capped(path: str | os.PathLike[str], cap: int, what: str) -> bytes:
    """The whole of a regular file of at most ``cap`` bytes (one clear error above it)."""
    fd, st = open_regular(path, what)
    try:
        if st.st_size > cap:
            raise HwtuiError(f"{what} {path} is {st.st_size} bytes, more than the {cap >> 20} MiB hwtui reads")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(cap + 1)
    except OSError as exc:
        raise HwtuiError(f"cannot read {what} {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > cap:  # it grew while we read
        raise HwtuiError(f"{what} {path} is more than the {cap >> 20} MiB hwtui reads")
    return data


def strict_json(raw: bytes, where: str) -> Any:
    """json.loads that fails cleanly: no NaN/Infinity, no 1e999, no stack overflow on deep nesting."""

    def bad_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON allows")

    def finite(text: str) -> float:
        v = float(text)
        if not math.isfinite(v):
            raise ValueError(f"number {text[:20]} is out of range")
        return v

    try:
        return json.loads(raw, parse_constant=bad_constant, parse_float=finite)
    except RecursionError:
        raise HwtuiError(f"{where} is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise HwtuiError(f"{where} is not valid JSON (truncated?): {str(exc)[:120]}") from None


def _is_int(v: Any) -> bool:
    return type(v) is int


def _valid_name(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a "\ud800" escape: not text any file system or JSON writer takes
        return False
    return True


DTYPE_NAMES = list(DTYPES)  # a dtype's code is its index here
_DTYPE_CODE = {d: i for i, d in enumerate(DTYPE_NAMES)}


@dataclass
class SafetensorsColumns:
    """A safetensors header as columns, in header order: no Python object per tensor but its name."""

    names: list[str]
    dtype: Any  # np.uint8 codes into DTYPE_NAMES
    ndims: Any  # np.int64
    dims: Any  # np.int64, all shapes end to end
    nbytes: Any  # np.int64
    offset: Any  # np.int64, absolute offset in the file


def parse_safetensors_columns(raw: bytes, start: int, size: int, where: str) -> SafetensorsColumns:
    """Validate a safetensors JSON header -> its columns.

    Every entry must be a dict with a known dtype, a shape of at most 64 non-negative ints, integer
    ``data_offsets`` [a, b] with b - a equal to the tensor's size, inside the file, and no two
    tensors may overlap. Anything else is one line naming the entry. One pass; the parsed JSON
    is dropped before returning and the names are re-made compactly, so the millions of small
    objects of a big header free whole allocator arenas instead of pinning them.
    """
    import numpy as np

    header = strict_json(raw, f"{where}: safetensors header")
    if not isinstance(header, dict):
        raise HwtuiError(f"{where}: safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise HwtuiError(f"{where}: safetensors __metadata__ must map strings to strings")
    codes: list[int] = []
    ndims: list[int] = []
    dims: list[int] = []
    sizes: list[int] = []
    starts: list[int] = []
    code, dt = _DTYPE_CODE, DTYPES
    end = size - start
    for name, entry in header.items():
        try:
            dtype, shape, (a, b) = entry["dtype"], entry["shape"], entry["data_offsets"]
            c, item = code[dtype], dt[dtype][0]
        except (KeyError, TypeError, ValueError):
            _bad_entry(name, entry, where)
        if type(shape) is not list or len(shape) > _MAX_DIMS or type(a) is not int or type(b) is not int:
            _bad_entry(name, entry, where)
        n = item
        for d in shape:
            if type(d) is not int or d < 0:
                _bad_entry(name, entry, where)
            n *= d
        if not (0 <= a <= b <= end and b - a == n):
            raise HwtuiError(f"{where}: tensor {name[:80]!r} has offsets {a}..{b} inconsistent with "
                             f"{dtype}{shape} or the file size"[:300])
        codes.append(c)
        ndims.append(len(shape))
        dims.extend(shape)
        sizes.append(n)
        starts.append(a)
    keys = list(header)
    del header
    names = _compact_names(keys, where)
    del keys
    if names and max(sizes) >= 1 << 62:
        raise HwtuiError(f"{where}: a tensor is impossibly large")
    cols = SafetensorsColumns(
        names=names, dtype=np.asarray(codes, dtype=np.uint8), ndims=np.asarray(ndims, dtype=np.int64),
        dims=np.asarray(dims, dtype=np.int64), nbytes=np.asarray(sizes, dtype=np.int64),
        offset=np.asarray(starts, dtype=np.int64) + start)
    order = np.argsort(cols.offset, kind="stable")
    o, n_ = cols.offset[order], cols.nbytes[order]
    bad = np.nonzero(o[1:] < o[:-1] + n_[:-1])[0]
    if len(bad):
        i, j = int(order[bad[0]]), int(order[bad[0] + 1])
        raise HwtuiError(f"{where}: tensors {cols.names[i][:80]!r} and {cols.names[j][:80]!r} overlap")
    return cols


def _compact_names(keys: list[str], where: str) -> list[str]:
    """The same names, checked as UTF-8 in one pass and allocated together (see parse_safetensors_columns)."""
    joined = "\0".join(keys)
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a "\ud800" escape: not text any file system or JSON writer takes
        bad = next(k for k in keys if not _valid_name(k))
        raise HwtuiError(f"{where}: tensor name {bad[:80]!r} is not valid UTF-8") from None
    if not keys or joined.count("\0") != len(keys) - 1:  # a name holds a NUL: keep the originals
        return keys
    return joined.split("\0")


def _bad_entry(name: str, entry: Any, where: str) -> None:
    """The one-line reason a header entry is malformed (only formatted on failure)."""
    shown = name[:80]
    if not isinstance(entry, dict):
        raise HwtuiError(f"{where}: malformed header entry for tensor {shown!r}")
    dtype, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise HwtuiError(f"{where}: tensor {shown!r} has unknown dtype {str(dtype)[:40]!r}")
    if not (isinstance(shape, list) and len(shape) <= _MAX_DIMS and all(_is_int(d) and d >= 0 for d in shape)):
        raise HwtuiError(f"{where}: tensor {shown!r} has a bad shape (a list of at most {_MAX_DIMS} "
                         "non-negative integers)")
    if not (isinstance(offs, list) and len(offs) == 2 and _is_int(offs[0]) and _is_int(offs[1])):
        raise HwtuiError(f"{where}: tensor {shown!r} has bad data_offsets (two integers)")
    raise HwtuiError(f"{where}: malformed header entry for tensor {shown!r}")


def _read_header_bytes(path: str | os.PathLike[str]) -> tuple[bytes, int, int]:
    """(raw header, data start, file size), reading at most 8 + ``MAX_HEADER`` bytes of a regular file."""
    fd, st = open_regular(path)
    size = st.st_size
    try:
        with os.fdopen(fd, "rb", closefd=False) as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise HwtuiError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > MAX_HEADER or 8 + hlen > size:
                raise HwtuiError(f"{path}: corrupt safetensors header length {hlen} (file is {size} bytes)")
            raw = fh.read(hlen)
    except OSError as exc:
        raise HwtuiError(f"cannot read weights {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(raw) != hlen:
        raise HwtuiError(f"{path}: safetensors header is truncated (the file shrank while it was read)")
    return raw, 8 + hlen, size


def safetensors_columns(path: str | os.PathLike[str]) -> tuple[SafetensorsColumns, bytes, int]:
    """-> ((names, dtypes, shapes, nbytes, absolute offsets), raw header bytes, data start)."""
    raw, start, size = _read_header_bytes(path)
    # A million-entry header is millions of small acyclic objects: with the cyclic GC running, each
    # collection walks all of them again (measured: it doubles the parse time).
    was = gc.isenabled()
    gc.disable()
    try:
        return parse_safetensors_columns(raw, start, size, str(path)), raw, start
    finally:
        if was:
            gc.enable()


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[list[TensorInfo], bytes, int]:
    """Return (tensors sorted by offset, raw header bytes, data start). Validates every offset.

    Reads at most 8 + ``MAX_HEADER`` bytes, from a regular file only (see :func:`open_regular`).
    """
    cols, raw, start = safetensors_columns(path)
    ends = cols.ndims.cumsum().tolist()
    dims = cols.dims.tolist()
    tensors = [TensorInfo(n, DTYPE_NAMES[c], tuple(dims[e - nd:e]), b, o) for n, c, nd, e, b, o in
               zip(cols.names, cols.dtype.tolist(), cols.ndims.tolist(), ends, cols.nbytes.tolist(),
                   cols.offset.tolist(), strict=True)]
    tensors.sort(key=lambda t: t.file_offset)
    return tensors, raw, start


def _flatten(obj: Any, prefix: str, out: dict[str, Any]) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    # other values (ints, strings in checkpoints: epoch, config) are not weights: skipped


def load_torch_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    import torch

    fd, _ = open_regular(path)
    try:
        # Through the descriptor we checked, so the file torch maps is the regular file we opened.
        obj = torch.load(f"/proc/self/fd/{fd}", map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HwtuiError(f"cannot load {path} with torch.load(weights_only=True): {first[:200]}") from None
    finally:
        os.close(fd)
    out: dict[str, Any] = {}
    try:
        _flatten(obj, "", out)
    except RecursionError:
        raise HwtuiError(f"{path}: the state dict is nested too deeply") from None
    if not out:
        raise HwtuiError(f"{path}: no tensors found")
    return out


def torch_tensor_infos(state: dict[str, Any], path: str) -> list[TensorInfo]:
    infos = []
    for name, t in state.items():
        st = _TORCH_TO_ST.get(str(t.dtype).removeprefix("torch."))
        if st is None:
            raise HwtuiError(f"{path}: tensor {name!r} has dtype {t.dtype} that replication does not carry")
        infos.append(TensorInfo(name, st, tuple(t.shape), t.numel() * t.element_size(), 0))
    return infos


def tensor_bytes(t: Any) -> Any:
    """A flat uint8 view of a tensor's bytes (a copy only when it is not contiguous)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().reshape(-1).view(torch.uint8)


def _map_readonly(path: str | os.PathLike[str], populate: bool = True) -> tuple[mmap.mmap | None, int]:
    """A shared read-only mapping of the whole file (None when empty), pre-populated where the
    platform allows so page-table work happens at open, not inside a timed transfer."""
    fd, st = open_regular(path)
    try:
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        return (mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ) if st.st_size else None), st.st_size
    finally:
        os.close(fd)


def _unmap(mm: mmap.mmap | None) -> None:
    if mm is not None:
        try:
            mm.close()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes when it does


class MappedFile:
    """A read-only view of a whole file as a torch uint8 tensor, backed by a shared mmap.

    The mapping is read-only (a write would fault, which is what we want for the source of
    truth) and pre-populated with MAP_POPULATE, so the page-table work happens when the file is
    opened rather than inside the timed transfer; a private writable mapping would instead copy
    every page on populate. torch.frombuffer warns about read-only buffers; we never write.
    """

    def __init__(self, path: str | os.PathLike[str], populate: bool = True):
        import warnings

        import torch

        self.path = str(path)
        self.tensor: Any = None
        self._mm, self.size = _map_readonly(path, populate)
        if self._mm is None:
            self.tensor = torch.empty(0, dtype=torch.uint8)
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self.tensor = torch.frombuffer(self._mm, dtype=torch.uint8)

    def close(self) -> None:
        self.tensor = None
        _unmap(self._mm)
        self._mm = None


class MappedArray:
    """The same read-only shared mapping as :class:`MappedFile`, seen as a numpy uint8 array.

    The planner only hashes bytes, so it uses this instead and never imports torch: planning a
    safetensors model then costs the hashing, not a 1.5 s torch import.
    """

    def __init__(self, path: str | os.PathLike[str]):
        import numpy as np

        self._mm, _ = _map_readonly(path)
        self.array: Any = np.frombuffer(self._mm, dtype=np.uint8) if self._mm is not None else np.empty(0, dtype=np.uint8)

    def close(self) -> None:
        self.array = None
        _unmap(self._mm)
        self._mm = None
