"""The IPC transport's protocol: export by handle, open, copy, verify on the device, release.

One source (rank 0, or a host leader) and the receivers on its node share a control channel (the
world's c10d store: small keyed values, no collective, so it works where NCCL refuses two ranks on
one GPU). Per bucket ``b``:

1. the source waits until the window slot ``b % window`` is free (every receiver released its
   previous occupant), fills it, computes its device checksum and pushes its export message onto
   each receiver's export queue;
2. each receiver pops and validates the message (ipc_wire: it must name bucket ``b``), opens the
   handle (or reuses its mapping of that slot: see below), copies the bytes into its own device
   buffer, computes the device checksum of its copy and compares it with the source's, and pushes
   its ack (released) onto its ack queue; a mismatch names the bucket on that rank (it finishes the
   schedule and votes no, as the broadcast path does);
3. the source, on every receiver's ack, frees the slot for the bucket ``b + window``.

Why queues (c10d's ``queue_push``/``queue_pop``), one per direction and receiver: a message is then
one store round trip to read (a pop that finds it) and none to write or to delete (a push is not
answered; a pop removes it). Keyed messages cost a receiver three round trips per bucket (the
abort check, the wait, the get) and the source one more per message to delete it: on an H200 that
was the largest part of a 64 MiB bucket's time after its copy and checksum (3.9 of 10 ms for 16
buckets). Each queue has one reader, so a queue's single wake-up (c10d wakes one waiter) is
always the right one. A store without working queues (torch before 2.7, a FileStore, a TCPStore
without libuv) gets the same channel over numbered keys (``Channel.queued`` says which).

Why a receiver keeps its mapping of a slot between buckets: opening a CUDA IPC handle costs ~0.7 ms
and a 256 MiB device copy ~0.13 ms (H200), so opening per bucket made the path open-bound. The
source allocates each slot once at the largest bucket's size, and when it must replace a slot's
buffer it allocates the new one before freeing the old, so a slot's new buffer never carries its
old handle (no reused memfd descriptor number, no reused device address): a receiver whose mapping
of slot ``s`` was made from the same handle is mapping the same memory. "Released" in an ack means
"done reading": the source may refill the slot; the mapping itself is closed when the receiver
closes (end of run, failure or abort), and a killed receiver's mappings go with its process.

So the source never has more than ``window`` buckets exported (``peak_exported`` proves it in
the tests). Every wait is bounded and also watches ``abort``: a rank that fails, or the launcher
when a rank dies, sets it with the reason, and every other rank stops waiting, closes what it has
open and releases what it exported (``close``), so a death at any phase leaves no handle open in
the living and nothing committed (a rank that did not vote yes blocks the commit).
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from hwtui.engine.replication.device_checksum import device_digest, device_sums, sums_digest
from hwtui.engine.replication.ipc_provider import ExportProvider, Opened, Opener, OpenError
from hwtui.engine.replication.ipc_wire import Ack, Export, WireError, decode_ack, decode_export

POLL_S = 0.2  # how often a wait looks at the abort key (a wait is woken by state, this only bounds it)
# phase hooks (tests inject deaths and corruption there): source "exported", "published";
# receiver "opened", "copied", "acked"
Hook = Callable[[str, int, Any], None]


class IpcFailure(Exception):
    """The IPC exchange could not go on (a peer aborted, a wait timed out, a hostile message)."""


@contextlib.contextmanager
def _store_gone(doing: str) -> Iterator[None]:
    """A store call that fails (c10d's network errors: rank 0, the store's host, ended) is the
    protocol's IpcFailure, "the control channel went away while <doing>": a rank reports that,
    never c10d's raw "DistNetworkError: Broken pipe" as an internal error."""
    try:
        yield
    except IpcFailure:
        raise
    except Exception:  # noqa: BLE001 - any store failure means the same
        raise IpcFailure(f"the control channel went away while {doing}") from None


class Store(Protocol):
    """The part of a c10d Store the protocol uses."""

    def set(self, key: str, value: Any) -> None: ...  # c10d takes bytes (its stubs say str)

    def get(self, key: str) -> bytes: ...

    def wait(self, keys: list[str], timeout: datetime.timedelta, /) -> None: ...

    def check(self, keys: list[str]) -> bool: ...

    def delete_key(self, key: str) -> bool: ...


_ABSENT = b"\x00hwtui-ipc-absent"  # compare_set's answer for a key not set: no message of ours (JSON) is this


def exports_to(rank: int) -> str:
    """The queue of export messages receiver ``rank`` reads (the source writes it)."""
    return f"x/{rank}"


def acks_from(rank: int) -> str:
    """The queue of receiver ``rank``'s acks (the source reads it)."""
    return f"a/{rank}"


def _has_queues(store: Any, prefix: str) -> bool:
    """Whether ``store`` carries queues: asked, not looked up. Every c10d Store has the methods;
    a FileStore and the TCPStore without libuv (``USE_LIBUV=0``) raise NotImplementedError."""
    try:
        store.queue_len(prefix + "q/probe")
    except Exception:  # noqa: BLE001 - AttributeError, NotImplementedError, or a store's own error
        return False
    return True


def _queue_empty(exc: BaseException) -> bool:
    return type(exc).__name__ == "QueueEmptyError"  # torch.distributed's, where the store has queues


class Channel:
    """Keyed values and queues of one IPC run over a store, with bounded waits that an abort interrupts."""

    def __init__(self, store: Store, run: str, timeout_s: float):
        self.store = store
        self.prefix = f"hwtui-ipc/{run}/"
        self.timeout_s = timeout_s
        self.queued = _has_queues(store, self.prefix)
        self._next: dict[str, int] = {}  # without queues: the next numbered key to write / read, per queue

    def put(self, key: str, value: bytes) -> None:
        self.store.set(self.prefix + key, value)

    def ready(self, key: str) -> bool:
        """Whether ``key`` is set now (no wait)."""
        return bool(self.store.check([self.prefix + key]))

    def abort(self, reason: str) -> None:
        """Tell every peer to stop waiting, with ``reason`` (the first reason stands). Best effort:
        a store that is gone (its host, rank 0, ended) has no one left to tell."""
        with contextlib.suppress(Exception):
            if not self.store.check([self.prefix + "abort"]):
                self.store.set(self.prefix + "abort", reason[:300].encode())

    def aborted(self) -> str | None:
        if self.store.check([self.prefix + "abort"]):
            return self.store.get(self.prefix + "abort").decode("utf-8", "replace")
        return None

    def take(self, key: str, what: str) -> bytes:
        """The value at ``key`` once it is set; IpcFailure on abort or after ``timeout_s``."""
        full = self.prefix + key
        deadline = time.monotonic() + self.timeout_s
        while (got := self._peek(full, what)) is None:
            self._await(full, what, deadline)
        return got

    def push(self, queue: str, value: bytes, what: str) -> None:
        """Append ``value`` (``what``, for the error) to ``queue`` (read in order by its one reader,
        ``pop``); IpcFailure when the store is gone. Why caught: a receiver whose ack met the store's
        host (rank 0) gone reported c10d's own "DistNetworkError: Broken pipe" as an internal error."""
        with _store_gone(f"sending {what}"):
            if self.queued:
                self.store.queue_push(self.prefix + "q/" + queue, value)  # type: ignore[attr-defined]
                return
            n = self._next.get("w" + queue, 0)
            self._next["w" + queue] = n + 1
            self.put(f"q/{queue}/{n}", value)

    @overload
    def pop(self, queue: str, what: str) -> bytes: ...

    @overload
    def pop(self, queue: str, what: str, *, wait: bool) -> bytes | None: ...

    def pop(self, queue: str, what: str, *, wait: bool = True) -> bytes | None:
        """The oldest value of ``queue``, removed, once there is one; IpcFailure on abort or after
        ``timeout_s``. ``wait=False``: None at once when the queue is empty."""
        if not self.queued:
            n = self._next.get("r" + queue, 0)
            key = f"q/{queue}/{n}"
            got = self.take(key, what) if wait else self._peek(self.prefix + key, what)
            if got is not None:
                self._next["r" + queue] = n + 1
                self.drop(key)
            return got
        full = self.prefix + "q/" + queue
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return bytes(self.store.queue_pop(full, False))  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - c10d's QueueEmptyError, or the store gone
                if not _queue_empty(exc):
                    raise IpcFailure(f"the control channel went away while waiting for {what}") from None
            if not wait:
                return None
            self._await(full, what, deadline)

    def backlog(self, queue: str) -> int:
        """How many values ``queue`` holds now (no wait); IpcFailure when the store is gone."""
        with _store_gone(f"reading {queue}"):
            if self.queued:
                return int(self.store.queue_len(self.prefix + "q/" + queue))  # type: ignore[attr-defined]
            n = first = self._next.get("r" + queue, 0)
            while self.ready(f"q/{queue}/{n}"):
                n += 1
            return n - first

    def clear(self, queue: str, most: int) -> None:
        """Drop what is left in ``queue`` (at most ``most`` values: a run's window), so a failed
        run leaves nothing in a store that outlives it (a resident world's). Cleanup only."""
        with contextlib.suppress(Exception):  # an empty queue (QueueEmptyError), or a store that is gone
            if self.queued:
                for _ in range(most):
                    self.store.queue_pop(self.prefix + "q/" + queue, False)  # type: ignore[attr-defined]
            elif (written := self._next.get("w" + queue, 0)) > 0:
                # A queue this side writes: its newest keys, read or not (a read one is gone).
                for n in range(max(0, written - most), written):
                    self.drop(f"q/{queue}/{n}")
            else:  # a queue this side reads: the keys from the next unread one on, while they are set
                first = n = self._next.get("r" + queue, 0)
                while n < first + most and self.ready(f"q/{queue}/{n}"):
                    self.drop(f"q/{queue}/{n}")
                    n += 1
                self._next["r" + queue] = n

    def _peek(self, full: str, what: str) -> bytes | None:
        """The value at ``full`` if it is set, in one round trip: compare_set with an expected value
        no message has answers that value for a missing key and the key's own otherwise, and sets
        nothing (``get`` waits for the key and then reads it: two)."""
        cas = getattr(self.store, "compare_set", None)
        with _store_gone(f"waiting for {what}"):
            if cas is None:
                return self.store.get(full) if self.store.check([full]) else None
            got = bytes(cas(full, _ABSENT, _ABSENT))
        return None if got == _ABSENT else got

    def _await(self, full: str, what: str, deadline: float) -> None:
        """Until ``full`` (a key, or a queue with something in it) is there; IpcFailure on abort,
        at ``deadline``, or when the store goes away."""
        while True:
            with _store_gone(f"waiting for {what}"):
                reason = self.aborted()
            if reason is not None:
                raise IpcFailure(f"aborted while waiting for {what}: {reason}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise IpcFailure(f"{what} did not arrive within {self.timeout_s:g} s")
            try:
                # Never a zero timeout: c10d reads 0 as "the store's default" (minutes, or none for a
                # HashStore), which made a wait whose deadline was a microsecond away hang.
                self.store.wait([full], datetime.timedelta(seconds=max(0.001, min(POLL_S, left))))
            except Exception:  # noqa: BLE001 - c10d raises its own error types for a timeout
                if not self._reachable():
                    raise IpcFailure(f"the control channel went away while waiting for {what}") from None
                continue
            return

    def _reachable(self) -> bool:
        try:
            self.store.check([self.prefix + "abort"])
        except Exception:  # noqa: BLE001 - any store failure means the same
            return False
        return True

    def drop(self, key: str) -> None:
        try:
            self.store.delete_key(self.prefix + key)
        except Exception:  # noqa: BLE001 - cleanup only: a store that is gone holds nothing
            pass


@dataclass
class _Slot:
    buf: Any
    capacity: int
    bucket: int | None = None  # the bucket exported from it, until every receiver released it


@dataclass
class SourceStats:
    exported: int = 0
    peak_exported: int = 0
    failed: dict[int, list[str]] = field(default_factory=dict)  # bucket -> "rank r: why" from acks


class IpcSource:
    def __init__(self, channel: Channel, provider: ExportProvider, receivers: list[int], window: int, *,
                 hook: Hook | None = None, capacity: int = 0):
        if window < 1:
            raise ValueError("the IPC window must be at least 1")
        self.ch = channel
        self.provider = provider
        self.capacity = capacity  # the largest bucket, when known: each slot is allocated once
        self.receivers = list(receivers)
        self.window = window
        self.hook = hook
        self.slots: list[_Slot | None] = [None] * window
        self.pending: deque[int] = deque()  # exported buckets, oldest first
        self.stats = SourceStats()

    def _live(self) -> int:
        return sum(1 for s in self.slots if s is not None and s.bucket is not None)

    def acquire(self, bucket: int, nbytes: int) -> Any:
        """The buffer to fill with bucket ``bucket``: its slot, once every receiver released it."""
        i = bucket % self.window
        slot = self.slots[i]
        if slot is not None and slot.bucket is not None:
            self._retire_through(slot.bucket)
        if slot is None or slot.capacity < nbytes:
            # The new buffer first, then the old one freed: the slot's handle changes whenever its
            # memory does (receivers keep their mapping of a slot while its handle stays the same).
            size = max(nbytes, self.capacity)
            fresh = _Slot(self.provider.alloc(size), size)
            if slot is not None:
                self.provider.free(slot.buf)
            slot = self.slots[i] = fresh
        return slot.buf[:nbytes]

    def free_now(self, bucket: int) -> bool:
        """Whether acquire(bucket) would return without waiting for any receiver: its slot is
        unused, or every receiver has already released what it holds."""
        slot = self.slots[bucket % self.window]
        if slot is None or slot.bucket is None:
            return True
        held = sum(1 for pb in self.pending if pb <= slot.bucket)  # each receiver's acks arrive in bucket order
        return all(self.ch.backlog(acks_from(r)) >= held for r in self.receivers)

    def publish(self, bucket: int, nbytes: int) -> str:
        """Export the filled slot of ``bucket``; returns its device digest."""
        slot = self.slots[bucket % self.window]
        assert slot is not None and slot.bucket is None
        digest = device_digest(slot.buf[:nbytes])
        msg = Export(bucket=bucket, slot=bucket % self.window, nbytes=nbytes, digest=digest, kind=self.provider.kind,
                     handle=self.provider.handle(slot.buf))
        slot.bucket = bucket
        self.pending.append(bucket)
        self.stats.exported += 1
        self.stats.peak_exported = max(self.stats.peak_exported, self._live())
        self._hook("exported", bucket)
        raw = msg.encode()
        for r in self.receivers:
            self.ch.push(exports_to(r), raw, f"the export of bucket {bucket}")
        self._hook("published", bucket)
        return digest

    def _retire_through(self, bucket: int) -> None:
        while self.pending and self.pending[0] <= bucket:
            self._retire(self.pending.popleft())

    def _retire(self, bucket: int) -> None:
        for r in self.receivers:
            raw = self.ch.pop(acks_from(r), f"rank {r}'s release of bucket {bucket}")
            try:
                ack = decode_ack(raw, bucket=bucket, rank=r)
            except WireError as exc:
                raise IpcFailure(f"rank {r}'s ack of bucket {bucket} is malformed: {exc}") from exc
            if not ack.released:
                raise IpcFailure(f"rank {r} did not release bucket {bucket}: {ack.error}")
            if not ack.ok:
                self.stats.failed.setdefault(bucket, []).append(f"rank {r}: {ack.error}")
        slot = self.slots[bucket % self.window]
        if slot is not None and slot.bucket == bucket:
            slot.bucket = None

    def drain(self) -> None:
        """Wait until every receiver released every exported bucket."""
        while self.pending:
            self._retire(self.pending.popleft())

    def close(self) -> None:
        """Free every slot (after a drain, or on failure: receivers that still hold a mapping keep
        their own pages until they close it or die; nothing stays exported by this process)."""
        for i, slot in enumerate(self.slots):
            if slot is not None:
                self.provider.free(slot.buf)
                self.slots[i] = None
        if self.pending:  # a failed run: acks nobody will read (a drained run left none)
            for r in self.receivers:
                # Its receivers' export queues are theirs to clear (IpcReceiver.close): taking from
                # them here raced a receiver still reading and made it meet the wrong bucket.
                self.ch.clear(acks_from(r), self.window + 1)
        self.pending.clear()

    def _hook(self, phase: str, bucket: int) -> None:
        if self.hook is not None:
            self.hook(phase, bucket, None)


@dataclass(frozen=True)
class Received:
    bucket: int
    ok: bool
    digest: str
    want: str
    error: str = ""
    copy_s: float = 0.0  # open (first use of a slot) + device-to-device copy + sync: the transfer
    verify_s: float = 0.0  # the device checksum of the copy


@dataclass
class _Started:
    """A bucket whose copy and sums are queued on the device, its ack not yet sent."""

    bucket: int
    want: str
    nbytes: int
    sums: Any  # on the host (pinned, filled by a queued transfer) or, on CPU, the sums themselves
    done: Any  # a CUDA event after the sums' transfer; None where everything ran already
    clock: _Clock


class IpcReceiver:
    """A receiver of the IPC path. ``receive`` takes one bucket, copied and verified, acked.

    ``submit``/``settle`` overlap buckets on a GPU: a bucket's copy, its sums and their transfer to
    the host are queued on the stream and the next bucket's export is taken meanwhile; its digest is
    compared and its ack sent once the device has done it (``settle``). Syncing on each bucket's
    digest left the GPU idle while the host took the next export and launched the next copy: on an
    H200, 16 buckets of 64 MiB spent 3.4 ms copying and 2.7 ms summing what takes ~0.8 ms of
    device time. At most ``depth`` = ``window`` buckets wait for their acks, and at most
    ``window - 1`` while the receiver takes the next export: the source needs the ack of bucket b to
    export bucket b + window into its slot, so the export taken is always one the source can make.
    Before waiting for an export that is not there yet everything started is settled: an ack never
    waits for the next bucket.
    """

    def __init__(self, channel: Channel, opener: Opener, rank: int, window: int, *, hook: Hook | None = None):
        self.ch = channel
        self.opener = opener
        self.rank = rank
        self.window = window
        self.depth = max(1, window)
        self.hook = hook
        self._mapped: dict[int, tuple[Any, Opened]] = {}  # slot -> (the memory its handle names, our mapping)
        self._started: deque[_Started] = deque()
        self.opens = 0  # handles opened (once per slot while the source keeps its buffers)
        self.peak_started = 0  # the most buckets started and not yet acked (<= depth)

    def _open(self, msg: Export) -> Opened:
        held = self._mapped.get(msg.slot)
        if held is not None and held[0] == msg.handle.memory():
            return held[1]
        if held is not None:  # the source replaced this slot's buffer
            del self._mapped[msg.slot]
            held[1].close()
        # The whole buffer (its capacity, at least this bucket: decode_export checked), not this
        # bucket's bytes: later buckets of the slot may be larger.
        opened = self.opener.open(msg.handle, msg.handle.size)
        self.opens += 1
        self._mapped[msg.slot] = (msg.handle.memory(), opened)
        return opened

    def mapped(self) -> list[Any]:
        """The source's buffers this receiver has open now, whole (for a benchmark that times copies
        out of an IPC mapping: benchmarks/bench_ipc_leg.py). Valid until ``close``."""
        return [opened.tensor for _, opened in self._mapped.values()]

    def close(self) -> None:
        """Close every mapping (end of run, failure, abort): nothing of the source stays mapped, and
        nothing left for this receiver stays in the store.

        Copies still queued from a mapping are waited for first (a failure between a submit and its
        settle): closing an IPC mapping under a copy that reads it is undefined, and nothing says
        cudaIpcCloseMemHandle waits for them. All of them ran on one stream: the last event covers
        the others."""
        if self._started and self._started[-1].done is not None:
            with contextlib.suppress(Exception):  # an asynchronous error: the mappings go regardless
                self._started[-1].done.synchronize()
        self._started.clear()
        while self._mapped:
            _, (_, opened) = self._mapped.popitem()
            opened.close()
        # What a failed run left for this receiver (none after a whole run): a store that outlives
        # the run (a resident world's) keeps nothing of it.
        self.ch.clear(exports_to(self.rank), self.window + 1)

    def receive(self, bucket: int, dst: Any) -> Received:
        """Copy bucket ``bucket`` into ``dst`` (1-D uint8 of the bucket's size), verify it there and
        ack it; every bucket started before it is settled first (their results are dropped: use
        submit/settle to keep them)."""
        done = self.submit(bucket, dst) + self.settle(block=True)
        return done[-1]

    def submit(self, bucket: int, dst: Any) -> list[Received]:
        """Start bucket ``bucket``'s copy into ``dst`` and its check; returns the buckets settled
        meanwhile, oldest first. ``dst`` must stay untouched until ``bucket`` is settled.

        A checksum mismatch is returned (named), not raised: the rank finishes and votes no. A
        malformed message or a handle that cannot be opened is raised, after telling the source
        (the ack says "released", since nothing is held) so it does not wait out its timeout.
        """
        done = self.settle(block=False)
        if len(self._started) >= self.depth:
            done.append(self._settle_oldest())
        what = f"the export of bucket {bucket}"
        raw = self.ch.pop(exports_to(self.rank), what, wait=False)
        if raw is None:
            done += self.settle(block=True)  # nothing to overlap with: no ack waits for the next export
            raw = self.ch.pop(exports_to(self.rank), what)
        nbytes = int(dst.numel())
        t0 = time.perf_counter()
        try:
            msg = decode_export(raw, bucket=bucket, nbytes=nbytes, window=self.window, kind=self.opener.kind)
            opened = self._open(msg)
        except (WireError, OpenError) as exc:
            why = f"rank {self.rank}: bucket {bucket}: rejected the IPC handle: {exc}"
            with contextlib.suppress(Exception):  # acks go in bucket order: the earlier ones first
                self.settle(block=True)
            self.close()
            self._ack(Ack(bucket, self.rank, released=True, ok=False, digest="", error=why))
            self.ch.abort(why)
            raise IpcFailure(why) from exc
        try:
            self._hook("opened", bucket, dst)
            clock = _Clock(dst, t0)
            dst.copy_(opened.tensor[:nbytes])
            clock.copied()
            self._hook("copied", bucket, dst)
            # No sync: the sums are queued behind the copy on the same stream, and their transfer to
            # the host behind both, so "released" (sent once the transfer is done) follows the copy.
            sums = device_sums(dst)
            clock.summed()
            self._started.append(_Started(bucket, msg.digest, nbytes, *_to_host(sums), clock))
        except BaseException:
            self.close()
            raise
        self.peak_started = max(self.peak_started, len(self._started))
        # Where the sums are already on the host (CPU: computed at once) the ack goes now, not at
        # the next submit: a rank held between buckets must not hold the source's slot with it.
        return done + self.settle(block=False)

    def settle(self, *, block: bool) -> list[Received]:
        """Ack the started buckets the device is done with (``block``: all of them, waiting), oldest
        first, and return their results."""
        done: list[Received] = []
        while self._started and (block or _finished(self._started[0].done)):
            done.append(self._settle_oldest())
        return done

    def _settle_oldest(self) -> Received:
        st = self._started[0]
        try:
            if st.done is not None:
                st.done.synchronize()  # an asynchronous error of the copy or the sums surfaces here
            got = sums_digest(st.nbytes, st.sums)
            copy_s, verify_s = st.clock.split()
        except BaseException:
            self.close()
            raise
        self._started.popleft()
        ok = got == st.want
        error = "" if ok else (f"rank {self.rank}: bucket {st.bucket} failed its device checksum after the IPC copy "
                               f"(got {got}, the source's is {st.want})")
        # Released before anything else: the source may reuse the slot while we go on.
        self._ack(Ack(st.bucket, self.rank, released=True, ok=ok, digest=got, error=error))
        self._hook("acked", st.bucket, None)
        return Received(st.bucket, ok, got, st.want, error, copy_s, verify_s)

    def _ack(self, ack: Ack) -> None:
        self.ch.push(acks_from(self.rank), ack.encode(), f"the ack of bucket {ack.bucket}")

    def _hook(self, phase: str, bucket: int, dst: Any) -> None:
        if self.hook is not None:
            self.hook(phase, bucket, dst)


def _to_host(sums: Any) -> tuple[Any, Any]:
    """(the sums on the host, an event for when they are there): on a GPU a queued transfer into
    pinned memory (torch's caching host allocator reuses it), elsewhere the sums and None."""
    if sums.device.type != "cuda":
        return sums, None
    import torch

    host = torch.empty(sums.shape, dtype=sums.dtype, pin_memory=True)
    host.copy_(sums, non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(sums.device))
    return host, done


def _finished(done: Any) -> bool:
    return done is None or bool(done.query())


class _Clock:
    """A receive's copy and verify times without a sync of their own: on a GPU, events around the
    copy and after the sums, read once the digest's transfer has waited for them (copy: the host's
    open, then the copy's device time; verify: the sums' device time, launches included; the
    transfer of the sums and the host hash in neither); elsewhere the host clock (copy: from the
    open to the copy's end; verify: the sums)."""

    def __init__(self, dst: Any, t0: float):
        self.t0 = t0
        self.events: list[Any] = []
        self.stream: Any = None
        if dst.device.type == "cuda":
            import torch

            self.stream = torch.cuda.current_stream(dst.device)  # the copy's and the sums' stream
        self.open_s = time.perf_counter() - t0
        self._mark()

    def _mark(self) -> None:
        if self.stream is None:
            self.events.append(time.perf_counter())
            return
        import torch

        ev = torch.cuda.Event(enable_timing=True)
        ev.record(self.stream)
        self.events.append(ev)

    def copied(self) -> None:
        self._mark()

    def summed(self) -> None:
        self._mark()

    def split(self) -> tuple[float, float]:
        """(copy_s, verify_s), once the digest is done."""
        start, copied, summed = self.events
        if self.stream is None:
            return copied - self.t0, summed - copied
        return self.open_s + start.elapsed_time(copied) / 1e3, copied.elapsed_time(summed) / 1e3
