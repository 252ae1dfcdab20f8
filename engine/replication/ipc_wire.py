"""The IPC transport's control messages: typed, JSON on the wire, validated as untrusted input.

Never pickle: torch's own handle exchange (``torch.multiprocessing``) pickles storages, and
unpickling a peer's bytes runs whatever the peer chose. Here every field is named, typed and
bounded, bytes travel as base64 text, and a message that is not exactly what the receiver expects
(wrong bucket, wrong size, an unknown field, a bool where an int belongs, a handle of the wrong
kind) is rejected with a one-line reason before anything is opened.

Messages:

- ``export``: the source (or a host leader) published bucket ``bucket`` in window slot ``slot``;
  ``digest`` is the device checksum of those bytes (device_checksum.py) and ``handle`` says where
  they are (a CUDA IPC handle, or the host stand-in's shared file).
- ``ack``: a receiver copied the bucket and closed the handle (``released``), with the digest it
  computed on its own copy and whether it matched.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

from hwtui.engine.replication.device_checksum import is_digest

MAX_MESSAGE = 16 * 1024  # a message is a few hundred bytes; anything bigger is not one of ours
MAX_BUCKET_BYTES = 1 << 44  # 16 TiB: far above any bucket, far below an overflow
MAX_HANDLE_BYTES = 1024  # a cudaIpcMemHandle_t is 64 bytes; torch's expandable-segment form is longer
MAX_NAME_BYTES = 512  # torch's ref-counter file name
# torch's ref counters: a shared file of this many int64 counters (CUDA_IPC_REF_COUNTER_FILE_SIZE in
# torch/csrc/CudaIPCTypes.h), named "/torch_<pid>_<random>_<n>" (at::NewProcessWideShmHandle; older
# torch: "/torch_<pid>_<random>"). A receiver closing its mapping decrements the counter at
# ref_offset of the file so named, with no bounds check of torch's own: a hostile offset would be
# a write anywhere in the receiver, so the wire bounds it and the name's form (and the H200 run
# that met the three-part name is why both forms pass).
REF_COUNTERS = 10_000
_REF_NAME = re.compile(rb"/torch_[0-9]{1,10}_[0-9]{1,20}(_[0-9]{1,20})?")
KINDS = ("cuda", "host")


class WireError(ValueError):
    """A control message that is malformed or not the one expected (untrusted input)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: object, what: str, limit: int, *, empty_ok: bool = False) -> bytes:
    if not isinstance(value, str) or len(value) > 4 * ((limit + 2) // 3):
        raise WireError(f"{what} is not base64 text of at most {limit} bytes")
    try:
        data = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise WireError(f"{what} is not valid base64") from exc
    if not data and not empty_ok:
        raise WireError(f"{what} is empty")
    return data


def _ref_name(name: bytes) -> bytes:
    if name and not _REF_NAME.fullmatch(name):
        raise WireError("ref_handle is not a torch ref-counter file name (/torch_<pid>_<random>_<n>)")
    return name


def _int(obj: dict[str, Any], key: str, lo: int, hi: int) -> int:
    value = obj.get(key)
    if type(value) is not int or not lo <= value <= hi:  # bool is an int subclass: refused
        raise WireError(f"{key} must be an integer in [{lo}, {hi}], got {value!r:.40}")
    return value


def _bool(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key)
    if type(value) is not bool:
        raise WireError(f"{key} must be true or false, got {value!r:.40}")
    return value


def _exact_keys(obj: object, keys: set[str], what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise WireError(f"{what} is not a JSON object")
    if set(obj) != keys:
        extra, missing = sorted(set(obj) - keys), sorted(keys - set(obj))
        raise WireError(f"{what} has unexpected fields {extra} / lacks {missing}")
    return obj


@dataclass(frozen=True)
class CudaHandle:
    """The fields of ``UntypedStorage._share_cuda_()``, in the order ``_new_shared_cuda`` takes them."""

    device: int
    handle: bytes
    size: int  # storage size in bytes
    offset: int  # storage offset in bytes inside the shared allocation
    ref_handle: bytes  # torch's ref-counter shared file name
    ref_offset: int
    event_handle: bytes  # empty when the exporter recorded no event
    event_sync: bool

    def memory(self) -> tuple[Any, ...]:
        """What names the memory: each ``_share_cuda_()`` of one storage records a new event (and
        may name a new ref-counter file), so two exports of the same buffer differ in those fields
        only. torch's own consumer cache keys the same way (reductions.rebuild_cuda_tensor)."""
        return ("cuda", self.device, self.handle, self.offset, self.size)

    def to_wire(self) -> dict[str, Any]:
        return {"device": self.device, "handle": _b64(self.handle), "size": self.size, "offset": self.offset,
                "ref_handle": _b64(self.ref_handle), "ref_offset": self.ref_offset,
                "event_handle": _b64(self.event_handle), "event_sync": self.event_sync}

    @classmethod
    def from_wire(cls, obj: object) -> CudaHandle:
        o = _exact_keys(obj, {"device", "handle", "size", "offset", "ref_handle", "ref_offset", "event_handle",
                              "event_sync"}, "cuda handle")
        return cls(device=_int(o, "device", 0, 255), handle=_unb64(o["handle"], "handle", MAX_HANDLE_BYTES),
                   size=_int(o, "size", 0, MAX_BUCKET_BYTES), offset=_int(o, "offset", 0, MAX_BUCKET_BYTES),
                   ref_handle=_ref_name(_unb64(o["ref_handle"], "ref_handle", MAX_NAME_BYTES, empty_ok=True)),
                   ref_offset=_int(o, "ref_offset", 0, REF_COUNTERS - 1),
                   event_handle=_unb64(o["event_handle"], "event_handle", MAX_HANDLE_BYTES, empty_ok=True),
                   event_sync=_bool(o, "event_sync"))


@dataclass(frozen=True)
class HostHandle:
    """The host stand-in's shared file: an anonymous memfd of process ``pid``, reached by the
    receiver at ``/proc/<pid>/fd/<fd>`` (only its user, or root, may open that)."""

    pid: int
    fd: int
    size: int  # the file's length (the slot's capacity)

    def memory(self) -> tuple[Any, ...]:
        return ("host", self.pid, self.fd, self.size)

    def to_wire(self) -> dict[str, Any]:
        return {"pid": self.pid, "fd": self.fd, "size": self.size}

    @classmethod
    def from_wire(cls, obj: object) -> HostHandle:
        o = _exact_keys(obj, {"pid", "fd", "size"}, "host handle")
        return cls(pid=_int(o, "pid", 1, 1 << 22), fd=_int(o, "fd", 0, 1 << 20), size=_int(o, "size", 0, MAX_BUCKET_BYTES))


Handle = CudaHandle | HostHandle


@dataclass(frozen=True)
class Export:
    bucket: int
    slot: int
    nbytes: int  # the bucket's bytes: the first nbytes of the shared buffer
    digest: str
    kind: str
    handle: Handle

    def encode(self) -> bytes:
        return json.dumps({"type": "export", "bucket": self.bucket, "slot": self.slot, "nbytes": self.nbytes,
                           "digest": self.digest, "kind": self.kind, "handle": self.handle.to_wire()},
                          separators=(",", ":")).encode()


@dataclass(frozen=True)
class Ack:
    bucket: int
    rank: int
    released: bool  # the receiver closed its handle: the source may reuse the slot
    ok: bool  # its device checksum matched the source's
    digest: str  # the digest it computed on its copy ("" when it never got a copy)
    error: str  # why it failed ("" when ok)

    def encode(self) -> bytes:
        return json.dumps({"type": "ack", "bucket": self.bucket, "rank": self.rank, "released": self.released,
                           "ok": self.ok, "digest": self.digest, "error": self.error[:300]},
                          separators=(",", ":")).encode()


def _load(raw: bytes, what: str) -> object:
    if not isinstance(raw, bytes | bytearray) or len(raw) > MAX_MESSAGE:
        raise WireError(f"{what} is larger than {MAX_MESSAGE} bytes")
    try:
        return json.loads(bytes(raw).decode("utf-8"))
    except RecursionError as exc:  # "[[[[..." within the size cap: nesting, not a message
        raise WireError(f"{what} is nested too deeply") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"{what} is not JSON") from exc


def decode_export(raw: bytes, *, bucket: int, nbytes: int, window: int, kind: str) -> Export:
    """An export message, checked against what this receiver expects of bucket ``bucket``."""
    o = _exact_keys(_load(raw, "export message"), {"type", "bucket", "slot", "nbytes", "digest", "kind", "handle"},
                    "export message")
    if o["type"] != "export":
        raise WireError(f"expected an export message, got type {o['type']!r:.40}")
    got = _int(o, "bucket", 0, 1 << 40)
    if got != bucket:
        raise WireError(f"export message names bucket {got}, expected {bucket}")
    slot = _int(o, "slot", 0, window - 1)
    n = _int(o, "nbytes", 0, MAX_BUCKET_BYTES)
    if n != nbytes:
        raise WireError(f"export message says bucket {bucket} has {n} bytes; the plan says {nbytes}")
    if not is_digest(o["digest"]):
        raise WireError("export digest is not 32 lowercase hex digits")
    if o["kind"] != kind:
        raise WireError(f"export handle kind {o['kind']!r:.20} where {kind!r} was expected")
    handle: Handle = CudaHandle.from_wire(o["handle"]) if kind == "cuda" else HostHandle.from_wire(o["handle"])
    if handle.size < n:
        raise WireError(f"the shared buffer ({handle.size} bytes) is smaller than bucket {bucket} ({n} bytes)")
    return Export(bucket=got, slot=slot, nbytes=n, digest=o["digest"], kind=kind, handle=handle)


def decode_ack(raw: bytes, *, bucket: int, rank: int) -> Ack:
    o = _exact_keys(_load(raw, "ack message"), {"type", "bucket", "rank", "released", "ok", "digest", "error"},
                    "ack message")
    if o["type"] != "ack":
        raise WireError(f"expected an ack message, got type {o['type']!r:.40}")
    if _int(o, "bucket", 0, 1 << 40) != bucket or _int(o, "rank", 0, 1 << 20) != rank:
        raise WireError(f"ack message is not rank {rank}'s for bucket {bucket}")
    digest, error = o["digest"], o["error"]
    if not (digest == "" or is_digest(digest)) or not isinstance(error, str) or len(error) > 300:
        raise WireError("ack digest/error malformed")
    return Ack(bucket=bucket, rank=rank, released=_bool(o, "released"), ok=_bool(o, "ok"), digest=digest, error=error)
