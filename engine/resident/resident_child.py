"""The resident replication rank: one long-lived interpreter per agent, torch imported once.

It reads push commands (JSON lines) on stdin and answers on its answer pipe. The first push of a
world forms the process group (``init_process_group``); every later push into the same world reuses
it -- only the settings and the plan digest are agreed again (world.RankWorld._agree) -- which is what
makes a second push cost little more than its transfer. The plan is a file the agent wrote and
checked; this rank loads it with the digest the agent put in its ``WorkerConfig``. Each push runs the replication worker's own phases (``engine.replication.worker``:
load, setup, barrier, transfer, prepare with verification, the unanimous vote and the two-phase
commit), so verification and all-or-nothing commit are exactly those of ``hwtui replicate``.

After any push that fails in the transport (a peer died, a wait timed out) the group is unusable:
the child says so and exits, and the agent starts a fresh one for the next push. It dies with the
agent (PR_SET_PDEATHSIG), so a killed agent never leaves a rank behind.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Callable
from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.core.events import ErrorEvent
from hwtui.core.forking import die_with_parent
from hwtui.core.supervisor import AnswerPipe, LineReader, decode_message
from hwtui.engine.replication.config import WorkerConfig
from hwtui.engine.replication.rank_base import SRC
from hwtui.engine.replication.rank_signals import (
    EXIT_ABORTED,
    EXIT_BAD_INPUT,
    EXIT_BROKEN,
    EXIT_OK,
    Interrupted,
    TransportFailure,
    install_signal_gate,
)
from hwtui.engine.replication.staging import WriteStopped
from hwtui.engine.replication.worker import Worker
from hwtui.probes.distributed.replication_defaults import PERSIST_MODES

# Largest command line (a plan path and settings, never the plan itself): anything longer is garbage.
MAX_COMMAND = 1 << 20


class ResidentWorker(Worker):
    """The replication worker in a resident process: the first push forms the group, later ones reuse it.

    Only the worker's own seams are used: ``reuse_world`` (init agrees settings and the plan digest
    again, nothing else) and ``staging_factory`` (the pre-made spare staging file, engine.resident.spare),
    plus its bucket events: a bucket that is done on a receiver is in the staging copy with its
    final, verified bytes, so its byte ranges start going to disk at once (SpareStaging.written).
    """

    def __init__(self, cfg: WorkerConfig, emit: Any, slot: Any = None, persist: str = "before-vote",
                 superseded: Callable[[str], bool] | None = None):
        import torch.distributed as dist

        from hwtui.engine.resident.spare import SpareStaging

        super().__init__(cfg, emit)
        self._answer = emit  # the answer pipe itself: resident.* messages are the agent's, not events
        # A receiver filling the agent's device slot serves from it once the commit is decided:
        # with "after-commit" its disk copy is fsynced and switched to after the push is reported
        # (engine.replication.vote: persist), not before its vote.
        self.defer_durable = slot is not None and persist == "after-commit" and cfg.rank != SRC
        self.reuse_world = dist.is_initialized()
        self.staging_factory = SpareStaging
        self._bucket_ranges: list[list[tuple[int, int]]] = []
        self._slot_desc = slot  # the agent's staged device slot (engine.resident.device_served), or None
        self.slot_fill: Any = None
        # Whether the agent asked this rank to stop writing a deferred disk copy (a push of a newer
        # version is waiting): asked between the write's chunks (_persist).
        self._superseded = superseded

    def setup(self, plan: Any) -> None:
        super().setup(plan)
        if self.rank != SRC and self.staging is not None:
            layout = self.staging.layout
            self._bucket_ranges = [_merged([(layout[it["name"]][0] + it["tensor_offset"], it["nbytes"]) for it in items])
                                   for items in plan.bucket_items]
            if self._slot_desc is not None:
                self._open_slot()
            if self.defer_durable and self.staging.written_at_flush:
                # The agent reads the tensors' places for its export from this file while the
                # version is served from the device and its data not yet written (persist).
                try:
                    self.staging.write_header_only()
                except OSError as exc:
                    raise TransportFailure(f"rank {self.rank}: the staging copy's header: {exc.strerror or exc}") from None
                # Read by the agent now, before the write after the commit replaces this file.
                self._answer({"kind": "resident.staged_header", "version": plan["version"]})

    def _open_slot(self) -> None:
        """Open the agent's staged slot; a slot that cannot be opened or is too small fails the push
        here, before any byte moves (the agent frees the slot when the push ends)."""
        from hwtui.engine.replication.ipc_provider import OpenError
        from hwtui.engine.replication.ipc_wire import WireError
        from hwtui.engine.resident.slot_fill import SlotFill, SlotFillError

        try:
            self.slot_fill = SlotFill(self._slot_desc, self.cfg.local_rank)
            self.slot_fill.check_size(int(self.staging.data_bytes))
        except (OpenError, WireError, SlotFillError, OSError) as exc:
            self.close_slot()
            raise TransportFailure(f"rank {self.rank}: the agent's device slot: {exc}") from None

    def bucket(self, b: int, state: str, nbytes: int, seconds: float = 0.0) -> None:
        super().bucket(b, state, nbytes, seconds)
        if state == "done" and b < len(self._bucket_ranges):
            if hasattr(self.staging, "written"):
                self.staging.written(self._bucket_ranges[b])
            if self.slot_fill is not None:
                # Verified in the staging copy: into the device slot now, while the next bucket arrives.
                self.slot_fill.copy(self.staging.data, self._bucket_ranges[b])

    def prepare(self, plan: Any) -> bool:
        ok = bool(super().prepare(plan))
        if ok and self.slot_fill is not None:
            try:
                # The staging copy is whole and verified: what no bucket carried goes in too, and
                # every copy is waited for, before this rank may vote yes.
                self.slot_fill.fill_rest(self.staging.data, int(self.staging.data_bytes))
            except (RuntimeError, OSError) as exc:
                self.failures.append(f"rank {self.rank}: filling the device slot failed: {str(exc)[:200]}")
                self.emit(ErrorEvent(message=self.failures[-1], rank=self.rank, where="device"))
                ok = False
        return ok

    def close_slot(self) -> None:
        if self.slot_fill is not None:
            fill, self.slot_fill = self.slot_fill, None
            fill.close()

    def _decide(self, plan: Any) -> bool:
        """The vote's outcome, recorded on this receiver's node too before it switches.

        The source's record is the authority, but it is on another node: an agent killed between
        the decision and its rank's switch finds this one at its next start and finishes the
        switch from its verified staged copy (engine.resident.recovery) instead of staying behind."""
        decided = super()._decide(plan)
        # A copy whose disk prepare waits for its write (a device staging copy with --persist
        # after-commit) is nothing to finish from yet: its record is written with it (before_switch),
        # and two fsyncs leave the vote's path.
        if decided and self.rank != SRC and self.cfg.out and not self.prepare_owed:
            self._record_decision(plan)
        return decided

    def before_switch(self, plan: Any) -> None:
        if self.cfg.out:
            self._record_decision(plan)

    def _record_decision(self, plan: Any) -> None:
        from hwtui.engine.replication.commit import write_decision

        assert self.cfg.out is not None
        try:
            write_decision(self.cfg.out, plan["version"], plan.digest, [self.rank])
        except OSError as exc:  # the switch goes on; a pusher's --resume can still settle this node
            self.emit(ErrorEvent(message=f"rank {self.rank}: the decision for {plan['version']!r} could not "
                                         f"be recorded on this node: {exc.strerror or exc}", rank=self.rank,
                                 where="commit"))

    def collective_timeout(self, seconds: float) -> None:
        """Bound every later collective of this rank's groups by ``seconds`` (gloo's own timeout).

        The group was formed with the init timeout, and gloo holds a collective for the group's
        timeout whatever ``work.wait`` is given: a survivor of a dead peer sat in its broadcast for
        up to a minute. During the transfer and the vote each wait is a bucket's (or the commit's)."""
        import datetime

        import torch.distributed as dist

        if not dist.is_initialized():
            return
        span = datetime.timedelta(seconds=seconds)
        for group in (None, *(g for g in (self.net_group, self.host_group) if g is not None)):
            with contextlib.suppress(Exception):  # a private torch API: without it, the old bound holds
                dist.distributed_c10d._set_pg_timeout(span, group)

    def tidy(self, plan: Any = None) -> None:
        """After a push is reported: the disk half of a deferred commit, then unmap the staging
        copy and the device slot and drop the push's sub-groups."""
        if self.switch_owed and plan is not None:
            self._persist(plan)
        self.close_slot()
        if self.staging is not None:
            self.staging.close()
        self.release_groups()

    def _persist(self, plan: Any) -> None:
        """Make the committed version durable on disk and switch the disk to it; the agent hears
        how it went (``resident.persist``) and serves from the device meanwhile.

        Any failure is reported, never a traceback that takes the rank down: a device copy's flush
        copies the whole model to the host first, which can fail as RuntimeError (no host memory,
        a CUDA error). A SIGTERM deferred through the write surfaces as Interrupted after it: the
        outcome is reported first, then the rank stops as asked."""
        t = time.perf_counter()
        version = plan["version"]

        def report(ok: bool, error: str = "", superseded: bool = False) -> None:
            self._answer({"kind": "resident.persist", "ok": ok, "version": version,
                          **({"error": error[:300]} if error else {}), **({"superseded": True} if superseded else {}),
                          "seconds": round(time.perf_counter() - t, 3)})

        try:
            asked = self._superseded
            self.persist(plan, (lambda: asked(version)) if asked is not None else None)
        except WriteStopped:
            # Not a failure: the device serves the version, the disk the one before, and the newer
            # push's copy is the next made durable. The unfinished file is never switched to; the
            # agent discards it with the staged copies before that push.
            report(False, f"rank {self.rank}: the write of {version} to disk stopped for a newer push", superseded=True)
            return
        except Interrupted:
            if self.switch_owed:
                report(False, f"rank {self.rank}: stopped before {version} was written to disk")
            else:
                report(True)  # written and switched; the stop surfaced as the write's gate opened
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the agent; the device serves the version meanwhile
            what = (getattr(exc, "strerror", None) or str(exc)) if isinstance(exc, (OSError, HwtuiError)) \
                else f"{type(exc).__name__}: {exc}"
            report(False, f"rank {self.rank}: {version} is served from the device but could not be written to disk: "
                          f"{what}; the staged copy is kept (the agent finishes it before its next push, or at its next "
                          "start)")
            return
        report(True)

    def release_groups(self) -> None:
        """Drop this push's sub-groups (same-host/hierarchical paths): the next push makes its own."""
        import torch.distributed as dist

        for group in {id(g): g for g in (self.net_group, self.host_group) if g is not None}.values():
            with contextlib.suppress(Exception):
                dist.destroy_process_group(group)
        self.net_group = self.host_group = None


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, nbytes) ranges with touching neighbours joined: one writeback call per contiguous run."""
    out: list[tuple[int, int]] = []
    for off, n in sorted(ranges):
        if out and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((off, n))
    return out


def _nothing() -> None:
    pass


def run_push(cfg: WorkerConfig, emit: Any, slot: Any = None, persist: str = "before-vote",
             superseded: Callable[[str], bool] | None = None) -> tuple[int, bool, Callable[[], None]]:
    """One push on this rank: (exit code as the worker's EXIT_*, whether the group is still usable,
    what is left to do once the push is reported).

    Unmapping the staging copy and dropping the push's sub-groups (30-130 ms for 1 GB on a busy
    node) come after the report: the pusher waits for every node's "done", not for this tidying.
    The next push's command waits in the channel until it is over."""
    w = ResidentWorker(cfg, emit, slot, persist, superseded)
    plan: Any = None
    try:
        if not w.reuse_world:
            w.start_world()  # torch is imported already; the rendezvous overlaps the plan load
        else:
            w.collective_timeout(cfg.timeouts.init)  # the agreement waits for every rank's start
        plan = w.load()
        w.init(plan)
        w.setup(plan)
        w.barrier()
        w.collective_timeout(max(cfg.timeouts.bucket, cfg.timeouts.commit))
        w.internal("ready")
        w.transfer(plan)
        ok = w.prepare(plan)
        unanimous = w.vote_and_commit(plan, ok)
        w.remove_shm()
        if not unanimous:
            w.close_slot()  # before the report: the agent frees the slot once it hears the push failed
        w.result(ok=unanimous, clean=True)
        return (EXIT_OK if unanimous else (EXIT_BAD_INPUT if w.bad_input else EXIT_ABORTED)), True, \
            lambda: w.tidy(plan)
    except HwtuiError as exc:
        w.emit(ErrorEvent(message=str(exc), rank=w.rank, where="input"))
        w.bad_input = True
        w.close_slot()
        w.cleanup_staging()
        w.result(ok=False, clean=False)
        # Bad input seen before the group was touched leaves it usable only if every rank saw it
        # too; we cannot know that here, so start afresh.
        return EXIT_BAD_INPUT, False, _nothing
    except Interrupted as exc:  # SIGTERM from the agent (an abort, or the agent shutting down)
        w.emit(ErrorEvent(message=f"rank {w.rank}: {exc}", rank=w.rank, where="signal"))
        w.close_slot()
        w.cleanup_staging()
        w.result(ok=False, clean=False)
        return EXIT_BROKEN, False, _nothing
    except TransportFailure as exc:
        w.emit(ErrorEvent(message=str(exc), rank=w.rank, where="transport"))
        w.close_slot()
        w.cleanup_staging()
        w.result(ok=False, clean=False)
        return EXIT_BROKEN, False, _nothing
    except Exception as exc:  # noqa: BLE001 - report, never a bare traceback
        w.emit(ErrorEvent(message=f"rank {w.rank}: {type(exc).__name__}: {exc}", rank=w.rank, where="internal"))
        w.close_slot()
        w.cleanup_staging()
        w.result(ok=False, clean=False)
        return EXIT_BROKEN, False, _nothing
    finally:
        if w._hash_pool is not None:
            w._hash_pool.shutdown(wait=False, cancel_futures=True)


SPARE_HOLD_ENV = "HWTUI_TEST_SPARE_HOLD"  # tests only: making a spare waits for the next command (bounded)


def _held(stop: Callable[[], bool], bound_s: float = 30.0) -> Callable[[], bool]:
    """``stop``, except that it returns only once a command is waiting (or after ``bound_s``): a
    spare held mid-way for a test's next push to arrive while it is being made."""

    def wait_for_command() -> bool:
        deadline = time.monotonic() + bound_s
        while not stop():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    return wait_for_command


def _make_spare(cfg: WorkerConfig, emit: Any, stop: Callable[[], bool]) -> None:
    """Idle work after a committed push: the next push's staging file, the size of this version.

    Only where the next push can use it: a staging copy on the host written as it arrives (a push
    staged in device memory writes its file whole at its flush and never takes a spare, so making
    one after it only loaded the disk and delayed the next push). Given up, its temporary file
    gone, as soon as ``stop`` says a push is waiting."""
    from hwtui.engine.replication.commit import ServedDir
    from hwtui.engine.replication.staging import AT_FLUSH_ENV
    from hwtui.engine.resident.spare import SpareStopped, make_spare

    if os.environ.get(SPARE_HOLD_ENV):
        stop = _held(stop)
    if cfg.settings.device != "cpu" or os.environ.get(AT_FLUSH_ENV) == "at-flush":
        emit({"kind": "resident.spare", "state": "skipped", "reason": "this push staged in device memory"})
        return
    t = time.perf_counter()
    try:
        if cfg.out is None:
            raise KeyError("out")
        served = ServedDir(cfg.out, cfg.rank)
        cur = served.current() or {}
        size = os.path.getsize(served.root / cur["file"]) if cur.get("file") else 0
        make_spare(served.root.resolve(), size, stop)
    except SpareStopped as exc:
        emit({"kind": "resident.spare", "state": "stopped", "reason": str(exc)})
        return
    except Interrupted:
        raise  # the agent stopping this rank: not the spare's failure
    except Exception as exc:  # noqa: BLE001 - idle work: a failure is reported, never the rank's end
        # A full disk (HwtuiError from its preallocation), an unreadable CURRENT (HwtuiError), a
        # record whose "file" is not a name (TypeError): each ended the rank with a traceback.
        why = str(exc) if isinstance(exc, (OSError, HwtuiError)) else f"{type(exc).__name__}: {exc}"
        emit({"kind": "resident.spare", "state": "failed", "reason": why[:200]})
        return
    emit({"kind": "resident.spare", "state": "ready", "bytes": size, "seconds": round(time.perf_counter() - t, 3)})


def _quiet_when_unheard(send: Callable[[Any], None]) -> Callable[[Any], None]:
    """``send``, dropping messages once the agent has closed its end of the answer pipe.

    The agent closes it when it stops this rank (an abort, or the agent shutting down on SIGTERM)
    without waiting for the last report. The rank still has its own cleanup to do (the staging
    copy goes, the exit is quiet): a BrokenPipeError escaping from a report mid-cleanup printed a
    traceback into the agent's log and cut the cleanup short. Nobody is left to tell: the rank
    ends when its command channel closes (or with its agent, PR_SET_PDEATHSIG)."""
    heard = [True]

    def quiet(msg: Any) -> None:
        if not heard[0]:
            return
        try:
            send(msg)
        except BrokenPipeError:
            heard[0] = False

    return quiet


def main(argv: list[str]) -> int:
    fd = int(argv[0])
    die_with_parent()

    emit = _quiet_when_unheard(AnswerPipe(fd).send)

    # The same gate as a replicate rank: SIGTERM (the agent stopping this rank: an abort, or the
    # agent shutting down) waits until the vote and the switch are done, so a rank is never
    # stopped half-way through renaming a version into place. Elsewhere it interrupts at once.
    stopping = install_signal_gate()
    try:
        _serve(emit, stopping)
    except Interrupted:
        pass  # stopped between pushes: nothing in flight
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(emit: Any, stopping: list[int]) -> None:
    """Take pushes from the agent until it closes the channel; ``stopping`` is set by the signal handler."""
    t = time.perf_counter()
    import torch  # noqa: F401 - the point of a resident rank: paid once, here
    import torch.distributed  # noqa: F401

    emit({"kind": "resident.ready", "import_s": round(time.perf_counter() - t, 3), "pid": os.getpid()})
    reader = LineReader(MAX_COMMAND)
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    lines: list[bytes] = []

    def command_waiting() -> bool:
        """A command (or the channel's end) is waiting: idle work stops for it."""
        return bool(lines) or bool(select.select([stdin], [], [], 0)[0])

    def superseded(version: str) -> bool:
        """Whether the agent asked this rank to stop writing ``version``'s deferred disk copy
        (resident.supersede: a push of a newer version is waiting). What is waiting in the channel
        is read, without waiting, into ``lines`` (the loop below takes the commands in order
        afterwards); the channel's end is not such a request: the write goes on, as it would
        without a channel."""
        while select.select([stdin], [], [], 0)[0]:
            chunk = stdin.read(65536)
            if not chunk:
                break
            lines.extend(reader.feed(chunk))
        asked = False  # the agent's last word on it counts: a push refused after asking withdraws
        for line in lines:
            msg = decode_message(line) or {}
            if msg.get("kind") == "resident.supersede" and msg.get("version") == version:
                asked = not msg.get("withdrawn")
        return asked

    while True:
        chunk = stdin.read(65536)
        if not chunk:
            break  # the agent closed the channel (or died): nothing more to do
        lines = list(reader.feed(chunk))
        while lines:
            line = lines.pop(0)
            cmd = decode_message(line)
            if not cmd or cmd.get("kind") != "resident.push" or not isinstance(cmd.get("cfg"), str):
                continue
            push_id = cmd.get("push_id")
            try:
                cfg = WorkerConfig.from_json(cmd["cfg"])
            except HwtuiError as exc:
                # The agent built it: a mismatch means two hwtui installs; this rank cannot take part.
                emit(ErrorEvent(message=f"resident rank: {exc}", where="input").to_dict())
                code, usable, tidy = EXIT_BAD_INPUT, False, _nothing
            else:
                persist = str(cmd.get("persist")) if cmd.get("persist") in PERSIST_MODES else "before-vote"
                code, usable, tidy = run_push(cfg, emit, cmd.get("slot"), persist, superseded)
            emit({"kind": "resident.done", "push_id": push_id, "code": code, "usable": usable})
            tidy()
            if usable and code == EXIT_OK and cfg.rank != SRC:
                _make_spare(cfg, emit, command_waiting)
            if not usable:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)  # a broken gloo group can block forever in its destructor
            if stopping:
                return  # a signal during a push ends this rank once the push is reported


if __name__ == "__main__":
    main(sys.argv[1:])
