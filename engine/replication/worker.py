"""One replication rank, run in a fresh interpreter per rank (or in-process under torchrun).

``Worker`` runs the phases in order -- load the plan, join the world, set up the staging copy and
the pools, transfer, verify, vote and commit -- and is assembled from one class per concern, each
readable alone:

- ``rank_base``: the state every part shares, events out, bounded waits;
- ``world``: the process group, the settings agreement, each receiver's path (``paths``);
- ``transfer``: the network path (the source's broadcast, the receivers' posted receives);
- ``host_copy``: the same-host, host-copy and shm paths (copies instead of a broadcast);
- ``verify``: every byte checked against the plan's checksums;
- ``vote``: the unanimous vote and the two-phase commit.

A checksum failure does not stop the collective schedule (the other ranks would only see a
timeout): the rank finishes the schedule and votes no, so every rank aborts together with the real
reason. Every wait has a timeout. Events go out as JSON lines through ``emit``; internal ``_rank``
messages (ready, transfer times, votes, results) let the launcher build the world view.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.core.events import ErrorEvent
from hwtui.core.forking import die_with_parent
from hwtui.core.supervisor import AnswerPipe
from hwtui.engine.replication.commit import ServedDir
from hwtui.engine.replication.config import WorkerConfig
from hwtui.engine.replication.ipc_path import RankIpc
from hwtui.engine.replication.plan import Plan, load_plan, preflight_sources
from hwtui.engine.replication.pool import BufferPool
from hwtui.engine.replication.rank_base import SRC, Emit, now, rss
from hwtui.engine.replication.rank_signals import (
    EXIT_ABORTED,
    EXIT_BAD_INPUT,
    EXIT_BROKEN,
    EXIT_INTERRUPTED,
    EXIT_OK,
    GATE,
    Interrupted,
    TransportFailure,
    install_signal_gate,
)
from hwtui.engine.replication.served_files import serve_modes
from hwtui.engine.replication.shared_prefault import SharedPrefaulted
from hwtui.engine.replication.shm import sweep_dead_run_dirs
from hwtui.engine.replication.source_reader import SourceReader, stream_order
from hwtui.engine.replication.staging import Prefaulted, PrefaultedFile, Staging, faithful_eligible
from hwtui.engine.replication.timeline import cpu_between, cpu_sample
from hwtui.engine.replication.transfer import RankTransfer
from hwtui.engine.replication.vote import RankCommit
from hwtui.engine.replication.world import RankWorld

# Re-exported: the launcher and the resident rank name them through this module.
__all__ = ["EXIT_ABORTED", "EXIT_BAD_INPUT", "EXIT_BROKEN", "EXIT_INTERRUPTED", "EXIT_OK", "GATE", "SRC",
           "Interrupted", "TransportFailure", "Worker", "install_signal_gate", "main", "run_worker"]


class Worker(RankWorld, RankTransfer, RankIpc, RankCommit):
    """One rank: the phases in order (see run_worker); the work of each is in its own module."""

    def load(self) -> Plan:
        t = now()
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
        self.phases["load"] = now() - t
        self.phase("plan loaded")
        if self.rank != SRC and self.settings.device == "cpu" and not (self.cfg.out and self.cfg.commit) \
                and self.staging_factory is None:
            # Host staging without a file: fault it in while the world forms (see staging.Prefaulted).
            # An upper bound of its size: the layout comes with the source's header, after the world.
            # After the phase report: starting a thread waits for the GIL, which `import torch` in
            # the world's thread may hold for a while (dlopen).
            bound = plan["files"][0]["size"] if faithful_eligible(plan) else sum(t["nbytes"] for t in plan["tensors"])
            # A rank likely to lead its host (engine.replication.shared_prefault) faults in memory
            # its host-mates can map; the others, and it where shared memory is short, private memory.
            self._shared = SharedPrefaulted.make(int(bound)) if self._may_lead() else None
            if self._shared is None:
                self._prefault = Prefaulted(int(bound))
        elif self.served is not None and self.settings.device == "cpu" and self.staging_factory is None:
            # The --out staging file: made, reserved and brought into the page cache by a thread
            # while the world forms (staging.PrefaultedFile). Its size: the source file's when the
            # replica is that file, else the data's (Staging adds the header's when it takes it).
            size = plan["files"][0]["size"] if faithful_eligible(plan) else sum(t["nbytes"] for t in plan["tensors"])
            self._prefault_file = PrefaultedFile(self.served.staging_file(plan["version"]), int(size))
        return plan

    def setup(self, plan: Plan) -> None:
        t = now()
        self.rss_base = rss()
        n = len(plan.buckets)
        largest = max((b["size"] for b in plan.buckets), default=1)
        k = self.settings.window
        device, comm = self.settings.device, self.comm_device()
        if self.rank == SRC:
            needs_pool = self._setup_source(plan, comm, n)
        else:
            needs_pool = self._setup_receiver(plan, device, comm, n, k, largest)
        if needs_pool:
            self.pool = BufferPool(k, largest, comm)
            self.pool.warm(min(k, n))
        if self.paths.get(self.rank, ("", ""))[0] == "ipc" or (self.rank == SRC and self._ipc_ranks()):
            self._ipc_warm()
        self.phases["setup"] = now() - t
        self.phase("ready")  # set up; the start barrier waits for the others

    def _setup_source(self, plan: Plan, comm: str, n: int) -> bool:
        """The source's readers (and the shm path's staging copy); whether buckets need a pool."""
        self._sources = SourceReader(plan, readers=self.cfg.readers, direct=self.cfg.direct_io,
                                     min_slice=self._ipc_read_floor())
        needs_pool = comm != "cpu" or any(not self._sources.contiguous(plan, b) for b in range(n))
        self._sources.warm(comm)  # the reader's pinned ring, before the clock starts
        if SRC in self.leader_files:
            # The "shm" path: a staging copy in shared memory with the receivers' own layout,
            # which they map and copy from (removed after the vote, on every error path, and by
            # the launcher after a SIGKILL).
            self.shm_file = self.leader_files[SRC]
            self.published = Staging(plan["tensors"], {"format": "pt"}, file=self.shm_file, first=stream_order(plan),
                                     header=self.source_header)
            self.faults.at_phase("setup")
        return needs_pool

    def _setup_receiver(self, plan: Plan, device: str, comm: str, n: int, k: int, largest: int) -> bool:
        """A receiver's staging copy (shared, prefaulted, a file or memory), the buckets it receives
        in place, its local reader and host pool; whether the other buckets need a pool."""
        file: Any = self.served.staging_file(plan["version"]) if self.served else None
        shared, self._shared = self._shared, None
        shared_buf = shared.take(float(self.cfg.timeouts.init)) if shared is not None else None
        self.shared_staging = shared_buf is not None
        leads_from_shared = shared_buf is not None and self.rank in self.leader_files
        if leads_from_shared:
            self.shm_file = shared.path if shared is not None else None  # its followers read it (data at 0)
        elif file is None and self.rank in self.leader_files:
            file = self.shm_file = self.leader_files[self.rank]  # its followers map it
        if shared is not None and not leads_from_shared:
            shared.discard()  # not a leader: the file goes (idempotent), the memory stays this rank's
        # hwtui's own facts (model, version, plan digest) live beside the replica in its
        # manifest.json, never inside it: the file is the source's, byte for byte, when the
        # version is one safetensors file, else a plain safetensors file of the same tensors.
        prefault, self._prefault = self._prefault, None
        if self.staging_factory is not None:
            self.staging = self.staging_factory(plan["tensors"], {"format": "pt"}, device=device, file=file,
                                                first=stream_order(plan), header=self.source_header)
        else:
            buffer = prefault.take(float(self.cfg.timeouts.init)) \
                if prefault is not None and file is None else shared_buf
            made, self._prefault_file = self._prefault_file, None
            reuse = made is not None and made.take(float(self.cfg.timeouts.init))
            self.staging = Staging(plan["tensors"], {"format": "pt"}, device=device, file=file,
                                   first=stream_order(plan), header=self.source_header, buffer=buffer,
                                   reuse_file=reuse)
            if leads_from_shared and getattr(self.staging, "_anon", None) is not shared_buf:
                # Its followers read the shared file: the copy must be that memory, or they
                # would read zeros (they would fail verification, but say nothing useful).
                raise TransportFailure(f"rank {self.rank}: its shared staging memory is smaller than the copy")
            if reuse and made is not None and not self.staging.preallocated:
                self.staging.preallocated = made.preallocated  # reserved by the thread, same size
        self.phases["populate"] = self._fault_in_leader_copy() + self._map_leader_copy()
        # Buckets that are one contiguous range of the staging copy are received straight into it:
        # no pooled buffer, no unpack copy. The rest go through the pool.
        self.direct = {}
        # The ipc path copies device to device whatever the world's backend (gloo): its buckets
        # land in place too, so prepare does not hash them again on the host.
        if device == comm or self.paths.get(self.rank, ("", ""))[0] == "ipc":
            for b in range(n):
                region = self.staging.direct_region(plan.bucket_items[b], plan.buckets[b]["size"])
                if region is not None:
                    self.direct[b] = region
        needs_pool = len(self.direct) < n
        if self.paths.get(self.rank, ("", ""))[0] == "same-host":
            # Mapped (and pre-populated) before the start barrier: page-table work is set-up.
            # Ranks beside the source share its host's cores: their readers take a share each.
            self._local_reader = SourceReader(plan, readers=self.cfg.readers, direct=self.cfg.direct_io,
                                              devices=max(1, self.cfg.world_size))
        if comm != "cpu" and self.settings.verify:
            self.host_pool = BufferPool(k, largest, "cpu", pin=True)
            self.host_pool.warm(min(k, n))
        return needs_pool

    def transfer(self, plan: Plan) -> None:
        cpu0 = cpu_sample()
        t = now()
        self.internal("transfer_start")
        path = self.paths.get(self.rank, ("network", ""))[0]
        if self.rank == SRC:
            ipc = self._ipc_ranks()
            try:
                if len(self.net_ranks) > 1:
                    self._send(plan)
                elif not ipc:
                    self._serve_local(plan)
                if ipc:
                    self._send_ipc(plan)
            finally:
                # Reads are over, on every path (the ipc path's too): the pinned ring, reader
                # threads and descriptors go now (a resident rank lives on after the push); the
                # mapping stays for the digests.
                self._sources.release_readers()
            if self.published is not None:
                self._release_followers()
        elif path == "ipc":
            self._receive_ipc(plan)
        elif path == "same-host":
            self._copy_local(plan)
        elif path in ("host-copy", "shm"):
            self._copy_from_leader(plan)
        else:
            self._receive(plan)
            if self.rank in self.leader_files:
                self._release_followers()
        self.phases["transfer"] = now() - t
        self.transfer_cpu = cpu_between(cpu0, cpu_sample())  # the timeline's "which resource saturates"
        self._span(-1, "transfer", self.phases["transfer"])
        self.internal("transfer_end", seconds=self.phases["transfer"])

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
                              "staging_bytes": self.staging.data_bytes if self.staging is not None else 0,
                              "staging_disk": self.staging.disk_stats() if self.staging is not None else None,
                              "device": self._device_memory()},
                      window=self.window_stats, collectives=self.collectives, transfer_cpu=self.transfer_cpu,
                      net_streams=self.net_streams,
                      shared_staging=self.shared_staging,
                      direct_buckets=len(self.direct) if self.rank != SRC else None,
                      path=self.paths.get(self.rank, ("network", ""))[0])

    def _device_memory(self) -> dict[str, int] | None:
        """What torch's allocator holds on this rank's GPU once the transfer is over: a resident
        rank serves push after push, and anything a push leaves allocated shows here first."""
        if self.settings.device != "cuda":
            return None
        import torch

        if not torch.cuda.is_initialized():
            return None
        return {"allocated_bytes": int(torch.cuda.memory_allocated()), "reserved_bytes": int(torch.cuda.memory_reserved())}

    def remove_shm(self) -> None:
        self._unmap_leader_copy()  # a follower's view of its leader's copy: done with it after the vote
        if self._shared is not None:  # made while the world formed, never taken (a run that failed early)
            self._shared.discard()
            self._shared = None
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


def main(argv: list[str]) -> int:
    """``python -m hwtui.engine.replication.worker ANSWER_FD CONFIG_JSON`` (started by the launcher)."""
    fd = int(argv[0])
    die_with_parent()

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
