"""A resident receiver's A/B device slots (engine/resident/device_slots.py) with host-memory
stand-ins (memfd slots, ipc_provider.HostStandIn) for device memory: switch on commit, rollback
on failure, everything freed on close; a slot's memory is gone once its holder is."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import weakref

import pytest

from hwtui.engine.replication.ipc_provider import HostStandIn
from hwtui.engine.resident.device_slots import DeviceSlots, SlotError


class Counting(HostStandIn):
    def __init__(self) -> None:
        super().__init__(secrets.token_hex(8))
        self.allocs = 0

    def alloc(self, nbytes: int):  # type: ignore[no-untyped-def]
        self.allocs += 1
        return super().alloc(nbytes)


def test_commit_switches_the_served_buffer_and_the_old_one_takes_the_next_push() -> None:
    mem = Counting()
    slots = DeviceSlots(mem)
    assert slots.served() == (None, None)
    slots.stage("v1", 64).fill_(1)
    assert slots.served() == (None, None)  # nothing served until the commit
    assert slots.commit("v1") == "A"
    v, buf_a = slots.served()
    assert v == "v1" and int(buf_a[:64].sum()) == 64
    slots.stage("v2", 64).fill_(2)
    assert slots.served()[0] == "v1" and int(slots.served()[1][:64].sum()) == 64  # still v1 while v2 arrives
    assert slots.commit("v2") == "B"
    assert slots.served()[0] == "v2"
    slots.stage("v3", 64)  # lands in A, reusing its buffer
    assert slots.commit("v3") == "A" and mem.allocs == 2
    assert slots.state()["serving"] == "A" and slots.state()["B"] is None
    slots.close()
    assert mem._buffers == {} and slots.served() == (None, None)


def test_a_failed_push_rolls_back_and_what_was_served_still_is() -> None:
    mem = Counting()
    slots = DeviceSlots(mem)
    slots.stage("v1", 32).fill_(7)
    slots.commit("v1")
    slots.stage("v2", 32).fill_(9)
    slots.rollback("v2")
    v, buf = slots.served()
    assert v == "v1" and int(buf[:32].sum()) == 7 * 32
    assert len(mem._buffers) == 1  # the staged slot's memory is freed
    with pytest.raises(SlotError):
        slots.commit("v2")
    slots.stage("v2", 48)
    assert slots.commit("v2") == "B"


def test_out_of_order_requests_are_refused() -> None:
    slots = DeviceSlots(Counting())
    slots.stage("v1", 8)
    with pytest.raises(SlotError, match="already receiving"):
        slots.stage("v2", 8)
    with pytest.raises(SlotError, match="not the version being received"):
        slots.commit("v2")
    slots.commit("v1")
    with pytest.raises(SlotError, match="already served"):
        slots.stage("v1", 8)
    slots.close()


def test_a_bigger_version_reallocates_its_slot() -> None:
    mem = Counting()
    slots = DeviceSlots(mem)
    slots.stage("v1", 8)
    slots.commit("v1")
    slots.stage("v2", 8)
    slots.commit("v2")
    buf = slots.stage("v3", 1000)
    assert buf.numel() == 1000 and mem.allocs == 3 and len(mem._buffers) == 2
    slots.close()


def test_slot_memory_is_gone_when_its_holder_dies() -> None:
    # The holder is killed with a slot staged: no file, no name anywhere holds its memory after.
    code = ("import os, secrets, signal, sys; from hwtui.engine.replication.ipc_provider import HostStandIn; "
            "from hwtui.engine.resident.device_slots import DeviceSlots; s = DeviceSlots(HostStandIn(secrets.token_hex(8))); "
            "b = s.stage('v1', 1 << 20); b.fill_(3); print(os.getpid(), flush=True); sys.stdin.readline(); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdin is not None
    pid = int(p.stdout.readline())
    held = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert any(h.startswith("/memfd:hwtui-ipc-") for h in held)
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.wait(timeout=60) == -9
    assert not os.path.exists(f"/proc/{pid}")  # its memfd had no other holder: the kernel freed it


class Tracked:
    """torch CPU tensors as the device memory, each freed one tracked by a weak reference: what a
    ``released`` hook (torch.cuda.empty_cache on a GPU) can give back is only what nobody holds."""

    def __init__(self) -> None:
        self.freed: list[weakref.ref] = []  # type: ignore[type-arg]
        self.alive_at_release: list[int] = []

    def alloc(self, nbytes: int):  # type: ignore[no-untyped-def]
        import torch

        return torch.empty(nbytes, dtype=torch.uint8)

    def free(self, buf) -> None:  # type: ignore[no-untyped-def]
        self.freed.append(weakref.ref(buf.untyped_storage()))

    def released(self) -> None:
        self.alive_at_release.append(sum(r() is not None for r in self.freed))


def test_a_freed_slot_is_referenced_by_nothing_when_its_memory_is_released() -> None:
    """H200, round sixteen: a failed push's 1 GiB slot stayed in nvidia-smi after the agent freed
    it, because the release (empty_cache) ran inside ``free`` while the slot still held the
    buffer. Every path that frees (rollback, a larger version, close) releases after the last
    reference is gone."""
    pytest.importorskip("torch")
    mem = Tracked()
    slots = DeviceSlots(mem, released=mem.released)
    slots.stage("v1", 64)
    slots.commit("v1")
    slots.stage("v2", 64)
    slots.rollback("v2")  # a failed push
    slots.stage("v2", 128)  # a larger version: slot B again, allocated at 128
    slots.commit("v2")
    slots.stage("v3", 256)  # slot A grows: its 64-byte buffer is freed first
    slots.commit("v3")
    slots.close()  # both
    assert len(mem.freed) == 4
    assert mem.alive_at_release == [0, 0, 0, 0]
