"""A receiver's staging copy of the next version.

The staging copy has the layout of a safetensors file (tensors sorted by itemsize then name, as
safetensors itself writes them, so every tensor stays aligned behind the 8-byte-padded header).
With an output directory on the CPU, the staging copy *is* a file in the staging directory,
memory-mapped so that received buckets land in it and it can be hashed in place; ``prepare`` only
has to fsync it; the served version is never touched. Bytes *copied* into it (the same-host and
host-copy paths, unpacked pieces) go in with ``pwrite`` rather than through the mapping: a store
through a shared file mapping costs a write fault and ``page_mkwrite`` per 4 KiB page (measured
1 GB: ~1.0 s through the mapping, ~0.25 s by pwrite, hash included), the kernel's copy does not.
Without a file, host staging is anonymous memory, faulted in by a thread while the rank forms its
world (:class:`Prefaulted`); it reads as zeros where no tensor covers it. Otherwise it is a buffer on the device (and, on commit, is written
out from there).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.core.private_file import create_private, open_private
from hwtui.engine.replication.checksum import tensor_hex
from hwtui.engine.replication.disk import NO_SPACE, WRITE_BEHIND_BYTES, WriteBehind, no_space, preallocate
from hwtui.engine.replication.weights import DTYPES, read_safetensors_header


def safetensors_layout(tensors: list[dict[str, Any]], metadata: dict[str, str],
                       first: list[str] | None = None) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """Return (header bytes incl. its 8-byte length, {name: (data offset, nbytes)}).

    ``first``: names laid out first, in this order (the plan's stream order), so that a bucket is
    usually one contiguous range of the staging copy and can be received straight into it.
    """
    by_name = {t["name"]: t for t in tensors}
    lead = [by_name[n] for n in (first or [])]
    seen = set(first or [])
    order = lead + sorted((t for t in tensors if t["name"] not in seen), key=lambda t: (-DTYPES[t["dtype"]][0], t["name"]))
    header: dict[str, Any] = {"__metadata__": metadata}
    layout: dict[str, tuple[int, int]] = {}
    pos = 0
    for t in order:
        header[t["name"]] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [pos, pos + t["nbytes"]]}
        layout[t["name"]] = (pos, t["nbytes"])
        pos += t["nbytes"]
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-len(raw)) % 8)
    return len(raw).to_bytes(8, "little") + raw, layout


def faithful_eligible(plan: Any) -> bool:
    """A version that is exactly one safetensors file can be replicated byte for byte (header included)."""
    files = plan["files"]
    return len(files) == 1 and files[0].get("format") == "safetensors"


def source_header(plan: Any) -> bytes:
    """Rank 0: the source file's header bytes (8-byte length + JSON), or b"" when it does not describe the plan."""
    path = plan["files"][0]["path"]
    infos, raw, _ = read_safetensors_header(path)
    header = len(raw).to_bytes(8, "little") + raw
    try:
        check_header_matches(header, plan)
    except HwtuiError:
        return b""  # the plan is a subset (or the file changed): fall back to a plain layout
    return header


def header_layout(header: bytes) -> dict[str, tuple[int, int]]:
    """{name: (data offset, nbytes)} from a safetensors header (8-byte length prefix included)."""
    raw = json.loads(header[8:])
    return {name: (int(m["data_offsets"][0]), int(m["data_offsets"][1]) - int(m["data_offsets"][0]))
            for name, m in raw.items() if name != "__metadata__"}


def check_header_matches(header: bytes, plan: Any) -> None:
    """The header must describe exactly the plan's tensors (names, dtypes, shapes, sizes), without overlaps."""
    try:
        if len(header) < 8 or int.from_bytes(header[:8], "little") != len(header) - 8:
            raise ValueError("length prefix")
        raw = json.loads(header[8:])
        layout = header_layout(header)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise HwtuiError(f"the source's safetensors header is malformed ({exc})") from None
    want = {t["name"]: t for t in plan["tensors"]}
    if set(layout) != set(want):
        raise HwtuiError("the source's safetensors header names other tensors than the plan")
    for name, t in want.items():
        meta = raw[name]
        if meta.get("dtype") != t["dtype"] or list(meta.get("shape", [])) != list(t["shape"]) or layout[name][1] != t["nbytes"]:
            raise HwtuiError(f"the source's safetensors header disagrees with the plan on tensor {name!r}")
    spans = sorted(layout.values())
    for (a, n), (b, _) in zip(spans, spans[1:], strict=False):
        if a + n > b:
            raise HwtuiError("the source's safetensors header has overlapping tensors")


def anonymous_buffer(nbytes: int) -> mmap.mmap:
    """Private anonymous memory (zeros until written).

    Deliberately without MADV_HUGEPAGE: on this class of VM a transparent huge page is often fresh
    guest memory the host has never backed, and faulting 1 GiB in took 0.2 s one time and 7-10 s
    the next (4 KiB pages: 0.9-2 s, steadily).
    """
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


MADV_POPULATE_READ = 22  # Linux >= 5.14: fault pages in (a file's: into the page cache), in one call
MADV_POPULATE_WRITE = 23  # Linux >= 5.14: fault pages in, writable, in one call


def populate(buf: mmap.mmap, advice: int = MADV_POPULATE_WRITE) -> bool:
    """Fault every page of an anonymous buffer in, inside the kernel, with the GIL released.

    ``mmap.madvise`` would hold the GIL for the whole call (up to a second per GB on a busy host)
    and stall the thread that imports torch and forms the world; through ctypes it does not.
    False where the kernel cannot (the pages then fault in when first written, as before).
    """
    import ctypes

    import numpy as np

    arr = np.frombuffer(buf, dtype=np.uint8)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return bool(arr.size) and libc.madvise(ctypes.c_void_p(arr.ctypes.data), arr.size, advice) == 0
    except (OSError, AttributeError):
        return False
    finally:
        del arr


class Prefaulted:
    """A receiver's host staging memory, faulted in by a thread while the rank forms its world.

    A fresh buffer pays a page fault per page the first time the transfer writes it (1 GB: 0.4-2 s
    here, as long as the copy itself); done in the kernel while ``import torch`` and the rendezvous
    run, that cost leaves the transfer. No pass of zeros from Python: fresh anonymous pages are
    zeros already, which is also what gaps no tensor covers must read as.
    """

    def __init__(self, nbytes: int):
        import threading

        self.nbytes = nbytes
        self.buf: mmap.mmap | None = anonymous_buffer(nbytes) if nbytes else None
        self.populated = False
        self._thread = threading.Thread(target=self._run, name="prefault-staging", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self.buf is not None:
            self.populated = populate(self.buf)

    def take(self, timeout: float) -> mmap.mmap | None:
        """The buffer once faulted in (a bounded wait); None if the thread is still at it."""
        self._thread.join(timeout)
        buf, self.buf = self.buf, None
        if self._thread.is_alive():
            return None  # dropped: a buffer a thread may still be touching is not handed out
        return buf


class PrefaultedFile:
    """A receiver's ``--out`` staging file, made by a thread while the rank forms its world.

    The file is created (0600, exclusively), reserved whole (:func:`disk.preallocate`) and its
    pages brought into the page cache (``MADV_POPULATE_READ`` on a read-only mapping: the blocks
    are an unwritten extent, so this reads no disk, it allocates zeroed cache pages), all inside
    the kernel with the GIL released, while ``import torch`` and the rendezvous run. The transfer
    then writes into cached pages, as into a reused spare (measured 1 GB: 0.12 s instead of 0.16 s
    into a fresh preallocated file, 0.23-2.1 s into a sparse one), and the page allocation it no
    longer pays is done where the rank was waiting anyway, as :class:`Prefaulted` does for memory.
    Nothing is written to the file: every data byte is still written by the transfer and verified.
    ``nbytes`` may be off (the layout comes with the source's header): :class:`Staging` resizes it.
    """

    def __init__(self, path: str | os.PathLike[str], nbytes: int):
        import threading

        self.path = Path(path)
        self.nbytes = nbytes
        self.preallocated = False
        self.populated = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="prefault-staging-file", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            fd = create_private(self.path, replace=True)
            try:
                os.ftruncate(fd, self.nbytes)
                self.preallocated = preallocate(fd, self.nbytes, f"the staging copy {self.path}")
                if self.nbytes:
                    with mmap.mmap(fd, self.nbytes, prot=mmap.PROT_READ) as mm:
                        self.populated = populate(mm, MADV_POPULATE_READ)
            finally:
                os.close(fd)
        except BaseException as exc:  # noqa: BLE001 - handed to the rank's own thread by take()
            self.error = exc

    def take(self, timeout: float) -> bool:
        """True once the file is made (a bounded wait). A full disk raises here, in the rank's
        thread, as the "no space" error; any other failure, or a thread still at it, is False:
        :class:`Staging` then makes the file itself, as it would have anyway."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        if isinstance(self.error, HwtuiError):
            raise self.error
        return self.error is None


def pwrite_all(fd: int, data: Any, offset: int) -> None:
    """Write every byte of ``data`` (a buffer) at ``offset``; a short write goes on where it stopped."""
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(f"pwrite wrote {n} bytes at offset {offset}")
        view, offset = view[n:], offset + n


def as_buffer(src: Any) -> Any:
    """A contiguous CPU uint8 torch tensor (or any buffer) as something ``pwrite`` and numpy accept."""
    return src.numpy() if hasattr(src, "numpy") else src


AT_FLUSH_ENV = "HWTUI_TEST_STAGING"
# A copy written at flush goes to disk this much at a time: each chunk crosses to the host alone,
# and a newer push can stop the write between two (64 MiB: ~1 ms over PCIe, ~50 ms of a disk).
WRITE_OUT_CHUNK = 64 << 20


class WriteStopped(Exception):
    """A deferred disk copy's write stopped for a newer push (``Staging.flush``'s ``should_stop``)."""


class Staging:
    # Class-level defaults: a subclass that builds its file itself (engine.resident.spare) still has them.
    _anon: mmap.mmap | None = None
    _fd: int | None = None
    _behind: WriteBehind | None = None
    preallocated = False
    _kicks = 0  # write-out kicks, kept when the WriteBehind closes
    _written_id: tuple[int, int] | None = None  # (dev, inode) of a file written whole at flush
    write_behind = True  # False: a subclass starts its own write-out (engine.resident.spare)

    def __init__(self, tensors: list[dict[str, Any]], metadata: dict[str, str], device: str = "cpu",
                 file: str | os.PathLike[str] | None = None, first: list[str] | None = None,
                 header: bytes | None = None, buffer: mmap.mmap | None = None, reuse_file: bool = False):
        """``buffer``: fresh anonymous memory for a host copy without a file (see :class:`Prefaulted`).

        ``reuse_file``: ``file`` already exists (the agent's spare, renamed into place): keep its
        allocated pages, resize it only if the model's size changed, and rewrite the header."""
        import torch

        self.tensors = {t["name"]: t for t in tensors}
        if header is not None:  # the source's own header: the replica is the source file, byte for byte
            self.header, self.layout = header, header_layout(header)
        else:
            self.header, self.layout = safetensors_layout(tensors, metadata, first)
        self.data_bytes = max((off + n for off, n in self.layout.values()), default=0)
        self.device = device
        self.file = Path(file) if file is not None else None
        self._mm: mmap.mmap | None = None
        # HWTUI_TEST_STAGING=at-flush (tests only, like HWTUI_TEST_IPC): a host copy kept in memory
        # and written whole at flush, as a device copy is, so CPU tests take a GPU receiver's path.
        self._at_flush = self.file is not None and device == "cpu" and os.environ.get(AT_FLUSH_ENV) == "at-flush"
        if self.file is not None and device == "cpu" and not self._at_flush:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            total = len(self.header) + self.data_bytes
            # Created exclusively, 0600, never through a symlink (core.private_file): the file may
            # sit in /dev/shm or under a shared --out; a spare is reopened the same way.
            fd = open_private(self.file) if reuse_file else create_private(self.file, replace=True)
            try:
                if not reuse_file or os.fstat(fd).st_size != total:
                    os.ftruncate(fd, total)
                    # Every block reserved before the first byte (engine.replication.disk): a full
                    # disk fails here, in one line, not mid-transfer (or by SIGBUS through the mapping).
                    self.preallocated = preallocate(fd, total, f"the staging copy {self.file}")
                self._pwrite(fd, self.header, 0)
                self._mm = mmap.mmap(fd, total) if total else None
            except BaseException:
                os.close(fd)
                raise
            if self._mm is None:
                os.close(fd)
            else:
                self._fd = fd  # kept for pwrite: the path is never opened again
                self._behind = self._write_behind_for(fd)
            whole = torch.frombuffer(self._mm, dtype=torch.uint8) if self._mm else torch.empty(0, dtype=torch.uint8)
            self.data = whole[len(self.header):]
        elif device == "cpu" and self.data_bytes:
            # Not pre-faulted (that pass over memory would only delay the first byte) and never
            # garbage: fresh anonymous pages read as zeros, so gaps no tensor covers need nothing.
            fits = buffer is not None and len(buffer) >= self.data_bytes
            self._anon = buffer if fits else anonymous_buffer(self.data_bytes)
            self.data = torch.frombuffer(self._anon, dtype=torch.uint8)[:self.data_bytes]
        else:
            self.data = torch.empty(self.data_bytes, dtype=torch.uint8, device=device)
            if sum(n for _, n in self.layout.values()) < self.data_bytes:
                self.data.zero_()  # a device buffer starts as garbage; gaps must read as zeros

    def region(self, name: str) -> Any:
        off, n = self.layout[name]
        return self.data[off:off + n]

    def direct_offset(self, items: list[dict[str, Any]], size: int) -> int | None:
        """Where in the data a bucket maps onto exactly (same order, no padding), or None."""
        if not items or sum(i["nbytes"] for i in items) != size:
            return None
        base = self.layout[items[0]["name"]][0] + items[0]["tensor_offset"] - items[0]["offset"]
        for it in items:
            if self.layout[it["name"]][0] + it["tensor_offset"] - it["offset"] != base:
                return None
        return int(base)

    def direct_region(self, items: list[dict[str, Any]], size: int) -> Any | None:
        """The staging bytes a bucket maps onto exactly (same order, no padding), or None."""
        base = self.direct_offset(items, size)
        return None if base is None else self.data[base:base + size]

    def write(self, name: str, tensor_offset: int, src: Any) -> None:
        off, _ = self.layout[name]
        self.write_at(off + tensor_offset, src)

    def write_at(self, start: int, src: Any) -> None:
        """Copy ``src`` (a uint8 tensor, or any buffer on the host) to data offset ``start``."""
        device: Any = getattr(src, "device", None)  # a torch device; numpy 2 arrays have device == "cpu"
        on_host = getattr(device, "type", "cpu") == "cpu"
        fd = self._file_fd() if on_host else None
        if fd is not None:
            buf = as_buffer(src)
            self._pwrite(fd, buf, len(self.header) + start)
            self.landed(start, memoryview(buf).nbytes)
        elif on_host and self.data.device.type == "cpu":
            import numpy as np

            raw = np.frombuffer(as_buffer(src), dtype=np.uint8)
            self.data[start:start + raw.size].numpy()[:] = raw  # numpy's memcpy beats torch's copy_ on one core
        else:
            self.data[start:start + src.numel()].copy_(src)

    def write_hashed(self, start: int, src: Any, step: int = 1 << 20) -> str:
        """Copy host bytes ``src`` to data offset ``start`` and return the xxh3 of what landed there.

        Slice by slice: each slice is hashed as this copy holds it (read back through the mapping
        or the buffer) right after it is written, while it is still in the CPU cache, so copying and
        verifying is one pass over memory instead of two (1 GB here: 0.21 s instead of 0.30 s).
        """
        import numpy as np
        import xxhash

        raw = np.frombuffer(as_buffer(src), dtype=np.uint8)
        mine: Any = self.data.numpy()
        fd = self._file_fd()
        h = xxhash.xxh3_64()
        for c in range(0, raw.size, step):
            piece, at = raw[c:c + step], start + c
            if fd is not None:
                self._pwrite(fd, piece, len(self.header) + at)
            else:
                mine[at:at + piece.size] = piece
            h.update(mine[at:at + piece.size])
        if fd is not None:
            self.landed(start, raw.size)
        return f"{h.intdigest():016x}"

    def landed(self, start: int, nbytes: int) -> None:
        """Data bytes ``[start, start + nbytes)`` of a file staging copy are in place (written, or
        received through the mapping): their write-out starts behind the transfer, so the fsync
        before the vote has little left to do (engine.replication.disk.WriteBehind). Nothing for
        a copy in memory or on a device."""
        if self._behind is not None:
            self._behind.landed(len(self.header) + start, nbytes)

    def _write_behind_for(self, fd: int) -> WriteBehind | None:
        # A kick per 32 MiB landed, or per eighth of a smaller copy: every copy gets a head start.
        total = len(self.header) + self.data_bytes
        return WriteBehind(fd, step=min(WRITE_BEHIND_BYTES, max(4096, total // 8))) if self.write_behind else None

    def disk_stats(self) -> dict[str, Any] | None:
        """For the rank's report: was the file reserved whole, and how often did write-out start behind the transfer."""
        if self.file is None or self.device != "cpu":
            return None
        behind = self._behind.kicks if self._behind is not None else self._kicks
        return {"preallocated": self.preallocated, "write_out_kicks": behind}

    def _pwrite(self, fd: int, data: Any, offset: int) -> None:
        """pwrite_all, with a full disk (a sparse file where the filesystem cannot preallocate) named as such."""
        try:
            pwrite_all(fd, data, offset)
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise no_space(f"the staging copy {self.file}", len(self.header) + self.data_bytes, exc) from None
            raise

    def _file_fd(self) -> int | None:
        """The staging file, open for pwrite (host copies only; a device copy is written out at flush)."""
        if self._fd is None and self.file is not None and self.device == "cpu" and self._mm is not None:
            self._fd = open_private(self.file)
            self._behind = self._write_behind_for(self._fd)
        return self._fd

    def verify(self, names: list[str] | None = None) -> list[str]:
        """Names whose bytes do not hash to the plan's checksum."""
        bad = []
        for name in names if names is not None else list(self.tensors):
            region = self.region(name)
            host = region if region.device.type == "cpu" else region.cpu()
            if tensor_hex(host) != self.tensors[name]["checksum"]:
                bad.append(name)
        return bad

    def flush(self, should_stop: Callable[[], bool] | None = None) -> None:
        """Make the staged file durable (prepare phase).

        ``should_stop`` (a deferred disk copy's write: a newer push is waiting) is asked before each
        chunk of a copy written at flush and before the fsync; when it says so, WriteStopped is
        raised and the file is left as far as it got (never switched to: its caller discards it)."""
        if self.file is None:
            return
        # fsync alone makes a mapped copy durable (no msync first: a store through the shared
        # mapping dirties its page at the write fault, and pwrite'd pages are dirty in the page
        # cache already, so msync(MS_SYNC) would only walk the same range once more).
        if self._mm is None and (self.device != "cpu" or self._at_flush):
            self._write_out(self.header, self.data, should_stop=should_stop)
        elif self._mm is None and not os.path.lexists(self.file):  # an empty model: header only
            self._write_out(self.header)
        if should_stop is not None and should_stop():
            raise WriteStopped(f"the staging copy {self.file} was not made durable: a newer push is waiting")
        if self._behind is not None:
            self._behind.drain()  # it only started write-out; the fsync below is what makes it durable
        if self._fd is not None:
            self._fsync(self._fd)
            return
        fd = open_private(self.file, os.O_RDONLY)
        try:
            self._fsync(fd)
        finally:
            os.close(fd)

    def _fsync(self, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno in NO_SPACE:  # a sparse file's delayed allocation can fail only here
                raise no_space(f"the staging copy {self.file}", len(self.header) + self.data_bytes, exc) from None
            raise

    @property
    def written_at_flush(self) -> bool:
        """Whether the file exists only once flush writes it whole (a device copy, an empty model),
        rather than being written through its mapping as bytes arrive."""
        return self.file is not None and self._mm is None

    def still_at_path(self) -> bool:
        """Whether the staging path still names the file this copy was written into: a regular
        file, the same one (not a link or a file put there since). What a switch publishes is the
        path, so it is checked before the rename."""
        if self.file is None:
            return True
        try:
            st = os.lstat(self.file)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode):
            return False
        mine = os.fstat(self._fd) if self._fd is not None else None
        ident = (mine.st_dev, mine.st_ino) if mine is not None else self._written_id
        return ident is None or ident == (st.st_dev, st.st_ino)

    def write_header_only(self) -> None:
        """A copy written at flush: its file now, holding the header at the file's full size and no
        data (sparse), so the tensors' places can be read from it (served_export.layout_of) before
        flush writes it whole. Never a copy anything trusts: it has no manifest until then."""
        assert self.file is not None and self.written_at_flush
        fd = create_private(self.file, replace=True)
        try:
            os.ftruncate(fd, len(self.header) + self.data_bytes)
            self._pwrite(fd, self.header, 0)
        finally:
            os.close(fd)

    def _write_out(self, header: bytes, data: Any = None, *, should_stop: Callable[[], bool] | None = None) -> None:
        """A staging file written whole at flush (a device copy, an empty model): created like any
        other, the header then the data (a 1-D uint8 tensor on any device) WRITE_OUT_CHUNK at a
        time. Why chunks: a device copy is brought to the host a chunk at a time (a 14 GB model is
        never copied to host memory whole), and a newer push can stop the write between two
        (``should_stop``: WriteStopped)."""
        assert self.file is not None
        fd = create_private(self.file, replace=True)
        try:
            st = os.fstat(fd)
            self._written_id = (st.st_dev, st.st_ino)
            self._pwrite(fd, header, 0)
            at = len(header)
            total = int(data.numel()) if data is not None else 0
            for off in range(0, total, WRITE_OUT_CHUNK):
                if should_stop is not None and should_stop():
                    raise WriteStopped(f"the staging copy {self.file} was stopped after {off} of {total} bytes: "
                                       "a newer push is waiting")
                chunk = data[off: off + WRITE_OUT_CHUNK]
                self._pwrite(fd, chunk.cpu().numpy(), at + off)  # .cpu(): the same tensor when on the host
        finally:
            os.close(fd)

    def close(self) -> None:
        self.data = None  # type: ignore[assignment]  # drop the view before unmapping
        if self._behind is not None:
            self._kicks = self._behind.kicks
            with contextlib.suppress(OSError):
                self._behind.close()  # before its fd goes: a kick never meets a closed (or reused) fd
            self._behind = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        for attr in ("_mm", "_anon"):
            mm = getattr(self, attr)
            if mm is not None:
                with contextlib.suppress(BufferError):  # a view is still alive; the mapping goes with it
                    mm.close()
                setattr(self, attr, None)
