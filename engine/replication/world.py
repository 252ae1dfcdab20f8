"""A rank joins the world: the process group, the settings agreement, each receiver's path, the
source's header and the start barrier. Nothing here moves a model byte."""

from __future__ import annotations

import os
import threading
from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.core.events import LogEvent
from hwtui.engine.replication import net_streams
from hwtui.engine.replication.agree import (
    decode_slot,
    encode_slot,
    first_difference,
    host_facts,
    hwtui_version,
    settings_record,
)
from hwtui.engine.replication.ipc_path import ipc_wanted
from hwtui.engine.replication.paths import choose_paths, describe_paths
from hwtui.engine.replication.plan import Plan
from hwtui.engine.replication.rank_base import SRC, RankBase, now
from hwtui.engine.replication.rank_signals import Interrupted, TransportFailure
from hwtui.engine.replication.shm import make_run_dir
from hwtui.engine.replication.staging import check_header_matches, faithful_eligible, source_header
from hwtui.engine.replication.transport import prepare_backend


def _data_at(record: dict[str, Any]) -> int | None:
    """A leader's ``staging_data_at`` (engine.replication.shared_prefault): 0, or None (after the header)."""
    at = record.get("staging_data_at")
    return 0 if at == 0 and type(at) is int else None


class RankWorld(RankBase):
    def start_world(self) -> None:
        """Import torch and form the process group in a thread, while the main thread loads the plan.

        Neither needs the other: the world needs only rank, size and address, and most of its time
        is spent waiting for the slowest peer's interpreter. The thread is a daemon so a rank that
        fails on its plan exits without waiting for the rendezvous.
        """
        # A bad interface list or stream count is bad input, said in one line before any
        # rendezvous (not a gloo error after it): engine.replication.net_streams.
        net_streams.device_count(os.environ, gloo=self.choice.backend == "gloo")

        def form() -> None:
            t = now()
            try:
                import torch.distributed as dist

                prepare_backend(self.choice, self.cfg.local_rank)
                init_method = f"tcp://{self.cfg.master_addr}:{self.cfg.master_port}"
                dist.init_process_group(self.choice.backend, init_method=init_method, rank=self.rank,
                                        world_size=self.world, timeout=self._timeout("init"))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread by init()
                self._world_error = exc
            self._world_seconds = now() - t

        self._world_thread = threading.Thread(target=form, name="form-world", daemon=True)
        self._world_thread.start()

    def init(self, plan: Plan) -> None:
        t = now()
        if self.reuse_world:
            self.internal("init", seconds=0.0, warm=True)
        else:
            self._join_world()
        self.phase("world joined")
        self._agree(plan)
        self.source_header = self._exchange_header(plan)
        self.phases["init"] = now() - t

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
                                 bucket_bytes=plan["bucket_bytes"], window=self.settings.window,
                                 chunk_bytes=self.settings.chunk_bytes, max_inflight_bytes=self.settings.max_inflight_bytes,
                                 verify=self.settings.verify, commit=self.cfg.commit, transport=self.choice.name)
        record["host"] = host_facts([f["path"] for f in plan["files"]])
        # How many TCP streams this rank can open in the network group (never compared as a
        # setting: _choose_paths uses them only where every network rank can, engine.replication.net_streams).
        record["net_devices"] = net_streams.device_count(os.environ, gloo=self.choice.backend == "gloo")
        record["staging_file"] = self._staging_file_for_followers(plan)
        # Where the data starts in that file: 0 in shared staging memory, else after the header.
        record["staging_data_at"] = 0 if self._shared is not None and record["staging_file"] == self._shared.path else None
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
        if not self.cfg.same_host or self.settings.device != "cpu" or self.comm_device() != "cpu":
            return None
        shared = self._shared
        if shared is not None:
            # Faulted in while the world formed (engine.replication.shared_prefault); waited for
            # here, bounded, so a rank never offers a copy it could not make.
            if shared.ready(float(self.cfg.timeouts.init)):
                self.run_dir = shared.run_dir
                return shared.path
            shared.discard()
            self._shared = None
        try:
            self.run_dir = make_run_dir()
        except OSError:
            return None  # no usable shared memory: this rank's host-mates take the network instead
        return self.run_dir.file(f"rank{self.rank}")

    def _choose_paths(self, plan: Plan, records: list[dict[str, Any]]) -> None:
        """Where each receiver takes its bytes from (engine.replication.paths), and the sub-groups it needs.

        Host memory on both sides is needed for anything but the network path.
        """
        import torch.distributed as dist

        why_not = None
        if not self.cfg.same_host:
            why_not = "same-host path turned off (--no-same-host)"
        elif self.settings.device != "cpu" or self.comm_device() != "cpu":
            why_not = f"device {self.settings.device}: buckets travel device to device"
        mappable = all(f.get("format") == "safetensors" for f in plan["files"])
        ipc = ipc_wanted(self.choice.name, self.settings.device)  # the transport line promised it: not turned off by --no-same-host
        choice = choose_paths(records, why_not=why_not, mappable=mappable, ipc=ipc)
        self.paths, self.leader_of, self.net_ranks = dict(choice.paths), dict(choice.leader_of), list(choice.net_ranks)
        # new_group is collective over the whole world: every rank calls it, in the same order.
        self.net_group = None
        streams = self._net_streams(records)  # the same on every rank
        if 1 < len(self.net_ranks) and (len(self.net_ranks) < self.world or streams > 1):
            mine = net_streams.network_ifnames(os.environ, gloo=True) if streams > 1 and self.rank in self.net_ranks else None
            with net_streams.gloo_interfaces(mine):
                self.net_group = dist.new_group(self.net_ranks)
        self.net_streams = streams if self.rank in self.net_ranks else 0
        self.host_group = None
        for leader in sorted(set(self.leader_of.values())):
            members = [leader, *sorted(r for r, lead in self.leader_of.items() if lead == leader)]
            group = dist.new_group(members)
            if self.rank in members:
                self.host_group = group
        # Where every leader stages (followers map it): its --out staging file, else a file in its
        # private /dev/shm directory. A rank that leads nobody gives its directory up now.
        self.leader_files = dict(choice.leader_files)
        self.leader_data_at = {lead: _data_at(records[lead]) for lead in self.leader_files}
        if self.rank not in self.leader_files and self.run_dir is not None:
            self.run_dir.remove()
            self.run_dir = None
        if self.rank == SRC:
            self.emit(LogEvent(message=describe_paths(self.paths, self.choice.backend), source="replication.transport"))

    def _net_streams(self, records: list[dict[str, Any]]) -> int:
        """How many TCP streams per peer the network group gets (engine.replication.net_streams),
        decided from the records alone, so the same on every rank: more than one only where every
        network rank can open that many -- else their connections would never pair up -- and 1
        (the group made as the world is) otherwise."""
        counts = {records[r].get("net_devices") for r in self.net_ranks}
        n = counts.pop() if len(counts) == 1 else None
        streams = n if type(n) is int and 1 < n <= net_streams.MAX_STREAMS and self.choice.backend == "gloo" else 1
        if self.rank == SRC and len(self.net_ranks) > 1 and self.choice.backend == "gloo":
            why = (f"{streams} TCP streams per peer ({net_streams.STREAMS_ENV})" if streams > 1 else
                   "one TCP stream per peer (streams each network rank can open: " +
                   ", ".join(f"rank {r} {records[r].get('net_devices')}" for r in self.net_ranks) + ")")
            self.emit(LogEvent(message=f"Network group (ranks {', '.join(map(str, self.net_ranks))}): {why}.",
                               source="replication.transport"))
        return streams

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

    def barrier(self) -> None:
        import torch
        import torch.distributed as dist

        flag = torch.ones(1, dtype=torch.int32, device=self.comm_device())
        self._wait(dist.all_reduce(flag, async_op=True), "init", "start barrier")

