"""Where an exported bucket lives and how a receiver reaches it: the seam between the IPC protocol
(ipc_protocol.py) and the memory it shares.

- :class:`CudaIpc`: the real thing. The source's slot is a CUDA tensor; its handle is the tuple of
  ``UntypedStorage._share_cuda_()``, sent field by field (ipc_wire.CudaHandle); the receiver maps
  it with ``UntypedStorage._new_shared_cuda(...)`` and copies device to device.
- :class:`HostStandIn`: the same protocol in host memory, so it runs (and is tested with real
  processes) on a machine without a GPU. A slot is an anonymous ``memfd`` of the source, named
  ``hwtui-ipc-<run>``; the receiver opens it as ``/proc/<pid>/fd/<fd>``, which the kernel allows
  only to the source's user (or root), and checks what it opened *after* opening it (its own
  ``/proc/self/fd`` link names this run's memfd; a regular file of this user, of the size
  announced), so a hostile message cannot point it at another file. Like CUDA IPC memory, a
  memfd needs no name in a shared directory and is freed by the kernel when the last process
  holding it goes, a killed one included.

Both hand the protocol 1-D uint8 torch tensors, so the copy and the device checksum are the same
code on both.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import stat
from typing import Any, Protocol

from hwtui.engine.replication.ipc_wire import CudaHandle, Handle, HostHandle, WireError

_RUN = re.compile(r"[0-9a-f]{8,64}")


class OpenError(Exception):
    """A handle that could not be opened, or opened something that is not the announced buffer."""


class Opened(Protocol):
    tensor: Any  # 1-D uint8, at least the bucket's bytes

    def close(self) -> None: ...


class ExportProvider(Protocol):
    kind: str

    def alloc(self, nbytes: int) -> Any:
        """A fresh exportable buffer (1-D uint8 tensor) of ``nbytes``."""

    def handle(self, buf: Any) -> Handle:
        """The handle a receiver opens ``buf`` with."""

    def free(self, buf: Any) -> None:
        """Give the buffer back (only once every receiver released it)."""


class Opener(Protocol):
    kind: str

    def open(self, handle: Handle, nbytes: int) -> Opened: ...


def check_run(run: str) -> str:
    if not _RUN.fullmatch(run):
        raise ValueError("an IPC run id is 8-64 lowercase hex digits")
    return run


# --- host stand-in ------------------------------------------------------------------------------

class _HostBuffer:
    def __init__(self, run: str, nbytes: int):
        import torch

        self.fd = os.memfd_create(f"hwtui-ipc-{run}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, max(1, nbytes))
            self.map = mmap.mmap(self.fd, max(1, nbytes), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(self.fd)
            raise
        self.nbytes = nbytes
        self.tensor: Any = torch.frombuffer(self.map, dtype=torch.uint8)[:nbytes]

    def close(self) -> None:
        self.tensor = None
        with contextlib.suppress(BufferError, ValueError):
            self.map.close()  # a view still alive elsewhere keeps the mapping; the fd goes regardless
        with contextlib.suppress(OSError):
            os.close(self.fd)


class HostStandIn:
    """Exporter and opener of host-memory slots (memfd), for CPU tests of the IPC protocol."""

    kind = "host"

    def __init__(self, run: str):
        self.run = check_run(run)
        self._buffers: dict[int, _HostBuffer] = {}  # id(tensor) -> its buffer
        self.opened = 0  # handles this process holds open now (receivers)

    def alloc(self, nbytes: int) -> Any:
        buf = _HostBuffer(self.run, nbytes)
        self._buffers[id(buf.tensor)] = buf
        return buf.tensor

    def handle(self, buf: Any) -> Handle:
        hb = self._buffers[id(buf)]
        return HostHandle(pid=os.getpid(), fd=hb.fd, size=max(1, hb.nbytes))

    def free(self, buf: Any) -> None:
        hb = self._buffers.pop(id(buf), None)
        if hb is not None:
            hb.close()

    def open(self, handle: Handle, nbytes: int) -> Opened:
        if not isinstance(handle, HostHandle):
            raise WireError("a host opener got a non-host handle")
        fd, size = open_memfd(handle, self.run, nbytes, writable=False, noun="the source's shared buffer",
                              mine="this run's shared buffer")
        try:
            return _HostOpened(self, fd, size, nbytes)
        except BaseException:
            os.close(fd)
            raise


def open_memfd(handle: HostHandle, run: str, nbytes: int, *, writable: bool, noun: str, mine: str) -> tuple[int, int]:
    """Open the memfd another process named by (pid, fd) and check it: (our descriptor, its size).

    One opener for every host stand-in handle (the IPC path's receivers read one, the resident
    rank writes the agent's slot): the name is this run's memfd, it is a regular file of this user
    and has the announced size, all judged from our own descriptor after the open (the message's
    pid/fd could have named any file, or the fd could have been swapped between a check and the
    open). The caller owns the descriptor."""
    try:
        # O_NONBLOCK|O_NOCTTY: a hostile pid/fd naming a FIFO or a terminal must not block
        # the open or become our controlling tty before the checks below refuse it.
        fd = os.open(f"/proc/{handle.pid}/fd/{handle.fd}",
                     (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise OpenError(f"cannot open {noun} (pid {handle.pid} fd {handle.fd}): {exc.strerror}") from exc
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
        st = os.fstat(fd)
        if not target.startswith(f"/memfd:hwtui-ipc-{run} "):
            raise OpenError(f"the handle names {target[:80]!r}, not {mine}")
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OpenError(f"{noun} is not a regular file of this user")
        if st.st_size != handle.size or nbytes > st.st_size:
            raise OpenError(f"{noun} has {st.st_size} bytes, not the {handle.size} announced")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


class _HostOpened:
    def __init__(self, owner: HostStandIn, fd: int, size: int, nbytes: int):
        import torch

        self._owner = owner
        # MAP_PRIVATE over a read-only fd: readable, and torch gets a writable buffer (no warning);
        # nothing written here could reach the source's pages.
        self._map = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fd)  # the mapping keeps the memory; no descriptor outlives the open
        self.tensor: Any = torch.frombuffer(self._map, dtype=torch.uint8)[:nbytes]
        owner.opened += 1

    def close(self) -> None:
        if self.tensor is None:
            return
        self.tensor = None
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
        self._owner.opened -= 1


# --- CUDA IPC -----------------------------------------------------------------------------------

class CudaIpc:
    """Exporter and opener of CUDA device buffers by IPC handle (needs torch with CUDA and a GPU)."""

    kind = "cuda"

    def __init__(self, device: int):
        self.device = device
        self.opened = 0
        self.shares = 0  # torch shares made (one per buffer, whatever the number of exports)
        # How this process's mappings were opened (_open_storage): None before the first, False
        # without torch's reference counter, True with it (this torch refused the empty name).
        self.counted: bool | None = None
        self._shared: dict[int, CudaHandle] = {}  # the buffer's storage address -> its handle

    def alloc(self, nbytes: int) -> Any:
        import torch

        return torch.empty(max(1, nbytes), dtype=torch.uint8, device=f"cuda:{self.device}")[:nbytes]

    def handle(self, buf: Any) -> Handle:
        """The buffer's handle, shared with torch once for the buffer's life.

        Why once, and why torch's counter is released at once: every ``_share_cuda_()`` wraps the
        storage in a new ref-counted record whose shared counter starts at 1 ("one consumer"), and
        torch keeps the memory allocated (its "limbo") until a consumer's close brings that count
        to 0. A receiver keeps its mapping of a slot between buckets (ipc_protocol), so it closes
        one mapping however many times the slot was exported: each export after the first left a
        count of 1 that nobody decremented, and the slot's memory outlived the run (an H200 source
        kept 320-1024 MiB after 4 runs; a resident rank grew by its window per push). A consumer
        killed before its close does the same. When the memory may be reused is decided here,
        not by torch's count: the source frees a slot only after every receiver acked it, and the
        agent a slot only when no consumer holds it (engine.resident.slot_holds); a mapping left
        open after that is never read. Consumers open without the counter (_open_storage): with
        it, a consumer closing before this process freed the buffer took the count below zero and
        the block was never freed (H200, round thirteen)."""
        storage = buf.untyped_storage()
        if buf.storage_offset() != 0:
            raise ValueError("an exported buffer starts its storage")
        key = int(storage.data_ptr())
        known = self._shared.get(key)
        if known is not None:
            return known
        (device, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync) = storage._share_cuda_()
        self.shares += 1
        if ref_handle:
            import torch

            torch.UntypedStorage._release_ipc_counter_cuda(bytes(ref_handle), int(ref_offset))
        shared = CudaHandle(device=int(device), handle=bytes(handle), size=int(size), offset=int(offset),
                            ref_handle=bytes(ref_handle or b""), ref_offset=int(ref_offset),
                            event_handle=bytes(event_handle or b""), event_sync=bool(event_sync))
        self._shared[key] = shared
        return shared

    def free(self, buf: Any) -> None:
        # Forget the handle: a later buffer at this address is new memory and gets its own share.
        # The block goes back to the caching allocator when the last reference goes (no count of
        # torch's holds it: handle() released it).
        self._shared.pop(int(buf.untyped_storage().data_ptr()), None)
        del buf

    def open(self, handle: Handle, nbytes: int) -> Opened:
        import torch

        if not isinstance(handle, CudaHandle):
            raise WireError("a CUDA opener got a non-CUDA handle")
        if handle.device >= torch.cuda.device_count():
            raise OpenError(f"the handle names cuda:{handle.device}; this process sees {torch.cuda.device_count()} GPUs")
        if nbytes > handle.size:
            raise OpenError(f"the shared buffer ({handle.size} bytes) is smaller than the bucket ({nbytes} bytes)")
        # CUDA must be initialised in this process before a handle is opened: a fresh consumer
        # (a serving process opening the agent's export) segfaulted without it on an H200; torch's
        # own consumer does the same (multiprocessing.reductions.rebuild_cuda_tensor).
        torch.cuda.init()
        return _CudaOpened(self, self._open_storage(torch, handle), nbytes)

    def _open_storage(self, torch: Any, handle: CudaHandle) -> Any:
        """The mapping, opened without torch's reference counter where this torch allows it.

        Why (H200, round thirteen, benchmarks/exp_ipc_counts.py): the exporter releases torch's
        count at the share (handle()), and a consumer's close then takes the count below zero;
        a block whose consumer closed before its exporter freed it was never freed (2-3 of 16 slots
        per IPC run, a killed push's slot in the agent). A mapping opened with no counter name
        decrements nothing when it closes (torch's close treats a counter it cannot open as its
        exporter gone), so the exporter's count is 0 from the share on and a freed block is free.
        Where this torch refuses an empty name, the mapping is opened with the counter, as before
        (``counted`` says which way this process went)."""
        head = (handle.device, handle.handle, handle.size, handle.offset)
        tail = (handle.event_handle or None, handle.event_sync)
        if self.counted is not True:
            try:
                storage = torch.UntypedStorage._new_shared_cuda(*head, b"", 0, *tail)
            except (RuntimeError, TypeError) as exc:
                first: Exception | None = exc
            else:
                self.counted = False
                return storage
        else:
            first = None
        try:
            storage = torch.UntypedStorage._new_shared_cuda(*head, handle.ref_handle or None, handle.ref_offset, *tail)
        except RuntimeError as exc:
            raise OpenError(f"cudaIpcOpenMemHandle failed: {str(exc).splitlines()[0][:200]}") from (first or exc)
        if first is not None:
            self.counted = True  # the handle opened with its counter: this torch wants one
        return storage


class _CudaOpened:
    def __init__(self, owner: CudaIpc, storage: Any, nbytes: int):
        import torch

        self._owner = owner
        self._storage: Any = storage
        self.tensor: Any = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (nbytes,), (1,))
        owner.opened += 1

    def close(self) -> None:
        if self._storage is None:
            return
        import torch

        self.tensor = None
        self._storage = None  # dropping the last reference closes the mapping and decrements torch's ref counter
        torch.cuda.ipc_collect()
        self._owner.opened -= 1
