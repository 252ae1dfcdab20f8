"""Zero-copy weight readers.

safetensors: we parse the 8-byte header length and the JSON header ourselves and memory-map the
file, so a tensor's bytes are a slice of the page cache: nothing is read until it is sent, and a
bucket that is one contiguous range of the file is broadcast straight from the mapping.

torch state dicts (``.pt``/``.bin``): ``torch.load(weights_only=True, mmap=True)``; never the
pickle-executing default. Nested dicts are flattened with dotted names.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def expected_nbytes(dtype: str, shape: Any) -> int:
    if dtype not in DTYPES:
        raise HwtuiError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    return DTYPES[dtype][0] * numel(shape)


def file_format(path: str | os.PathLike[str]) -> str:
    return "safetensors" if str(path).endswith(".safetensors") else "torch"


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[list[TensorInfo], bytes, int]:
    """Return (tensors sorted by offset, raw header bytes, data start). Validates every offset."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise HwtuiError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > MAX_HEADER or 8 + hlen > size:
                raise HwtuiError(f"{path}: corrupt safetensors header length {hlen} (file is {size} bytes)")
            raw = fh.read(hlen)
    except OSError as exc:
        raise HwtuiError(f"cannot read weights {path}: {exc.strerror}") from None
    try:
        header = json.loads(raw)
    except ValueError:
        raise HwtuiError(f"{path}: safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise HwtuiError(f"{path}: safetensors header is not a JSON object")
    start = 8 + hlen
    tensors = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (a, b) = meta["dtype"], tuple(int(d) for d in meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise HwtuiError(f"{path}: malformed header entry for tensor {name!r}") from None
        nbytes = expected_nbytes(dtype, shape)
        if not (0 <= a <= b and b - a == nbytes and start + b <= size):
            raise HwtuiError(f"{path}: tensor {name!r} has offsets {a}..{b} inconsistent with "
                             f"{dtype}{list(shape)} or the file size")
        tensors.append(TensorInfo(name, dtype, shape, nbytes, start + a))
    tensors.sort(key=lambda t: t.file_offset)
    for prev, cur in zip(tensors, tensors[1:], strict=False):
        if cur.file_offset < prev.file_offset + prev.nbytes:
            raise HwtuiError(f"{path}: tensors {prev.name!r} and {cur.name!r} overlap")
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

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HwtuiError(f"cannot load {path} with torch.load(weights_only=True): {first}") from None
    out: dict[str, Any] = {}
    _flatten(obj, "", out)
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


def _map_readonly(path: str | os.PathLike[str]) -> tuple[mmap.mmap | None, int]:
    """A shared read-only mapping of the whole file (None when empty), pre-populated where the
    platform allows so page-table work happens at open, not inside a timed transfer."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        return (mmap.mmap(fh.fileno(), 0, flags=flags, prot=mmap.PROT_READ) if size else None), size


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

    def __init__(self, path: str | os.PathLike[str]):
        import warnings

        import torch

        self.path = str(path)
        self._mm, self.size = _map_readonly(path)
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
        self.array = np.frombuffer(self._mm, dtype=np.uint8) if self._mm is not None else np.empty(0, dtype=np.uint8)

    def close(self) -> None:
        self.array = None
        _unmap(self._mm)
        self._mm = None
