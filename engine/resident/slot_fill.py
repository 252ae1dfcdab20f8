"""The resident rank's side of a device-resident receiver: fill the agent's staged slot.

The agent (engine.resident.device_served) allocates the slot and sends its descriptor in the push
command; the rank opens it by IPC handle (CUDA IPC on a GPU, the memfd stand-in in CPU tests) and
copies each bucket into it as soon as the bucket is verified in the staging copy, so the slot fills
while the transfer runs. What no bucket carried (a delta's unchanged tensors, copied into the
staging copy from the served version) is copied at prepare, after the staging copy is verified and
before the vote: a yes vote means the slot holds the whole version. The rank closes its mapping
when the push is over; the slot stays the agent's.

The descriptor is untrusted input for this process in the same way an IPC export is: exact fields,
types and bounds (ipc_wire), and the opener checks what it opened.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from typing import Any

from hwtui.engine.replication.ipc_provider import open_memfd
from hwtui.engine.replication.ipc_wire import MAX_BUCKET_BYTES, CudaHandle, HostHandle, WireError


class SlotFillError(Exception):
    pass


def parse_descriptor(obj: object) -> tuple[str, str, int, CudaHandle | HostHandle]:
    """(kind, run, nbytes, handle) of a slot descriptor, or WireError."""
    if not isinstance(obj, dict) or set(obj) != {"kind", "run", "nbytes", "handle"}:
        raise WireError("a slot descriptor has exactly kind, run, nbytes and handle")
    kind, run, nbytes = obj["kind"], obj["run"], obj["nbytes"]
    if kind not in ("cuda", "host"):
        raise WireError("slot kind must be cuda or host")
    if not isinstance(run, str) or not 8 <= len(run) <= 64:
        raise WireError("slot run must be a run id")
    if type(nbytes) is not int or not 0 <= nbytes <= MAX_BUCKET_BYTES:
        raise WireError("slot nbytes out of range")
    handle = CudaHandle.from_wire(obj["handle"]) if kind == "cuda" else HostHandle.from_wire(obj["handle"])
    return kind, run, nbytes, handle


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for off, n in sorted(r for r in ranges if r[1] > 0):
        if out and out[-1][0] + out[-1][1] >= off:
            end = max(out[-1][0] + out[-1][1], off + n)
            out[-1] = (out[-1][0], end - out[-1][0])
        else:
            out.append((off, n))
    return out


class SlotFill:
    """The staged slot, opened in the rank: ``copy`` ranges of the staging copy's data into it."""

    def __init__(self, descriptor: object, local_rank: int = 0):
        from hwtui.engine.replication.ipc_provider import CudaIpc, check_run

        self.kind, run, self.nbytes, handle = parse_descriptor(descriptor)
        if self.kind == "cuda":
            import torch

            opener: Any = CudaIpc(handle.device if isinstance(handle, CudaHandle) else local_rank)
            torch.cuda.set_device(opener.device)
            self._opened: Any = opener.open(handle, self.nbytes)
        else:
            assert isinstance(handle, HostHandle)
            self._opened = _HostWritable(check_run(run), handle, self.nbytes)
        self.tensor: Any = self._opened.tensor
        self._covered: list[tuple[int, int]] = []
        self.copied = 0

    def check_size(self, data_bytes: int) -> None:
        if data_bytes > self.nbytes:
            raise SlotFillError(f"the version has {data_bytes} bytes of tensors; the agent's slot holds {self.nbytes}")

    def copy(self, data: Any, ranges: list[tuple[int, int]]) -> None:
        """Copy ``data[off:off+n]`` (the staging copy's data section) into the slot at the same offsets."""
        if self.tensor is None:
            return
        for off, n in ranges:
            self.tensor[off:off + n].copy_(data[off:off + n], non_blocking=self.kind == "cuda")
            self._covered.append((off, n))
            self.copied += n

    def fill_rest(self, data: Any, data_bytes: int) -> None:
        """Copy whatever no bucket carried, then wait for every copy: the slot holds the whole version."""
        gaps, pos = [], 0
        for off, n in _merge(self._covered):
            if off > pos:
                gaps.append((pos, off - pos))
            pos = max(pos, off + n)
        if pos < data_bytes:
            gaps.append((pos, data_bytes - pos))
        self.copy(data, gaps)
        if self.kind == "cuda":
            import torch

            torch.cuda.synchronize()

    def close(self) -> None:
        if self._opened is not None:
            self.tensor = None
            opened, self._opened = self._opened, None
            opened.close()


class _HostWritable:
    """The host stand-in's slot opened for writing (the IPC path's receivers only read, privately).

    Opened and checked by ``ipc_provider.open_memfd`` (the IPC path's receivers use the same): this
    agent run's memfd, a regular file of this user, the announced size; then a shared mapping, so
    what the rank writes is what the agent serves."""

    def __init__(self, run: str, handle: HostHandle, nbytes: int):
        import torch

        fd, size = open_memfd(handle, run, nbytes, writable=True, noun="the agent's slot", mine="this agent's slot")
        try:
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping keeps the memory
        self.tensor: Any = torch.frombuffer(self._map, dtype=torch.uint8)[:nbytes]

    def close(self) -> None:
        self.tensor = None
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
