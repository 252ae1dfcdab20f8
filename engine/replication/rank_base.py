"""What every part of a replication rank shares: its settings, its state and its plumbing.

A rank is one :class:`~hwtui.engine.replication.worker.Worker`, assembled from one class per
concern that each read and write the state declared here (``world`` forms the process group and
chooses each receiver's path, ``transfer`` and ``host_copy`` move the bytes, ``verify`` checks
them, ``vote`` runs the unanimous vote and the two-phase commit). This module holds that state
(with what each field means) and what they all use: events out, bounded waits, the pools.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hwtui.core.events import Event
from hwtui.engine.replication.commit import ServedDir
from hwtui.engine.replication.config import WorkerConfig
from hwtui.engine.replication.events import ReplBucket
from hwtui.engine.replication.faults import Injector
from hwtui.engine.replication.pool import BufferPool
from hwtui.engine.replication.rank_signals import TransportFailure
from hwtui.engine.replication.shared_prefault import SharedPrefaulted
from hwtui.engine.replication.shm import RunDir
from hwtui.engine.replication.source_reader import SourceReader
from hwtui.engine.replication.staging import Prefaulted, PrefaultedFile

SRC = 0

Emit = Callable[[dict[str, Any]], None]


def now() -> float:
    return time.perf_counter()


def rss() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def hash_threads(cores: int | None = None) -> int:
    """Threads hashing the source's buckets beside the send (its check that the files did not
    change since planning; xxhash releases the GIL, and buckets are independent): one per four
    cores, 1..4. Why more than one: on an H200 host a push's 1 GiB went out in 0.12 s by IPC, and
    one thread's hashing finished 0.08 s after it, inside the source's prepare (the vote waits
    for it). A small host keeps one, beside its reader and its transport."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cores // 4))


class RankBase:
    # The source's reader of the weight files, made by Worker.setup on rank 0 only.
    _sources: SourceReader

    def __init__(self, cfg: WorkerConfig, emit: Emit):
        self.cfg = cfg
        self.settings = cfg.settings  # window, chunk, verify, device: the same on every rank (agree.py)
        self.rank = cfg.rank
        self.world = cfg.world_size
        self._emit = emit
        self.choice = cfg.transport
        self.faults = Injector(self.rank, cfg.fault)
        self.plan_version: str | None = None  # known once the plan is loaded
        self.source_header: bytes | None = None
        self.source_digests: dict[int, Future[str]] = {}
        self.hash_spans: dict[int, tuple[float, float]] = {}  # bucket -> (end, seconds) of the source's hashing of it
        self._hash_pool: ThreadPoolExecutor | None = None
        self._world_thread: threading.Thread | None = None
        self.paths: dict[int, tuple[str, str]] = {}  # rank -> (source | same-host | network, why)
        self.net_ranks: list[int] = list(range(cfg.world_size))
        self.net_group: Any = None  # None: the whole world
        self.host_group: Any = None  # a host leader and the ranks that copy from it
        self.leader_of: dict[int, int] = {}  # host-copy rank -> its host leader
        self.leader_files: dict[int, str] = {}  # host leader -> the staging file its followers map
        self.shm_file: str | None = None  # a leader's /dev/shm staging file, removed at the end
        self.run_dir: RunDir | None = None  # the private /dev/shm directory it lives in (engine.replication.shm)
        self.published: Any = None  # the source's /dev/shm staging copy for its "shm" path ranks
        self.announcements: list[Any] = []
        self._local_reader: SourceReader | None = None  # a leader's pending "bucket ready" broadcasts
        self._world_error: BaseException | None = None
        self._world_seconds = 0.0
        self.keep_staging = False  # voted yes with --commit: the decision record, not this rank, decides
        self.switched = False
        self.phases: dict[str, float] = {}
        self.failures: list[str] = []
        self.bad_input = False
        self.pool: BufferPool | None = None
        self.host_pool: BufferPool | None = None
        self.staging: Any = None
        self.served: ServedDir | None = None
        self.window_stats: dict[str, int] = {}
        self.transfer_cpu: dict[str, float | int] | None = None  # CPU during the transfer (engine.replication.timeline)
        self.rss_base = 0
        self.direct: dict[int, Any] = {}
        self.collectives = 0  # broadcasts issued for buckets (chunks), reported for the record
        self.net_streams = 0  # TCP streams per peer in the network group (0: not in it; engine.replication.net_streams)
        # Seams for a resident rank (engine.resident.resident_child), both off for `hwtui replicate`:
        # reuse_world: the process group already exists (a warm push): init() only agrees the
        # settings and the plan digest again; staging_factory: what builds a receiver's staging copy.
        self.reuse_world = False
        self.staging_factory: Callable[..., Any] | None = None
        self._prefault: Prefaulted | None = None
        self._shared: SharedPrefaulted | None = None  # the same, in shared memory, for a rank likely to lead its host
        self.shared_staging = False  # this rank staged in that shared memory (reported)
        self.leader_data_at: dict[int, int | None] = {}  # host leader -> where data starts in its file (None: after the header)
        self._prefault_file: PrefaultedFile | None = None  # a receiver's --out staging file, made while the world forms
        self._leader_map: Any = None  # a follower's read-only mapping of its leader's shared memory (host_copy)

    # ------------------------------------------------------------------ plumbing

    def _hasher(self) -> ThreadPoolExecutor:
        if self._hash_pool is None:
            self._hash_pool = ThreadPoolExecutor(max_workers=hash_threads(), thread_name_prefix="source-hash")
        return self._hash_pool

    def _pooled(self) -> BufferPool:
        assert self.pool is not None, "setup() allocates the pool whenever a bucket needs it"
        return self.pool

    def _host_pooled(self) -> BufferPool:
        assert self.host_pool is not None, "setup() allocates the host pool for device-side verification"
        return self.host_pool

    def emit(self, ev: Event) -> None:
        self._emit(ev.to_dict())

    def internal(self, what: str, **data: Any) -> None:
        self._emit({"kind": "_rank", "rank": self.rank, "what": what, "t": time.time(), **data})

    def bucket(self, b: int, state: str, nbytes: int, seconds: float = 0.0) -> None:
        self.emit(ReplBucket(bucket_id=b, state=state, nbytes=nbytes, seconds=round(seconds, 6), rank=self.rank))

    def _timeout(self, key: str) -> datetime.timedelta:
        return datetime.timedelta(seconds=float(getattr(self.cfg.timeouts, key)))

    def _wait(self, work: Any, key: str, what: str) -> None:
        try:
            work.wait(timeout=self._timeout(key))
        except Exception as exc:  # noqa: BLE001 - gloo/NCCL raise RuntimeError subclasses
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            kind = "timed out" if "timed out" in msg.lower() or "timeout" in msg.lower() else "failed"
            raise TransportFailure(f"rank {self.rank}: {what} {kind} after waiting up to "
                                   f"{getattr(self.cfg.timeouts, key):g} s ({msg})") from None


    def comm_device(self) -> str:
        return self.choice.comm_device

    def phase(self, name: str) -> None:
        """This rank reached a start-up phase (events.RANK_PHASES); the launcher counts them per phase."""
        self.internal("phase", phase=name)

