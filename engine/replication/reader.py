"""The parallel file -> device reader: every source that reads weights goes through it.

A weight file is read with large ``preadv`` calls by T threads, in file order (each thread takes
the next slice from one shared counter), into a ring of host slices per thread: on an accelerator
each thread owns ``depth`` pinned buffers and its own stream, so slice k is copied to the device
while slice k+1 is read (double buffering); the thread waits for a buffer's copy to finish before
it reads into that buffer again, which bounds host memory to T x depth x slice and is the ring's
backpressure. Nothing is read through a mapping here: a device copy never takes a page fault.

On a CPU destination there is nothing to copy: each thread ``preadv``s straight into its part of
the destination buffer, in parallel. With O_DIRECT (cold files: the page cache is skipped, so
reading 100 GB does not evict everything else) reads go to aligned bounce buffers, whole blocks
at aligned offsets, and only the asked-for bytes are copied on (the file's tail included).

Bytes are exact or the read fails with one named error (:class:`ReadFailed`, ``kind`` one of
``short-read``, ``io-error``, ``truncated``, ``replaced``, ``changed``): the file is identified by
its descriptor's (device, inode, size, mtime) when opened and checked again, through the
descriptor and through the path, after the last byte is read. The checksum path (the planner's
bucket digests) still verifies what the source sends; this catches what a checksum would only
call "corrupt".

The device is reached only through :class:`DeviceSeam` (pinned allocation, stream, async copy,
wait), so the CPU tests drive the ring, ordering, backpressure and error paths with host stand-ins.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hwtui.core.errors import HwtuiError

SLICE_BYTES = 64 << 20  # H200, 16 threads: 39.5 GB/s with 64 MiB slices, 38.3 with 16 MiB (bench_gpu.py)
MIN_SLICE = 1 << 20  # smaller slices cost more in syscalls and copy launches than they gain
# The smallest slice a request is cut into for a device (each slice also a copy launch and an event,
# taken under the GIL). H200, 16 threads, a warm 4 GiB file (bench_gpu.py, round seventeen): 4 MiB
# slices 9.6-12.7 GB/s, 8 MiB 23.2-26.9, 64 MiB 31.0-33.8 (16 MiB 38.4 in round sixteen). Cut at
# total / T, a 64 MiB bucket went in 4 MiB slices: the source path staged at 11-13 GB/s where the
# same reader took the whole file at 31-39. Where a bucket gives fewer slices than threads, the
# threads take the next bucket's (a source queues its reads ahead: source_reader.stage).
DEVICE_MIN_SLICE = 16 << 20
DEPTH = 2  # buffers per thread: one being read, one being copied
ALIGN = 4096  # O_DIRECT: offset, length and buffer address aligned to this (covers 512 B and 4 KiB devices)
MAX_READERS = 64
_MAX_CALL = 1 << 30  # Linux returns at most 0x7ffff000 bytes per call; a slice never asks for more than this


class ReadFailed(HwtuiError):
    """A weight file could not be read exactly; ``kind`` names why (one line, never wrong bytes)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def default_readers(cores: int | None = None, devices: int = 1) -> int:
    """Reader threads per rank: the cores shared among the ranks of this host's devices, 1..16.

    At most 16: on an H200's 16-core host, a warm 4 GiB file went to the GPU at 29.9 / 35.8 / 39.5 GB/s
    with 8 / 12 / 16 threads (64 MiB slices; the page cache alone gave 46.7 at 16; bench_gpu.py)."""
    cores = cores if cores is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                             else (os.cpu_count() or 1))
    return max(1, min(16, cores // max(1, devices)))


def check_readers(n: Any) -> int:
    """``--readers``: an int 1..64 (the CLI turns the error into one line, exit 2)."""
    if type(n) is not int or not 1 <= n <= MAX_READERS:
        raise HwtuiError(f"--readers must be an integer from 1 to {MAX_READERS}, not {str(n)[:20]!r}")
    return n


def check_direct(mode: Any) -> str:
    if mode not in ("auto", "on", "off"):
        raise HwtuiError(f"--direct-io must be auto, on or off, not {str(mode)[:20]!r}")
    return str(mode)


# ---------------------------------------------------------------- the device seam


class DeviceSeam(Protocol):
    """What the reader needs of a device: host buffers, streams, an async copy and a wait."""

    on_host: bool  # the destination is host memory: read straight into it, no staging

    def host_buffer(self, nbytes: int) -> tuple[Any, memoryview]:
        """(the buffer, a writable byte view of it starting at an ALIGN-aligned address)."""
        ...

    def stream(self) -> Any: ...

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int, stream: Any) -> Any:
        """Start copying src[src_offset:+nbytes] to dst[dst_offset:]; -> a token for :meth:`wait`."""
        ...

    def wait(self, token: Any) -> None: ...

    def synchronize(self) -> None: ...


def _aligned_anon(nbytes: int) -> tuple[Any, memoryview]:
    # An anonymous mapping is page-aligned, which is what O_DIRECT wants of its buffer.
    mm = mmap.mmap(-1, max(nbytes, 1))
    return mm, memoryview(mm)[:nbytes]


class HostSeam:
    """A CPU destination: reads land in it directly; the bounce buffers O_DIRECT needs are copied by memcpy."""

    on_host = True

    def host_buffer(self, nbytes: int) -> tuple[Any, memoryview]:
        return _aligned_anon(nbytes)

    def stream(self) -> Any:
        return None

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int, stream: Any) -> Any:
        host_view(dst)[dst_offset:dst_offset + nbytes] = memoryview(src)[src_offset:src_offset + nbytes]
        return None

    def wait(self, token: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None


class TorchSeam:
    """cuda (and hip, which torch calls cuda) and xpu: pinned host slices, one stream per thread,
    a non-blocking copy and an event per slice. Pinning falls back to pageable memory where the
    build cannot pin (the copy is then synchronous, the bytes the same)."""

    on_host = False

    def __init__(self, device: Any):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.module: Any = torch.get_device_module(self.device.type)
        # A backend without streams and events in torch's device-module API (hpu builds differ) is
        # still served: pageable buffers and a synchronous copy per slice, the threads still parallel.
        self.streams = all(hasattr(self.module, a) for a in ("Stream", "Event", "stream", "current_stream"))
        index = self.module.current_device() if hasattr(self.module, "current_device") else None
        if self.device.index is None and type(index) is int:
            # Resolved here, in the caller's thread: a reader thread's current device is device 0.
            self.device = torch.device(self.device.type, index)
        # The stream the rank's own work runs on.
        self.caller_stream = self.module.current_stream(self.device) if self.streams else None
        self.pinned = self.streams

    def host_buffer(self, nbytes: int) -> tuple[Any, memoryview]:
        torch = self.torch
        try:
            buf = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=self.pinned)
        except RuntimeError:
            self.pinned = False
            buf = torch.empty(nbytes + ALIGN, dtype=torch.uint8)
        skip = -buf.data_ptr() % ALIGN
        view = buf[skip:skip + nbytes]
        return view, memoryview(view.numpy()).cast("B")

    def stream(self) -> Any:
        if not self.streams:
            return None
        try:
            return self.module.Stream(device=self.device)
        except TypeError:  # torch.cpu's stand-in streams take no device
            return self.module.Stream()

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int, stream: Any) -> Any:
        if stream is None:
            dst[dst_offset:dst_offset + nbytes].copy_(src[src_offset:src_offset + nbytes])
            return None
        # The destination may still be read by work queued on the caller's stream (a broadcast of
        # the buffer's previous bucket): this stream's copy is ordered after it.
        stream.wait_stream(self.caller_stream)
        with self.module.stream(stream):
            dst[dst_offset:dst_offset + nbytes].copy_(src[src_offset:src_offset + nbytes], non_blocking=self.pinned)
            event = self.module.Event()
            event.record(stream)
        return event

    def wait(self, token: Any) -> None:
        if token is not None:
            token.synchronize()

    def synchronize(self) -> None:
        if hasattr(self.module, "synchronize"):
            self.module.synchronize(self.device)


def on_host(device: Any) -> bool:
    """Whether ``device`` ("cpu", "cpu:0", "cuda:1", a torch.device) is host memory: read straight into."""
    return str(device).split(":")[0] == "cpu"


def slice_floor(host: bool, min_slice: int | None = None) -> int:
    """The smallest slice a read is cut into: the caller's ``min_slice`` where it gives one, else
    MIN_SLICE into host memory and DEVICE_MIN_SLICE for a device (each of its slices also a copy
    launch and an event). One rule for the reader's cut and the bucket reader's ring."""
    if min_slice is not None:
        return min_slice
    return MIN_SLICE if host else DEVICE_MIN_SLICE


def seam_for(device: Any) -> DeviceSeam:
    """The seam for a destination on ``device`` ("cpu", "cuda", "cuda:1", "xpu", a torch.device)."""
    if on_host(device):
        return HostSeam()
    return TorchSeam(device)


def host_view(dst: Any) -> memoryview:
    """A writable byte view of a host destination (a CPU torch tensor, numpy array, bytearray, mmap)."""
    if hasattr(dst, "numpy") and hasattr(dst, "is_contiguous"):  # a torch tensor, without importing torch
        if not dst.is_contiguous():
            raise ValueError("the destination tensor must be contiguous")
        dst = dst.numpy()
    view = memoryview(dst)
    if view.readonly:
        raise ValueError("the destination is read-only")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _nbytes(dst: Any) -> int:
    if hasattr(dst, "element_size") and hasattr(dst, "numel"):  # a torch tensor, on any device
        return int(dst.numel() * dst.element_size())
    return memoryview(dst).nbytes


# ---------------------------------------------------------------- the file


@dataclass(frozen=True)
class Extent:
    """``nbytes`` of the file at ``file_offset`` go to the destination at ``dst_offset``."""

    file_offset: int
    nbytes: int
    dst_offset: int


@dataclass(frozen=True)
class _Slice:
    file_offset: int
    nbytes: int
    dst_offset: int


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


def _mem_available() -> int:
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62


class WeightFile:
    """One weight file open for parallel reads: its identity pinned at open, direct I/O decided once.

    ``direct``: "off" (page cache), "on" (O_DIRECT, falling back with a named reason where the
    filesystem refuses it) or "auto" (O_DIRECT only for a file larger than the memory available
    now, which could not stay cached anyway: reading it through the cache would only evict).
    """

    def __init__(self, path: str | os.PathLike[str], direct: str = "off"):
        from hwtui.engine.replication.weights import open_regular

        self.path = str(path)
        self.fd, st = open_regular(path)
        # Closed by close(), or when the object goes (a long-lived resident rank must not leak them).
        self._fds = [self.fd]
        self._closer = weakref.finalize(self, _close_all, self._fds)
        self.identity = _identity(st)
        self.size = st.st_size
        self.direct_fd: int | None = None
        self.direct_reason = "off"
        want = direct == "on" or (direct == "auto" and st.st_size > _mem_available())
        if want:
            self._open_direct()
        elif direct == "auto":
            self.direct_reason = "auto: the file fits in the page cache"

    def _open_direct(self) -> None:
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            self.direct_reason = "O_DIRECT is not available on this platform"
            return
        try:
            # The same file: opened through our own descriptor, never the path again.
            fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | flag | os.O_CLOEXEC)
        except OSError as exc:
            self.direct_reason = f"the filesystem refuses O_DIRECT ({errno.errorcode.get(exc.errno or 0, exc.errno)})"
            return
        if _identity(os.fstat(fd))[:2] != self.identity[:2]:
            os.close(fd)
            raise ReadFailed("replaced", f"weight file {self.path} was replaced while it was opened")
        # Some filesystems accept the flag and refuse the first read (EINVAL): try one block now.
        probe, view = _aligned_anon(ALIGN)
        try:
            os.preadv(fd, [view], 0)
        except OSError as exc:
            os.close(fd)
            self.direct_reason = f"the filesystem refuses O_DIRECT reads ({errno.errorcode.get(exc.errno or 0, exc.errno)})"
            return
        finally:
            view.release()
            probe.close()
        self.direct_fd = fd
        self._fds.append(fd)
        self.direct_reason = "on"

    @property
    def direct(self) -> bool:
        return self.direct_fd is not None

    def close(self) -> None:
        self._closer()
        self.fd, self.direct_fd = -1, None

    def __enter__(self) -> WeightFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_unchanged(self) -> None:
        """After the last read: the same file, same size, same mtime, still at its path."""
        now = os.fstat(self.fd)
        if now.st_size < self.identity[2]:
            raise ReadFailed("truncated", f"weight file {self.path} was truncated while it was read "
                                          f"({self.identity[2]} -> {now.st_size} bytes)")
        if _identity(now) != self.identity:
            raise ReadFailed("changed", f"weight file {self.path} was modified while it was read")
        try:
            at_path = os.stat(self.path)
        except OSError:
            at_path = None
        if at_path is None or (at_path.st_dev, at_path.st_ino) != self.identity[:2]:
            raise ReadFailed("replaced", f"weight file {self.path} was replaced while it was read")

    def read_exact(self, view: memoryview, offset: int) -> None:
        """Fill ``view`` from ``offset`` through the page cache (partial reads continued, bounded)."""
        done, n = 0, len(view)
        while done < n:
            got = self._preadv(self.fd, view[done:min(n, done + _MAX_CALL)], offset + done)
            if got == 0:
                self._ended(offset + done, offset + n)
            done += got

    def read_direct(self, bounce: memoryview, offset: int, nbytes: int) -> int:
        """O_DIRECT: whole aligned blocks covering [offset, offset+nbytes) into ``bounce``; -> where
        the asked-for bytes start in it. The last block may run past the end of the file (the tail)."""
        assert self.direct_fd is not None
        start = offset - offset % ALIGN
        skip = offset - start
        need = skip + nbytes
        length = -(-need // ALIGN) * ALIGN
        done = 0
        while done < need:
            got = self._preadv(self.direct_fd, bounce[done:length], start + done)
            if got == 0:
                self._ended(start + done, offset + nbytes)
            done += got
            if done < need and done % ALIGN:  # an unaligned return is the end of the file
                self._ended(start + done, offset + nbytes)
        return skip

    def _preadv(self, fd: int, view: memoryview, offset: int) -> int:
        try:
            return os.preadv(fd, [view], offset)
        except OSError as exc:
            if exc.errno == errno.EIO:
                raise ReadFailed("io-error", f"I/O error reading weight file {self.path} at byte {offset} "
                                             "(the disk or the filesystem failed)") from None
            raise ReadFailed("io-error", f"cannot read weight file {self.path} at byte {offset}: "
                                         f"{exc.strerror or exc}") from None

    def _ended(self, at: int, wanted: int) -> None:
        now = os.fstat(self.fd).st_size
        if now < self.identity[2]:
            raise ReadFailed("truncated", f"weight file {self.path} was truncated while it was read "
                                          f"({self.identity[2]} -> {now} bytes)")
        raise ReadFailed("short-read", f"short read of weight file {self.path}: the file ended at byte {at}, "
                                       f"{wanted - at} bytes before the {wanted} asked for")


# ---------------------------------------------------------------- the reader


def coalesce(extents: Sequence[Extent]) -> list[Extent]:
    """``extents`` in file order, neighbours that continue each other both in the file and in the
    destination joined into one: a bucket of many tensors that lie back to back in the file and in
    the bucket is one range to read, not one slice (a syscall and a copy) per tensor."""
    out: list[Extent] = []
    for e in sorted((e for e in extents if e.nbytes), key=lambda e: e.file_offset):
        last = out[-1] if out else None
        if last is not None and last.file_offset + last.nbytes == e.file_offset and last.dst_offset + last.nbytes == e.dst_offset:
            out[-1] = Extent(last.file_offset, last.nbytes + e.nbytes, last.dst_offset)
        else:
            out.append(e)
    return out


@dataclass
class ReadStats:
    threads: int = 0
    slices: int = 0
    direct: bool = False
    direct_reason: str = "off"
    peak_host_bytes: int = 0


class _Landing:
    """One device copy a reader thread started: landed (waited on) once, by whoever needs it first
    (the thread reusing its buffer, or the caller waiting for the read); a failure is kept for both."""

    __slots__ = ("_seam", "_token", "_lock", "_landed", "error")

    def __init__(self, seam: DeviceSeam, token: Any):
        self._seam, self._token = seam, token
        self._lock = threading.Lock()
        self._landed = token is None
        self.error: BaseException | None = None

    def land(self) -> BaseException | None:
        with self._lock:
            if not self._landed:
                try:
                    self._seam.wait(self._token)
                except BaseException as exc:  # noqa: BLE001 - kept, and raised by the read that owns it
                    self.error = exc
                self._landed, self._token = True, None
            return self.error


class Reading:
    """A read handed to the reader's threads (:meth:`ParallelReader.submit`); :meth:`wait` returns
    when every byte is in place or raises the read's first error (a named ReadFailed first)."""

    def __init__(self, wf: WeightFile, slices: list[_Slice], dst: Any, dview: memoryview | None, check: bool):
        self.wf, self.slices, self.dst, self.dview, self.check = wf, slices, dst, dview, check
        self.handed = 0  # slices handed to a thread (under the reader's lock)
        self.open = len(slices)  # slices not yet finished: read and copy started, or abandoned
        self.landings: list[_Landing] = []
        self.errors: list[BaseException] = []
        self.finished = threading.Event()
        if not slices:
            self.finished.set()

    def wait(self) -> None:
        self.finished.wait()  # each slice is one bounded read (a file's bytes) and one copy
        for landing in self.landings:  # a buffer is never handed back (or freed) under a copy in flight
            if (err := landing.land()) is not None:
                self.errors.append(err)
        if self.errors:
            raise next((e for e in self.errors if isinstance(e, ReadFailed)), self.errors[0])
        if self.check:
            self.wf.check_unchanged()


class _Crew:
    """A reader's threads and everything they share: the queue of reads, each thread's ring of
    host buffers and its stream. The threads hold this, never the reader, so a reader nobody
    closes is still collected, and its finalizer stops them (a resident rank lives on across
    pushes: a reader left open per push must not leave threads and pinned memory behind)."""

    def __init__(self, seam: DeviceSeam, threads: int, slice_bytes: int, depth: int, stats: ReadStats):
        self.seam, self.threads, self.slice_bytes, self.depth, self.stats = seam, threads, slice_bytes, depth, stats
        self.rings: list[list[tuple[Any, memoryview]]] = [[] for _ in range(threads)]
        self.streams: list[Any] = [None] * threads
        self.cond = threading.Condition()
        self.queue: deque[Reading] = deque()
        self.workers: list[threading.Thread] = []
        self.closing = False

    def ring(self, t: int) -> list[tuple[Any, memoryview]]:
        if not self.rings[t]:
            # Built whole before it is kept: a failed allocation leaves no short ring behind.
            # Room for a slice plus the alignment slack on both ends of an O_DIRECT read.
            made: list[tuple[Any, memoryview]] = []
            try:
                for _ in range(self.depth):
                    made.append(self.seam.host_buffer(self.slice_bytes + 2 * ALIGN))
                stream = self.seam.stream()
            except BaseException:
                _free(made)
                raise
            with self.cond:  # the threads make their rings at once; the count is shared
                self.stats.peak_host_bytes += self.depth * (self.slice_bytes + 2 * ALIGN)
            self.rings[t], self.streams[t] = made, stream
        return self.rings[t]

    def start(self) -> None:
        """(Lock held.) Every thread running: they live as long as the reader (a source reads
        bucket after bucket, and starting T threads per bucket would cost more than a small read)."""
        while len(self.workers) < self.threads:
            t = threading.Thread(target=self._work, args=(len(self.workers),), daemon=True,
                                 name=f"hwtui-reader-{len(self.workers)}")
            self.workers.append(t)
            t.start()

    def _take(self) -> tuple[Reading, _Slice] | None:
        """The oldest read's next slice; None once the reader is closing and nothing is queued."""
        with self.cond:
            while True:
                while self.queue and self.queue[0].handed >= len(self.queue[0].slices):
                    self.queue.popleft()
                if self.queue:
                    job = self.queue[0]
                    s = job.slices[job.handed]
                    job.handed += 1
                    return job, s
                if self.closing:
                    return None
                self.cond.wait()

    @staticmethod
    def _done(job: Reading, n: int) -> None:
        """(Lock held.) ``n`` of a read's slices finished (or dropped); the last one ends the read."""
        job.open -= n
        if job.open == 0:
            job.finished.set()

    def abandon(self, job: Reading, exc: BaseException) -> None:
        """(Lock held.) A read's first error: its slices not yet handed out are dropped; the threads
        go on to the next read, and the reads queued behind it are not affected."""
        job.errors.append(exc)
        left, job.handed = len(job.slices) - job.handed, len(job.slices)
        if left:
            self._done(job, left)

    def _work(self, t: int) -> None:
        ring: list[tuple[Any, memoryview]] = []
        landings: list[_Landing | None] = [None] * self.depth
        k = 0
        try:
            while (got := self._take()) is not None:
                job, s = got
                del got
                try:
                    if job.dview is not None:  # CPU, page cache: preadv straight into the destination
                        job.wf.read_exact(job.dview[s.dst_offset:s.dst_offset + s.nbytes], s.file_offset)
                        continue
                    ring = ring or self.ring(t)
                    buf, view = ring[k]
                    prev, landings[k] = landings[k], None
                    if prev is not None:
                        prev.land()  # backpressure; a failed copy is raised by the read that owns it
                    if job.wf.direct:
                        skip = job.wf.read_direct(view, s.file_offset, s.nbytes)
                    else:
                        skip = 0
                        job.wf.read_exact(view[:s.nbytes], s.file_offset)
                    landing = landings[k] = _Landing(
                        self.seam, self.seam.copy(job.dst, s.dst_offset, buf, skip, s.nbytes, self.streams[t]))
                    with self.cond:
                        job.landings.append(landing)
                    k = (k + 1) % self.depth
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                    with self.cond:
                        self.abandon(job, exc)
                finally:
                    with self.cond:
                        self._done(job, 1)
                    # An idle thread pins no read: a failed one's error holds its traceback, and so
                    # the caller's frames and the reader itself, which then is never collected.
                    del job, s
        finally:
            for pending in landings:  # the ring is never freed under a copy in flight
                if pending is not None:
                    pending.land()

    def stop(self, join: bool) -> None:
        """The threads told to end (a read still queued is abandoned and raises on wait); with
        ``join``, waited for and the rings freed. The finalizer of a reader nobody closed does not
        join (it may run on any thread): the threads end on their own, the rings go with them."""
        with self.cond:
            self.closing = True
            for job in self.queue:
                if job.handed < len(job.slices):
                    self.abandon(job, RuntimeError("the reader was closed before this read finished"))
            self.queue.clear()
            self.cond.notify_all()
        if not join:
            return
        for w in self.workers:
            w.join()  # each finishes its current slice: one bounded read
        self.workers.clear()
        for ring in self.rings:
            _free(ring)
            ring.clear()
        with self.cond:
            self.closing = False  # a closed reader may be used again: threads and rings come back


def _free(ring: list[tuple[Any, memoryview]]) -> None:
    for buf, view in ring:
        view.release()
        if isinstance(buf, mmap.mmap):
            try:
                buf.close()
            except BufferError:
                pass  # a failed read's traceback still holds a view of it: unmapped when that goes


class ParallelReader:
    """T threads reading extents of files into destinations (see the module docstring).

    Reads are queued (:meth:`submit`) and the threads take slices from the oldest read first, so a
    thread done with the last slices of one read goes straight on to the next: a source that queues
    bucket b+1 before it waits for bucket b never drains the ring between buckets. Host buffers are
    allocated once per reader and reused across reads (pinning is costly), so a source keeps one
    reader for the whole transfer; :meth:`close` stops the threads (and so does dropping the reader)."""

    def __init__(self, seam: DeviceSeam, *, threads: int = 1, slice_bytes: int = SLICE_BYTES, depth: int = DEPTH):
        if threads < 1 or slice_bytes < ALIGN or depth < 1:
            raise ValueError("a reader needs >= 1 thread, >= 1 buffer per thread and slices of >= 4 KiB")
        self.seam, self.threads, self.depth = seam, threads, depth
        self.slice_bytes = slice_bytes - slice_bytes % ALIGN
        self.stats = ReadStats(threads=threads)
        self._crew = _Crew(seam, threads, self.slice_bytes, depth, self.stats)
        self._finalizer = weakref.finalize(self, self._crew.stop, False)

    def warm(self) -> None:
        """Allocate every thread's ring and stream now (pinning is slow: a source does it in set-up,
        before the clock starts, not inside its first bucket)."""
        if not self.seam.on_host:
            for t in range(self.threads):
                self._crew.ring(t)

    def _slices(self, extents: Sequence[Extent], min_slice: int | None) -> list[_Slice]:
        out: list[_Slice] = []
        # Every thread gets work even when the request is smaller than T slices (one bucket):
        # slices of total / T, at least MIN_SLICE on the host and DEVICE_MIN_SLICE for a device
        # (a syscall, and a copy launch, per slice) unless the caller says (``min_slice``), at
        # most the ring's buffer.
        total = sum(e.nbytes for e in extents)
        per = -(-total // self.threads)
        floor = slice_floor(self.seam.on_host, min_slice)
        per = min(self.slice_bytes, max(min(floor, self.slice_bytes), -(-per // ALIGN) * ALIGN))
        for e in coalesce(extents):
            pos = 0
            while pos < e.nbytes:
                n = min(per, e.nbytes - pos)
                out.append(_Slice(e.file_offset + pos, n, e.dst_offset + pos))
                pos += n
        return out

    def read(self, wf: WeightFile, extents: Sequence[Extent], dst: Any, *, check: bool = True) -> None:
        """Every extent of ``wf`` into ``dst`` (a device tensor, or host memory for a CPU seam);
        returns when every byte is in place (device copies synchronised) or raises ReadFailed."""
        self.submit(wf, extents, dst, check=check).wait()

    def submit(self, wf: WeightFile, extents: Sequence[Extent], dst: Any, *, check: bool = True,
               min_slice: int | None = None) -> Reading:
        """Queue a read of every extent of ``wf`` into ``dst`` and return at once; the returned
        :class:`Reading`'s ``wait()`` is :meth:`read`'s return. ``dst`` is not touched by anyone
        else until then. Bad extents and a too-small destination are refused here, before any read.
        ``min_slice``: the smallest slice this read is cut into (default: MIN_SLICE on the host,
        DEVICE_MIN_SLICE for a device; a caller that queues no reads behind this one may want all
        T threads on it)."""
        for e in extents:
            if e.file_offset < 0 or e.nbytes < 0 or e.file_offset + e.nbytes > wf.size:
                raise ReadFailed("short-read", f"weight file {wf.path} is {wf.size} bytes; bytes "
                                               f"{e.file_offset}..{e.file_offset + e.nbytes} were asked for")
        need = max((e.dst_offset + e.nbytes for e in extents), default=0)
        if min((e.dst_offset for e in extents), default=0) < 0 or _nbytes(dst) < need:
            raise ValueError(f"the destination holds {_nbytes(dst)} bytes; the extents need {need}")
        slices = self._slices(extents, min_slice)
        straight = self.seam.on_host and not wf.direct
        job = Reading(wf, slices, dst, host_view(dst) if straight and slices else None, check)
        crew = self._crew
        with crew.cond:
            if crew.closing:
                raise RuntimeError("the reader is closed")
            self.stats.slices += len(slices)
            self.stats.direct, self.stats.direct_reason = wf.direct, wf.direct_reason
            if slices:
                crew.start()
                crew.queue.append(job)
                crew.cond.notify_all()
        return job

    def close(self) -> None:
        """Stop the threads (a read still queued is abandoned and raises on wait) and free the ring."""
        self._crew.stop(join=True)


def read_file(path: str | os.PathLike[str], dst: Any, *, device: Any = "cpu", threads: int | None = None,
              direct: str = "off", offset: int = 0, nbytes: int | None = None,
              slice_bytes: int = SLICE_BYTES) -> ReadStats:
    """Convenience: bytes [offset, offset+nbytes) of one file into ``dst`` on ``device``."""
    with WeightFile(path, direct) as wf:
        return read_range(wf, dst, device=device, threads=threads, offset=offset, nbytes=nbytes,
                          slice_bytes=slice_bytes)


def read_range(wf: WeightFile, dst: Any, *, device: Any = "cpu", threads: int | None = None, offset: int = 0,
               nbytes: int | None = None, slice_bytes: int = SLICE_BYTES) -> ReadStats:
    """Bytes [offset, offset+nbytes) of an open weight file into ``dst`` on ``device``, by a reader
    made for this one read (its threads and ring gone when it returns)."""
    n = wf.size - offset if nbytes is None else nbytes
    reader = ParallelReader(seam_for(device), threads=threads or default_readers(), slice_bytes=slice_bytes)
    try:
        reader.read(wf, [Extent(offset, n, 0)], dst)
    finally:
        reader.close()
    return reader.stats
