"""The served version's export: what a local serving process needs to use the agent's device slot.

An export (``POST /v1/served/export`` on the agent, with the token, from the agent's own user or a
member of its ``--serve-group``) is a JSON document: the served version, the slot, its IPC handle
(the fields of ``UntypedStorage._share_cuda_()``, as ipc_wire sends them; the memfd stand-in's in
CPU tests) and the layout, ``{name: {dtype, shape, offset, nbytes}}``, each offset relative to the
slot (the served safetensors file's data section). :func:`open_served` turns a document into typed
tensor views of the slot, without a copy.

A document is untrusted input to its consumer: exact handle fields (ipc_wire), every tensor
inside the slot, its byte count its dtype times its shape.

The A/B slots rotate: after the next commit the slot a consumer was given becomes the one the push
after that is received into. An export holds its slot (engine.resident.slot_holds: the push that
would overwrite it is refused while the hold lasts); a consumer renews the hold while it reads,
re-exports when ``version`` changes (``GET /v1/replication`` says ``device.serving``), moves to the
new slot and releases the old lease.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.ipc_wire import CudaHandle, HostHandle, WireError

MAX_TENSORS = 10_000_000


def layout_of(path: Path) -> dict[str, dict[str, Any]]:
    """Each tensor's place in the slot, from the served file's header (read bounded and validated)."""
    from hwtui.engine.replication.weights import read_safetensors_header

    tensors, _, start = read_safetensors_header(path)
    return {t.name: {"dtype": t.dtype, "shape": list(t.shape), "offset": t.file_offset - start, "nbytes": t.nbytes}
            for t in tensors}


def _check_layout(layout: object, nbytes: int) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    from hwtui.engine.replication.weights import DTYPES

    if not isinstance(layout, dict) or len(layout) > MAX_TENSORS:
        raise WireError("layout must be an object of tensors")
    out: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for name, t in layout.items():
        if not isinstance(t, dict) or set(t) != {"dtype", "shape", "offset", "nbytes"}:
            raise WireError(f"layout[{name[:80]!r}] must have exactly dtype, shape, offset, nbytes")
        dtype, shape, off, n = t["dtype"], t["shape"], t["offset"], t["nbytes"]
        if dtype not in DTYPES:
            raise WireError(f"layout[{name[:80]!r}]: unknown dtype")
        if not isinstance(shape, list) or len(shape) > 64 or any(type(d) is not int or d < 0 for d in shape):
            raise WireError(f"layout[{name[:80]!r}]: shape must be a list of sizes")
        if type(off) is not int or type(n) is not int or off < 0 or n < 0 or off + n > nbytes:
            raise WireError(f"layout[{name[:80]!r}] lies outside the slot")
        if math.prod(shape) * DTYPES[dtype][0] != n:
            raise WireError(f"layout[{name[:80]!r}]: {n} bytes is not its dtype times its shape")
        out[name] = (dtype, tuple(shape), off, n)
    return out


@dataclass
class Served:
    """The served version's tensors, mapped from the agent's slot; ``close`` releases the mapping."""

    version: str
    tensors: dict[str, Any]
    _opened: Any

    def close(self) -> None:
        self.tensors = {}
        if self._opened is not None:
            opened, self._opened = self._opened, None
            opened.close()


def open_served(doc: dict[str, Any]) -> Served:
    """Open an export document: typed views of every tensor of the served version (no copy)."""
    import torch

    from hwtui.engine.replication.ipc_provider import CudaIpc, HostStandIn, check_run
    from hwtui.engine.replication.weights import DTYPES

    kind, nbytes, version = doc.get("kind"), doc.get("bytes"), doc.get("version")
    if kind not in ("cuda", "host") or type(nbytes) is not int or nbytes < 0 or not isinstance(version, str):
        raise HwtuiError("not an export document of an hwtui agent (kind, bytes, version)")
    try:
        layout = _check_layout(doc.get("layout"), nbytes)
        if kind == "cuda":
            handle: Any = CudaHandle.from_wire(doc.get("handle"))
            opener: Any = CudaIpc(handle.device)
        else:
            handle = HostHandle.from_wire(doc.get("handle"))
            opener = HostStandIn(check_run(str(doc.get("run"))))
        opened = opener.open(handle, nbytes)
    except (WireError, ValueError) as exc:
        raise HwtuiError(f"the agent's export is refused: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - an OpenError, or the driver's: one line
        raise HwtuiError(f"cannot open the agent's served slot: {exc}") from None
    base = opened.tensor
    tensors = {}
    for name, (dtype, shape, off, n) in layout.items():
        tdtype = getattr(torch, DTYPES[dtype][1])
        tensors[name] = base[off:off + n].view(tdtype).view(shape) if n else torch.empty(shape, dtype=tdtype, device=base.device)
    return Served(version=version, tensors=tensors, _opened=opened)
