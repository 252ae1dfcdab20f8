"""The plan read as byte ranges: the source's zero-copy view of the weight files, and the order and
grouping of the buckets on the wire (the same answer on every rank: it reads only the plan)."""

from __future__ import annotations

from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.checksum import Streaming
from hwtui.engine.replication.plan import Plan
from hwtui.engine.replication.pool import BufferPool
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


class SourceReader:
    """The source's zero-copy view of the weight files."""

    def __init__(self, plan: Plan):
        self.mapped: dict[int, MappedFile] = {}
        self.states: dict[int, dict[str, Any]] = {}
        for idx, f in enumerate(plan["files"]):
            if f["format"] == "safetensors":
                self.mapped[idx] = MappedFile(f["path"])
            else:
                self.states[idx] = {k: tensor_bytes(v) for k, v in load_torch_state(f["path"]).items()}

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

    def stage(self, plan: Plan, b: int, pool: BufferPool | None) -> tuple[Any, bool]:
        """(buffer holding bucket b, whether it came from the pool)."""
        size = plan.buckets[b]["size"]
        if self.contiguous(plan, b):
            it = plan.bucket_items[b][0]
            start = it["file_offset"] - it["offset"]
            view = self.mapped[it["file"]].tensor[start:start + size]
            if pool is None or pool.device == "cpu":
                return view, False  # zero-copy: broadcast straight from the mapping
            buf = pool.acquire(size)
            buf[:size].copy_(view)  # one host-to-device copy per bucket
            return buf, True
        assert pool is not None, "setup() allocates the pool when a bucket must be packed"
        buf = pool.acquire(size)
        pos = 0
        for it in plan.bucket_items[b]:
            if it["offset"] > pos:
                buf[pos:it["offset"]].zero_()  # alignment padding is hashed as zeros by the planner
            buf[it["offset"]:it["offset"] + it["nbytes"]].copy_(self.piece(it))
            pos = it["offset"] + it["nbytes"]
        if pos < size:
            buf[pos:size].zero_()
        return buf, True

    def contiguous_view(self, plan: Plan, b: int) -> Any | None:
        """Bucket b as a slice of the mapped file (no copy) when it is one byte range of it, else None."""
        if not self.contiguous(plan, b):
            return None
        it = plan.bucket_items[b][0]
        start = it["file_offset"] - it["offset"]
        return self.mapped[it["file"]].tensor[start:start + plan.buckets[b]["size"]]

    def copy_into(self, plan: Plan, b: int, dst: Any) -> None:
        """Bucket b's bytes (pieces and zero padding, as the planner laid them out) into ``dst``."""
        size = plan.buckets[b]["size"]
        if self.contiguous(plan, b):
            it = plan.bucket_items[b][0]
            start = it["file_offset"] - it["offset"]
            dst[:size].copy_(self.mapped[it["file"]].tensor[start:start + size])
            return
        pos = 0
        for it in plan.bucket_items[b]:
            if it["offset"] > pos:
                dst[pos:it["offset"]].zero_()
            dst[it["offset"]:it["offset"] + it["nbytes"]].copy_(self.piece(it))
            pos = it["offset"] + it["nbytes"]
        if pos < size:
            dst[pos:size].zero_()

    def close(self) -> None:
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

