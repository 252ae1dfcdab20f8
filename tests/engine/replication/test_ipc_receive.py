"""IpcReceiver.receive's timing (ipc_protocol._Clock) and its hooks' order: on a GPU the copy and
the checksum are not separated by a sync, so the split of a receive into copy_s and verify_s comes
from CUDA events read after the digest's one transfer; on the host, from the host clock."""

from __future__ import annotations

import secrets
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from hwtui.engine.replication import ipc_protocol
from hwtui.engine.replication.ipc_protocol import Channel, IpcReceiver, IpcSource
from hwtui.engine.replication.ipc_provider import HostStandIn


def test_a_receive_runs_its_hooks_in_order_and_times_the_open_as_part_of_the_copy() -> None:
    store, run, n = dist.HashStore(), secrets.token_hex(8), 3 * 16384 + 5
    src = IpcSource(Channel(store, run, 30.0), HostStandIn(run), [1], 1)
    seen: list[str] = []

    def hook(phase: str, b: int, dst: Any) -> None:
        seen.append(phase)
        if phase == "opened":
            time.sleep(0.05)  # counted in copy_s: the transfer, open included
        if phase == "copied":
            dst[7] ^= 4  # after the copy, before the checksum: named

    rx = IpcReceiver(Channel(store, run, 30.0), HostStandIn(run), 1, 1, hook=hook)
    try:
        data = torch.randint(0, 256, (n,), dtype=torch.uint8)
        src.acquire(0, n).copy_(data)
        src.publish(0, n)
        got = rx.receive(0, torch.empty(n, dtype=torch.uint8))
        src.drain()
    finally:
        rx.close()
        src.close()
    assert seen == ["opened", "copied", "acked"]
    assert not got.ok and "failed its device checksum" in got.error
    assert 0.05 <= got.copy_s < 5 and 0 <= got.verify_s < 5


class _FakeEvent:
    """A CUDA event on a fake device clock: record() takes the clock's next reading."""

    readings: list[float] = []

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.t: float | None = None

    def record(self, stream: Any) -> None:
        assert stream == "the copy's stream"
        self.t = _FakeEvent.readings.pop(0)

    def elapsed_time(self, end: _FakeEvent) -> float:  # milliseconds, as torch.cuda.Event says
        assert self.t is not None and end.t is not None
        return (end.t - self.t) * 1e3


def test_on_a_gpu_copy_and_verify_come_from_events_with_the_open_in_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: "the copy's stream")
    _FakeEvent.readings = [10.0, 10.002, 10.0035]  # device seconds: before the copy, after it, after the sums
    dst = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    t0 = time.perf_counter() - 0.25  # the open took 0.25 s of host time
    clock = ipc_protocol._Clock(dst, t0)
    clock.copied()
    clock.summed()
    copy_s, verify_s = clock.split()
    assert copy_s == pytest.approx(0.25 + 0.002, abs=0.02)
    assert verify_s == pytest.approx(0.0015)
    assert not _FakeEvent.readings  # three events, no more
