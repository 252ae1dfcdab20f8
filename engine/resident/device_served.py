"""The served version in device memory (``hwtui agent --device cuda``): the agent's A/B slots.

The slots live in the *agent's* process, not in its resident rank: a rank stopped or killed
mid-push (an abort, a dead peer, SIGKILL) takes nothing served with it, and the agent frees the
slot that push was filling. The rank writes into the staged slot through its IPC handle
(engine.resident.slot_fill): the slot descriptor travels in the push command, field by field
(ipc_wire), never pickled. The commit switches which slot is served; a push that does not commit
frees its slot; ``close`` (the agent stops) frees both, and the driver frees everything with the
agent's process whatever way it ends.

The memory is CUDA memory (``ipc_provider.CudaIpc``) on a GPU, and the memfd stand-in
(``ipc_provider.HostStandIn``) under ``HWTUI_TEST_IPC=host``, so every path here runs in CPU tests.
A slot's bytes are the served safetensors file's data section, byte for byte: tensor ``t`` lies at
``data_offsets[0]`` of the file's header, which is what the export gives a consumer
(engine.resident.served_export).

torch is imported on first use only (the agent imports it for its first push, or to load the
version it serves at start), never at import.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwtui.engine.resident.device_slots import DeviceSlots, SlotError, SlotHeld
from hwtui.engine.resident.slot_holds import Hold, SlotHolds

SLOT_KINDS = ("cuda", "host")


class _Counting:
    """The allocator seam with counts: steady state allocates nothing (slot reuse), and says so."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.allocs = 0
        self.frees = 0

    def alloc(self, nbytes: int) -> Any:
        buf = self.inner.alloc(nbytes)
        self.allocs += 1
        return buf

    def free(self, buf: Any) -> None:
        self.inner.free(buf)
        self.frees += 1


def _cuda_release() -> None:
    """Give freed blocks back to the driver at once (nvidia-smi agrees), not to torch's cache."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()


@dataclass(frozen=True)
class Exported:
    version: str
    slot: str
    nbytes: int
    handle: dict[str, Any]
    hold: Hold | None


class DeviceServed:
    def __init__(self, kind: str, device_index: int = 0):
        if kind not in SLOT_KINDS:
            raise ValueError(f"slot kind {kind!r}")
        self.kind = kind
        self.device_index = device_index
        self.run = secrets.token_hex(16)  # names this agent's memfds (host); a consumer checks it
        self._lock = threading.Lock()
        self._mem: _Counting | None = None
        self._slots: DeviceSlots | None = None
        self.error: str | None = None
        self.loaded: str | None = None  # the last version loaded from disk (not pushed), in words
        # Consumers' holds on the slot they were exported (engine.resident.slot_holds). Checking a
        # hold and staging a slot, and reading the served slot and holding it, are each one step
        # under this lock: no push lands between an export and its hold.
        self.holds = SlotHolds()
        self._hold_lock = threading.Lock()

    @property
    def device(self) -> str:
        return f"cuda:{self.device_index}" if self.kind == "cuda" else "host"

    def _ensure(self) -> DeviceSlots:
        with self._lock:
            if self._slots is None:
                if self.kind == "cuda":
                    import torch

                    from hwtui.engine.replication.ipc_provider import CudaIpc

                    torch.cuda.set_device(self.device_index)
                    self._mem, released = _Counting(CudaIpc(self.device_index)), _cuda_release
                else:
                    from hwtui.engine.replication.ipc_provider import HostStandIn

                    self._mem, released = _Counting(HostStandIn(self.run)), None
                self._slots = DeviceSlots(self._mem, released=released)
            return self._slots

    # ------------------------------------------------------------------ a push

    def stage(self, version: str, nbytes: int) -> dict[str, Any]:
        """The slot ``version`` (``nbytes`` of tensor data) is received into, as the descriptor the
        resident rank opens it with (engine.resident.slot_fill.parse_descriptor)."""
        slots = self._ensure()
        try:
            self._stage_unheld(slots, version, nbytes)
        except SlotError:
            raise
        except (RuntimeError, OSError, MemoryError) as exc:  # out of device memory: the push is refused
            raise SlotError(f"cannot allocate {nbytes} bytes on {self.device}: {str(exc).splitlines()[0][:200]}") from None
        _, buf = slots.receiving()
        assert self._mem is not None
        handle = self._mem.inner.handle(buf)
        return {"kind": self.kind, "run": self.run, "nbytes": nbytes, "handle": handle.to_wire()}

    def _stage_unheld(self, slots: DeviceSlots, version: str, nbytes: int) -> Any:
        """Stage the slot not serving, unless a consumer holds it (SlotHeld, nothing changed)."""
        with self._hold_lock:
            slots.rollback()  # a push the agent never heard the end of: its slot goes first
            why = self.holds.refusal(slots.next_slot())
            if why is not None:
                raise SlotHeld(why)
            return slots.stage(version, nbytes)

    def export(self, hold_s: float, holder: str) -> Exported:
        """The served slot, read and held for ``hold_s`` seconds in one step (a commit or a push
        landing between the two would hand out a slot nobody holds). Raises SlotError when nothing
        is served, HoldError when no hold can be taken."""
        with self._hold_lock:
            slots = self._slots
            got = slots.serving() if slots is not None else None
            if got is None:
                raise SlotError(f"no version is served on {self.device} yet")
            slot, version, buf = got
            return Exported(version, slot, int(buf.numel()), self.handle(buf),
                            self.holds.hold(slot, version, hold_s, holder))

    def slot_held(self) -> str | None:
        """Why a push could not be received into the slot it would land in now, or None."""
        with self._hold_lock:
            return self.holds.refusal(self._slots.next_slot()) if self._slots is not None else None

    def commit(self, version: str) -> str | None:
        """Serve the staged ``version``; None when it is not the one staged (nothing changes)."""
        if self._slots is None:
            return None
        try:
            return self._slots.commit(version)
        except SlotError:
            return None

    def rollback(self) -> None:
        if self._slots is not None:
            self._slots.rollback()

    def close(self) -> None:
        with self._lock:
            slots, self._slots = self._slots, None
        if slots is not None:
            slots.close()

    # ------------------------------------------------------------------ the version on disk

    def load(self, version: str, path: Path, *, readers: int | None = None) -> None:
        """Serve ``version`` from its safetensors file (``path``): the agent's start, or a switch
        finished from a staged copy, put on disk a version no push filled a slot with.

        The data section goes through the parallel reader a replicate source uses (T threads,
        a pinned ring and one stream each on a GPU; engine.replication.reader), not one thread
        and a 64 MiB pinned chunk synchronised per copy. The file is opened once: its header and
        its bytes are read from the same descriptor's file, and one changed under the read is a
        named error, never a mixed slot."""
        from hwtui.engine.replication.reader import WeightFile, read_range
        from hwtui.engine.replication.weights import read_safetensors_header

        t = time.perf_counter()
        with WeightFile(path) as wf:
            _, _, start = read_safetensors_header(path)
            wf.check_unchanged()  # the header read is the opened file's
            nbytes = wf.size - start
            slots = self._ensure()
            dst = self._stage_unheld(slots, version, nbytes)
            try:
                read_range(wf, dst, device=self.device if self.kind == "cuda" else "cpu", threads=readers,
                           offset=start, nbytes=nbytes)
            except BaseException:
                # This frame's view goes before the rollback frees the slot. The traceback's frames
                # still hold read_range's: the block stays in torch's cache (reused by the next
                # slot, not returned to the driver) until the agent handles the error.
                del dst
                slots.rollback(version)
                raise
        slots.commit(version)
        self.loaded = f"{version} loaded from disk in {time.perf_counter() - t:.3f} s"

    # ------------------------------------------------------------------ what it serves

    def served(self) -> tuple[str | None, Any]:
        return self._slots.served() if self._slots is not None else (None, None)

    def handle(self, buf: Any) -> dict[str, Any]:
        assert self._mem is not None
        return dict(self._mem.inner.handle(buf).to_wire())

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device": self.device, "kind": self.kind, "serving": None, "slot": None, "bytes": 0,
                               "receiving": None, "slots": {}, "allocs": 0, "frees": 0, "holds": []}
        if self.error:
            out["error"] = self.error
        if self.loaded:
            out["loaded"] = self.loaded
        slots = self._slots
        if slots is None:
            return out
        st = slots.state()
        name = st["serving"]
        out.update(serving=st.get(name) if name else None, slot=name, receiving=st["receiving"],
                   bytes=int(st["bytes"].get(name, 0)) if name else 0,
                   slots={n: {"version": st[n], "bytes": st["bytes"].get(n, 0)} for n in ("A", "B")})
        if self._mem is not None:
            out.update(allocs=self._mem.allocs, frees=self._mem.frees)
        out["holds"] = self.holds.state()
        return out


def data_bytes(plan: Any) -> int:
    """The tensor bytes of a version (its safetensors file's data section): the slot's size."""
    with contextlib.suppress(KeyError, TypeError):
        return int(sum(int(t["nbytes"]) for t in plan["tensors"]))
    return 0
