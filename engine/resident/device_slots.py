"""A resident receiver's two device buffers (A/B): one serves, the other takes the next push.

For ``hwtui agent --device cuda`` (issue 23.3) the served version lives in device memory. A push
is received into the slot that is not serving; the commit switches which buffer is served (the
old one becomes the next push's buffer, so steady state allocates nothing); a failed or aborted
push rolls back (the staged slot is freed, what was served still is); closing (the agent stops,
or its rank dies and the agent cleans up) frees both. The memory itself comes from an allocator
seam: ``ipc_provider.CudaIpc`` on a GPU (so a same-node push can also export a slot by IPC
handle), ``ipc_provider.HostStandIn`` in CPU tests.

The agent holds the slots (engine.resident.device_served), so a resident rank that dies or is
stopped mid-push takes none of them with it; the rank writes the staged slot through its IPC
handle (engine.resident.slot_fill).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Allocator(Protocol):
    def alloc(self, nbytes: int) -> Any: ...

    def free(self, buf: Any) -> None: ...


class SlotError(Exception):
    """A slot operation out of order (a second push while one is staged, a commit of another version)."""


class SlotHeld(SlotError):
    """The slot a push would be received into is held by a consumer still reading it (slot_holds)."""


@dataclass
class _Slot:
    buf: Any = None
    capacity: int = 0
    version: str | None = None


class DeviceSlots:
    NAMES = ("A", "B")

    def __init__(self, allocator: Allocator, released: Callable[[], None] | None = None):
        """``released`` runs after a buffer is freed and every reference this object held to it is
        gone: on a GPU it hands the freed block back to the driver (device_served._cuda_release).
        Why not inside ``allocator.free``: the slot and the caller's frame still reference the
        buffer there, so torch's cache could return nothing (H200, round sixteen: a failed push's
        1 GiB slot stayed in nvidia-smi after it was "freed")."""
        self._alloc = allocator
        self._released = released
        self._slots = {name: _Slot() for name in self.NAMES}
        self._serving: str | None = None
        self._staging: str | None = None  # the slot a push is being received into
        self._lock = threading.Lock()

    def _other(self) -> str:
        return "B" if self._serving == "A" else "A"

    def stage(self, version: str, nbytes: int) -> Any:
        """The buffer (``nbytes`` long) to receive ``version`` into: the slot not serving."""
        with self._lock:
            if self._staging is not None:
                raise SlotError(f"slot {self._staging} is already receiving {self._slots[self._staging].version!r}")
            if self._serving is not None and self._slots[self._serving].version == version:
                raise SlotError(f"{version!r} is already served")
            name = self._other()
            slot = self._slots[name]
            if slot.buf is None or slot.capacity < nbytes:
                self._free(slot)  # before the larger one is allocated: the device may hold one only
                slot.buf, slot.capacity = self._alloc.alloc(nbytes), nbytes
            slot.version = version
            self._staging = name
            return slot.buf[:nbytes]

    def commit(self, version: str) -> str:
        """Serve the staged ``version``; returns the slot now serving."""
        with self._lock:
            if self._staging is None or self._slots[self._staging].version != version:
                raise SlotError(f"{version!r} is not the version being received")
            old = self._serving
            self._serving, self._staging = self._staging, None
            if old is not None:
                self._slots[old].version = None  # kept allocated: the next push lands there
            return self._serving

    def rollback(self, version: str | None = None) -> None:
        """Drop the push being received (its buffer is freed); what was served still is."""
        with self._lock:
            if self._staging is None:
                return
            slot = self._slots[self._staging]
            if version is not None and slot.version != version:
                raise SlotError(f"{version!r} is not the version being received")
            self._free(slot)
            self._slots[self._staging] = _Slot()
            self._staging = None

    def _free(self, slot: _Slot) -> None:
        """Free ``slot``'s buffer (if any) and drop this object's last reference to it before
        ``released`` runs. A view handed out by ``stage`` and still held by a caller keeps its
        block allocated until that view goes: callers drop theirs before a rollback."""
        buf, slot.buf, slot.capacity = slot.buf, None, 0
        if buf is None:
            return
        self._alloc.free(buf)
        del buf
        if self._released is not None:
            self._released()

    def _view(self, which: str | None) -> tuple[str | None, Any]:
        if which is None:
            return None, None
        slot = self._slots[which]
        return slot.version, slot.buf

    def receiving(self) -> tuple[str | None, Any]:
        """(version, whole buffer) of the slot a push is being received into, or (None, None)."""
        with self._lock:
            return self._view(self._staging)

    def serving(self) -> tuple[str, str, Any] | None:
        """(slot, version, buffer) being served, read in one step, or None."""
        with self._lock:
            if self._serving is None:
                return None
            slot = self._slots[self._serving]
            if slot.version is None or slot.buf is None:
                return None
            return self._serving, slot.version, slot.buf

    def next_slot(self) -> str:
        """The slot the next push is received into (the one not serving)."""
        with self._lock:
            return self._other()

    def serving_slot(self) -> str | None:
        with self._lock:
            return self._serving

    def served(self) -> tuple[str | None, Any]:
        """(version, buffer) being served, or (None, None)."""
        with self._lock:
            return self._view(self._serving)

    def close(self) -> None:
        """Free both buffers (the agent stops, or cleans up after its rank died)."""
        with self._lock:
            for name, slot in self._slots.items():
                self._free(slot)
                self._slots[name] = _Slot()
            self._serving = self._staging = None

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"A": self._slots["A"].version, "B": self._slots["B"].version, "serving": self._serving,
                    "receiving": self._staging,
                    "bytes": {n: s.capacity for n, s in self._slots.items() if s.buf is not None}}
