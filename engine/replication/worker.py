"""Per-rank replication logic, run in a fresh interpreter per rank (or in-process under torchrun).

Source (rank 0): for each bucket, take its bytes zero-copy from the memory-mapped file when the
bucket is one contiguous file range, else pack its pieces into a pooled buffer; hash it (a
mismatch with the plan means the file changed since planning); broadcast it in chunks as async
collectives. At most ``window`` buckets are between "staged" and "done".

Receivers: post the broadcast of up to ``window`` buckets into pooled buffers ahead of time; when
the oldest completes, verify its xxh3 against the plan (naming the bucket on a mismatch), unpack
its pieces into the staging copy and recycle the buffer. A checksum failure does not stop the
collective schedule (the other ranks would only see a timeout): the rank finishes the schedule and
votes no, so every rank aborts together with the real reason.

Every wait has a timeout. Events go out as JSON lines through ``emit``; internal ``_rank``
messages (ready, transfer times, votes, results) let the launcher build the world view.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import resource
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.core.events import ErrorEvent, Event, LogEvent
from hwtui.core.supervisor import AnswerPipe
from hwtui.engine.replication.agree import (
    decode_slot,
    encode_slot,
    first_difference,
    host_facts,
    hwtui_version,
    same_host_reason,
    settings_record,
)
from hwtui.engine.replication.checksum import Streaming, xxh3_hex
from hwtui.engine.replication.commit import ServedDir, write_decision
from hwtui.engine.replication.config import WorkerConfig
from hwtui.engine.replication.events import ReplBucket, ReplWindow
from hwtui.engine.replication.faults import Injector
from hwtui.engine.replication.plan import Plan, load_plan, manifest_of, preflight_sources
from hwtui.engine.replication.pool import BufferPool
from hwtui.engine.replication.served_files import serve_modes
from hwtui.engine.replication.shm import RunDir, make_run_dir, sweep_dead_run_dirs
from hwtui.engine.replication.staging import (
    Prefaulted,
    Staging,
    check_header_matches,
    faithful_eligible,
    header_layout,
    source_header,
)
from hwtui.engine.replication.transport import prepare_backend
from hwtui.engine.replication.weights import MappedFile, load_torch_state, tensor_bytes
from hwtui.engine.replication.window import Window

SRC = 0
# Worker exit codes: the launcher tells a clean "voted and aborted" from a rank that fell over.
EXIT_OK, EXIT_ABORTED, EXIT_BAD_INPUT, EXIT_BROKEN, EXIT_INTERRUPTED = 0, 1, 2, 3, 4

Emit = Callable[[dict[str, Any]], None]


class Interrupted(Exception):
    pass


class TransportFailure(Exception):
    pass


class SignalGate:
    """Defers SIGTERM/SIGINT over a section that must not be cut in half (the vote and the switch).

    pthread_sigmask cannot do this: it blocks the signal for one thread only, and the kernel
    hands a process-directed signal to any of gloo's threads instead. Python runs handlers in the
    main thread, so the handler asks the gate: inside a held section it records the signal, and
    the section raises :class:`Interrupted` when it ends.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None

    def deliver(self, signum: int) -> None:
        if self.depth:
            self.pending = self.pending or signum
            return
        raise Interrupted(f"stopped by {signal.Signals(signum).name}")

    @contextlib.contextmanager
    def held(self, hold: bool = True) -> Iterator[None]:
        if not hold:
            yield
            return
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if self.depth == 0 and self.pending is not None:
            signum, self.pending = self.pending, None
            raise Interrupted(f"stopped by {signal.Signals(signum).name} (after this rank's commit step)")


GATE = SignalGate()


def _now() -> float:
    return time.perf_counter()


class Worker:
    def __init__(self, cfg: WorkerConfig, emit: Emit):
        self.cfg = cfg
        self.rank = cfg.rank
        self.world = cfg.world_size
        self._emit = emit
        self.choice = cfg.transport
        self.faults = Injector(self.rank, cfg.fault)
        self.plan_version: str | None = None  # known once the plan is loaded
        self.source_header: bytes | None = None
        self.source_digests: dict[int, Future[str]] = {}
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
        self._local_reader: _SourceReader | None = None  # a leader's pending "bucket ready" broadcasts
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
        self.rss_base = 0
        self.direct: dict[int, Any] = {}
        self.collectives = 0  # broadcasts issued for buckets (chunks), reported for the record
        # Seams for a resident rank (engine.resident.resident_child), both off for `hwtui replicate`:
        # reuse_world: the process group already exists (a warm push): init() only agrees the
        # settings and the plan digest again; staging_factory: what builds a receiver's staging copy.
        self.reuse_world = False
        self.staging_factory: Callable[..., Any] | None = None
        self._prefault: Prefaulted | None = None

    # ------------------------------------------------------------------ plumbing

    def _hasher(self) -> ThreadPoolExecutor:
        if self._hash_pool is None:
            self._hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="source-hash")
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

    # ------------------------------------------------------------------ phases

    def phase(self, name: str) -> None:
        """This rank reached a start-up phase (events.RANK_PHASES); the launcher counts them per phase."""
        self.internal("phase", phase=name)

    def load(self) -> Plan:
        t = _now()
        self.phase("started")
        # Validated once, by the coordinator that built this config (it passes the digest of what it
        # validated): this rank checks the digest and maps the tables, nothing more. The digest is
        # checked before anything is staged, so a rank handed another plan refuses it before any
        # byte moves (and _agree compares every rank's digest with rank 0's again).
        digest = self.cfg.plan_digest
        plan = load_plan(self.cfg.plan, validate=digest is None, expect_digest=digest)
        if self.rank == SRC:
            preflight_sources(plan)
        elif self.cfg.out and self.cfg.commit:
            self.served = ServedDir(self.cfg.out, self.rank, serve_modes(self.cfg.serve_group), self.faults.at_phase)
            have = self.served.current_version()
            if plan["prev_version"] is not None and have != plan["prev_version"]:
                raise HwtuiError(f"rank {self.rank} serves version {have!r} but the plan is a delta from "
                                 f"{plan['prev_version']!r}; replan against {have!r} or push in full")
            try:
                self.faults.at_phase("load")
                self.served.begin(plan["version"])
            except OSError as exc:
                raise HwtuiError(f"rank {self.rank} cannot stage {plan['version']!r} under {self.served.root}: "
                                 f"{exc.strerror or exc}") from None
        elif plan["prev_version"] is not None:
            raise HwtuiError("a delta plan needs --commit --out DIR holding the previous version on every receiver")
        self.plan_version = plan["version"]
        self.phases["load"] = _now() - t
        self.phase("plan loaded")
        if self.rank != SRC and self.cfg.device == "cpu" and not (self.cfg.out and self.cfg.commit) \
                and self.staging_factory is None:
            # Host staging without a file: fault it in while the world forms (see staging.Prefaulted).
            # An upper bound of its size: the layout comes with the source's header, after the world.
            # After the phase report: starting a thread waits for the GIL, which `import torch` in
            # the world's thread may hold for a while (dlopen).
            bound = plan["files"][0]["size"] if faithful_eligible(plan) else sum(t["nbytes"] for t in plan["tensors"])
            self._prefault = Prefaulted(int(bound))
        return plan

    def start_world(self) -> None:
        """Import torch and form the process group in a thread, while the main thread loads the plan.

        Neither needs the other: the world needs only rank, size and address, and most of its time
        is spent waiting for the slowest peer's interpreter. The thread is a daemon so a rank that
        fails on its plan exits without waiting for the rendezvous.
        """
        def form() -> None:
            t = _now()
            try:
                import torch.distributed as dist

                prepare_backend(self.choice, self.cfg.local_rank)
                init_method = f"tcp://{self.cfg.master_addr}:{self.cfg.master_port}"
                dist.init_process_group(self.choice.backend, init_method=init_method, rank=self.rank,
                                        world_size=self.world, timeout=self._timeout("init"))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread by init()
                self._world_error = exc
            self._world_seconds = _now() - t

        self._world_thread = threading.Thread(target=form, name="form-world", daemon=True)
        self._world_thread.start()

    def init(self, plan: Plan) -> None:
        t = _now()
        if self.reuse_world:
            self.internal("init", seconds=0.0, warm=True)
        else:
            self._join_world()
        self.phase("world joined")
        self._agree(plan)
        self.source_header = self._exchange_header(plan)
        self.phases["init"] = _now() - t

    def _join_world(self) -> None:
        if self._world_thread is None:
            self.start_world()
        assert self._world_thread is not None
        # Bounded: init_process_group itself gives up after the init timeout.
        self._world_thread.join(float(self.cfg.timeouts.init) + 60.0)
        if self._world_thread.is_alive():
            raise TransportFailure(f"rank {self.rank}: forming the world did not finish within "
                                   f"{self.cfg.timeouts.init:g} s")
        if self._world_error is not None:
            exc = self._world_error
            if isinstance(exc, (HwtuiError, Interrupted)):
                raise exc
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TransportFailure(f"rank {self.rank}: forming the world failed ({msg})")
        self.internal("init", seconds=self._world_seconds)

    def _agree(self, plan: Plan) -> None:
        """Every rank's effective settings against rank 0's, before any byte moves (see agree.py)."""
        import torch
        import torch.distributed as dist

        record = settings_record(hwtui=hwtui_version(), torch=torch.__version__.split("+")[0], plan_digest=plan.digest,
                                 bucket_bytes=plan["bucket_bytes"], window=self.cfg.inflight,
                                 chunk_bytes=self.cfg.chunk_bytes, max_inflight_bytes=self.cfg.max_inflight_bytes,
                                 verify=self.cfg.verify, commit=self.cfg.commit, transport=self.choice.name)
        record["host"] = host_facts([f["path"] for f in plan["files"]])
        record["staging_file"] = self._staging_file_for_followers(plan)
        mine = torch.frombuffer(bytearray(encode_slot(record)), dtype=torch.uint8).to(self.comm_device())
        slots = [torch.empty_like(mine) for _ in range(self.world)]
        self._wait(dist.all_gather(slots, mine, async_op=True), "init", "settings exchange")
        records = [decode_slot(slot.cpu().numpy().tobytes(), r) for r, slot in enumerate(slots)]
        diff = first_difference(records)
        if diff is not None:
            raise HwtuiError(diff)
        self._choose_paths(plan, records)

    def _staging_file_for_followers(self, plan: Plan) -> str | None:
        """The file this rank would stage in if it leads its host: its ``--out`` staging file, else
        a file in a fresh private directory in /dev/shm (0700, unpredictable name, locked while this
        rank lives: engine.replication.shm), made before the records go out so followers learn its
        name from them. None where no follower could use it (then nobody copies from this rank)."""
        if self.served is not None:
            return str(self.served.staging_file(plan["version"]))
        if not self.cfg.same_host or self.cfg.device != "cpu" or self.comm_device() != "cpu":
            return None
        try:
            self.run_dir = make_run_dir()
        except OSError:
            return None  # no usable shared memory: this rank's host-mates take the network instead
        return self.run_dir.file(f"rank{self.rank}")

    def _choose_paths(self, plan: Plan, records: list[dict[str, Any]]) -> None:
        """Where each receiver takes its bytes from (the same answer on every rank, from the gathered records).

        - same-host: on the source's host with the same source file: copy from its page cache.
          Needs the version in safetensors files (torch pickles have no byte range to map).
        - network: one rank per other host (its leader) receives by broadcast from rank 0, in a
          process group of rank 0 and the leaders, so network bytes per host are model bytes.
        - host-copy: the other ranks of a leader's host copy from the leader's verified staging
          copy (a file: its ``--out`` staging file, else one in /dev/shm) and verify their own copy.
        Host memory on both sides is needed for anything but the network path.
        """
        import torch.distributed as dist

        why_not = None
        if not self.cfg.same_host:
            why_not = "same-host path turned off (--no-same-host)"
        elif self.cfg.device != "cpu" or self.comm_device() != "cpu":
            why_not = f"device {self.cfg.device}: buckets travel device to device"
        mappable = all(f.get("format") == "safetensors" for f in plan["files"])
        src_host = records[SRC].get("host") or {}

        def host_key(r: int) -> tuple[Any, Any, Any]:
            # The user too: a leader's staging file is 0600 in a 0700 directory, readable by its own user only.
            h = records[r].get("host") or {}
            return h.get("boot_id"), h.get("netns"), h.get("uid")

        def can_lead(r: int) -> bool:
            return bool(records[r].get("staging_file"))

        self.paths = {SRC: ("source", "holds the files")}
        self.leader_of = {}
        leaders: dict[tuple[Any, Any, Any], int] = {}
        for r in range(1, self.world):
            if why_not is not None:
                self.paths[r] = ("network", why_not)
                continue
            local, why = same_host_reason(records[r].get("host") or {}, src_host)
            if local and mappable:
                self.paths[r] = ("same-host", why)
                continue
            if local and host_key(r) == host_key(SRC) and can_lead(SRC):
                # The source's bytes are not a file it can map (a torch pickle is unpickled into
                # memory): the source stages each bucket in /dev/shm and announces it, as a host
                # leader does for its followers; the bytes still never touch a socket.
                self.leader_of[r] = SRC
                self.paths[r] = ("shm", "same host, but a source file is not safetensors (cannot be mapped): the source "
                                        "stages each bucket in /dev/shm")
                continue
            if local:
                why = "same host, but a source file is not safetensors (only safetensors files can be mapped)"
            key = host_key(r)
            if host_key(r) == host_key(SRC) or not key[0] or key not in leaders or not can_lead(leaders[key]):
                leaders.setdefault(key, r)
                self.paths[r] = ("network", f"host leader: {why}" if key != host_key(SRC) else why)
            else:
                self.leader_of[r] = leaders[key]
                self.paths[r] = ("host-copy", f"copies rank {leaders[key]}'s verified copy on the same host")
        self.net_ranks = [r for r, (path, _) in sorted(self.paths.items()) if path in ("source", "network")]
        # new_group is collective over the whole world: every rank calls it, in the same order.
        self.net_group = None
        if 1 < len(self.net_ranks) < self.world:
            self.net_group = dist.new_group(self.net_ranks)
        self.host_group = None
        for leader in sorted(set(self.leader_of.values())):
            members = [leader, *sorted(r for r, lead in self.leader_of.items() if lead == leader)]
            group = dist.new_group(members)
            if self.rank in members:
                self.host_group = group
        # Where every leader stages (followers map it): its --out staging file, else a file in its
        # private /dev/shm directory. A rank that leads nobody gives its directory up now.
        self.leader_files = {leader: str(records[leader]["staging_file"]) for leader in set(self.leader_of.values())}
        if self.rank not in self.leader_files and self.run_dir is not None:
            self.run_dir.remove()
            self.run_dir = None
        if self.rank == SRC:
            parts = []
            for kind in ("same-host", "shm", "network", "host-copy"):
                rs = [r for r, (path, _) in sorted(self.paths.items()) if path == kind]
                if rs:
                    whys = sorted({self.paths[r][1] for r in rs})
                    what = {"same-host": "copy each bucket from the source's page cache (memory map of the same file) "
                                         "and verify it",
                            "shm": "copy each bucket from the source's staging copy in /dev/shm and verify it",
                            "network": f"receive each bucket by {self.choice.backend} broadcast",
                            "host-copy": "copy from their host leader's verified copy and verify it"}[kind]
                    parts.append(f"{kind} path: rank(s) {', '.join(map(str, rs))} {what} ({'; '.join(whys)})")
            self.emit(LogEvent(message="Replication paths: " + "; ".join(parts), source="replication.transport"))

    def _exchange_header(self, plan: Plan) -> bytes | None:
        """The source file's own safetensors header (length prefix included), so a replica is byte-identical.

        Only when the version is exactly one safetensors file; rank 0 reads it, every receiver
        checks that it describes the plan's tensors (the data bytes are verified by checksum).
        """
        import torch
        import torch.distributed as dist

        if not faithful_eligible(plan):
            return None
        raw = b""
        if self.rank == SRC:
            raw = source_header(plan)
        size = torch.tensor([len(raw)], dtype=torch.int64, device=self.comm_device())
        self._wait(dist.broadcast(size, SRC, async_op=True), "init", "header size exchange")
        n = int(size.item())
        if n == 0:
            return None
        buf = (torch.frombuffer(bytearray(raw), dtype=torch.uint8) if self.rank == SRC
               else torch.empty(n, dtype=torch.uint8)).to(self.comm_device())
        self._wait(dist.broadcast(buf, SRC, async_op=True), "init", "header exchange")
        header = buf.cpu().numpy().tobytes()
        if self.rank != SRC:
            check_header_matches(header, plan)
        return header

    def comm_device(self) -> str:
        return self.choice.comm_device

    def setup(self, plan: Plan) -> None:
        t = _now()
        self.rss_base = _rss()
        n = len(plan.buckets)
        largest = max((b["size"] for b in plan.buckets), default=1)
        k = self.cfg.inflight
        device, comm = self.cfg.device, self.comm_device()
        if self.rank == SRC:
            self._sources = _SourceReader(plan)
            needs_pool = comm != "cpu" or any(not self._sources.contiguous(plan, b) for b in range(n))
            if SRC in self.leader_files:
                # The "shm" path: a staging copy in shared memory with the receivers' own layout,
                # which they map and copy from (removed after the vote, on every error path, and by
                # the launcher after a SIGKILL).
                self.shm_file = self.leader_files[SRC]
                self.published = Staging(plan["tensors"], {"format": "pt"}, file=self.shm_file, first=stream_order(plan),
                                         header=self.source_header)
                self.faults.at_phase("setup")
        else:
            file: Any = self.served.staging_file(plan["version"]) if self.served else None
            if file is None and self.rank in self.leader_files:
                file = self.shm_file = self.leader_files[self.rank]  # its followers map it
            # hwtui's own facts (model, version, plan digest) live beside the replica in its
            # manifest.json, never inside it: the file is the source's, byte for byte, when the
            # version is one safetensors file, else a plain safetensors file of the same tensors.
            prefault, self._prefault = self._prefault, None
            if self.staging_factory is not None:
                self.staging = self.staging_factory(plan["tensors"], {"format": "pt"}, device=device, file=file,
                                                    first=stream_order(plan), header=self.source_header)
            else:
                buffer = prefault.take(float(self.cfg.timeouts.init)) \
                    if prefault is not None and file is None else None
                self.staging = Staging(plan["tensors"], {"format": "pt"}, device=device, file=file,
                                       first=stream_order(plan), header=self.source_header, buffer=buffer)
            # Buckets that are one contiguous range of the staging copy are received straight into it:
            # no pooled buffer, no unpack copy. The rest go through the pool.
            self.direct = {}
            if device == comm:
                for b in range(n):
                    region = self.staging.direct_region(plan.bucket_items[b], plan.buckets[b]["size"])
                    if region is not None:
                        self.direct[b] = region
            needs_pool = len(self.direct) < n
            if self.paths.get(self.rank, ("", ""))[0] == "same-host":
                # Mapped (and pre-populated) before the start barrier: page-table work is set-up.
                self._local_reader = _SourceReader(plan)
            if comm != "cpu" and self.cfg.verify:
                self.host_pool = BufferPool(k, largest, "cpu", pin=True)
                self.host_pool.warm(min(k, n))
        if needs_pool:
            self.pool = BufferPool(k, largest, comm)
            self.pool.warm(min(k, n))
        self.phases["setup"] = _now() - t
        self.phase("ready")  # set up; the start barrier waits for the others

    def barrier(self) -> None:
        import torch
        import torch.distributed as dist

        flag = torch.ones(1, dtype=torch.int32, device=self.comm_device())
        self._wait(dist.all_reduce(flag, async_op=True), "init", "start barrier")

    # ------------------------------------------------------------------ transfer

    def _chunks(self, buf: Any) -> list[Any]:
        step = max(1, int(self.cfg.chunk_bytes) or buf.numel())
        chunks = [buf[i:i + step] for i in range(0, buf.numel(), step)]
        self.collectives += len(chunks)
        return chunks

    def transfer(self, plan: Plan) -> None:
        t = _now()
        self.internal("transfer_start")
        path = self.paths.get(self.rank, ("network", ""))[0]
        if self.rank == SRC:
            if len(self.net_ranks) > 1:
                self._send(plan)
            else:
                self._serve_local(plan)
            if self.published is not None:
                self._release_followers()
        elif path == "same-host":
            self._copy_local(plan)
        elif path in ("host-copy", "shm"):
            self._copy_from_leader(plan)
        else:
            self._receive(plan)
            if self.rank in self.leader_files:
                self._release_followers()
        self.phases["transfer"] = _now() - t
        self.internal("transfer_end", seconds=self.phases["transfer"])

    def _window(self) -> Window:
        return Window(self.cfg.inflight, max_bytes=self.cfg.max_inflight_bytes,
                      adaptive=self.cfg.adaptive and self.rank == SRC,
                      target_s=self.cfg.target_bucket_s, max_limit=self.cfg.inflight)

    def _groups(self, plan: Plan) -> list[list[int]]:
        # Only on host memory: the source sends zero-copy from the mapping and every receiver
        # receives straight into its staging copy, so a group needs no pooled buffer at all and the
        # pool bound (window x bucket) is untouched. Every rank derives the same groups from the plan.
        cpu = self.cfg.device == "cpu" and self.comm_device() == "cpu"
        layout = header_layout(self.source_header) if self.source_header else None
        return collective_groups(plan, chunk_bytes=int(self.cfg.chunk_bytes),
                                 max_group=max(1, self.cfg.inflight // 2), enabled=cpu, layout=layout)

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
                t0 = _now()
                if len(group) == 1:
                    buf, pooled = self._sources.stage(plan, group[0], self.pool)
                    total = sizes[group[0]]
                else:  # one contiguous range of the mapped file (see collective_groups)
                    it = plan.bucket_items[group[0]][0]
                    start, total = it["file_offset"] - it["offset"], sum(sizes[x] for x in group)
                    buf, pooled = self._sources.mapped[it["file"]].tensor[start:start + total], False
                staged = _now() - t0
                for x in group:
                    self.bucket(x, "staged", sizes[x], staged)
                works = [dist.broadcast(c, SRC, group=self.net_group, async_op=True) for c in self._chunks(buf[:total])]
                t_post = _now()
                if self.cfg.verify:
                    # The source's check of what it sends runs beside the send, on the host copy
                    # (xxhash releases the GIL), instead of a second pass over the model afterwards.
                    for x in group:
                        self.source_digests[x] = self._hasher().submit(self._sources.bucket_digest, plan, x)
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
            dt = _now() - t0
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
        verify = self.cfg.verify
        while b < len(groups) or inflight:
            while b < len(groups) and win.can_admit(sum(sizes[x] for x in groups[b]), count=len(groups[b])):
                group = groups[b]
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
                t_post = _now()
                for x in group:
                    win.admit(sizes[x])
                    self.bucket(x, "inflight", sizes[x])
                inflight.append((group, buf, works, t_post))
                b += 1
            group, buf, works, t0 = inflight.popleft()
            for w in works:
                self._wait(w, "bucket", f"broadcast of bucket {group[0]}" if len(group) == 1
                           else f"broadcast of buckets {group[0]}-{group[-1]}")
            pos = 0
            for ob in group:
                # Every bucket of a group is verified on its own, in place, before it counts as done.
                size = sizes[ob]
                self.bucket(ob, "verifying", size, _now() - t0)
                win.retire(size, _now() - t0)
                t1 = _now()
                data = buf[pos:pos + size]
                pos += size
                if self.faults.corrupts(ob):
                    data[size // 2] ^= 0xFF
                ok = not verify or self._verify_bucket(plan, ob, data)
                if ok and ob not in self.direct:
                    for it in plan.bucket_items[ob]:
                        self.staging.write(it["name"], it["tensor_offset"], data[it["offset"]:it["offset"] + it["nbytes"]])
                self.bucket(ob, "done" if ok else "failed", size, _now() - t1)
                if self.host_group is not None:
                    self._announce(ob)
            if len(group) == 1 and group[0] not in self.direct:
                self._pooled().release(buf)
        self.window_stats = {"peak_occupancy": win.peak_occupancy, "peak_bytes": win.peak_bytes,
                             "final_limit": win.limit, "changes": win.changes}

    def _serve_local(self, plan: Plan) -> None:
        """The source when every receiver copies from its page cache: nothing to send; it checks its files."""
        sizes = [bk["size"] for bk in plan.buckets]
        for b, size in enumerate(sizes):
            self.faults.at_bucket(b)
            # No "staged"/"inflight": the source sends nothing here, so its window (what the TUI's
            # lanes show, and the report's peak_occupancy) stays empty; "done" says it checked the bucket.
            if self.cfg.verify:
                self.source_digests[b] = self._hasher().submit(self._sources.bucket_digest, plan, b)
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
                t0 = _now()
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
                self.bucket(b, "verifying", size, _now() - t0)
                t1 = _now()
                if self.faults.corrupts(b):
                    data[size // 2] ^= 0xFF
                    digest = None  # hash this copy again, as it is now
                if not self.cfg.verify:
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
                self.bucket(b, "done" if ok else "failed", size, _now() - t1)
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

    def _release_followers(self) -> None:
        """The leader's announcements are delivered (bounded waits) before it moves on."""
        for work in self.announcements:
            self._wait(work, "bucket", "host copy hand-off")
        self.announcements.clear()

    def _copy_from_leader(self, plan: Plan) -> None:
        """Copy each bucket from the host leader's verified copy (or, on the "shm" path, the source's
        /dev/shm staging copy) once it is announced, and verify this rank's own copy of it."""
        import torch
        import torch.distributed as dist

        leader = self.leader_of[self.rank]
        src = MappedFile(self.leader_files[leader])
        try:
            hlen = len(self.staging.header)
            theirs = src.tensor[hlen:hlen + self.staging.data_bytes]
            for _ in range(len(plan.buckets)):
                flag = torch.zeros(1, dtype=torch.int64)
                # The leader's first bucket waits on its own world start-up and the network.
                self._wait(dist.broadcast(flag, leader, group=self.host_group, async_op=True), "bucket",
                           f"host leader rank {leader}")
                b = int(flag.item())
                size = plan.buckets[b]["size"]
                self.faults.at_bucket(b)
                self.bucket(b, "inflight", size)
                t0 = _now()
                region = self.direct.get(b)
                if region is not None:
                    off = self._direct_offset(b)
                    self.staging.write_at(off, theirs[off:off + size])
                else:
                    for it in plan.bucket_items[b]:
                        off = self.staging.layout[it["name"]][0] + it["tensor_offset"]
                        self.staging.write_at(off, theirs[off:off + it["nbytes"]])
                self.bucket(b, "verifying", size, _now() - t0)
                t1 = _now()
                if self.faults.corrupts(b) and region is not None:
                    region[size // 2] ^= 0xFF
                ok = not self.cfg.verify or self._verify_digest(plan, b, self._staged_digest(plan, b))
                self.bucket(b, "done" if ok else "failed", size, _now() - t1)
        finally:
            src.close()

    def _direct_offset(self, b: int) -> int:
        """Where a bucket received in place starts in this rank's staging data."""
        return int(self.direct[b].data_ptr() - self.staging.data.data_ptr())

    def _staged_digest(self, plan: Plan, b: int) -> str:
        """xxh3 of bucket b as this rank's staging copy holds it (pieces and zero padding)."""
        region = self.direct.get(b)
        if region is not None:
            return xxh3_hex(region.numpy())
        h, pos = Streaming(), 0
        for it in plan.bucket_items[b]:
            h.pad(it["offset"] - pos)
            h.update(self.staging.region(it["name"])[it["tensor_offset"]:it["tensor_offset"] + it["nbytes"]].numpy())
            pos = it["offset"] + it["nbytes"]
        h.pad(plan.buckets[b]["size"] - pos)
        return h.hexdigest()

    def _verify_digest(self, plan: Plan, ob: int, got: str) -> bool:
        if got == plan.buckets[ob]["checksum"]:
            return True
        self.failures.append(f"bucket {ob} failed verification on rank {self.rank} "
                             f"(xxh3 {got} != plan {plan.buckets[ob]['checksum']})")
        self.emit(ErrorEvent(message=self.failures[-1], rank=self.rank, where="verify"))
        return False

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

    def _verify_bucket(self, plan: Plan, ob: int, data: Any) -> bool:
        size = data.numel()
        if data.device.type == "cpu":
            got = xxh3_hex(data.numpy())
        else:  # the bytes must reach the host to be hashed; a pinned, pooled buffer
            hbuf = self._host_pooled().acquire(size)
            hbuf[:size].copy_(data)
            got = xxh3_hex(hbuf[:size].numpy())
            self._host_pooled().release(hbuf)
        return self._verify_digest(plan, ob, got)

    # ------------------------------------------------------------------ commit

    def prepare(self, plan: Plan) -> bool:
        t = _now()
        if self.rank == SRC and self.cfg.verify:
            self._check_sources(plan)
        if self.rank != SRC and not self.failures:
            kept = [tt["name"] for tt in plan["tensors"] if not tt["send"]]
            if kept:
                self._copy_kept(kept)
            if self.cfg.verify:
                # Bytes received straight into the staging copy were verified there, bucket by
                # bucket; what was copied (unpacked from the pool, kept from the served version)
                # is checked again per tensor against the plan.
                in_place = _in_place_tensors(plan, set(self.direct))
                bad = self.staging.verify([tt["name"] for tt in plan["tensors"] if tt["name"] not in in_place])
                if bad:
                    self.failures.append(f"{len(bad)} tensor(s) of the staging copy on rank {self.rank} do not match "
                                         f"the plan (first: {bad[0]!r})")
                    self.emit(ErrorEvent(message=self.failures[-1], rank=self.rank, where="verify"))
            if self.served and not self.failures:
                self.staging.flush()
                try:
                    self.served.prepare(plan["version"], manifest_of(plan))
                except (OSError, HwtuiError) as exc:
                    # Caught before the vote, a rank that cannot switch makes every rank abort.
                    self.failures.append(f"rank {self.rank} cannot switch to {plan['version']!r} under "
                                         f"{self.served.root}: {getattr(exc, 'strerror', None) or exc}")
                    self.emit(ErrorEvent(message=self.failures[-1], rank=self.rank, where="commit"))
        self.phases["prepare"] = _now() - t
        ok = not self.failures
        self.internal("prepared", ok=ok, detail="; ".join(self.failures)[:500])
        self.faults.at_phase("prepare")
        return ok

    def _check_sources(self, plan: Plan) -> None:
        """The source's own check that it sent what was planned, hashed beside the send (see _send).

        A file changed since planning makes every receiver fail verification; this names the cause
        (the file, not the wire) and makes it bad input (exit 2). Nothing commits either way.
        """
        for b in range(len(plan.buckets)):
            future = self.source_digests.get(b)
            digest = future.result() if future is not None else self._sources.bucket_digest(plan, b)
            if digest != plan.buckets[b]["checksum"]:
                self.bad_input = True
                self.failures.append(f"the weight files changed since planning: bucket {b} hashes to {digest}, "
                                     f"the plan says {plan.buckets[b]['checksum']}")
                self.emit(ErrorEvent(message=f"rank {self.rank}: {self.failures[-1]}", rank=self.rank, where="source"))
                return

    def _copy_kept(self, names: list[str]) -> None:
        assert self.served is not None  # kept tensors exist only in delta plans, which need --out
        mapped, offsets = self.served.open_current()
        try:
            for name in names:
                if name not in offsets:
                    raise HwtuiError(f"rank {self.rank}: tensor {name!r} is not in the served version")
                off, nbytes = offsets[name]
                self.staging.write(name, 0, mapped.tensor[off:off + nbytes])
        finally:
            mapped.close()

    def vote_and_commit(self, plan: Plan, ok: bool) -> bool:
        """Vote; on a unanimous yes the coordinator records the decision durably, then every rank switches.

        From its yes vote until its switch is done a receiver defers SIGTERM/SIGINT (every wait in
        between is bounded by the commit timeout), and it keeps its prepared copy whatever happens:
        once the decision record may exist, deleting that copy could leave this rank unable to
        finish a commit its peers have made. A rank SIGKILLed here finishes on a re-run.
        """
        import torch
        import torch.distributed as dist

        t = _now()
        guard = self.served is not None and ok and self.cfg.commit
        with GATE.held(guard):
            if guard:
                self.keep_staging = True
            vote = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.comm_device())
            self._wait(dist.all_reduce(vote, op=dist.ReduceOp.MIN, async_op=True), "commit", "commit vote")
            unanimous = int(vote.item()) == 1
            decided = False
            if unanimous and self.cfg.commit:
                decided = self._decide(plan)
            self.internal("decided", unanimous=unanimous, decision="commit" if decided else "abort")
            if decided:
                self.faults.at_phase("commit")  # between the decision and this rank's switch
                if self.served is not None:
                    try:
                        self.served.commit(plan["version"], plan.digest)
                        self.switched = True
                    except OSError as exc:
                        self.failures.append(f"rank {self.rank} could not switch to {plan['version']!r} under "
                                             f"{self.served.root}: {exc.strerror or exc}; its verified copy is kept: "
                                             "re-run the same command to finish the commit")
                        self.emit(ErrorEvent(message=self.failures[-1], rank=self.rank, where="commit"))
            elif self.served is not None:
                self.keep_staging = False
                self.served.abort(plan["version"])
        if decided and self.cfg.parent_pid is None:
            self._tally(plan)
        self.phases["commit"] = _now() - t
        return unanimous and (decided or not self.cfg.commit) and not self.failures

    def _tally(self, plan: Plan) -> None:
        """Joined worlds (torchrun, srun, mpirun, agents): rank 0's launcher cannot read the other
        nodes' disks, so each rank leaves what it serves now in the world's store and rank 0 reports
        every receiver's (it printed "all 0 receivers switched" before). Through the store, not a
        collective: a rank that died after the decision costs at most the commit timeout and is
        reported as unknown; it never turns a decided commit into a failure here."""
        import torch.distributed as dist

        self._tallies = getattr(self, "_tallies", 0) + 1  # resident ranks vote once per push
        prefix = f"hwtui-tally/{plan['version']}/{str(plan.digest)[:16]}/{self._tallies}"
        serves = None
        if self.served is not None:
            with contextlib.suppress(HwtuiError):
                serves = self.served.current_version()
        try:
            store = dist.distributed_c10d._get_default_store()
            store.set(f"{prefix}/{self.rank}", json.dumps({"serves": serves}))
            if self.rank != SRC:
                return
            keys = [f"{prefix}/{r}" for r in range(1, self.world)]
            with contextlib.suppress(Exception):  # a timeout: whoever did not report is unknown
                store.wait(keys, self._timeout("commit"))
            found = {r: json.loads(store.get(k)).get("serves") for r, k in enumerate(keys, 1) if store.check([k])}
        except Exception as exc:  # noqa: BLE001 - the store failing must not undo a decided commit
            found = {}
            self.emit(ErrorEvent(message=f"rank {self.rank}: could not collect the receivers' versions: {exc}",
                                 rank=self.rank, where="commit"))
        if self.rank == SRC:
            self.internal("tally", serving={str(r): v for r, v in found.items()},
                          unknown=[r for r in range(1, self.world) if r not in found])

    def _decide(self, plan: Plan) -> bool:
        """Rank 0 writes the decision record, then tells every rank whether it exists (one broadcast)."""
        import torch
        import torch.distributed as dist

        go = 1
        if self.rank == SRC:
            assert self.cfg.out is not None, "--commit needs --out (checked by the launcher)"
            try:
                self.faults.at_phase("decide")
                write_decision(self.cfg.out, plan["version"], plan.digest, list(range(1, self.world)))
            except OSError as exc:
                go = 0
                self.failures.append(f"the decision record for {plan['version']!r} could not be written under "
                                     f"{self.cfg.out}: {exc.strerror or exc}; nothing was committed")
                self.emit(ErrorEvent(message=f"rank {self.rank}: {self.failures[-1]}", rank=self.rank, where="commit"))
        flag = torch.tensor([go], dtype=torch.int32, device=self.comm_device())
        self._wait(dist.broadcast(flag, SRC, async_op=True), "commit", "commit decision")
        return int(flag.item()) == 1

    # ------------------------------------------------------------------ results

    def result(self, ok: bool, clean: bool) -> None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        serves = None
        if self.served is not None:
            with contextlib.suppress(HwtuiError):
                serves = self.served.current_version()
        self.internal("result", ok=ok, clean=clean, serves=serves, switched=self.switched, phases={k: round(v, 6) for k, v in self.phases.items()},
                      failures=self.failures, bad_input=self.bad_input,
                      memory={"peak_rss_bytes": peak, "rss_before_setup_bytes": self.rss_base,
                              "pool": self.pool.stats() if self.pool else None,
                              "host_pool": self.host_pool.stats() if self.host_pool else None,
                              "staging_bytes": self.staging.data_bytes if self.staging is not None else 0},
                      window=self.window_stats, collectives=self.collectives,
                      direct_buckets=len(self.direct) if self.rank != SRC else None,
                      path=self.paths.get(self.rank, ("network", ""))[0])

    def remove_shm(self) -> None:
        if self.published is not None:
            self.published.close()
            self.published = None
        self.shm_file = None
        if self.run_dir is not None:
            with contextlib.suppress(OSError):
                self.run_dir.remove()  # the staging file, the directory, and its lock
            self.run_dir = None

    def cleanup_staging(self) -> None:
        self.remove_shm()
        # A leader (or the source) killed outright cannot remove its own copy, and its followers
        # are the ones on its host: a follower of a failed run sweeps every directory whose owner
        # is gone (its lock is free). Never by a path a peer sent: a live run's copy, another
        # user's files and anything planted are left alone (engine.replication.shm).
        if self.rank in self.leader_of:
            with contextlib.suppress(OSError):
                sweep_dead_run_dirs()
        if self.staging is not None:
            self.staging.close()
        if self.served is not None and self.plan_version is not None and not self.keep_staging:
            self.served.abort(self.plan_version)


def _in_place_tensors(plan: Plan, direct: set[int]) -> set[str]:
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


def _rss() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class _SourceReader:
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


def run_worker(cfg: WorkerConfig, emit: Emit) -> int:
    """Run one rank to completion; returns its exit code (see EXIT_*)."""
    w = Worker(cfg, emit)
    plan: Plan | None = None
    joined = False
    try:
        w.start_world()
        plan = w.load()
        w.init(plan)
        joined = True
        w.setup(plan)
        w.barrier()
        w.internal("ready")
        w.transfer(plan)
        ok = w.prepare(plan)
        unanimous = w.vote_and_commit(plan, ok)
        w.remove_shm()  # every follower copied it before the vote
        w.result(ok=unanimous, clean=True)
        code = EXIT_OK if unanimous else (EXIT_BAD_INPUT if w.bad_input else EXIT_ABORTED)
    except HwtuiError as exc:
        w.emit(ErrorEvent(message=str(exc), rank=w.rank, where="input"))
        w.bad_input = True
        w.cleanup_staging()
        w.result(ok=False, clean=False)
        code = EXIT_BAD_INPUT
    except TransportFailure as exc:
        w.emit(ErrorEvent(message=str(exc), rank=w.rank, where="transport"))
        w.cleanup_staging()
        w.result(ok=False, clean=False)
        code = EXIT_BROKEN
    except Interrupted as exc:
        w.emit(ErrorEvent(message=f"rank {w.rank}: {exc}", rank=w.rank, where="signal"))
        w.cleanup_staging()
        w.result(ok=False, clean=False)
        code = EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - report, never a bare traceback
        w.emit(ErrorEvent(message=f"rank {w.rank}: {type(exc).__name__}: {exc}", rank=w.rank, where="internal"))
        w.cleanup_staging()
        w.result(ok=False, clean=False)
        code = EXIT_BROKEN
    if w._hash_pool is not None:
        w._hash_pool.shutdown(wait=False, cancel_futures=True)
    # A world formed but refused at the settings agreement (bad input) must be torn down too:
    # left to the interpreter's exit, gloo's destructor aborts the process (SIGABRT) once a peer
    # has gone, and a clean exit 2 would read as a crash.
    world_formed = joined or (w._world_thread is not None and not w._world_thread.is_alive() and w._world_error is None)
    if world_formed and code in (EXIT_OK, EXIT_ABORTED, EXIT_BAD_INPUT):
        import torch.distributed as dist

        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001, S110 - best effort on the way out
            pass
    return code


# ---------------------------------------------------------------------- process entry


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the launcher dies, so no orphan ever holds a port or a GPU."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def install_signal_gate() -> list[int]:
    """SIGTERM/SIGINT go through :data:`GATE` (deferred over the vote and the switch); returns the
    list the handler appends the first signal to, so a loop between runs can see it came.

    Only the first signal interrupts; a second one while the rank cleans up and reports must not
    cut that short (nor print a traceback): it is ignored.
    """
    stopping: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if stopping:
            return
        stopping.append(signum)
        GATE.deliver(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stopping


def main(argv: list[str]) -> int:
    """``python -m hwtui.engine.replication.worker ANSWER_FD CONFIG_JSON`` (started by the launcher)."""
    fd = int(argv[0])
    _die_with_parent()

    emit = AnswerPipe(fd).send
    stopping = install_signal_gate()
    code = EXIT_BROKEN
    try:
        try:
            cfg = WorkerConfig.from_json(argv[1])
        except HwtuiError as exc:
            emit(ErrorEvent(message=f"worker: {exc}", where="input").to_dict())
            os._exit(EXIT_BAD_INPUT)
        if cfg.parent_pid is not None and os.getppid() != cfg.parent_pid:
            os._exit(EXIT_BROKEN)  # the launcher died before we could arm the death signal
        code = run_worker(cfg, emit)
    except (BrokenPipeError, Interrupted):
        code = EXIT_INTERRUPTED if stopping else EXIT_BROKEN
    except BaseException:  # noqa: BLE001 - a rank never prints a traceback; the launcher names its exit
        code = EXIT_BROKEN
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    # os._exit: a rank whose peer died can block forever in gloo's destructors on a normal exit.
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
