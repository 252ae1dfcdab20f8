"""The IPC protocol (ipc_wire, ipc_provider.HostStandIn, ipc_protocol) in one process: a source and
receivers in threads over a real c10d HashStore, host-memory slots standing in for device memory.
Deaths and hostile sources across real processes are in test_ipc_processes.py."""

from __future__ import annotations

import base64
import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from hwtui.engine.replication.device_checksum import device_digest
from hwtui.engine.replication.ipc_protocol import Channel, IpcFailure, IpcReceiver, IpcSource, acks_from, exports_to
from hwtui.engine.replication.ipc_provider import HostStandIn, OpenError
from hwtui.engine.replication.ipc_wire import (
    Ack,
    CudaHandle,
    Export,
    HostHandle,
    WireError,
    decode_ack,
    decode_export,
)


def _data(b: int, n: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(b))


class KeyedOnly:
    """A c10d store without queue operations (torch before 2.7), at the library boundary: the
    channel then carries its queues over numbered keys."""

    def __init__(self, store: Any):
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name.startswith("queue_"):
            raise AttributeError(name)
        return getattr(self._store, name)


class Counting:
    """A store that counts the calls each thread makes (each is a round trip to a TCPStore, but
    ``set`` and ``queue_push``, which it does not answer)."""

    def __init__(self, store: Any):
        self._store = store
        self.calls: dict[str, list[str]] = {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._store, name)

        def counted(*args: Any) -> Any:
            self.calls.setdefault(threading.current_thread().name, []).append(name)
            return fn(*args)

        return counted


def _run(sizes: list[int], receivers: int, window: int, *, corrupt: tuple[int, int] | None = None,
         timeout_s: float = 30.0, capacity: int = 0,
         flip_after_publish: int | None = None, store: Any = None) -> dict[str, Any]:
    store = dist.HashStore() if store is None else store
    run = secrets.token_hex(8)
    out: dict[str, Any] = {"rx": {}, "errors": []}
    live_max = [0]

    def source() -> None:
        prov = HostStandIn(run)
        bufs: dict[int, Any] = {}

        def flip(phase: str, b: int, _dst: Any = None) -> None:
            # The exported memory changes after its digest was taken, before any receiver is told.
            if phase == "exported" and b == flip_after_publish:
                bufs[b][bufs[b].numel() // 2] ^= 0x10

        src = IpcSource(Channel(store, run, timeout_s), prov, list(range(1, receivers + 1)), window,
                        capacity=capacity, hook=flip)
        try:
            for b, n in enumerate(sizes):
                buf = bufs[b] = src.acquire(b, n)
                buf.copy_(_data(b, n))
                src.publish(b, n)
                live_max[0] = max(live_max[0], sum(1 for s in src.slots if s is not None and s.bucket is not None))
            src.drain()
        except IpcFailure as exc:
            out["errors"].append(str(exc))
        finally:
            src.close()
        out["stats"] = src.stats

    def receiver(rank: int) -> None:
        prov = HostStandIn(run)

        def hook(phase: str, b: int, dst: Any) -> None:
            if corrupt == (rank, b) and phase == "copied":
                dst[3] ^= 1

        rx = IpcReceiver(Channel(store, run, timeout_s), prov, rank, window, hook=hook)
        got = []
        try:
            for b, n in enumerate(sizes):
                dst = torch.empty(n, dtype=torch.uint8)
                r = rx.receive(b, dst)
                got.append((r.ok, r.error, torch.equal(dst, _data(b, n))))
            out.setdefault("held", {})[rank] = prov.opened
            # What a benchmark times copies out of: the source's buffers, whole, each one's last bucket.
            out.setdefault("mapped", {})[rank] = sorted(bytes(t[:4].tolist()) for t in rx.mapped())
        except IpcFailure as exc:
            out["errors"].append(str(exc))
        finally:
            rx.close()
        out.setdefault("mapped_after_close", {})[rank] = len(rx.mapped())
        out.setdefault("opens", {})[rank] = rx.opens
        out["rx"][rank] = (got, prov.opened)

    threads = [threading.Thread(target=source, name="source")] + [
        threading.Thread(target=receiver, args=(r,), name=f"rank{r}") for r in range(1, receivers + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()
    out["live_max"] = live_max[0]
    ch = Channel(store, run, 1.0)
    out["left"] = sum(ch.backlog(q(r)) for r in range(1, receivers + 1) for q in (exports_to, acks_from))
    return out


def test_buckets_arrive_verified_and_the_window_bounds_what_is_exported() -> None:
    sizes = [1000, 4096, 3, 0, 70_001, 5, 4096, 12, 999]
    out = _run(sizes, receivers=3, window=2)
    assert out["errors"] == []
    for _rank, (got, opened) in out["rx"].items():
        assert [g[0] for g in got] == [True] * len(sizes)
        assert all(g[2] for g in got)  # byte-exact, not just checksum-equal
        assert opened == 0  # every handle closed
    assert out["stats"].exported == len(sizes)
    assert out["stats"].peak_exported <= 2 and out["live_max"] <= 2


def _store(kind: str, tmp_path: Path) -> Any:
    """A real c10d store of each kind hwtui may be handed: HashStore and the libuv TCPStore carry
    queues; a FileStore and the TCPStore without libuv (USE_LIBUV=0) have the methods but raise
    NotImplementedError; KeyedOnly is a store without the methods (torch before 2.7)."""
    import datetime

    if kind == "hash":
        return dist.HashStore()
    if kind == "keyed":
        return KeyedOnly(dist.HashStore())
    if kind == "file":
        return dist.FileStore(str(tmp_path / "filestore"), 1)
    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30),
                         wait_for_workers=False, use_libuv=kind == "tcp")


@pytest.mark.parametrize("kind,queues", [("hash", True), ("tcp", True), ("keyed", False), ("file", False),
                                         ("tcp-legacy", False)])
def test_the_channel_carries_the_protocol_with_or_without_store_queues_and_leaves_nothing(
        kind: str, queues: bool, tmp_path: Path) -> None:
    sizes = [1000, 4096, 3, 0, 70_001, 5, 4096, 12, 999]
    store = _store(kind, tmp_path)
    assert Channel(store, "x", 1.0).queued == queues
    out = _run(sizes, receivers=2, window=2, store=store, corrupt=(2, 4))
    assert out["errors"] == [] and out["left"] == 0
    for rank, (got, opened) in out["rx"].items():
        assert [g[0] for g in got] == [not (rank == 2 and b == 4) for b in range(len(sizes))]
        assert all(g[2] for b, g in enumerate(got) if (rank, b) != (2, 4)) and opened == 0
    assert list(out["stats"].failed) == [4]


def test_a_bucket_costs_a_receiver_one_answered_store_call_once_its_export_is_there() -> None:
    """Keyed messages cost a receiver three round trips per bucket (abort check, wait, get) and the
    source one more per message to delete it (an H200's 64 MiB buckets spent 0.24 ms each on the
    control channel). With the source's whole window exported first, a receiver's bucket is one
    pop (answered) and one push (not); the source's retire one pop per receiver."""
    n = 12
    counting = Counting(dist.HashStore())
    run = secrets.token_hex(8)
    src = IpcSource(Channel(counting, run, 10.0), HostStandIn(run), [1], window=n)
    rx = IpcReceiver(Channel(counting, run, 10.0), HostStandIn(run), 1, n)
    try:
        for b in range(n):
            src.acquire(b, 64).copy_(_data(b, 64))
            src.publish(b, 64)
        threading.current_thread().name, name = "receiving", threading.current_thread().name
        try:
            assert all(rx.receive(b, torch.empty(64, dtype=torch.uint8)).ok for b in range(n))
            threading.current_thread().name = "retiring"
            src.drain()
        finally:
            threading.current_thread().name = name
    finally:
        rx.close()
        src.close()
    assert counting.calls["receiving"] == ["queue_pop", "queue_push"] * n
    assert counting.calls["retiring"] == ["queue_pop"] * n


@pytest.mark.parametrize("kind", ["hash", "keyed"])
def test_a_run_that_fails_leaves_no_message_in_the_store(kind: str, tmp_path: Path) -> None:
    """A receiver that stops after two buckets: the source times out on its ack, and its close takes
    what is left of the run's queues (a resident world's store outlives every push)."""
    store, run = _store(kind, tmp_path), secrets.token_hex(8)
    src = IpcSource(Channel(store, run, 0.5), HostStandIn(run), [1], window=3)
    rx = IpcReceiver(Channel(store, run, 0.5), HostStandIn(run), 1, 3)
    with pytest.raises(IpcFailure, match="rank 1's release of bucket 2"):
        try:
            for b in range(6):
                src.acquire(b, 64).copy_(_data(b, 64))
                src.publish(b, 64)
                if b < 2:
                    assert rx.receive(b, torch.empty(64, dtype=torch.uint8)).ok
        finally:
            rx.close()
            src.close()
    ch = Channel(store, run, 0.5)
    assert ch.backlog(exports_to(1)) == ch.backlog(acks_from(1)) == 0
    if kind == "keyed":  # every numbered key of the run is gone, read or not
        assert not any(ch.ready(f"q/{q}/{n}") for q in (exports_to(1), acks_from(1)) for n in range(8))


def test_a_receiver_maps_each_slot_once_while_the_source_keeps_its_buffers() -> None:
    """Opening a CUDA IPC handle costs several copies' worth: with slots sized for the largest
    bucket, each receiver opens one mapping per slot for the whole run and closes them at the end."""
    sizes = [1000, 4096, 3, 0, 70_001, 5, 4096, 12, 999]
    out = _run(sizes, receivers=2, window=2, capacity=max(sizes))
    assert out["errors"] == []
    for rank, (got, opened) in out["rx"].items():
        assert all(g[0] and g[2] for g in got)
        assert out["opens"][rank] == 2 and out["held"][rank] == 2 and opened == 0
        # Open until the close, each holding the last bucket its slot carried (buckets 7 and 8).
        assert out["mapped"][rank] == sorted(bytes(_data(b, sizes[b])[:4].tolist()) for b in (7, 8))
        assert out["mapped_after_close"][rank] == 0


def test_a_slot_whose_buffer_the_source_replaced_is_mapped_again_not_read_stale() -> None:
    """Growing buckets make the source replace slot buffers: the handle names the new buffer (its
    size differs, and it is allocated before the old one is freed, so not even a memfd descriptor
    number repeats), and every receiver re-opens and reads the new bytes, never the old mapping's."""
    sizes = [16, 16, 4096, 4096, 70_001, 70_001, 8, 8]
    out = _run(sizes, receivers=2, window=2)
    assert out["errors"] == []
    for rank, (got, opened) in out["rx"].items():
        assert all(g[0] and g[2] for g in got), got
        assert out["opens"][rank] == 6 and opened == 0  # 2 slots x 3 sizes


def test_window_one_exports_one_bucket_at_a_time() -> None:
    out = _run([100] * 6, receivers=2, window=1)
    assert out["errors"] == [] and out["stats"].peak_exported == 1


def test_a_corrupted_copy_is_named_on_its_rank_and_reported_to_the_source() -> None:
    out = _run([64, 64, 64], receivers=2, window=2, corrupt=(2, 1))
    got1, _ = out["rx"][1]
    got2, _ = out["rx"][2]
    assert all(g[0] for g in got1)
    assert [g[0] for g in got2] == [True, False, True]
    assert "rank 2: bucket 1 failed its device checksum" in got2[1][1]
    assert list(out["stats"].failed) == [1] and "rank 2" in out["stats"].failed[1][0]


def test_a_missing_receiver_times_out_named_and_the_source_frees_its_slots() -> None:
    store = dist.HashStore()
    run = secrets.token_hex(8)
    prov = HostStandIn(run)
    src = IpcSource(Channel(store, run, 0.5), prov, [1], window=1)
    src.acquire(0, 10).fill_(1)
    src.publish(0, 10)
    with pytest.raises(IpcFailure, match="rank 1's release of bucket 0 did not arrive"):
        src.acquire(1, 10)
    src.close()
    assert all(s is None for s in src.slots) and prov._buffers == {}


def test_an_abort_ends_every_wait_with_its_reason() -> None:
    store = dist.HashStore()
    run = secrets.token_hex(8)
    ch = Channel(store, run, 60)
    ch.abort("rank 2 died (SIGKILL)")
    rx = IpcReceiver(ch, HostStandIn(run), 1, 2)
    with pytest.raises(IpcFailure, match=r"aborted while waiting for the export of bucket 0: rank 2 died"):
        rx.receive(0, torch.empty(4, dtype=torch.uint8))


# --- hostile and malformed messages --------------------------------------------------------------

# A fixed pid, not this process's: the cases below are test parameters, and pytest-xdist requires
# every worker to collect the same ids (a pid in them made each worker's list differ).
_PID = 4242


def _good(n: int = 16) -> Export:
    return Export(bucket=3, slot=1, nbytes=n, digest="a" * 32, kind="host", handle=HostHandle(_PID, 5, 4096))


def _mutate(**changes: Any) -> bytes:
    obj = json.loads(_good().encode())
    for k, v in changes.items():
        if k.startswith("h_"):
            obj["handle"][k[2:]] = v
        elif v is KeyError:
            del obj[k]
        else:
            obj[k] = v
    return json.dumps(obj).encode()


def test_a_good_message_round_trips() -> None:
    msg = decode_export(_good().encode(), bucket=3, nbytes=16, window=2, kind="host")
    assert msg == _good()
    cuda = CudaHandle(0, bytes(range(64)), 1 << 30, 512, b"/torch_123_4567_0", 9_999, b"\x01" * 64, True)
    raw = Export(3, 1, 16, "b" * 32, "cuda", cuda).encode()
    assert decode_export(raw, bucket=3, nbytes=16, window=2, kind="cuda").handle == cuda
    ack = Ack(3, 2, True, False, "c" * 32, "rank 2: bad")
    assert decode_ack(ack.encode(), bucket=3, rank=2) == ack


_HOSTILE = [
    (b"\x80\x04\x95pickle", "not JSON"),
    (b"[]", "not a JSON object"),
    (b"[" * 15000, "nested too deeply"),  # found by hand: a RecursionError escaped before
    (b"{" + b" " * 20000 + b"}", "larger than"),
    (_mutate(bucket=4), "names bucket 4, expected 3"),
    (_mutate(bucket=True), "must be an integer"),
    (_mutate(bucket="3"), "must be an integer"),
    (_mutate(slot=2), r"slot must be an integer in \[0, 1\]"),
    (_mutate(slot=-1), "slot must be"),
    (_mutate(nbytes=17), "has 17 bytes; the plan says 16"),
    (_mutate(nbytes=2**70), "nbytes must be"),
    (_mutate(digest="A" * 32), "digest"),
    (_mutate(digest="a" * 31), "digest"),
    (_mutate(kind="cuda"), "kind"),
    (_mutate(type="ack"), "expected an export"),
    (_mutate(exec="x"), "unexpected fields"),
    (_mutate(handle=KeyError), "lacks"),
    (_mutate(h_pid=0), "pid must be"),
    (_mutate(h_fd=-3), "fd must be"),
    (_mutate(h_size=8), "smaller than bucket 3"),
    (_mutate(h_extra=1), "unexpected fields"),
]


@pytest.mark.parametrize("raw, why", _HOSTILE, ids=[f"case{i}" for i in range(len(_HOSTILE))])
def test_malformed_or_lying_export_messages_are_refused(raw: Any, why: Any) -> None:
    with pytest.raises(WireError, match=why):
        decode_export(raw, bucket=3, nbytes=16, window=2, kind="host")


@pytest.mark.parametrize("field, value", [
    ("handle", "!!!"), ("handle", ""), ("handle", "A" * 5000), ("event_sync", 1), ("device", 256), ("ref_handle", 7),
    # torch decrements the counter at ref_offset of the file ref_handle names, with no bounds check
    # of its own, when the mapping is closed: a write anywhere in the receiver, unless refused here.
    ("ref_offset", 10_000), ("ref_offset", 1 << 32), ("ref_offset", -1),
    ("ref_handle", base64.b64encode(b"/dev/shm/hwtui").decode()),
    ("ref_handle", base64.b64encode(b"/torch_1_2/../../etc/passwd").decode()),
    ("ref_handle", base64.b64encode(b"/torch_1_2\n").decode()),
])
def test_malformed_cuda_handles_are_refused(field: Any, value: Any) -> None:
    obj = json.loads(Export(3, 1, 16, "b" * 32, "cuda", CudaHandle(0, b"h" * 64, 64, 0, b"", 0, b"", False)).encode())
    obj["handle"][field] = value
    with pytest.raises(WireError):
        decode_export(json.dumps(obj).encode(), bucket=3, nbytes=16, window=2, kind="cuda")


def test_a_handle_naming_another_file_is_refused_after_opening_it(tmp_path: Path) -> None:
    run = secrets.token_hex(8)
    prov = HostStandIn(run)
    path = tmp_path / "secret"
    path.write_bytes(b"x" * 64)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OpenError, match="not this run's shared buffer"):
            prov.open(HostHandle(os.getpid(), fd, 64), 16)
    finally:
        os.close(fd)
    other = HostStandIn(secrets.token_hex(8))  # another run's memfd: refused too
    buf = other.alloc(64)
    with pytest.raises(OpenError, match="not this run's"):
        prov.open(other.handle(buf), 16)
    mine = prov.alloc(64)
    h = prov.handle(mine)
    with pytest.raises(OpenError, match="not the 1000 announced"):
        prov.open(HostHandle(h.pid, h.fd, 1000), 16)  # type: ignore[union-attr]
    with pytest.raises(OpenError, match="cannot open"):
        prov.open(HostHandle(h.pid, 999_999, 64), 16)  # type: ignore[union-attr]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with no writer: a blocking open would hang
    try:
        with pytest.raises(OpenError, match="not this run's"):
            prov.open(HostHandle(os.getpid(), rfd, 16), 16)
    finally:
        os.close(rfd)
    assert prov.opened == 0
    opened = prov.open(h, 16)
    assert prov.opened == 1 and device_digest(opened.tensor) == device_digest(mine[:16])
    opened.close()
    assert prov.opened == 0
    other.free(buf)
    prov.free(mine)


def test_the_cuda_opener_refuses_before_touching_the_driver() -> None:
    from hwtui.engine.replication.ipc_provider import CudaIpc

    cuda = CudaIpc(0)
    with pytest.raises(WireError, match="non-CUDA handle"):
        cuda.open(HostHandle(os.getpid(), 0, 16), 16)
    handle = CudaHandle(device=torch.cuda.device_count(), handle=b"h" * 64, size=64, offset=0, ref_handle=b"",
                        ref_offset=0, event_handle=b"", event_sync=False)
    with pytest.raises(OpenError, match="GPUs"):
        cuda.open(handle, 16)  # a device this process does not have
    assert cuda.opened == 0


def test_a_wait_whose_deadline_is_a_hair_away_never_hands_the_store_a_zero_timeout(monkeypatch) -> None:
    """c10d's store.wait reads a zero timeout as "no timeout" (a HashStore then blocks for ever): a
    wait entered a microsecond before its deadline hung a whole suite run. The store records what it
    was given; the clock puts the first look 1e-9 s before the deadline."""
    from hwtui.engine.replication import ipc_protocol

    given: list[float] = []

    class RecordingStore:  # at the library boundary: what c10d's wait receives
        def check(self, keys: list[str]) -> bool:
            return False

        def wait(self, keys: list[str], timeout: Any) -> None:
            given.append(timeout.total_seconds())
            raise RuntimeError("wait timed out")

    ticks = iter([0.0, 0.5 - 1e-9])
    monkeypatch.setattr(ipc_protocol.time, "monotonic", lambda: next(ticks, 10.0))
    chan = Channel(RecordingStore(), "run", 0.5)  # type: ignore[arg-type]
    with pytest.raises(IpcFailure, match="did not arrive within 0.5 s"):
        chan.take("k", "bucket 0")
    assert given and all(t > 0 for t in given), given


class _CountingCudaOpener:
    """A CUDA opener at the driver boundary: host tensors stand in for the mapped device memory."""

    kind = "cuda"

    def __init__(self, memory: torch.Tensor):
        self.memory, self.opens, self.closes = memory, 0, 0

    def open(self, handle: Any, nbytes: int) -> Any:
        self.opens += 1
        owner = self

        class _Opened:
            tensor = self.memory[:nbytes]

            def close(self) -> None:
                owner.closes += 1

        return _Opened()


def test_two_exports_of_one_cuda_buffer_reuse_the_mapping_though_their_event_fields_differ() -> None:
    """Measured on an H200: each ``_share_cuda_()`` of the same slot recorded a new event, so a
    receiver that compared whole handles opened every bucket again (4 opens for 4 buckets). What
    names the memory is (device, handle, offset, size)."""
    a = CudaHandle(0, b"h" * 64, 4096, 0, b"/torch_1_10", 0, b"\x01" * 64, True)
    b = CudaHandle(0, b"h" * 64, 4096, 0, b"/torch_1_20", 8, b"\x02" * 64, True)
    assert a != b and a.memory() == b.memory()
    assert CudaHandle(0, b"h" * 64, 4096, 512, b"", 0, b"", False).memory() != a.memory()
    assert HostHandle(1, 5, 64).memory() != HostHandle(1, 5, 128).memory()

    store, run = dist.HashStore(), secrets.token_hex(8)
    ch = Channel(store, run, 10.0)
    data = _data(0, 4096)
    opener = _CountingCudaOpener(data)
    rx = IpcReceiver(ch, opener, 1, 1)
    digest = device_digest(data)
    for bucket, handle in enumerate((a, b, a)):
        ch.push(exports_to(1), Export(bucket, 0, 4096, digest, "cuda", handle).encode(), "an export")
        dst = torch.empty(4096, dtype=torch.uint8)
        got = rx.receive(bucket, dst)
        assert got.ok and torch.equal(dst, data)
    assert opener.opens == 1 and opener.closes == 0
    other = CudaHandle(0, b"g" * 64, 4096, 0, b"", 0, b"", False)  # the source replaced the slot's buffer
    ch.push(exports_to(1), Export(3, 0, 4096, digest, "cuda", other).encode(), "an export")
    assert rx.receive(3, torch.empty(4096, dtype=torch.uint8)).ok
    assert opener.opens == 2 and opener.closes == 1
    rx.close()
    assert opener.closes == 2


def test_exported_memory_changed_after_its_digest_is_named() -> None:
    """The source's slot altered between its publish and the receivers' copy: every receiver names
    the bucket (its copy is not what the source digested), the others arrive exact."""
    sizes = [5000, 70_001, 4096]
    out = _run(sizes, receivers=2, window=2, flip_after_publish=1)
    for rank, (got, _opened) in out["rx"].items():
        assert [g[0] for g in got] == [True, False, True], rank
        assert f"rank {rank}: bucket 1 failed its device checksum after the IPC copy" in got[1][1]
        assert got[0][2] and got[2][2]


def test_free_now_says_whether_acquire_would_wait_for_a_receiver() -> None:
    """The IPC source reads bucket b+1 ahead only into a slot no receiver still holds: free_now
    answers without waiting, and is true once every receiver has released the slot's bucket."""
    store = dist.HashStore()
    run = secrets.token_hex(8)
    ch = Channel(store, run, 5.0)
    src = IpcSource(ch, HostStandIn(run), [1, 2], 2)
    try:
        for b in (0, 1):
            src.acquire(b, 64).fill_(b)
            src.publish(b, 64)
        assert not src.free_now(2)  # slot 0 holds bucket 0, released by nobody yet
        ch.push(acks_from(1), Ack(0, 1, released=True, ok=True, digest="", error="").encode(), "an ack")
        assert not src.free_now(2)  # rank 2 still holds it
        ch.push(acks_from(2), Ack(0, 2, released=True, ok=True, digest="", error="").encode(), "an ack")
        assert src.free_now(2) and not src.free_now(3)
        src.acquire(2, 64)  # returns at once: the acks are there
    finally:
        src.close()


class _CudaStorage:
    """torch's CUDA storage at the IPC boundary: ``_share_cuda_()`` as torch returns it, counted (each
    call is a new ref-counted record in torch, its shared counter at 1)."""

    def __init__(self, address: int):
        self.address, self.shares = address, 0

    def data_ptr(self) -> int:
        return self.address

    def _share_cuda_(self) -> tuple[Any, ...]:
        self.shares += 1
        return (0, b"h" * 64, 1 << 20, 0, b"/torch_7_1", 10 + self.shares, b"e" * 64, True)


class _CudaBuffer:
    def __init__(self, storage: _CudaStorage):
        self.storage = storage

    def untyped_storage(self) -> _CudaStorage:
        return self.storage

    def storage_offset(self) -> int:
        return 0


def test_a_cuda_buffer_is_shared_once_and_torch_keeps_no_count_of_it(monkeypatch) -> None:
    """The H200 leak (a source kept 320-1024 MiB after 4 runs, a resident rank its window per push):
    each export of a slot was a new ``_share_cuda_()`` whose counter torch holds the memory on until
    a consumer closes it, and a receiver that keeps its mapping closes one. Now a buffer is shared
    once whatever the number of exports, its counter released at the share (this process's protocol
    says when the memory may be reused), and a freed buffer's address shared again is new memory."""
    from hwtui.engine.replication.ipc_provider import CudaIpc

    released: list[tuple[bytes, int]] = []
    monkeypatch.setattr(torch.UntypedStorage, "_release_ipc_counter_cuda",
                        classmethod(lambda cls, name, offset: released.append((name, offset))), raising=False)
    cuda = CudaIpc(0)
    slot = _CudaBuffer(_CudaStorage(0x7000_0000))
    handles = [cuda.handle(slot) for _ in range(16)]  # 16 buckets through one slot
    assert slot.storage.shares == 1 and cuda.shares == 1
    assert len({h.memory() for h in handles}) == 1 and handles[0] is handles[-1]
    assert released == [(b"/torch_7_1", 11)]  # the one count torch made, given back at once
    cuda.free(slot)
    again = _CudaBuffer(_CudaStorage(0x7000_0000))  # the allocator hands the address out again
    assert cuda.handle(again).ref_offset == 11 and again.storage.shares == 1
    assert released == [(b"/torch_7_1", 11), (b"/torch_7_1", 11)] and cuda.shares == 2


def test_a_cuda_mapping_is_opened_without_torchs_counter_where_torch_allows_it(monkeypatch) -> None:
    """H200, round thirteen (benchmarks/exp_ipc_counts.py): with the exporter's count released at
    the share, a consumer's close took it below zero, and a block whose consumer closed first was
    never freed. A mapping opened with no counter name decrements nothing. Where a torch refuses
    that, the counted open is used, once found, for the rest of the process; a handle that opens
    neither way is an OpenError and decides nothing."""
    from hwtui.engine.replication.ipc_provider import CudaIpc

    calls: list[tuple[bytes | None, int]] = []
    refuse: dict[str, type[Exception] | None] = {"uncounted": None, "counted": None}

    def new_shared(cls, device, handle, size, offset, ref, ref_offset, event, sync):  # type: ignore[no-untyped-def]
        calls.append((ref, ref_offset))
        kind = "uncounted" if ref == b"" else "counted"
        if refuse[kind] is not None:
            raise refuse[kind]("cudaIpcOpenMemHandle: invalid argument")
        return ("storage", kind)

    monkeypatch.setattr(torch.UntypedStorage, "_new_shared_cuda", classmethod(new_shared), raising=False)
    handle = CudaHandle(device=0, handle=b"h" * 64, size=64, offset=0, ref_handle=b"/torch_7_1", ref_offset=11,
                        event_handle=b"", event_sync=False)

    cuda = CudaIpc(0)
    assert cuda._open_storage(torch, handle) == ("storage", "uncounted") and cuda.counted is False
    assert calls == [(b"", 0)]

    calls.clear()
    refuse.update(uncounted=RuntimeError, counted=RuntimeError)  # a handle that opens neither way
    bad = CudaIpc(0)
    with pytest.raises(OpenError, match="cudaIpcOpenMemHandle failed"):
        bad._open_storage(torch, handle)
    assert bad.counted is None and calls == [(b"", 0), (b"/torch_7_1", 11)]

    calls.clear()
    refuse.update(uncounted=TypeError, counted=None)  # this torch wants a counter name
    assert bad._open_storage(torch, handle) == ("storage", "counted") and bad.counted is True
    assert bad._open_storage(torch, handle) == ("storage", "counted")
    assert calls == [(b"", 0), (b"/torch_7_1", 11), (b"/torch_7_1", 11)]  # found once, then counted only


class _PendingEvent:
    """A CUDA event at the library boundary whose work is done only once someone waits for it (the
    device never finishes on its own here, so what is settled when is the receiver's choice)."""

    def __init__(self) -> None:
        self.waited = False

    def query(self) -> bool:
        return self.waited

    def synchronize(self) -> None:
        self.waited = True


def _pending_events(monkeypatch: pytest.MonkeyPatch) -> None:
    from hwtui.engine.replication import ipc_protocol

    monkeypatch.setattr(ipc_protocol, "_to_host", lambda sums: (sums, _PendingEvent()))


@pytest.mark.parametrize("window", [1, 2, 4])
def test_a_receiver_keeps_up_to_window_buckets_started_and_acks_them_in_order(monkeypatch, window: int) -> None:
    """On a GPU a bucket's copy and sums are queued and the next export taken before its digest is
    back: at most window buckets wait for their acks, window - 1 while the next export is taken
    (the source can always make it), and every result comes back once, in bucket order, exact."""
    _pending_events(monkeypatch)
    n = 7
    store, run = dist.HashStore(), secrets.token_hex(8)
    src = IpcSource(Channel(store, run, 10.0), HostStandIn(run), [1], window)
    rx = IpcReceiver(Channel(store, run, 10.0), HostStandIn(run), 1, window, hook=None)
    dsts = [torch.empty(100 + b, dtype=torch.uint8) for b in range(n)]
    results = []
    errors: list[BaseException] = []

    def source(first: int) -> None:  # each slot refilled once the receiver acked its previous bucket
        try:
            for b in range(first, n):
                src.acquire(b, 100 + b).copy_(_data(b, 100 + b))
                src.publish(b, 100 + b)
            src.drain()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    exporting = threading.Thread(target=source, args=(window,))
    try:
        for b in range(window):  # the first window: exported before the receiver looks
            src.acquire(b, 100 + b).copy_(_data(b, 100 + b))
            src.publish(b, 100 + b)
        for b in range(window):
            results += rx.submit(b, dsts[b])
        assert results == [] and len(rx._started) == window and rx.ch.backlog(acks_from(1)) == 0
        exporting.start()  # the rest: each needs the ack of the bucket window before it
        for b in range(window, n):
            results += rx.submit(b, dsts[b])
            assert len(rx._started) <= window
        results += rx.settle(block=True)
        exporting.join(30)
        assert not exporting.is_alive() and errors == []
    finally:
        rx.close()
        src.close()
    assert rx.peak_started == window
    assert [r.bucket for r in results] == list(range(n)) and all(r.ok for r in results)
    assert all(torch.equal(dsts[b], _data(b, 100 + b)) for b in range(n))


def test_a_receiver_about_to_wait_for_an_export_acks_what_it_started_first(monkeypatch) -> None:
    """No ack waits for the next bucket: with bucket 1 not exported yet, the receiver settles and
    acks bucket 0 before it waits (the source, reading bucket 1 from its file, may need that slot)."""
    _pending_events(monkeypatch)
    store, run = dist.HashStore(), secrets.token_hex(8)
    ch = Channel(store, run, 10.0)
    src = IpcSource(ch, HostStandIn(run), [1], 3)
    rx = IpcReceiver(Channel(store, run, 10.0), HostStandIn(run), 1, 3)
    got: list[Any] = []
    try:
        src.acquire(0, 64).copy_(_data(0, 64))
        src.publish(0, 64)
        got += rx.submit(0, torch.empty(64, dtype=torch.uint8))
        assert got == [] and ch.backlog(acks_from(1)) == 0  # started, not acked: the device is busy
        waiting = threading.Thread(target=lambda: got.extend(rx.submit(1, torch.empty(64, dtype=torch.uint8))))
        waiting.start()
        deadline = time.monotonic() + 30
        while ch.backlog(acks_from(1)) == 0:  # bucket 0's ack, sent while bucket 1 is not there
            assert time.monotonic() < deadline, "bucket 0 was not acked before the wait for bucket 1"
            time.sleep(0.005)
        src.acquire(1, 64).copy_(_data(1, 64))
        src.publish(1, 64)
        waiting.join(30)
        assert not waiting.is_alive()
        got += rx.settle(block=True)
        src.drain()
    finally:
        rx.close()
        src.close()
    assert [(r.bucket, r.ok) for r in got] == [(0, True), (1, True)]


def test_where_the_sums_are_on_the_host_at_once_submit_acks_its_bucket_before_it_returns() -> None:
    """On CPU (the stand-in) nothing is left queued: a rank held between buckets (a pause fault, a
    slow staging write) must not keep the source's slot, so submit settles its own bucket."""
    store, run = dist.HashStore(), secrets.token_hex(8)
    ch = Channel(store, run, 10.0)
    src = IpcSource(ch, HostStandIn(run), [1], 2)
    rx = IpcReceiver(Channel(store, run, 10.0), HostStandIn(run), 1, 2)
    try:
        src.acquire(0, 64).copy_(_data(0, 64))
        src.publish(0, 64)
        got = rx.submit(0, torch.empty(64, dtype=torch.uint8))
        assert [(r.bucket, r.ok) for r in got] == [(0, True)] and ch.backlog(acks_from(1)) == 1
        assert rx.settle(block=True) == []
        src.drain()
    finally:
        rx.close()
        src.close()


def test_a_store_that_went_away_makes_abort_quiet_and_a_wait_an_ipc_failure() -> None:
    """Rank 0 hosts the world's store: once it has ended, every call raises c10d's network error.
    Telling peers to stop is then best effort (no one is left), and a wait says the channel went
    away: a rank reports that, not a raw DistNetworkError from inside its error handling."""

    class Gone:  # at the library boundary: every call as c10d raises once the store's host ended
        def __getattr__(self, name: str) -> Any:
            def call(*args: Any) -> Any:
                raise RuntimeError("DistNetworkError: Broken pipe")

            return call

    ch = Channel(Gone(), "run", 5.0)  # type: ignore[arg-type]
    assert not ch.queued
    ch.abort("rank 2: OSError")  # returns
    with pytest.raises(IpcFailure, match="the control channel went away while waiting for the export of bucket 0"):
        ch.pop(exports_to(1), "the export of bucket 0")
    # Sending and counting say the same (a receiver's ack once rank 0 had ended was c10d's own
    # "DistNetworkError: Broken pipe", reported as an internal error), with queues or keys.
    queued = Channel(dist.HashStore(), "run", 5.0)
    assert queued.queued
    queued.store = Gone()  # type: ignore[assignment]
    for channel in (ch, queued):
        with pytest.raises(IpcFailure, match="the control channel went away while sending the ack of bucket 0"):
            channel.push(acks_from(1), b"ack", "the ack of bucket 0")
        with pytest.raises(IpcFailure, match="the control channel went away while reading"):
            channel.backlog(acks_from(1))
