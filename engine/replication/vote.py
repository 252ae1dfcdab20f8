"""The end of a rank's run: final checks, the unanimous vote and the two-phase commit.

Every rank votes; on a unanimous yes rank 0 writes the decision record (engine.replication.commit)
and only then does every receiver switch to the new version. No rank switches on its own.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
from collections.abc import Callable

from hwtui.core.errors import HwtuiError
from hwtui.core.events import ErrorEvent
from hwtui.engine.replication.commit import write_decision
from hwtui.engine.replication.plan import Plan, manifest_of
from hwtui.engine.replication.rank_base import SRC, now
from hwtui.engine.replication.rank_signals import GATE
from hwtui.engine.replication.verify import RankVerify


class RankCommit(RankVerify):
    # A receiver that serves from device memory (a GPU-resident agent's rank, engine.resident)
    # votes once its device copy is whole and verified; its disk copy is made durable and switched
    # to after the commit (``persist``), off the vote's path. Everywhere else the disk copy is
    # what is served, so it is fsynced before the vote.
    defer_durable = False
    switch_owed = False  # decided, the disk switch still to do (persist)
    prepare_owed = False  # the disk's prepare too (a device staging copy: nothing on disk before persist)

    def prepare(self, plan: Plan) -> bool:
        t = now()
        if self.rank == SRC and self.settings.verify:
            self._check_sources(plan)
        if self.rank != SRC and not self.failures:
            kept = [tt["name"] for tt in plan["tensors"] if not tt["send"]]
            if kept:
                self._copy_kept(kept)
            if self.settings.verify:
                self._verify_staging(plan)
            if self.served and not self.failures and self.defer_durable and self.staging.written_at_flush:
                # A staging copy in device memory has no file until its flush writes it whole: its
                # manifest and CURRENT are written with it, after the commit (persist).
                self.prepare_owed = True
            elif self.served and not self.failures:
                if not self.defer_durable:
                    self.staging.flush()
                if not self.staging.still_at_path():
                    self.failures.append(f"rank {self.rank}: the staging copy {self.staging.file} was replaced "
                                         "since it was written; it is not switched to")
                    self.emit(ErrorEvent(message=self.failures[-1], rank=self.rank, where="commit"))
            if self.served and not self.failures and not self.prepare_owed:
                try:
                    self.served.prepare(plan["version"], manifest_of(plan))
                except (OSError, HwtuiError) as exc:
                    # Caught before the vote, a rank that cannot switch makes every rank abort.
                    self.failures.append(f"rank {self.rank} cannot switch to {plan['version']!r} under "
                                         f"{self.served.root}: {getattr(exc, 'strerror', None) or exc}")
                    self.emit(ErrorEvent(message=self.failures[-1], rank=self.rank, where="commit"))
        self.phases["prepare"] = now() - t
        ok = not self.failures
        self.internal("prepared", ok=ok, detail="; ".join(self.failures)[:500])
        self.faults.at_phase("prepare")
        return ok

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

        t = now()
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
                if self.served is not None and self.defer_durable:
                    self.switch_owed = True  # the device serves it now; the disk follows (persist)
                elif self.served is not None:
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
        self.phases["commit"] = now() - t
        return unanimous and (decided or not self.cfg.commit) and not self.failures

    def persist(self, plan: Plan, should_stop: Callable[[], bool] | None = None) -> None:
        """The disk half of a deferred commit: the staging copy made durable, then switched to.

        ``should_stop``: a newer push is waiting (a resident receiver's agent asked). Asked before
        the write, between its chunks and before the switch, it raises staging.WriteStopped and
        nothing is switched: the disk keeps the version it had, the device serves this one, and
        the newer push's copy is the next one made durable.

        Runs after the push is reported, with SIGTERM deferred as during a switch (a stopping
        agent waits for it, bounded). A failure is the caller's to report: a copy written through
        the page cache stays, with its decision record, and the agent finishes the switch from
        them (recovery.finish, which hashes the copy again) before its next push, at its next
        start, or when this rank is gone; a copy in device memory dies with the rank."""
        assert self.served is not None and self.switch_owed
        with GATE.held(True):
            self.faults.at_phase("persist")
            self.staging.flush(should_stop)
            if not self.staging.still_at_path():
                # Replaced since it was verified (a link, another file): never published. The agent
                # finds it at its next start, where its hash against the plan decides.
                raise HwtuiError(f"the staging copy {self.staging.file} was replaced while it was written; "
                                 "it is not switched to")
            if self.prepare_owed:
                self.served.prepare(plan["version"], manifest_of(plan))
                self.prepare_owed = False
                self.before_switch(plan)
            self.served.commit(plan["version"], plan.digest)
            self.switch_owed = False
            self.switched = True

    def before_switch(self, plan: Plan) -> None:
        """A deferred disk switch's copy is durable and prepared: the last step before the renames
        (a resident receiver records the decision on its node here)."""

    def _tally(self, plan: Plan) -> None:
        """Joined worlds (torchrun, srun, mpirun, agents): rank 0's launcher cannot read the other
        nodes' disks, so each rank leaves what it serves now in the world's store and rank 0 reports
        every receiver's (it printed "all 0 receivers switched" before). Through the store, not a
        collective: a rank that died after the decision costs at most the commit timeout and is
        reported as unknown; it never turns a decided commit into a failure here."""
        import torch.distributed as dist

        self._tallies = getattr(self, "_tallies", 0) + 1  # resident ranks vote once per push
        prefix = f"hwtui-tally/{plan['version']}/{str(plan.digest)[:16]}/{self._tallies}"
        serves = plan["version"] if self.switch_owed else None  # served from the device; the disk follows
        if self.served is not None and serves is None:
            with contextlib.suppress(HwtuiError):
                serves = self.served.current_version()
        try:
            store = dist.distributed_c10d._get_default_store()
            store.set(f"{prefix}/{self.rank}", json.dumps({"serves": serves}))
            if self.rank != SRC:
                return
            keys = [f"{prefix}/{r}" for r in range(1, self.world)]
            # HWTUI_TALLY_WAIT_S (default: the commit timeout): tests of agent pushes, whose resident
            # tally feeds no report, set it short instead of waiting out each stopped rank.
            wait = float(os.environ.get("HWTUI_TALLY_WAIT_S") or self._timeout("commit").total_seconds())
            with contextlib.suppress(Exception):  # a timeout: whoever did not report is unknown
                store.wait(keys, datetime.timedelta(seconds=wait))
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

