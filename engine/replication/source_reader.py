"""The plan read as byte ranges: the source's zero-copy view of the weight files, and the order and
grouping of the buckets on the wire (the same answer on every rank: it reads only the plan)."""

from __future__ import annotations

from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.bucket_reader import BucketFill, BucketReader
from hwtui.engine.replication.checksum import Streaming
from hwtui.engine.replication.plan import Plan
from hwtui.engine.replication.pool import BufferPool
from hwtui.engine.replication.reader import MIN_SLICE, WeightFile, check_direct
from hwtui.engine.replication.weights import MappedFile, load_torch_state, tensor_bytes


def in_place_tensors(plan: Plan, direct: set[int]) -> set[str]:
    """Tensors all of whose pieces travelled in buckets received straight into the staging copy."""
    ok: dict[str, bool] = {}
    for b, items in enumerate(plan.bucket_items):
        for it in items:
            ok[it["name"]] = ok.get(it["name"], True) and b in direct
    return {name for name, v in ok.items() if v}


def stream_order(plan: Plan) -> list[str]:
    """Names of the tensors sent, in the order their bytes travel."""
    seen: dict[str, None] = {}
    for items in plan.bucket_items:
        for it in items:
            seen.setdefault(it["name"], None)
    return list(seen)


def collective_groups(plan: Plan, *, chunk_bytes: int, max_group: int, enabled: bool,
                      layout: dict[str, tuple[int, int]] | None = None) -> list[list[int]]:
    """Buckets sent together as one collective (the same answer on every rank: it reads only the plan).

    A run of consecutive buckets that are one contiguous byte range of one safetensors file on the
    source *and* one contiguous range of every receiver's staging copy (whose layout is the plan's
    stream order) travels as one broadcast of up to ``chunk_bytes``: on gloo over loopback each
    collective costs a few ms of setup and thread hand-off, so 256 MB in 8 broadcasts runs measurably
    slower than in one. Each bucket is still verified on its own before it is done. At most
    ``max_group`` buckets go together so that, with the window, a group is always being received
    while the previous one is hashed. Everything else is a group of one bucket (chunked as before).
    """
    n = len(plan.buckets)
    if not enabled or max_group < 2 or n < 2:
        return [[b] for b in range(n)]
    sizes = {t["name"]: t["nbytes"] for t in plan["tensors"]}
    stream_off: dict[str, int] = {}
    if layout is not None:  # the staging copy has the source's own layout (see staging.Staging)
        stream_off = {name: off for name, (off, _) in layout.items()}
    else:
        pos = 0
        for name in stream_order(plan):
            stream_off[name] = pos
            pos += sizes[name]
    files = plan["files"]

    def bases(b: int) -> tuple[int, int, int] | None:
        """(file, file base, staging base) of a bucket that is contiguous in both, else None."""
        items = plan.bucket_items[b]
        if not items or files[items[0]["file"]]["format"] != "safetensors":
            return None
        if sum(i["nbytes"] for i in items) != plan.buckets[b]["size"]:
            return None  # alignment padding: not a plain byte range anywhere
        f = items[0]["file"]
        fbase = items[0]["file_offset"] - items[0]["offset"]
        sbase = stream_off[items[0]["name"]] + items[0]["tensor_offset"] - items[0]["offset"]
        for i in items:
            if (i["file"] != f or i["file_offset"] - i["offset"] != fbase
                    or stream_off[i["name"]] + i["tensor_offset"] - i["offset"] != sbase):
                return None
        return f, fbase, sbase

    groups: list[list[int]] = []
    prev: tuple[int, int, int] | None = None
    group_bytes = 0
    for b in range(n):
        cur, size = bases(b), plan.buckets[b]["size"]
        if (cur is not None and prev is not None and groups and len(groups[-1]) < max_group
                and group_bytes + size <= chunk_bytes and cur[0] == prev[0]
                and cur[1] == prev[1] + plan.buckets[b - 1]["size"] and cur[2] == prev[2] + plan.buckets[b - 1]["size"]):
            groups[-1].append(b)
            group_bytes += size
        else:
            groups.append([b])
            group_bytes = size
        prev = cur
    return groups


def _device_key(device: Any) -> str:
    """One name per device ("cuda" and "cuda:0" are the same one when 0 is current): one reader,
    one pinned ring per device, whichever way the caller names it."""
    import torch

    d = torch.device(device)
    if d.type != "cpu" and d.index is None:
        index = torch.get_device_module(d.type).current_device()
        if type(index) is int:
            d = torch.device(d.type, index)
    return "cpu" if d.type == "cpu" else str(d)


class SourceReader:
    """The source's view of the weight files: zero-copy slices of the mapping where the bytes go
    out from host memory as they are, and the parallel reader (engine.replication.reader) wherever
    they are copied: into a device buffer (pinned slices, one stream per reader thread: no device
    copy ever reads through the mapping) or into a host buffer (``preadv`` straight into it)."""

    def __init__(self, plan: Plan, *, readers: int | None = None, direct: str = "auto", devices: int = 1,
                 min_slice: int | None = None):
        self.mapped: dict[int, MappedFile] = {}
        self.states: dict[int, dict[str, Any]] = {}
        self._files = plan["files"]
        # min_slice: the floor this source's callers cut every read with (the IPC-only source's
        # T shares): its rings' slices are sized to it; a read's own cut is the caller's (start_into).
        self._read_opts: dict[str, Any] = {"readers": readers, "direct": direct, "devices": devices,
                                           "largest": max((b["size"] for b in plan.buckets), default=1),
                                           "min_slice": min_slice}
        self._readers: dict[str, BucketReader] = {}
        # Buckets queued behind the one being staged (stage(ahead=...)): buffer, its read, its pool.
        self._ahead: dict[int, tuple[Any, BucketFill, BufferPool]] = {}
        # Opened now, beside the mapping: each file's identity (device, inode, size, mtime) is pinned
        # here, and a file changed or replaced before any later read is named by that read.
        self._opened: dict[int, WeightFile] = {}
        for idx, f in enumerate(plan["files"]):
            if f["format"] == "safetensors":
                self._opened[idx] = WeightFile(f["path"], check_direct(direct))
                self.mapped[idx] = MappedFile(f["path"])
            else:
                self.states[idx] = {k: tensor_bytes(v) for k, v in load_torch_state(f["path"]).items()}

    def reader(self, device: Any) -> BucketReader:
        """The one reader that fills buffers on ``device`` (its ring and threads reused bucket after bucket)."""
        key = _device_key(device)
        r = self._readers.get(key)
        if r is None:
            r = self._readers[key] = BucketReader(self._files, key, opened=self._opened, **self._read_opts)
        return r

    def warm(self, device: Any) -> None:
        """Pin the reader's ring for ``device`` now (set-up), not inside the first bucket."""
        if _device_key(device) != "cpu":
            self.reader(device).warm()

    def contiguous(self, plan: Plan, b: int) -> bool:
        """True when bucket b is exactly one byte range of one safetensors file (no packing needed)."""
        items = plan.bucket_items[b]
        if not items or items[0]["file"] not in self.mapped:
            return False
        base = items[0]["file_offset"] - items[0]["offset"]
        return (sum(i["nbytes"] for i in items) == plan.buckets[b]["size"]
                and all(i["file"] == items[0]["file"] and i["file_offset"] - i["offset"] == base for i in items))

    def piece(self, it: dict[str, Any]) -> Any:
        if it["file"] in self.mapped:
            return self.mapped[it["file"]].tensor[it["file_offset"]:it["file_offset"] + it["nbytes"]]
        src = self.states[it["file"]].get(it["name"])
        if src is None:
            raise HwtuiError(f"tensor {it['name']!r} is missing from {it['file']} (the weight file changed since planning)")
        return src[it["tensor_offset"]:it["tensor_offset"] + it["nbytes"]]

    def stage(self, plan: Plan, b: int, pool: BufferPool | None, *, ahead: int = 0) -> tuple[Any, bool]:
        """(buffer holding bucket b, whether it came from the pool).

        With ``ahead`` > 0 the next ``ahead`` buckets that need a pooled copy are queued behind
        bucket b's read, each into a buffer the pool has spare (never one it would have to make
        beyond its count: the window's memory bound holds), so the reader's threads go from bucket
        to bucket without draining their ring; staging one of them later takes the buffer already
        filling. On an H200 the source path staged 64 MiB buckets at 11.6 GB/s bucket by bucket,
        where the same reader took the whole file at 39.5 (bench_gpu.py); measured again with this
        (round nine): 12.94 GB/s against 12.78 without, so the drain was not what bounds it."""
        # Read ahead of a bucket that is not next (staged out of order, skipped): its buffer goes
        # back to the pool first, so this bucket's acquire never finds the pool exhausted by it.
        for stale in [x for x in self._ahead if x != b and not b < x <= b + ahead]:
            self._drop(stale)
        view = self._zero_copy(plan, b, pool)
        if view is not None:
            self._read_ahead(plan, b, pool, ahead)
            return view, False
        assert pool is not None, "setup() allocates the pool when a bucket must be packed"
        queued = self._ahead.pop(b, None)
        if queued is not None:
            buf, fill = queued[:2]
        else:
            # A bucket with no read queued behind it, and none that can be (no spare buffer: a
            # replicate's window full of buckets in flight; no bucket after it to read ahead), is
            # cut into T shares, as the IPC source cuts its own: at the 16 MiB device floor a 32
            # MiB bucket would keep 2 of 16 threads busy (reader.DEVICE_MIN_SLICE).
            alone = not self._ahead and not (pool.spare(2) and any(self._can_read_ahead(plan, nb, pool)
                                                                   for nb in self._ahead_range(plan, b, ahead)))
            buf, fill = self._begin(plan, b, pool, min_slice=MIN_SLICE if alone else None)
        try:
            self._read_ahead(plan, b, pool, ahead)
            fill.wait()
        except BaseException:
            fill.settle()
            pool.release(buf)
            raise
        return buf, True

    def _read_ahead(self, plan: Plan, b: int, pool: BufferPool | None, ahead: int) -> None:
        if pool is None:
            return
        for nb in self._ahead_range(plan, b, ahead):
            if pool.spare() and self._can_read_ahead(plan, nb, pool):
                self._ahead[nb] = (*self._begin(plan, nb, pool), pool)

    @staticmethod
    def _ahead_range(plan: Plan, b: int, ahead: int) -> range:
        return range(b + 1, min(len(plan.buckets), b + 1 + ahead))

    def _can_read_ahead(self, plan: Plan, nb: int, pool: BufferPool) -> bool:
        """Whether bucket nb, not queued yet, would be read ahead into a pool buffer: it needs one
        (no zero-copy view), and holds no piece of a torch file (those are copied on this thread
        as the read is queued, which would only hold the bucket being staged back)."""
        return (nb not in self._ahead and self._zero_copy(plan, nb, pool) is None
                and all(it["file"] in self.mapped for it in plan.bucket_items[nb]))

    def _zero_copy(self, plan: Plan, b: int, pool: BufferPool | None) -> Any | None:
        """Bucket b as a slice of the mapping, where it goes out from host memory as it is."""
        return self.contiguous_view(plan, b) if pool is None or pool.device == "cpu" else None

    def _begin(self, plan: Plan, b: int, pool: BufferPool, *, min_slice: int | None = None) -> tuple[Any, BucketFill]:
        """A pooled buffer with bucket b's read queued into it."""
        buf = pool.acquire(plan.buckets[b]["size"])
        try:
            return buf, self.start_into(plan, b, buf, min_slice=min_slice)
        except BaseException:
            pool.release(buf)
            raise

    def drop_ahead(self) -> None:
        """Buckets read ahead and never staged (a transfer that stopped early): their reads settled,
        their buffers back in the pool."""
        for b in list(self._ahead):
            self._drop(b)

    def _drop(self, b: int) -> None:
        buf, fill, pool = self._ahead.pop(b)
        fill.settle()
        pool.release(buf)

    def contiguous_view(self, plan: Plan, b: int) -> Any | None:
        """Bucket b as a slice of the mapped file (no copy) when it is one byte range of it, else None."""
        if not self.contiguous(plan, b):
            return None
        it = plan.bucket_items[b][0]
        start = it["file_offset"] - it["offset"]
        return self.mapped[it["file"]].tensor[start:start + plan.buckets[b]["size"]]

    def copy_into(self, plan: Plan, b: int, dst: Any) -> None:
        """Bucket b's bytes (pieces and zero padding, as the planner laid them out) into ``dst``,
        read from the files by the parallel reader of ``dst``'s device: one bucket at a time, so
        cut into T shares (no read is queued behind it to keep the other threads busy)."""
        self.start_into(plan, b, dst, min_slice=MIN_SLICE).wait()

    def start_into(self, plan: Plan, b: int, dst: Any, *, min_slice: int | None = None) -> BucketFill:
        """:meth:`copy_into`, queued behind the reads already queued; ``wait()`` on the result.
        ``min_slice``: as ParallelReader.submit's."""
        return self.reader(dst.device).start(plan.bucket_items[b], plan.buckets[b]["size"], dst, self.piece,
                                             min_slice=min_slice)

    def release_readers(self) -> None:
        """The readers' pinned rings, threads and descriptors, released (the mapping stays)."""
        self.drop_ahead()
        for r in self._readers.values():
            r.close()
        self._readers.clear()
        for wf in self._opened.values():
            wf.close()
        self._opened.clear()

    def close(self) -> None:
        self.release_readers()
        for m in self.mapped.values():
            m.close()
        self.mapped.clear()

    def bucket_digest(self, plan: Plan, b: int) -> str:
        """xxh3 of bucket b as the files hold it now, streamed from host memory (no buffer, no device)."""
        h, pos = Streaming(), 0
        for it in plan.bucket_items[b]:
            h.pad(it["offset"] - pos)
            h.update(self.piece(it).numpy())
            pos = it["offset"] + it["nbytes"]
        h.pad(plan.buckets[b]["size"] - pos)
        return h.hexdigest()

