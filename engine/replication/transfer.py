"""The network path: the source broadcasts each bucket, the receivers post their receives ahead.

Source (rank 0): for each bucket, take its bytes zero-copy from the memory-mapped file when the
bucket is one contiguous file range, else pack its pieces into a pooled buffer; broadcast it in
chunks as async collectives, hashing what it sends beside the send. Receivers post the broadcast
of up to ``window`` buckets into pooled buffers (or straight into the staging copy); when the
oldest completes, post the next receive that lands in place (so its connection does not idle while
this one is hashed), then verify its xxh3 against the plan, unpack it and recycle the buffer. At most
``window`` buckets are between "staged" and "done" (engine.replication.window).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hwtui.engine.replication.events import ReplWindow
from hwtui.engine.replication.host_copy import RankHostCopy
from hwtui.engine.replication.plan import Plan
from hwtui.engine.replication.rank_base import SRC, now
from hwtui.engine.replication.source_reader import collective_groups
from hwtui.engine.replication.staging import header_layout
from hwtui.engine.replication.window import Window


class RankTransfer(RankHostCopy):
    def _chunks(self, buf: Any) -> list[Any]:
        step = max(1, int(self.settings.chunk_bytes) or buf.numel())
        chunks = [buf[i:i + step] for i in range(0, buf.numel(), step)]
        self.collectives += len(chunks)
        return chunks

    def _window(self) -> Window:
        return Window(self.settings.window, max_bytes=self.settings.max_inflight_bytes,
                      adaptive=self.settings.adaptive and self.rank == SRC,
                      target_s=self.settings.target_bucket_s, max_limit=self.settings.window)

    def _groups(self, plan: Plan) -> list[list[int]]:
        # Only on host memory: the source sends zero-copy from the mapping and every receiver
        # receives straight into its staging copy, so a group needs no pooled buffer at all and the
        # pool bound (window x bucket) is untouched. Every rank derives the same groups from the plan.
        cpu = self.settings.device == "cpu" and self.comm_device() == "cpu"
        layout = header_layout(self.source_header) if self.source_header else None
        return collective_groups(plan, chunk_bytes=int(self.settings.chunk_bytes),
                                 max_group=max(1, self.settings.window // 2), enabled=cpu, layout=layout)

    def _send(self, plan: Plan) -> None:
        import torch.distributed as dist

        win, b = self._window(), 0
        inflight: deque[Any] = deque()
        groups = self._groups(plan)
        sizes = [bk["size"] for bk in plan.buckets]
        while b < len(groups) or inflight:
            while b < len(groups) and win.can_admit(sum(sizes[x] for x in groups[b]), count=len(groups[b])):
                group = groups[b]
                for x in group:
                    self.faults.at_bucket(x)
                t0 = now()
                if len(group) == 1:
                    # The next buckets' reads are queued behind this one's, each into a spare pool
                    # buffer (the window bounds them): the reader's threads never drain between
                    # buckets, and a bucket of fewer slices than threads leaves none idle
                    # (source_reader.stage, reader.DEVICE_MIN_SLICE).
                    buf, pooled = self._sources.stage(plan, group[0], self.pool, ahead=max(1, self.settings.window - 1))
                    total = sizes[group[0]]
                else:  # one contiguous range of the mapped file (see collective_groups)
                    it = plan.bucket_items[group[0]][0]
                    start, total = it["file_offset"] - it["offset"], sum(sizes[x] for x in group)
                    buf, pooled = self._sources.mapped[it["file"]].tensor[start:start + total], False
                staged = now() - t0
                for x in group:
                    self.bucket(x, "staged", sizes[x], staged)
                works = [dist.broadcast(c, SRC, group=self.net_group, async_op=True) for c in self._chunks(buf[:total])]
                t_post = now()
                if self.settings.verify:
                    # The source's check of what it sends runs beside the send, on the host copy
                    # (xxhash releases the GIL), instead of a second pass over the model afterwards.
                    for x in group:
                        self.source_digests[x] = self._hasher().submit(self._timed_digest, plan, x)
                for x in group:
                    win.admit(sizes[x])
                    self.bucket(x, "inflight", sizes[x])
                    if self.published is not None:
                        self._publish(plan, x)
                inflight.append((group, buf, pooled, works, t_post))
                self.emit(ReplWindow(occupancy=win.occupancy, window=win.limit, bytes_in_flight=win.bytes_in_flight))
                b += 1
            group, buf, pooled, works, t0 = inflight.popleft()
            for w in works:
                self._wait(w, "bucket", f"broadcast of bucket {group[0]}" if len(group) == 1
                           else f"broadcast of buckets {group[0]}-{group[-1]}")
            dt = now() - t0
            if pooled:
                self._pooled().release(buf)
            for x in group:
                win.retire(sizes[x], dt)
                self.bucket(x, "done", sizes[x], dt)
            self.emit(ReplWindow(occupancy=win.occupancy, window=win.limit, bytes_in_flight=win.bytes_in_flight))
        self.window_stats = {"peak_occupancy": win.peak_occupancy, "peak_bytes": win.peak_bytes,
                             "final_limit": win.limit, "changes": win.changes}

    def _receive(self, plan: Plan) -> None:
        import torch.distributed as dist

        win, b = self._window(), 0
        inflight: deque[Any] = deque()
        groups = self._groups(plan)
        sizes = [bk["size"] for bk in plan.buckets]
        verify = self.settings.verify

        def post(in_place_only: bool) -> None:
            nonlocal b
            while b < len(groups) and win.can_admit(sum(sizes[x] for x in groups[b]), count=len(groups[b])):
                group = groups[b]
                if in_place_only and len(group) == 1 and group[0] not in self.direct:
                    return  # a pooled buffer: the one just received is still being verified
                for x in group:
                    self.faults.at_bucket(x)
                total = sum(sizes[x] for x in group)
                if len(group) == 1:
                    buf = self.direct.get(group[0])
                    if buf is None:
                        buf = self._pooled().acquire(total)
                else:
                    buf = self._group_region(group, total)
                works = [dist.broadcast(c, SRC, group=self.net_group, async_op=True) for c in self._chunks(buf[:total])]
                t_post = now()
                for x in group:
                    win.admit(sizes[x])
                    self.bucket(x, "inflight", sizes[x])
                inflight.append((group, buf, works, t_post))
                b += 1

        while b < len(groups) or inflight:
            post(in_place_only=False)
            group, buf, works, t0 = inflight.popleft()
            for w in works:
                self._wait(w, "bucket", f"broadcast of bucket {group[0]}" if len(group) == 1
                           else f"broadcast of buckets {group[0]}-{group[-1]}")
            arrived = now() - t0  # every bucket of the group arrived together (the timeline reads it)
            for ob in group:
                self.bucket(ob, "verifying", sizes[ob], arrived)
                win.retire(sizes[ob], arrived)
            # The next receive is posted before this group is verified, not after: with N streams
            # (engine.replication.net_streams) the connection this group came on would otherwise
            # idle for the hashing. Only into the staging copy in place: a pooled buffer waits for
            # the one being verified to come back (the pool holds window buffers).
            post(in_place_only=True)
            pos = 0
            for ob in group:
                # Every bucket of a group is verified on its own, in place, before it counts as done.
                size = sizes[ob]
                t1 = now()
                data = buf[pos:pos + size]
                pos += size
                if self.faults.corrupts(ob):
                    data[size // 2] ^= 0xFF
                ok = not verify or self._verify_bucket(plan, ob, data)
                if ok and ob not in self.direct:
                    for it in plan.bucket_items[ob]:
                        self.staging.write(it["name"], it["tensor_offset"], data[it["offset"]:it["offset"] + it["nbytes"]])
                elif ok:
                    # Received in place through the mapping: its write-out to disk starts now, behind
                    # the transfer (staging.Staging.landed), so the fsync before the vote finds it done.
                    self.staging.landed(self._direct_offset(ob), size)
                self.bucket(ob, "done" if ok else "failed", size, now() - t1)
                if self.host_group is not None:
                    self._announce(ob)
            if len(group) == 1 and group[0] not in self.direct:
                self._pooled().release(buf)
        self.window_stats = {"peak_occupancy": win.peak_occupancy, "peak_bytes": win.peak_bytes,
                             "final_limit": win.limit, "changes": win.changes}

    def _group_region(self, group: list[int], total: int) -> Any:
        """The staging bytes a group of buckets lands in: their direct regions, back to back."""
        first = self.direct.get(group[0])
        if first is None:
            raise RuntimeError(f"rank {self.rank}: bucket {group[0]} was grouped but is not received in place")
        base = first.data_ptr()
        pos = 0
        for x in group:
            region = self.direct.get(x)
            if region is None or region.data_ptr() != base + pos:
                raise RuntimeError(f"rank {self.rank}: grouped bucket {x} is not contiguous in the staging copy")
            pos += region.numel()
        whole = self.staging.data
        start = base - whole.data_ptr()
        return whole[start:start + total]

