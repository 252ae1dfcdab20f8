"""The paths on which a receiver copies instead of receiving a broadcast (engine.replication.paths).

- same-host: the receiver maps the source's own file and copies each bucket from its page cache;
  the source sends nothing and only checks its files (``_serve_local``).
- host-copy and shm: a leader (or, on the shm path, the source) announces each bucket once it is
  in its staging copy; its followers copy that bucket from the leader's file and verify their copy.
"""

from __future__ import annotations

import mmap
import os
import time
from typing import Any

from hwtui.engine.replication.events import ReplSpan
from hwtui.engine.replication.plan import Plan
from hwtui.engine.replication.rank_base import now
from hwtui.engine.replication.rank_signals import TransportFailure
from hwtui.engine.replication.staging import MADV_POPULATE_WRITE
from hwtui.engine.replication.verify import RankVerify
from hwtui.engine.replication.weights import MappedFile, open_regular


def read_hashed(fd: int, offset: int, dest: Any, step: int = 1 << 20) -> str:
    """Read ``dest.size`` bytes of ``fd`` from ``offset`` into ``dest`` (a uint8 numpy array) and
    return the xxh3 of what landed, each slice hashed right after it is read, while it is still in
    the CPU cache. A file that ends early is an error (the leader's copy is its full size)."""
    import xxhash

    h = xxhash.xxh3_64()
    n = int(dest.size)
    pos = 0
    while pos < n:
        want = min(step, n - pos)
        got = os.preadv(fd, [memoryview(dest[pos:pos + want])], offset + pos)
        if got <= 0:
            raise OSError(f"the host leader's staging copy ended {n - pos} bytes early")
        h.update(dest[pos:pos + got])
        pos += got
    return f"{h.intdigest():016x}"


def populate_range(data: Any) -> bool:
    """Fault every page of a host tensor's mapping in, writable, in one call with the GIL released
    (``MADV_POPULATE_WRITE``, Linux >= 5.14); False where the kernel cannot (pages then fault in
    when first written, as before)."""
    import ctypes

    n = int(data.numel())
    if n == 0:
        return False
    page = mmap.PAGESIZE
    start = int(data.data_ptr())
    base = start - start % page  # madvise wants a page-aligned start; the page is the same mapping's
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return bool(libc.madvise(ctypes.c_void_p(base), n + start - base, MADV_POPULATE_WRITE) == 0)
    except (OSError, AttributeError):
        return False


class RankHostCopy(RankVerify):
    def _span(self, b: int, phase: str, seconds: float, end: float | None = None) -> None:
        """A timed step the bucket states do not show (events.SPAN_PHASES), ending now or at ``end`` (wall clock)."""
        self.emit(ReplSpan(rank=self.rank, bucket_id=b, phase=phase, seconds=round(seconds, 6),
                           t=time.time() if end is None else end))

    def _fault_in_leader_copy(self) -> float:
        """A host leader's /dev/shm staging copy gets its page-table entries before the start barrier.

        The network receives straight into that shared mapping. Left to fault in page by page
        inside ``recv`` -- each 4 KiB page a shared-memory write fault, competing with the
        network's own copies for the host's cores -- the leader received 1 GB in 3-4 s instead of
        0.6 s (docs/replication.md, "Same-host path"). One ``MADV_POPULATE_WRITE`` here (the pages
        are already allocated: the file was preallocated) maps them all at once, outside the
        transfer; seconds spent, for the rank's phases. Nothing is written: the transfer still
        writes, and verifies, every byte.
        """
        if self.shm_file is None or self.staging is None or self.staging.file is None:
            return 0.0
        t = now()
        populate_range(self.staging.data)
        return now() - t

    def _map_leader_copy(self) -> float:
        """A follower whose leader stages in shared memory maps that copy at set-up, read-only and
        populated; seconds spent (the rank's ``populate`` phase).

        Its leader made and faulted in that memory before it offered the file in the agreement
        (engine.replication.shared_prefault), so populating maps pages that exist: page-table work
        only, before the start barrier, instead of a ``preadv`` through the page cache per 4 KiB page
        inside the transfer (1 GB: 0.24 -> 0.12 CPU-s in the follower's transfer, bench below).
        The mapping is released after the vote (``remove_shm``): a 1 GB unmap is ~0.07 s that no
        transfer needs to wait for. Only into memory: a ``--out`` follower maps its leader's file
        inside the transfer as before (that copy may still be being made), and a leader that
        stages elsewhere (no shared memory) is read by ``preadv``.
        """
        leader = self.leader_of.get(self.rank)
        if leader is None or self.staging is None or self.staging.file is not None or self.leader_data_at.get(leader) != 0:
            return 0.0
        t = now()
        mapped = MappedFile(self.leader_files[leader], populate=True)
        if mapped.size < self.staging.data_bytes:
            mapped.close()
            raise TransportFailure(f"rank {self.rank}: its host leader's staging copy has {mapped.size} bytes, "
                                   f"fewer than the {self.staging.data_bytes} it must hold")
        self._leader_map = mapped
        return now() - t

    def _unmap_leader_copy(self) -> None:
        if self._leader_map is not None:
            self._leader_map.close()
            self._leader_map = None

    def _timed_digest(self, plan: Plan, b: int) -> str:
        """The source's digest of bucket b (in its hasher thread), timed for the timeline: the span
        is kept here and sent from the rank's own thread (:meth:`_send_hash_spans`)."""
        t = now()
        digest = self._sources.bucket_digest(plan, b)
        self.hash_spans[b] = (time.time(), now() - t)  # one dict store: atomic under the GIL
        return digest

    def _send_hash_spans(self) -> None:
        """The source's hashing, one "hash" span per bucket, once the digests are all in."""
        spans, self.hash_spans = self.hash_spans, {}
        for b, (end, seconds) in sorted(spans.items()):
            self._span(b, "hash", seconds, end)

    def _may_lead(self) -> bool:
        """Likely to lead its host (the lowest rank of a node leads it, engine.replication.paths), so
        worth staging in shared memory: a receiver of local rank 0 that may copy on its host."""
        return (self.rank != 0 and self.cfg.local_rank == 0 and self.cfg.same_host and self.settings.device == "cpu"
                and self.comm_device() == "cpu")

    def _serve_local(self, plan: Plan) -> None:
        """The source when every receiver copies from its page cache: nothing to send; it checks its files."""
        sizes = [bk["size"] for bk in plan.buckets]
        for b, size in enumerate(sizes):
            self.faults.at_bucket(b)
            # No "staged"/"inflight": the source sends nothing here, so its window (what the TUI's
            # lanes show, and the report's peak_occupancy) stays empty; "done" says it checked the bucket.
            if self.settings.verify:
                self.source_digests[b] = self._hasher().submit(self._timed_digest, plan, b)
            if self.published is not None:
                self._publish(plan, b)
            self.bucket(b, "done", size)

    def _copy_local(self, plan: Plan) -> None:
        """Same host as the source: copy each bucket from the source file's pages, verify it on this copy.

        The bytes never touch a socket: the receiver maps the very file the source holds (the
        agreement step proved it is the same file: device, inode, size, mtime), copies a bucket
        into its own staging copy and hashes *that* copy, so what it serves is what it verified.
        """
        reader = self._local_reader
        assert reader is not None, "setup() maps the source files for a same-host rank"
        try:
            for b, bk in enumerate(plan.buckets):
                size = bk["size"]
                self.faults.at_bucket(b)
                self.bucket(b, "inflight", size)
                t0 = now()
                region = self.direct.get(b)
                view = reader.contiguous_view(plan, b) if region is not None else None
                buf: Any
                digest = None
                if view is not None:
                    # Copied from the source's page cache into this rank's copy (pwrite into a
                    # staging file: no write fault per page) and hashed as it landed, slice by slice.
                    buf = region
                    digest = self.staging.write_hashed(self._direct_offset(b), view)
                else:
                    buf = region if region is not None else self._pooled().acquire(size)
                    reader.copy_into(plan, b, buf[:size])
                data = buf[:size]
                self.bucket(b, "verifying", size, now() - t0)
                t1 = now()
                if self.faults.corrupts(b):
                    data[size // 2] ^= 0xFF
                    digest = None  # hash this copy again, as it is now
                if not self.settings.verify:
                    ok = True
                elif digest is not None:
                    ok = self._verify_digest(plan, b, digest)
                else:
                    ok = self._verify_bucket(plan, b, data)
                if ok and region is None:
                    for it in plan.bucket_items[b]:
                        self.staging.write(it["name"], it["tensor_offset"], data[it["offset"]:it["offset"] + it["nbytes"]])
                if region is None:
                    self._pooled().release(buf)
                self.bucket(b, "done" if ok else "failed", size, now() - t1)
        finally:
            reader.close()

    def _publish(self, plan: Plan, b: int) -> None:
        """Source: bucket b into its /dev/shm staging copy, then tell the "shm" ranks they may copy it."""
        for it in plan.bucket_items[b]:
            self.published.write(it["name"], it["tensor_offset"], self._sources.piece(it))
        self._announce(b)

    def _announce(self, b: int) -> None:
        """Leader: bucket b is in its staging copy (verified); its followers may copy it now.

        One small broadcast per bucket in the host's group, so followers copy bucket b while the
        leader is still receiving the next ones (the host's copy pipelines behind the network).
        """
        import torch
        import torch.distributed as dist

        flag = torch.tensor([b], dtype=torch.int64)
        self.announcements.append(dist.broadcast(flag, self.rank, group=self.host_group, async_op=True))
        self._span(b, "announce", 0.0)

    def _release_followers(self) -> None:
        """The leader's announcements are delivered (bounded waits) before it moves on."""
        for work in self.announcements:
            self._wait(work, "bucket", "host copy hand-off")
        self.announcements.clear()

    def _copy_from_leader(self, plan: Plan) -> None:
        """Copy each bucket from the host leader's verified copy (or, on the "shm" path, the source's
        /dev/shm staging copy) once it is announced, and verify this rank's own copy of it.

        Into staging memory from a leader staging in shared memory: copied from the mapping made
        at set-up (``_map_leader_copy``), slice by slice, each slice hashed as it landed (one pass,
        memcpy speed, no page faults: the mapping was populated before the start barrier, and its
        unmap waits until after the vote). From any other leader into memory, the bytes are read
        from its file (``preadv``, the same one pass, through the kernel's page cache: 2x the CPU).
        Into a staging file (``--out``), through a mapping of it, by ``pwrite``, as before.
        """
        import torch
        import torch.distributed as dist

        leader = self.leader_of[self.rank]
        t = now()
        at = self.leader_data_at.get(leader)
        base = len(self.staging.header) if at is None else at  # shared staging memory has no header
        in_memory = self.staging.file is None
        mapped = self._leader_map  # mapped at set-up (_map_leader_copy), unmapped after the vote
        fd = -1 if mapped is not None else open_regular(self.leader_files[leader], "host leader's staging copy")[0]
        src = mapped
        try:
            if src is None and not in_memory:
                src = MappedFile(self.leader_files[leader], populate=False)
            self._span(-1, "map", now() - t)
            theirs = src.tensor[base:base + self.staging.data_bytes] if src is not None else None
            for _ in range(len(plan.buckets)):
                flag = torch.zeros(1, dtype=torch.int64)
                t = now()
                # The leader's first bucket waits on its own world start-up and the network.
                self._wait(dist.broadcast(flag, leader, group=self.host_group, async_op=True), "bucket",
                           f"host leader rank {leader}")
                b = int(flag.item())
                self._span(b, "wait", now() - t)
                size = plan.buckets[b]["size"]
                self.faults.at_bucket(b)
                self.bucket(b, "inflight", size)
                t0 = now()
                region = self.direct.get(b)
                digest = None
                if region is not None:
                    # Copied and hashed in one pass, slice by slice as this rank's copy holds it,
                    # as the same-host path does: not a second pass over the bucket.
                    off = self._direct_offset(b)
                    digest = (read_hashed(fd, base + off, region.numpy()) if theirs is None
                              else self.staging.write_hashed(off, theirs[off:off + size]))
                else:
                    for it in plan.bucket_items[b]:
                        off = self.staging.layout[it["name"]][0] + it["tensor_offset"]
                        if theirs is None:
                            read_hashed(fd, base + off, self.staging.data[off:off + it["nbytes"]].numpy())
                        else:
                            self.staging.write_at(off, theirs[off:off + it["nbytes"]])
                self.bucket(b, "verifying", size, now() - t0)
                t1 = now()
                if self.faults.corrupts(b) and region is not None:
                    region[size // 2] ^= 0xFF
                    digest = None  # hash this copy again, as it is now
                if digest is None and self.settings.verify:
                    digest = self._staged_digest(plan, b)
                ok = not self.settings.verify or self._verify_digest(plan, b, str(digest))
                self.bucket(b, "done" if ok else "failed", size, now() - t1)
        finally:
            if fd >= 0:
                os.close(fd)
            if src is not None and src is not mapped:
                src.close()

    def _direct_offset(self, b: int) -> int:
        """Where a bucket received in place starts in this rank's staging data."""
        return int(self.direct[b].data_ptr() - self.staging.data.data_ptr())

