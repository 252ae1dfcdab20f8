"""The ipc path of a replicate rank (engine.replication.paths): receivers on the source's node take
each bucket by IPC handle (engine.replication.ipc_protocol) instead of a broadcast.

Source: each bucket goes from its files (the parallel reader, the next bucket's read queued into
its slot behind this one's) into a window slot of device memory, which it exports; its xxh3
against the plan is checked on the host beside it, as on the network path (``_check_sources``),
so the device digest the receivers compare with is a digest of planned bytes.
Receivers: the copy lands in the staging copy's own region when the bucket is one contiguous range
of it, else in a scratch buffer that is unpacked into it; a device-checksum mismatch names the
bucket on this rank and the rank votes no.

The memory is CUDA IPC's on ``--device cuda``. ``HWTUI_TEST_IPC=host`` (tests only, like
``HWTUI_TEST_FAULT``) runs the same path on host memory with the memfd stand-in, so the whole
replicate run over this path is tested on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from typing import Any

from hwtui.core.events import ErrorEvent
from hwtui.engine.replication.ipc_protocol import Channel, IpcFailure, IpcReceiver, IpcSource, Received
from hwtui.engine.replication.ipc_provider import CudaIpc, HostStandIn
from hwtui.engine.replication.plan import Plan
from hwtui.engine.replication.rank_base import now
from hwtui.engine.replication.rank_signals import TransportFailure
from hwtui.engine.replication.reader import MIN_SLICE
from hwtui.engine.replication.verify import RankVerify

TEST_ENV = "HWTUI_TEST_IPC"


def ipc_wanted(transport: str, device: str, env: dict[str, str] | None = None) -> bool:
    """Whether receivers on the source's node take the ipc path."""
    env = env if env is not None else dict(os.environ)
    return transport == "cuda-ipc" or (device == "cpu" and env.get(TEST_ENV) == "host")


class RankIpc(RankVerify):
    def _ipc_ranks(self) -> list[int]:
        return [r for r, (path, _) in sorted(self.paths.items()) if path == "ipc"]

    def _ipc_read_floor(self) -> int | None:
        """The floor of every read of a source whose only receivers take the ipc path: each bucket
        is cut into T shares (``_send_ipc``), so its reader's pinned ring needs no larger slices.
        None where the source also sends over the network (those reads keep the device floor)."""
        return MIN_SLICE if self._ipc_ranks() and len(self.net_ranks) <= 1 else None

    def _ipc_run(self, plan: Plan) -> str:
        # The same on every rank of this world, different for the next (a new port each run).
        seed = f"{plan['version']}|{self.cfg.master_addr}|{self.cfg.master_port}|{self.cfg.plan_digest}"
        return hashlib.sha256(seed.encode()).hexdigest()[:32]

    def _ipc_channel(self, plan: Plan) -> Channel:
        import torch.distributed as dist

        store = dist.distributed_c10d._get_default_store()
        return Channel(store, self._ipc_run(plan), float(self.cfg.timeouts.bucket))

    def _ipc_gpu(self) -> int | None:
        """This rank's GPU on the ipc path (made current), or None on the host stand-in."""
        if self.settings.device != "cuda":
            return None
        import torch

        dev = self.cfg.local_rank % max(1, torch.cuda.device_count())
        torch.cuda.set_device(dev)
        return dev

    def _ipc_provider(self, plan: Plan) -> Any:
        dev = self._ipc_gpu()
        return CudaIpc(dev) if dev is not None else HostStandIn(self._ipc_run(plan))

    def _ipc_warm(self) -> None:
        """Set-up, on a rank of the ipc path: the device checksum's kernels loaded before the clock
        (the source digests each bucket it exports, a receiver each copy)."""
        from hwtui.engine.replication.device_checksum import warm

        dev = self._ipc_gpu()
        warm(f"cuda:{dev}" if dev is not None else "cpu")

    def _send_ipc(self, plan: Plan) -> None:
        sizes = [bk["size"] for bk in plan.buckets]
        ch = self._ipc_channel(plan)
        src = IpcSource(ch, self._ipc_provider(plan), self._ipc_ranks(), max(1, self.settings.window),
                        capacity=max(sizes, default=0))
        # Each bucket is cut into T shares (MIN_SLICE floor, not the reader's 16 MiB device floor):
        # this path reads one bucket ahead only, and a 32 MiB bucket in two 16 MiB slices left most
        # threads idle. H200, `hwtui replicate --device cuda --nproc 2` of 1 GiB (tests/gpu): transfer
        # 0.277 s with T shares (round sixteen), 0.60 s with the floor, 1.13 s with the floor and
        # three buckets read ahead (round seventeen, one run each).
        # Bucket b+1's read is queued into its slot behind bucket b's (two slots or more): the
        # reader's threads go from bucket to bucket without draining (source_reader.stage does
        # the same on the network path). Only into a slot the receivers have already released:
        # waiting for one here, before bucket b is published, would export one bucket fewer.
        ahead: tuple[int, Any, Any] | None = None
        try:
            with _failures_abort(ch, self.rank):
                for b, size in enumerate(sizes):
                    self.faults.at_bucket(b)
                    t0 = now()
                    if ahead is not None and ahead[0] == b:
                        _, slot, fill = ahead
                        ahead = None
                    else:
                        slot = src.acquire(b, size)
                        fill = self._sources.start_into(plan, b, slot, min_slice=MIN_SLICE)
                    if src.window >= 2 and b + 1 < len(sizes) and src.free_now(b + 1):
                        try:
                            nxt = src.acquire(b + 1, sizes[b + 1])
                            ahead = (b + 1, nxt, self._sources.start_into(plan, b + 1, nxt, min_slice=MIN_SLICE))
                        except BaseException:
                            fill.settle()
                            raise
                    fill.wait()  # every read of the bucket settled, even when one failed
                    if self.settings.verify:
                        self.source_digests[b] = self._hasher().submit(self._sources.bucket_digest, plan, b)
                    self.bucket(b, "staged", size, now() - t0)
                    src.publish(b, size)
                    self.bucket(b, "inflight", size)
                src.drain()
                for b, size in enumerate(sizes):
                    self.bucket(b, "done", size)
        finally:
            if ahead is not None:
                ahead[2].settle()  # no reader thread is left copying into a slot about to be freed
            src.close()
            self.window_stats = {"peak_occupancy": src.stats.peak_exported, "peak_bytes": 0,
                                 "final_limit": src.window, "changes": 0}

    def _receive_ipc(self, plan: Plan) -> None:
        import torch

        sizes = [bk["size"] for bk in plan.buckets]
        corrupt = {b for b in range(len(sizes)) if self.faults.corrupts(b)}

        def hook(phase: str, b: int, dst: Any) -> None:
            if phase == "copied" and b in corrupt and dst.numel():
                dst[dst.numel() // 2] ^= 0xFF

        ch = self._ipc_channel(plan)
        rx = IpcReceiver(ch, self._ipc_provider(plan), self.rank, max(1, self.settings.window), hook=hook)
        scratch: Any = None
        started: dict[int, Any] = {}  # bucket -> where it was copied to, until it is settled

        def settled(results: list[Received]) -> None:
            for got in results:
                b, size = got.bucket, sizes[got.bucket]
                dst = started.pop(b)
                self.bucket(b, "verifying", size, got.copy_s)
                t1 = now()
                ok = got.ok or not self.settings.verify
                if not ok:
                    self.failures.append(got.error)
                    self.emit(ErrorEvent(message=got.error, rank=self.rank, where="verify"))
                elif b not in self.direct:
                    for it in plan.bucket_items[b]:
                        self.staging.write(it["name"], it["tensor_offset"], dst[it["offset"]:it["offset"] + it["nbytes"]])
                self.bucket(b, "done" if ok else "failed", size, now() - t1)

        try:
            with _failures_abort(ch, self.rank):
                for b, size in enumerate(sizes):
                    self.faults.at_bucket(b)
                    self.bucket(b, "inflight", size)
                    region = self.direct.get(b)
                    if region is None:
                        if scratch is None or scratch.numel() < size:
                            scratch = torch.empty(max(sizes), dtype=torch.uint8, device=self.settings.device)
                        dst = scratch[:size]
                    else:
                        dst = region[:size]  # the bucket's own place: later buckets overlap it
                    started[b] = dst
                    settled(rx.submit(b, dst))
                    if region is None:  # one scratch buffer: settled (and written out) before it is reused
                        settled(rx.settle(block=True))
                settled(rx.settle(block=True))
        finally:
            rx.close()
            # How far this receiver's buckets overlapped (started, not yet acked): on a GPU up to
            # window where buckets have their own place; 1 where each was settled at once.
            self.window_stats = {"peak_occupancy": rx.peak_started, "peak_bytes": 0, "final_limit": rx.depth,
                                 "changes": 0}


@contextlib.contextmanager
def _failures_abort(ch: Channel, rank: int) -> Iterator[None]:
    """Any failure of a rank on the ipc path aborts the channel with its reason, so its peers stop
    waiting for exports or acks that will not come, and say why, instead of waiting out the bucket
    timeout or meeting a store that went away: the protocol's own (IpcFailure, raised on as the
    rank's TransportFailure) and any other (a read error, a full disk, a signal), raised as it is."""
    try:
        yield
    except IpcFailure as exc:
        why = _ranked(rank, str(exc))
        ch.abort(why)
        raise TransportFailure(why) from None
    except BaseException as exc:
        ch.abort(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise


def _ranked(rank: int, text: str) -> str:
    """``text`` naming ``rank`` once (a receiver's own failures already start with its rank)."""
    return text if text.startswith(f"rank {rank}: ") else f"rank {rank}: {text}"
