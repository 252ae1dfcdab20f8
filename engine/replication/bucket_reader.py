"""The source's reads of planned buckets: every safetensors piece through the parallel reader.

A bucket is a list of pieces (a tensor's bytes, or part of them) at planned offsets, with zero
padding between them. Pieces from safetensors files are read by :class:`reader.ParallelReader`
straight from the file into the bucket's buffer (pinned slices and streams on an accelerator,
``preadv`` into host memory on a CPU rank); pieces of torch state dicts (already loaded, mapped by
``torch.load``) are copied as before; padding is zeroed, as the planner hashed it.

One reader (its pinned ring allocated once) and one open descriptor per file serve the whole
transfer; :meth:`close` releases them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from hwtui.engine.replication.reader import (
    ALIGN,
    SLICE_BYTES,
    Extent,
    ParallelReader,
    Reading,
    ReadStats,
    WeightFile,
    check_direct,
    default_readers,
    on_host,
    seam_for,
    slice_floor,
)


class BucketFill:
    """A bucket being read: one queued read per file it draws on."""

    def __init__(self) -> None:
        self.readings: list[Reading] = []

    def wait(self) -> None:
        """Every byte in place, or the first read's error once every read has settled (none is
        left writing into the buffer, so the caller may hand it back)."""
        first: BaseException | None = None
        for r in self.readings:
            try:
                r.wait()
            except BaseException as exc:  # noqa: BLE001 - the first is raised once all have settled
                first = first or exc
        if first is not None:
            raise first

    def settle(self) -> None:
        """Wait for every read, keeping no error (a path that is already failing)."""
        with contextlib.suppress(BaseException):  # wait() raises only once every read has settled
            self.wait()


class BucketReader:
    def __init__(self, files: Sequence[dict[str, Any]], device: Any, *, readers: int | None = None,
                 direct: str = "auto", devices: int = 1, largest: int | None = None,
                 opened: dict[int, WeightFile] | None = None, min_slice: int | None = None):
        self.device = str(device)
        self.threads = readers or default_readers(devices=devices)
        self.direct = check_direct(direct)
        # Ring buffers of a bucket's share per thread (pinned memory is T x 2 x slice), but for a
        # device never below DEVICE_MIN_SLICE where the buckets are that large: a 64 MiB bucket
        # shared by 16 threads went in 4 MiB slices, and per-slice costs held the source to a third
        # of the reader's speed (reader.DEVICE_MIN_SLICE). With the default readers (16 at most) that
        # is at most 16 x 2 x 16 MiB = 512 MiB pinned; --readers 64 pins up to 2 GiB.
        # Unknown: the ring's most. A plan whose buckets are all empty reads nothing: one page, not
        # the 16 MiB device slices (512 MiB pinned at 16 threads) that `largest or SLICE_BYTES` gave.
        largest = SLICE_BYTES if largest is None else max(ALIGN, largest)
        share = -(-largest // self.threads)  # ceil(largest / threads)
        host = on_host(self.device)  # host rings are O_DIRECT's bounce buffers only: MIN_SLICE, as before
        # ``min_slice``: a caller whose every read is cut with this floor (the IPC source: T shares
        # of each bucket) needs no larger ring slices: 16 threads x 2 x 16 MiB pinned (512 MiB)
        # held the 2 MiB reads of 32 MiB buckets, where their shares take 64 MiB.
        floor = slice_floor(host, min_slice)
        if not host:
            floor = min(floor, largest)
        self.slice_bytes = min(SLICE_BYTES, max(floor, -(-share // ALIGN) * ALIGN))
        self._paths = {i: f["path"] for i, f in enumerate(files) if f.get("format") == "safetensors"}
        # Files opened by the caller (their identity pinned when the source opened them) are shared,
        # and closed by the caller; the rest are opened on first use and closed here.
        self._shared: dict[int, WeightFile] = dict(opened or {})
        self._open: dict[int, WeightFile] = {}
        self._reader: ParallelReader | None = None

    def reads(self, item: dict[str, Any]) -> bool:
        """True when this piece comes from a file this reader reads (a safetensors file)."""
        return item["file"] in self._paths

    def _file(self, idx: int) -> WeightFile:
        wf = self._shared.get(idx) or self._open.get(idx)
        if wf is None:
            wf = self._open[idx] = WeightFile(self._paths[idx], self.direct)
        return wf

    def _ready(self) -> ParallelReader:
        if self._reader is None:
            self._reader = ParallelReader(seam_for(self.device), threads=self.threads, slice_bytes=self.slice_bytes)
        return self._reader

    def warm(self) -> None:
        """The pinned ring and streams, allocated now (set-up) instead of in the first bucket."""
        self._ready().warm()

    def fill(self, items: Sequence[dict[str, Any]], size: int, dst: Any,
             other: Callable[[dict[str, Any]], Any] | None = None) -> None:
        """Bucket bytes [0, size) into ``dst`` as the planner laid them out: pieces, zero padding."""
        self.start(items, size, dst, other).wait()

    def start(self, items: Sequence[dict[str, Any]], size: int, dst: Any,
              other: Callable[[dict[str, Any]], Any] | None = None, *, min_slice: int | None = None) -> BucketFill:
        """:meth:`fill`, queued: padding and torch-file pieces are written now, the file pieces are
        handed to the reader's threads; ``wait()`` on the result returns when every byte is in place."""
        reader = self._ready()
        by_file: dict[int, list[Extent]] = {}
        pos = 0
        for it in items:
            if it["offset"] > pos:
                dst[pos:it["offset"]] = 0  # alignment padding is hashed as zeros by the planner
            if self.reads(it):
                by_file.setdefault(it["file"], []).append(Extent(it["file_offset"], it["nbytes"], it["offset"]))
            else:
                assert other is not None, "a piece of a torch file needs its loaded tensor"
                dst[it["offset"]:it["offset"] + it["nbytes"]].copy_(other(it))
            pos = it["offset"] + it["nbytes"]
        if pos < size:
            dst[pos:size] = 0
        fill = BucketFill()
        try:
            for idx, extents in by_file.items():
                fill.readings.append(reader.submit(self._file(idx), extents, dst, min_slice=min_slice))
        except BaseException:
            fill.settle()  # nothing queued is left writing into dst
            raise
        return fill

    @property
    def stats(self) -> ReadStats | None:
        return self._reader.stats if self._reader is not None else None

    def close(self) -> None:
        for wf in self._open.values():
            wf.close()
        self._open.clear()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
