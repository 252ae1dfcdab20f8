"""The agent's side of a hot push: the resident rank's lifecycle, its state and its two version slots.

Layout under the agent's ``--out DIR``::

    served/CURRENT, served/versions/<v>/...   what this node serves (engine.replication.commit.ServedDir)
    served/SLOTS                              {"A": v, "B": v, "serving": "A"|"B"}: two version slots
    ranks/rank<R> -> ../served                the worker keeps a rank's versions in OUT/rank<R>; the
                                              link keeps this node's versions in one place whatever
                                              rank a push gives it
    served/staging/<v>                        the version a push is receiving (or a prepared copy
                                              whose switch is still owed: engine.resident.recovery)
    ranks/decisions/<v>.json                  the decision record for <v>: the source's (the
                                              authority), and each receiver's copy, written
                                              when it learns the decision, before it switches
    pushes/<push id>.plan                     the plan file of a push (its digest checked before it is accepted)
    pushes/upload-<digest>.plan               plans uploaded by digest (POST /v1/push/plan), the newest few

A push writes the new version next to the served one (the slot not serving); only after every rank
voted yes does CURRENT switch, and only then is the version the new slot held before removed. So a
node always has its served version intact and at most two versions on disk, plus the copy of the
one push it is receiving. What a dead agent left (a staging copy, its push's plan file) is finished
or removed by the decision record when the agent starts again (``_recover``), and a new push
removes any staged copy an earlier one left.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import json
import os
import re
import shutil
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwtui.core.atomic import atomic_open, atomic_write_text
from hwtui.core.errors import HwtuiError
from hwtui.core.private_file import create_private
from hwtui.core.redact import redact_text
from hwtui.core.supervisor import Child, Group, exit_text
from hwtui.engine.resident import recovery
from hwtui.probes.distributed.replication_defaults import (
    DEFAULT_CHUNK_MB,
    DEFAULT_INIT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WINDOW,
    MAX_CHUNK_MB,
    MAX_TIMEOUT_S,
    MAX_WINDOW,
    PERSIST_MODES,
)

if TYPE_CHECKING:
    from hwtui.engine.replication.config import Timeouts, WorkerConfig
    from hwtui.engine.replication.settings import ReplicationSettings
    from hwtui.engine.resident.device_served import DeviceServed, Exported

_DIGEST = re.compile(r"^[0-9a-f]{16,128}$")
_PUSH_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_START_TIMEOUT_S = 120.0  # importing torch on a loaded node
# How long a push (or a resolve) waits for the last push's disk copy (--persist after-commit) before
# it is refused: under the pusher's own 180 s for its start request. HWTUI_TEST_PERSIST_WAIT_S
# (tests only) shortens it, so the refusal is tested without waiting two minutes.
PERSIST_WAIT_S = 120.0
MAX_PLAN_BYTES = 1 << 30  # one uploaded plan file (a plan of millions of tensors is tens of MB)
KEEP_UPLOADS = 4  # uploaded plans kept by digest (a retry need not send it again); older ones go
# Versions served from the device and replaced before their disk copy was written (MOVED_ON), kept
# so that a --resume of one is refused as going back; a version older than these is long evicted.
MAX_MOVED_ON = 64
MOVED_ON_WHY = "the record of a version this node moved on from (served/MOVED_ON) could not be written"


def _persist_wait_s() -> float:
    try:
        return min(PERSIST_WAIT_S, max(0.0, float(os.environ.get("HWTUI_TEST_PERSIST_WAIT_S") or PERSIST_WAIT_S)))
    except ValueError:
        return PERSIST_WAIT_S


class PushRefused(Exception):
    """A push request this agent cannot take: (HTTP status, one-line reason)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise PushRefused(400, message)


def _is_version(v: Any) -> bool:
    from hwtui.engine.replication.plan_legacy import check_version

    try:
        check_version(v, "version")
    except HwtuiError:
        return False
    return True


def free_port(address: str) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _remove_in_background(path: Path) -> None:
    threading.Thread(target=shutil.rmtree, args=(path,), kwargs={"ignore_errors": True}, name="evict",
                     daemon=True).start()


AGENT_LOCK = ".lock.agent"


def lock_agent_out(out: Path) -> int:
    """An exclusive flock on ``<out>/.lock.agent`` for this agent's life (its descriptor): one agent
    per --out. A second agent says who has it; a killed agent leaves no stale lock."""
    from hwtui.engine.replication.commit import LockHeld, flock_with_pid

    try:
        out.mkdir(parents=True, exist_ok=True)
        return flock_with_pid(out / AGENT_LOCK)
    except LockHeld as held:
        raise HwtuiError(f"--out {out} is in use by another agent (pid {held.holder}); stop it or choose another "
                         "--out") from None
    except OSError as exc:
        raise HwtuiError(f"--out {out} cannot hold this agent's lock: {exc.strerror or exc}") from None


def push_settings(settings: dict[str, Any], device_kind: str | None = None) -> tuple[ReplicationSettings, Timeouts]:
    """A push's settings, as the pusher sent them (untrusted JSON), into the rank's typed settings.

    The wire keeps the command line's name for the window (``inflight``); every default and maximum
    is the one ``hwtui replicate`` and ``hwtui push`` use (probes/distributed/replication_defaults.py).
    Anything out of bounds is refused (HTTP 400) before a rank is told anything."""
    from hwtui.engine.replication.config import Timeouts
    from hwtui.engine.replication.settings import MB, ReplicationSettings

    def number(key: str, default: float, lo: float, hi: float) -> float:
        v = settings.get(key, default)
        _need(isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi,
              f"settings.{key} must be a number from {lo:g} to {hi:g}")
        return float(v)

    device = settings.get("device", "cpu")
    _need(device in ("cpu", "cuda"), "settings.device must be cpu or cuda")
    # cuda: the push moves device buffers (CUDA IPC inside one node, NCCL between nodes) into
    # agents that keep the served version on the GPU; the pusher asks it only of such agents.
    _need(device == "cpu" or device_kind == "cuda",
          "settings.device cuda: this node keeps no version on a GPU (start its agent with --device cuda)")
    number("nodes", 1, 1, 4096)
    repl = ReplicationSettings(window=int(number("inflight", DEFAULT_WINDOW, 1, MAX_WINDOW)), max_inflight_bytes=None,
                               adaptive=False, chunk_bytes=int(number("chunk_mb", DEFAULT_CHUNK_MB, 1, MAX_CHUNK_MB) * MB),
                               verify=bool(settings.get("verify", True)), device=device)
    init = number("init_timeout", DEFAULT_INIT_TIMEOUT_S, 1, MAX_TIMEOUT_S)
    timeout = number("timeout", DEFAULT_TIMEOUT_S, 0.5, MAX_TIMEOUT_S)
    return repl, Timeouts(init=init, bucket=timeout, commit=timeout)


SPARE_STATES = ("ready", "failed", "skipped", "stopped")


def _spare_state(msg: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The rank's word on the next push's spare staging file (engine.resident.spare), as served:
    ready (its bytes and seconds), failed, skipped (pushes stage in device memory and would not
    use one) or stopped (given up because a push arrived: ``stopped`` counts those, so an operator
    sees pushes coming faster than the disk makes spares)."""
    state = msg.get("state") if msg.get("state") in SPARE_STATES else "failed"
    stopped = int(before.get("stopped") or 0) + (state == "stopped")
    if state == "ready":
        return {"state": state, "bytes": msg.get("bytes"), "seconds": msg.get("seconds"), "stopped": stopped}
    return {"state": state, "reason": str(msg.get("reason") or "")[:200], "stopped": stopped}


def push_transport(device: str, nodes: int) -> Any:
    """What carries a push's bytes. Host memory: gloo, as between hosts (receivers on the source's
    host copy its pages). A push into GPU-resident agents (every agent ``--device cuda``): inside one
    node CUDA IPC (the world is gloo, for control and votes: NCCL refuses two ranks on one GPU),
    across nodes NCCL (CUDA IPC stops at the node)."""
    from hwtui.engine.replication.transport import choose_transport

    if device == "cuda":
        return choose_transport("cuda", None, multi_node=nodes > 1, shared_gpu=nodes == 1)
    return choose_transport("cpu", None, multi_node=True)


def host_identity() -> str:
    """This node and user, as the ipc path tells them apart (boot id, network namespace, uid),
    hashed: the pusher counts the nodes of a push from its agents' answers."""
    import hashlib

    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read(64).strip()
    except OSError:
        boot = ""
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return hashlib.sha256(f"{boot}|{netns}|{os.geteuid()}".encode()).hexdigest()[:16]


class ResidentRank:
    def __init__(self, *, node: str, out: str | os.PathLike[str], advertise: str, serve_group: str | None = None,
                 readers: int | None = None, direct_io: str = "auto", device_slots: str | None = None,
                 persist: str = "after-commit"):
        from hwtui.engine.replication.served_files import serve_modes

        self.node = node
        # --serve-group: who may read the versions this node serves (resolved here, on this host:
        # an unknown group fails the agent's start, not a push). Every path that publishes a
        # version uses it: the rank's own commit and a switch finished from a staged copy.
        self.serve_group = serve_group
        self.modes = serve_modes(serve_group)
        # `hwtui agent --readers/--direct-io`: how this node reads weight files when it is a push's
        # source; a push's own settings.readers / settings.direct_io win.
        self.readers, self.direct_io = readers, direct_io
        self.out = Path(out).resolve()
        # Before anything under --out is touched: a second agent started on it (a mistaken
        # second start, a service manager's retry) ran the recovery below on the live agent's
        # files -- its half-made spare, its staged push, its plan files -- and only then failed
        # on its port.
        self._out_lock = lock_agent_out(self.out)
        self.served = self.out / "served"
        self.ranks_out = self.out / "ranks"  # the worker's --out: decisions/<v>.json live here
        self.advertise = advertise
        self._lock = threading.Lock()
        # Notified whenever the push in flight changes phase or ends: what /v1/push/wait waits on.
        self._changed = threading.Condition(self._lock)
        self.child: Child | None = None
        self.world_key: str | None = None
        self.busy = False
        self.in_flight: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None
        self.pushes: Counter[str] = Counter()
        self.child_starts = 0
        self.spare: dict[str, Any] = {"state": "none"}  # the next push's pre-made staging file (engine.resident.spare)
        # `hwtui agent --persist` (GPU-resident receivers only): "after-commit" makes the disk copy
        # durable after the push is reported, not before the vote (engine.replication.vote). Until
        # the rank says it is done, this node serves the version from its device slot and owes
        # the disk its switch (``_owed``: version, plan digest); ``persist`` says how it went.
        _need(persist in PERSIST_MODES, f"persist must be one of {', '.join(PERSIST_MODES)}")
        self.persist_mode = persist
        self.persist: dict[str, Any] = {"state": "none"}
        self._owed: tuple[str, str] | None = None
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="resident-spawner")
        self._flight_child: Child | None = None  # the child running the push in flight
        self._done_bytes = 0
        self._result: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._group: Group | None = None
        for d in (self.served, self.out / "ranks", self.out / "pushes"):
            d.mkdir(parents=True, exist_ok=True)
        if (self.served / ".trash").exists():  # evictions an agent stopped before they were deleted
            _remove_in_background(self.served / ".trash")
        self.recovered = self._recover()
        # --device cuda: the served version also lives in device memory, in two slots this agent
        # holds (engine.resident.device_served); "host" is the memfd stand-in of CPU tests.
        self.device: DeviceServed | None = None
        self._layouts: dict[str, dict[str, Any]] = {}
        self._staged_layout: tuple[str, dict[str, Any]] | None = None  # a device copy's, read at its set-up
        if device_slots is not None:
            from hwtui.engine.resident.device_served import DeviceServed

            self.device = DeviceServed(device_slots)
            self._device_follow_disk()

    # ------------------------------------------------------------------ state

    def serving(self) -> str | None:
        """The version this node serves: a committed one the disk still owes its switch (served
        from the device slot meanwhile), else what the disk's CURRENT names."""
        owed = self._owed
        return owed[0] if owed is not None else self._disk_serving()

    def _disk_serving(self) -> str | None:
        try:
            raw = json.loads((self.served / "CURRENT").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return raw.get("version") if isinstance(raw, dict) else None

    def slots(self) -> dict[str, Any]:
        try:
            raw = json.loads((self.served / "SLOTS").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = None
        return raw if isinstance(raw, dict) else {"A": self.serving(), "B": None, "serving": "A" if self.serving() else None}

    def state(self) -> dict[str, Any]:
        with self._lock:
            flight = dict(self.in_flight) if self.in_flight else None
            last = dict(self.last) if self.last else None
            warm = self.child is not None and self.child.running and self.world_key is not None
            return {"serving": self.serving(), "slots": self.slots(), "in_flight": flight, "last": last,
                    "pushes": dict(self.pushes), "spare": dict(self.spare), "persist": dict(self.persist),
                    "staged": recovery.staged(self.served, self.ranks_out), "recovered": list(self.recovered),
                    "resident": {"warm": warm, "starts": self.child_starts,
                                                               "pid": self.child.pid if warm and self.child else None},
                    **({"device": self.device.state()} if self.device is not None else {})}

    # ------------------------------------------------------------------ requests

    def prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        """Whether this node can reuse its process group for ``world_key``, and a port to form a new one on."""
        key = body.get("world_key")
        _need(isinstance(key, str) and 0 < len(key) <= 4096, "world_key must be a string")
        version = body.get("version")
        _need(version is None or (isinstance(version, str) and _is_version(version)),
              "version must be a version name")
        with self._lock:
            warm = (self.child is not None and self.child.running and self.world_key == key and not self.busy)
            busy = self.busy
        answer = {"node": self.node, "warm": warm, "busy": busy, "advertise": self.advertise,
                  "port": free_port(self.advertise), "host": host_identity(),
                  "device": "cuda" if self.device is not None and self.device.kind == "cuda" else "cpu",
                  # A consumer's hold on the slot this push would be received into (slot_holds):
                  # the pusher refuses (or waits, --wait-holds) before any rank starts.
                  # None for a version the device serves already (its push brings bytes to disk only).
                  "slot_held": self.device.slot_held()
                  if self.device is not None and not (version and self._device_serves(version)) else None,
                  **self._holds(version)}
        return answer

    def _holds(self, version: str | None) -> dict[str, Any]:
        """What this node serves, read from its disk, and (with ``version``) what it holds of that
        version: the pusher's read-back, before a push (what to finish, what to skip) and after it."""
        try:
            cur = recovery.served_dir(self.served, self.modes).current() or {}
        except HwtuiError:
            cur = {}
        # A version still being written counts as served (it will be, on disk, in seconds); one whose
        # write failed does not: the pusher's --resume must see the disk without it, or it would
        # skip this node as "already served" and leave a restart to roll it back.
        owed = self._owed if self.persist.get("state") == "writing" else None
        out: dict[str, Any] = {"serving": owed[0] if owed else cur.get("version"),
                               "serving_digest": owed[1] if owed else cur.get("plan_digest"),
                               "staged": recovery.staged(self.served, self.ranks_out)}
        if version is not None:
            dec = recovery.decision(self.ranks_out, version)
            out["decision"] = {"version": version, "plan_digest": dec.get("plan_digest")} if dec else None
        return out

    def resolve(self, body: dict[str, Any]) -> dict[str, Any]:
        """Finish (``decision: commit``) or discard (``abort``) a version this node missed the end of.

        The pusher read the decision from the source's record (the authority); a node that holds
        a prepared copy of a committed version switches to it after hashing it again against its
        manifest; one without a usable copy says it needs the bytes again. ``abort`` removes a
        staged copy of a version nothing decided, never a version this node serves or has decided.
        """
        version, digest, what = body.get("version"), body.get("plan_digest"), body.get("decision")
        _need(isinstance(version, str) and _is_version(version), "version must be a version name")
        _need(isinstance(digest, str) and bool(_DIGEST.match(digest)), "plan_digest must be the plan's hex digest")
        _need(what in ("commit", "abort"), "decision must be commit or abort")
        assert isinstance(version, str) and isinstance(digest, str)
        with self._lock:
            if self.busy:
                raise PushRefused(409, f"node {self.node} is busy with push {self.in_flight and self.in_flight.get('push_id')}")
            self.busy = True
        try:
            self._await_persist()
            if what == "abort":
                local = recovery.decision(self.ranks_out, version)
                if local is not None or self.serving() == version:
                    return {"node": self.node, "done": False, "what": f"it has a decision for {version}: kept",
                            **self._holds(version)}
                recovery.discard(self.served, version)
                return {"node": self.node, "done": True, "what": "its staged copy was removed", **self._holds(version)}
            if self.serving() != version and (version in (self.slots().get("A"), self.slots().get("B"))
                                              or version in self._moved_on()):
                # It served this version before and has moved on: going back is a new version,
                # not a switch it missed (the push then refuses it as it always did).
                return {"node": self.node, "done": False, "moved_on": True, "what": f"it served {version} before "
                        "and moved on (going back is a new version)", **self._holds(version)}
            done, how = recovery.finish(self.served, self.ranks_out, version, digest, self.modes)
            if done and how != "already serves it":
                self._rotate_slots(version)
            if done:
                self._owed_written(version, how)
            if done and self.device is not None:
                self._device_follow_disk()
            return {"node": self.node, "done": done, "what": how, **self._holds(version)}
        finally:
            with self._lock:
                self.busy = False
                self._changed.notify_all()

    def _recover(self) -> list[str]:
        """At agent start: finish or discard what a dead agent left, by the decision record.

        No push is in flight here (the agent is not listening yet), so everything a push leaves
        while it runs is a dead push's: its plan file, half-received uploads, a half-made spare.
        A staged copy of a version this node has a decision for is switched to (verified first);
        one prepared but undecided here is kept (the pusher's read-back resolves it by the
        source's record: ``hwtui push --resume``); any other staged copy can never commit and goes.
        Returns what was done, in words (also in ``GET /v1/replication`` as ``recovered``)."""
        done: list[str] = []
        pushes = self.out / "pushes"
        for p in sorted(pushes.glob("*.plan")):
            if not p.name.startswith("upload-"):  # a dead push's own plan, or a half-received upload
                with contextlib.suppress(OSError):
                    p.unlink()
        from hwtui.engine.replication.served_files import own_real_dir

        spare_dir = self.served / "spare"  # engine.resident.spare: never through a link planted there
        if own_real_dir(spare_dir):
            for half_made in [spare_dir / ".spare.tmp", *spare_dir.glob(".spare.discard.*")]:
                with contextlib.suppress(OSError):
                    half_made.unlink()
        for item in recovery.staged(self.served, self.ranks_out):
            v = item["version"]
            if self.serving() == v:
                recovery.discard(self.served, v)
                continue
            dec = recovery.decision(self.ranks_out, v)
            if dec is not None and item["prepared"]:
                ok, how = recovery.finish(self.served, self.ranks_out, v, str(dec.get("plan_digest")), self.modes)
                done.append(f"{v}: {how}")
                if ok:
                    self._rotate_slots(v)
            elif item["prepared"]:
                done.append(f"{v}: a prepared copy kept, undecided here (hwtui push --resume resolves it)")
            else:
                recovery.discard(self.served, v)
                done.append(f"{v}: the staged copy of a push that ended with its agent was removed")
        cur = self.serving()
        try:
            versions = sorted(os.listdir(self.served / "versions"))
        except OSError:
            versions = []
        for v in versions:
            # Moved into versions/ but CURRENT not yet replaced: the switch of a decided version.
            dec = recovery.decision(self.ranks_out, v)
            if v != cur and dec is not None and v not in self.slots().values():
                ok, how = recovery.finish(self.served, self.ranks_out, v, str(dec.get("plan_digest")), self.modes)
                if ok:
                    done.append(f"{v}: {how}")
                    self._rotate_slots(v)
                    cur = v
        slots = self.slots()
        if cur is not None and cur not in (slots.get("A"), slots.get("B")):
            self._rotate_slots(cur)  # switched, but the agent died before it recorded the slot
        elif cur is not None and slots.get(str(slots.get("serving"))) != cur:
            slots["serving"] = "A" if slots.get("A") == cur else "B"
            atomic_write_text(self.served / "SLOTS", json.dumps(slots) + "\n")
        keep = {cur, *(self.slots().get(k) for k in ("A", "B"))}
        for v in versions:
            if v not in keep and (self.served / "versions" / v).exists():
                shutil.rmtree(self.served / "versions" / v, ignore_errors=True)
                done.append(f"{v}: a version in neither slot was removed")
        return done

    def start(self, body: dict[str, Any]) -> dict[str, Any]:
        push_id: Any = body.get("push_id")
        rank: Any = body.get("rank")
        world: Any = body.get("world_size")
        _need(isinstance(push_id, str) and bool(_PUSH_ID.match(push_id)), "push_id: 1-64 of A-Z a-z 0-9 _ . -")
        _need(type(world) is int and 2 <= world <= 4096, "world_size must be an integer from 2 to 4096")
        _need(type(rank) is int and 0 <= rank < world, "rank must be an integer in [0, world_size)")
        master: Any = body.get("master_addr")
        port: Any = body.get("master_port")
        _need(isinstance(master, str) and 0 < len(master) <= 255 and re.fullmatch(r"[A-Za-z0-9.:%_-]+", master) is not None,
              "master_addr must be a host name or an address")
        _need(type(port) is int and 0 < port < 65536, "master_port must be an integer from 1 to 65535")
        _need(isinstance(body.get("world_key"), str), "world_key must be a string")
        settings = body.get("settings") or {}
        _need(isinstance(settings, dict), "settings must be an object")
        digest: Any = body.get("plan_digest")
        _need(isinstance(digest, str) and bool(_DIGEST.match(digest)), "plan_digest must be the plan's hex digest")
        t_request = time.time()
        if body.get("plan") is None:  # uploaded before (POST /v1/push/plan): named by its digest
            incoming, plan = self._uploaded_plan(digest, validate=rank == 0)
        else:
            incoming, plan = self._receive_plan(body.get("plan"), digest, validate=rank == 0)
        plan_path = self.out / "pushes" / f"{push_id}.plan"
        with self._lock:
            if self.busy:
                with contextlib.suppress(OSError):
                    incoming.unlink()
                raise PushRefused(409, f"node {self.node} is busy with push {self.in_flight and self.in_flight.get('push_id')}")
            self.busy = True
            # The rank of the last push is no longer this push's: when a fresh push stops it, its
            # reader must not take its exit for the end of *this* push (it did, and marked the
            # node free mid-start, so an abort of this push found nothing to stop).
            self._flight_child = None
        try:
            self._settle_last_write(rank, str(plan["version"]))
            owed_copy = self._retry_owed()
            # The slot too, before any discard (a slot that cannot be had refuses the push with the
            # node as it was). None for a version the device serves already, whose disk copy was
            # lost (--persist after-commit, its write failed): the push brings the bytes to disk only.
            slot = self._stage_device(plan) if rank != 0 and not self._device_serves(str(plan["version"])) else None
            # A new push supersedes whatever an earlier one left staged (an aborted push's copy, a
            # copy kept undecided or not yet switched to): a node holds its two slots and this
            # push's copy, never more. (A decided version whose copy goes here is sent again by
            # `hwtui push --resume`, should anyone still want it.)
            for item in recovery.staged(self.served, self.ranks_out):
                if item["version"] != owed_copy:  # the copy of what this node serves, its disk write owed
                    recovery.discard(self.served, item["version"])
            # The resident rank loads it from here and checks the digest again (the worker's load).
            os.replace(incoming, plan_path)
            if rank != 0:
                link = self.out / "ranks" / f"rank{rank}"
                if not (link.is_symlink() and os.readlink(link) == "../served"):
                    tmp = link.with_name(f".{link.name}.tmp")
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
                    os.symlink("../served", tmp)
                    os.replace(tmp, link)
            t_accepted = time.time()
            warm = self._ensure_child(body["world_key"], fresh=bool(body.get("fresh")))
            cfg = self._worker_cfg(body, settings, plan_path, digest, rank, world, master, port)
            with self._lock:
                self.in_flight = {"push_id": push_id, "version": plan["version"], "rank": rank, "progress": 0.0,
                                  "bytes_done": 0, "total_bytes": plan["total_bytes"], "phase": "starting",
                                  "warm": warm, "started": time.time(), "timeline": {"request": t_request, "accepted": t_accepted},
                                  "device_slot": slot is not None,
                                  "deferred": slot is not None and self.persist_mode == "after-commit",
                                  "plan_digest": digest}
                self._done_bytes = 0
                self._result = None
                self._changed.notify_all()
            assert self.child is not None
            self._flight_child = self.child
            self.child.send({"kind": "resident.push", "push_id": push_id, "cfg": cfg.to_json(),
                             **({"slot": slot, "persist": self.persist_mode} if slot is not None else {})})
        except BaseException:
            if self.device is not None:
                self.device.rollback()
            with self._lock:
                self.busy = False
                self.in_flight = None
            for kept in (incoming, plan_path):  # the plan as it came, or where it was moved to
                with contextlib.suppress(OSError):
                    kept.unlink()
            raise
        return {"node": self.node, "accepted": True, "warm": warm}

    def abort(self, body: dict[str, Any]) -> dict[str, Any]:
        """Stop the push ``push_id`` if it is still in flight here (the pusher gave up on it).

        A rank past the vote (phase "committing": the decision is made) is never stopped here: it
        finishes its switch, so a commit is all or nothing whatever the pusher thinks it saw.
        """
        push_id = body.get("push_id")
        _need(isinstance(push_id, str) and bool(_PUSH_ID.match(push_id)), "push_id: 1-64 of A-Z a-z 0-9 _ . -")
        reason = body.get("reason")
        _need(reason is None or isinstance(reason, str), "reason must be a string")
        with self._lock:
            flight = self.in_flight or {}
            mine = self.busy and flight.get("push_id") == push_id and flight.get("phase") != "committing"
            if mine:
                flight["stopped"] = redact_text(str(reason or "the pusher gave up on it"))[:300]
        if mine:
            self._stop_child(wait_reader=True)
        return {"node": self.node, "aborted": mine, "serving": self.serving()}

    def wait(self, body: dict[str, Any]) -> dict[str, Any]:
        """This node's replication state once push ``push_id`` leaves ``phase`` (or ends), or after
        ``timeout`` s: the pusher follows a push without polling (a long poll, bounded)."""
        push_id = body.get("push_id")
        _need(isinstance(push_id, str) and bool(_PUSH_ID.match(push_id)), "push_id: 1-64 of A-Z a-z 0-9 _ . -")
        timeout = body.get("timeout", 1.0)
        _need(isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 <= timeout <= 10,
              "timeout must be a number from 0 to 10")
        seen = body.get("phase")
        deadline = time.monotonic() + float(timeout)
        with self._changed:
            while True:
                flight = self.in_flight
                if flight is None or flight.get("push_id") != push_id or flight.get("phase") != seen:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
        return self.state()

    def upload_plan(self, query: dict[str, str], length: int, read: Any) -> dict[str, Any]:
        """A plan file streamed in (``POST /v1/push/plan?digest=D[&validate=1]``, raw bytes): written to
        disk as it arrives, then loaded and checked against ``D`` (and, with ``validate=1``, against
        every plan invariant); only a plan whose bytes are that digest is kept
        (as ``pushes/upload-D.plan``), and a later ``/v1/push/start`` names it by digest alone.

        This is how a plan of any size up to ``MAX_PLAN_BYTES`` travels: a JSON request body is
        bounded far below that (and base64 in JSON costs a third more)."""
        digest = query.get("digest")
        _need(isinstance(digest, str) and bool(_DIGEST.match(digest)), "digest must be the plan's hex digest")
        assert digest is not None
        if length > MAX_PLAN_BYTES:
            raise PushRefused(413, f"the plan is {length} bytes; at most {MAX_PLAN_BYTES} are accepted")
        _need(length > 0, "the plan is empty")
        incoming = self.out / "pushes" / f".incoming-{uuid.uuid4().hex}.plan"
        try:
            # No fsync: this file lives for one push; a torn one fails its digest check on load.
            failed = self._receive_to(incoming, length, read)
            if failed is not None:
                # A full (or read-only) disk is an answer, not a dropped connection: the rest of the
                # body was read and discarded (bounded by its length and the server's deadline) so
                # the client, still sending, gets to read the refusal instead of a reset.
                with contextlib.suppress(OSError):
                    incoming.unlink()
                where = self.out / "pushes"
                if failed.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise PushRefused(507, f"node {self.node}: no space left on {where} for the plan "
                                           f"({length} bytes)")
                raise PushRefused(507, f"node {self.node}: cannot store the plan under {where}: "
                                       f"{failed.strerror or failed}")
            # validate=1: the source's agent, which checks the plan's invariants before any rank starts.
            self._load_incoming(incoming, digest, validate=query.get("validate") == "1")
            os.replace(incoming, self._upload_path(digest))
        except BaseException:
            with contextlib.suppress(OSError):
                incoming.unlink()
            raise
        uploads = sorted(self.out.glob("pushes/upload-*.plan"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in uploads[KEEP_UPLOADS:]:
            with contextlib.suppress(OSError):
                old.unlink()
        return {"node": self.node, "digest": digest, "bytes": length}

    @staticmethod
    def _receive_to(path: Path, length: int, read: Any) -> OSError | None:
        """Write the ``length`` bytes ``read`` gives to a new file ``path``; the first error writing
        it (a full disk), else None. Every byte is read either way; an error *reading* (the client
        went, or fell behind) is not caught here: it ends the request as before."""
        failed: OSError | None = None
        fh = None
        try:
            # Exclusive, owner-only, never through a symlink (core.private_file), like every file hwtui
            # makes where a receiver's weights go; closed below, where a full disk's error shows too.
            fh = os.fdopen(create_private(path), "wb")
        except OSError as exc:
            failed = exc
        left = length
        try:
            while left:
                chunk = read(left)
                left -= len(chunk)
                if failed is None and fh is not None:
                    try:
                        fh.write(chunk)
                    except OSError as exc:
                        failed = exc
        finally:
            if fh is not None:
                try:
                    fh.close()  # flushes the buffer: ENOSPC can surface only here
                except OSError as exc:
                    failed = failed or exc
        return failed

    def _upload_path(self, digest: str) -> Path:
        return self.out / "pushes" / f"upload-{digest}.plan"

    def _uploaded_plan(self, digest: str, *, validate: bool) -> tuple[Path, Any]:
        """The uploaded plan ``digest`` as this push's own file (a hard link: evicting the upload
        later cannot take it from a push in flight) and the loaded plan."""
        incoming = self.out / "pushes" / f".incoming-{uuid.uuid4().hex}.plan"
        try:
            os.link(self._upload_path(digest), incoming)
        except FileNotFoundError:
            raise PushRefused(400, f"node {self.node} has no plan {digest[:16]}: upload it first "
                                   "(POST /v1/push/plan?digest=...)") from None
        return incoming, self._load_incoming(incoming, digest, validate=validate)

    def _load_incoming(self, incoming: Path, digest: str, *, validate: bool) -> Any:
        """Load a plan file that arrived; a plan that is not ``digest`` (or not a plan) is refused and removed."""
        from hwtui.engine.replication.plan import load_plan

        try:
            return load_plan(incoming, validate=validate, expect_digest=digest)
        except HwtuiError as exc:
            with contextlib.suppress(OSError):
                incoming.unlink()
            why = str(exc).replace(f"plan {incoming}", "the pushed plan").replace(str(incoming), "the pushed plan")
            raise PushRefused(400, f"the plan is refused: {why}") from None
        except BaseException:
            with contextlib.suppress(OSError):
                incoming.unlink()
            raise

    def _receive_plan(self, encoded: Any, digest: str, *, validate: bool) -> tuple[Path, Any]:
        """The plan file a push carries (base64 of its bytes) -> (where it was written, the loaded plan).

        Its digest must be the one the pusher announced: a plan edited or cut short on the way, or
        another plan, is refused before anything else happens. Only the agent of rank 0 (the
        coordinator of the push) checks the plan's invariants; every other rank trusts the digest,
        which every rank compares with rank 0's again before any byte moves (world._agree).
        """
        _need(isinstance(encoded, str) and 0 < len(encoded), "plan must be the plan file's bytes, base64-encoded")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise PushRefused(400, "plan is not valid base64") from None
        incoming = self.out / "pushes" / f".incoming-{uuid.uuid4().hex}.plan"
        try:
            with atomic_open(incoming, "wb", encoding=None, perms=0o600) as fh:
                fh.write(raw)
        except BaseException:
            with contextlib.suppress(OSError):
                incoming.unlink()
            raise
        del raw
        return incoming, self._load_incoming(incoming, digest, validate=validate)

    def _worker_cfg(self, body: dict[str, Any], settings: dict[str, Any], plan_path: Path, digest: str, rank: int,
                    world: int, master: str, port: int) -> WorkerConfig:
        from hwtui.engine.replication.config import WorkerConfig

        repl, timeouts = push_settings(settings, self.device.kind if self.device is not None else None)
        choice = push_transport(repl.device, int(settings.get("nodes", 1)))
        return WorkerConfig(plan=str(plan_path), plan_digest=digest, transport=choice, world_size=world,
                            rank=rank, local_rank=0, master_addr=master, master_port=port, settings=repl, commit=True,
                            out=str(self.out / "ranks"), timeouts=timeouts, serve_group=self.serve_group,
                            fault=os.environ.get("HWTUI_TEST_FAULT"), **self._read_settings(settings))

    def _read_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        readers = settings.get("readers", self.readers)
        _need(readers is None or (type(readers) is int and 1 <= readers <= 64), "settings.readers must be an integer from 1 to 64")
        direct = settings.get("direct_io", self.direct_io)
        _need(direct in ("auto", "on", "off"), "settings.direct_io must be auto, on or off")
        return {"readers": readers, "direct_io": direct}

    # ------------------------------------------------------------------ the resident child

    def _ensure_child(self, world_key: str, fresh: bool) -> bool:
        """Start (or keep) the resident rank; True when it is warm for ``world_key``."""
        if not fresh and self.child is not None and self.child.running and self.world_key == world_key:
            return True
        self._stop_child()
        # fork=True: through the agent's fork server when it has one (engine.rank_fork), else exec'd.
        child = Child([sys.executable, "-m", "hwtui.engine.resident.resident_child", "{answer_fd}"], name=f"resident-{self.node}",
                      answer_pipe=True, stdin="pipe", stdout="null", stderr="inherit", fork=True)
        # Started from one long-lived thread: PR_SET_PDEATHSIG fires when the *thread* that forked the
        # child exits, and HTTP handler threads end with their request.
        self._spawner.submit(child.start).result()
        group = Group()
        group.add(child)
        deadline = time.monotonic() + _START_TIMEOUT_S
        ready = False
        while time.monotonic() < deadline and not ready:
            for m in group.poll(0.2):
                if m.msg is None:
                    deadline = 0  # died while importing torch
                elif m.msg.get("kind") == "resident.ready":
                    ready = True
            if child.poll() is not None:
                break
        if not ready:
            code = child.terminate(grace_s=1)
            group.close()
            raise PushRefused(500, f"node {self.node}: the resident rank did not start ({exit_text(code)})")
        self.child, self._group, self.world_key = child, group, world_key
        self.child_starts += 1
        self._stop = threading.Event()
        threading.Thread(target=self._read_child, args=(child, group, self._stop), name="resident-reader", daemon=True).start()
        return False

    def _stop_child(self, wait_reader: bool = False) -> None:
        """Stop the resident rank; with ``wait_reader`` its reader records the push it was running as failed."""
        child = self.child
        if child is None:
            return
        if not wait_reader:
            self._stop.set()
        child.terminate(grace_s=2)
        if wait_reader:
            deadline = time.monotonic() + 5
            while self.busy and self._flight_child is child and time.monotonic() < deadline:
                time.sleep(0.02)
            self._stop.set()
        with self._lock:
            if self.child is child:
                self.child = None
                self.world_key = None

    def _read_child(self, child: Child, group: Group, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                for m in group.poll(0.2):
                    if m.msg is None:
                        self._child_gone(child)
                        return
                    try:
                        self._on_message(m.msg)
                    except Exception as exc:  # noqa: BLE001 - one message's failure must not end the reading
                        self._reader_failed(msg=m.msg, exc=exc)
                if not child.running and not group.open_pipes:
                    self._child_gone(child)
                    return
        finally:
            group.close()

    def _reader_failed(self, msg: dict[str, Any], exc: BaseException) -> None:
        """Handling a message of the rank failed (an OSError writing the slots record, say): said
        on stderr and in the push's state, and the reader goes on, so later messages and the rank's
        exit are still seen (before, its thread died and the node stayed busy or writing)."""
        why = redact_text(f"handling the resident rank's {str(msg.get('kind'))[:40]!r} failed: {type(exc).__name__}: {exc}")
        print(f"hwtui agent: {why}", file=sys.stderr, flush=True)
        with self._lock:
            if self.persist.get("state") == "writing" and msg.get("kind") == "resident.persist":
                self.persist = {**self.persist, "state": "failed", "error": why[:300]}
            if self.busy and self.in_flight is not None:
                self.in_flight.setdefault("errors", []).append(why[:300])
            self._changed.notify_all()

    def _on_message(self, msg: dict[str, Any]) -> None:
        kind = msg.get("kind")
        with self._lock:
            flight = self.in_flight
            phase = flight.get("phase") if flight is not None else None
            if kind == "repl.bucket" and flight is not None:
                if msg.get("state") == "done":
                    self._done_bytes += int(msg.get("nbytes") or 0)
                    flight["bytes_done"] = self._done_bytes
                    flight["progress"] = round(min(1.0, self._done_bytes / max(1, flight["total_bytes"])), 4)
                flight["phase"] = "transfer"
            elif kind == "_rank" and flight is not None:
                what = msg.get("what")
                if isinstance(what, str) and isinstance(msg.get("t"), (int, float)):
                    # When each step began on this rank (wall clock): where a push's time goes.
                    flight.setdefault("timeline", {}).setdefault(what, msg["t"])
                if what in ("init", "ready", "prepared", "decided"):
                    flight["phase"] = {"init": "joining", "ready": "transfer", "prepared": "voting",
                                       "decided": "committing"}[what]
                if what == "decided":  # the worker's record of the vote: decision "commit" or "abort"
                    flight["committed"] = msg.get("decision") == "commit"
                if what == "result":
                    self._result = msg
            elif kind == "error" and flight is not None:
                flight.setdefault("errors", []).append(redact_text(str(msg.get("message")))[:300])
            elif kind == "resident.done":
                self._finish(msg)
                self.spare = {"state": "preparing", "stopped": self.spare.get("stopped", 0)} \
                    if self.last and self.last.get("outcome") == "committed" and self.last.get("rank") != 0 else self.spare
            elif kind == "resident.persist":
                self._persisted(msg)
            elif kind == "resident.staged_header" and flight is not None and msg.get("version") == flight.get("version"):
                self._staged_layout = self._read_layout(str(flight["version"]))
            elif kind == "resident.spare":
                self.spare = _spare_state(msg, self.spare)
            if self.in_flight is not flight or (flight is not None and flight.get("phase") != phase):
                self._changed.notify_all()

    def _finish(self, msg: dict[str, Any]) -> None:
        """Called with the lock held: the push ended on this rank."""
        flight = self.in_flight or {}
        result = self._result or {}
        # A rank stopped (SIGTERM) or lost after the commit decision has still done its part: a
        # receiver's signal gate defers a SIGTERM until its switch is done, and the source has
        # nothing left to do once the decision is recorded (receivers roll forward from the
        # record). So a receiver that serves the version on disk, and a source past a "commit"
        # decision, report "committed" (with the stop in their failures), never "failed" beside
        # a push that committed.
        decided = bool(flight.get("committed"))
        if flight.get("rank", 0) == 0:
            committed = decided
        else:
            # The agent may not have seen the "decided" message of a rank that died right after it
            # recorded the decision (and _settle finished the switch): this node's record counts too.
            version = flight.get("version")
            decided = decided or (version is not None and recovery.decision(self.ranks_out, str(version)) is not None)
            committed = decided and (msg.get("code") == 0 or (version is not None and self.serving() == version))
        if committed and flight.get("rank", 0) != 0:
            self._record_commit(flight)
        if self.device is not None and flight.get("device_slot"):
            # The rank filled the staged slot and waited for every copy before its yes vote, so a
            # committed push serves it; anything else frees it (what was served still is).
            if not (committed and self.device.commit(str(flight["version"]))):
                self.device.rollback()
        outcome = "committed" if committed else ("aborted" if msg.get("usable") or flight.get("stopped") else "failed")
        self.pushes[outcome] += 1
        self.last = {"push_id": flight.get("push_id"), "version": flight.get("version"), "rank": flight.get("rank"),
                     "outcome": outcome, "code": msg.get("code"), "warm": flight.get("warm"),
                     "phases": result.get("phases") or {}, "memory": result.get("memory") or {},
                     "failures": ([f"stopped: {flight['stopped']}"] if flight.get("stopped") else [])
                                 + (result.get("failures") or flight.get("errors") or []),
                     "serving": self.serving(), "ended": time.time(),
                     "timeline": {**(flight.get("timeline") or {}), "done": time.time()}}
        self.in_flight = None
        self.busy = False
        # Its child no longer runs a push here: a resolve that holds the node busy later must not
        # take that child's exit for the end of a push (it recorded a failed push that never was).
        self._flight_child = None
        self._changed.notify_all()
        with contextlib.suppress(OSError):
            (self.out / "pushes" / f"{flight.get('push_id')}.plan").unlink()

    def _record_commit(self, flight: dict[str, Any]) -> None:
        """Called with the lock held: a receiver's push committed here. Its disk's slots record it
        now, or once its rank has written the disk copy (--persist after-commit: resident.persist)."""
        version, deferred = str(flight["version"]), bool(flight.get("deferred"))
        if self._owed is not None and self._owed[0] != version:
            # A version served from the device whose disk copy never came (its write stopped for
            # this push, or failed and could not be finished) is replaced here: recorded as served
            # and moved on from, as the disk's slots record the versions it held (resolve).
            self._record_moved_on(self._owed[0])
            self._owed = None
        if deferred and self._disk_serving() != version:
            # Served from the device slot from now on; the rank writes the disk copy out and
            # switches the disk after this report, and the disk's slots follow then.
            self._owed = (version, str(flight.get("plan_digest")))
            self.persist = {"state": "writing", "version": version, "since": time.time()}
            self._layout_owed(version)
            return
        # The disk serves it already: a switch, or a write that was done before this report was
        # read, or a dead rank's staged copy that _settle finished.
        self._rotate_slots(version)
        if deferred:
            self.persist = {"state": "done", "version": version}
        elif self._owed is not None and self._owed[0] == version:
            # the device's version, whose disk write had failed, brought to disk by this push
            self._owed = None
            self.persist = {"state": "done", "version": version, "how": "received again"}

    def _record_moved_on(self, version: str) -> None:
        """Called with the lock held: ``version`` was served here (from the device) and a newer one
        replaced it before its disk copy was written, so the disk's slots never held it. Kept in
        ``MOVED_ON`` (the newest MAX_MOVED_ON), so that a pusher's --resume of it is refused as
        going back, as for a version the slots held (it rolled the node back before)."""
        seen = [v for v in self._moved_on() if v != version][-(MAX_MOVED_ON - 1):] + [version]
        try:
            atomic_write_text(self.served / "MOVED_ON", json.dumps({"versions": seen}) + "\n")
        except OSError as exc:  # said, not fatal: only a later --resume of it is not refused
            print(f"hwtui agent: {MOVED_ON_WHY}: {exc.strerror or exc}", file=sys.stderr, flush=True)

    def _moved_on(self) -> list[str]:
        try:
            with open(self.served / "MOVED_ON", "rb") as f:
                raw = json.loads(f.read(MAX_MOVED_ON * 512))  # 64 version names; more is not ours
        except (OSError, ValueError, RecursionError):
            return []
        got = raw.get("versions") if isinstance(raw, dict) else None
        return [v for v in got if isinstance(v, str)][-MAX_MOVED_ON:] if isinstance(got, list) else []

    def _layout_owed(self, version: str) -> None:
        """The owed version's tensor places for the export (the disk's CURRENT names the previous
        one): read when its rank wrote a device copy's header (resident.staged_header), else now."""
        staged, self._staged_layout = self._staged_layout, None
        found = staged if staged is not None and staged[0] == version else self._read_layout(version)
        if found is not None:
            self._layouts = {version: found[1]}

    def _read_layout(self, version: str) -> tuple[str, dict[str, Any]] | None:
        """``version``'s tensor places from its copy's header: staged, or moved into versions/
        already by the rank's switch (None: neither can be read)."""
        from hwtui.engine.resident.served_export import layout_of

        for path in (self.served / "staging" / version / "model.safetensors",
                     self.served / "versions" / version / "model.safetensors"):
            with contextlib.suppress(OSError, HwtuiError):
                return version, layout_of(path)
        return None

    def _persisted(self, msg: dict[str, Any]) -> None:
        """Called with the lock held: the rank made the owed version durable and switched the disk
        to it (or could not: the device still serves it, the staged copy is kept)."""
        version = msg.get("version")
        seconds = msg.get("seconds")
        if self._owed is None and msg.get("ok") and self.persist == {"state": "done", "version": version}:
            self.persist["seconds"] = seconds  # written before its push's report was read (_finish)
            return
        if self._owed is None or version != self._owed[0]:
            return
        if msg.get("superseded") and not msg.get("ok"):
            # Not written, by request: the device serves it, the disk the version before, and the
            # push that asked brings its own copy to disk next. ``_owed`` stays: should that push
            # fail, this is still the version served, owed to the disk (`hwtui push --resume`).
            by = self.persist.get("superseded_by")
            self.persist = {"state": "superseded", "version": version, "seconds": seconds,
                            **({"by": by} if isinstance(by, str) else {})}
        elif msg.get("ok"):
            self._owed = None
            self.persist = {"state": "done", "version": version, "seconds": seconds}
            try:
                self._rotate_slots(str(version))
            except OSError as exc:  # the disk serves it (CURRENT); only its slot record could not be written
                self.persist["error"] = f"its slot record could not be written: {exc.strerror or exc}"
        else:
            self.persist = {"state": "failed", "version": version, "seconds": seconds,
                            "error": redact_text(str(msg.get("error")))[:300]}
        self._changed.notify_all()

    def _device_serves(self, version: str) -> bool:
        return self.device is not None and self.device.served()[0] == version

    def _owed_written(self, version: str, how: str) -> bool:
        """Whether the disk now serves ``version``, whose switch this node owed (its write failed, or
        its rank died writing it) and which was finished here: resolve, the next push, the dead
        rank's staged copy. If so the debt is cleared and the disk's slots record it."""
        with self._lock:
            if self._owed is None or self._owed[0] != version or self._disk_serving() != version:
                return False
            self._owed = None
            self.persist = {"state": "done", "version": version, "how": how}
            with contextlib.suppress(OSError):  # recorded already where this node finished the switch
                self._rotate_slots(version)
            self._changed.notify_all()
            return True

    def _retry_owed(self) -> str | None:
        """Before a push discards staged copies: a version whose disk write failed is finished from
        its kept copy if it can be (hashed again, fsynced, switched); if not, that copy is kept, and
        its version returned (this node still serves it from its device)."""
        with self._lock:
            owed = self._owed if self.persist.get("state") == "failed" else None
        if owed is None:
            return None
        self._settle(owed[0])
        return None if self._owed_written(owed[0], "finished from its kept copy before the next push") else owed[0]

    def _settle_last_write(self, rank: int, version: str) -> None:
        """Before a push (rank ``rank``, of ``version``) touches any staged copy: the last push's
        disk copy may still be being written (--persist after-commit). A push of another version
        that this node receives stops that write (the disk would be switched to a version this
        push replaces at once); the same version again, or this node as the source, waits for it.
        Either way the staged copies are not this push's to discard until the rank has let go."""
        if rank != 0 and self.device is not None and not self._device_serves(version) \
                and (held := self.device.slot_held()) is not None:
            # Before anything is stopped or discarded: a push refused here leaves the node as it was
            # (a hold taken after this is refused by the slot's staging). A version the device
            # serves already takes no slot: its bytes go to disk only.
            raise PushRefused(409, f"node {self.node}: {held}")
        # Only a push this node receives stops the write: as the source (rank 0) it gets no copy of
        # the new version to write instead (the write it stopped would never be made).
        asked = rank != 0 and self._supersede_persist(version)
        try:
            self._await_persist()
        except PushRefused:
            if asked:  # this push is not coming: the write it stopped goes on
                self._supersede_persist(version, withdraw=True)
            raise

    def _supersede_persist(self, version: str, *, withdraw: bool = False) -> bool:
        """Ask the rank writing the last push's disk copy to stop, where ``version`` replaces it.

        Why: the write of a deferred copy takes the disk's time (1.4-1.7 s per GiB on the H200
        runs, ~20 s for a 14 GB model) and a push arriving meanwhile waited for all of it, so a
        trainer pushing faster than the disk writes was held to the disk's pace. The device
        serves the newest version either way; the disk is brought to the newest version the
        pushes leave time for. The rank stops between two chunks of the write (or before it) and
        answers resident.persist with ``superseded``; past the write (its switch) it finishes.
        ``withdraw``: the push that asked was refused after all (its wait ran out): the rank's
        last word on that version is "go on". Returns whether the rank was asked (or told)."""
        with self._lock:
            writing = self.persist.get("state") == "writing" and self.persist.get("version") != version
            child = self.child
            written = self.persist.get("version")
            if writing and withdraw:
                self.persist.pop("superseded_by", None)
            elif writing:
                self.persist["superseded_by"] = version
        if not (writing and child is not None and child.running):
            return False
        try:
            child.send({"kind": "resident.supersede", "version": written, **({"withdrawn": True} if withdraw else {})})
        except (OSError, ValueError):  # the rank is gone: _child_gone settles its write
            return False
        return True

    def _await_persist(self) -> None:
        """Wait (at most PERSIST_WAIT_S) for the rank to finish writing the last push's disk copy."""
        bound = _persist_wait_s()
        deadline = time.monotonic() + bound
        with self._changed:
            while self.persist.get("state") == "writing":
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PushRefused(409, f"node {self.node} is still writing version {self.persist.get('version')} "
                                           f"to disk after {bound:g} s; try again when it is done")
                self._changed.wait(min(left, 1.0))

    def _child_gone(self, child: Child) -> None:
        with self._lock:
            owed = self._owed if self.persist.get("state") == "writing" and self.child is child else None
        if owed is not None:
            # The rank died writing the disk copy of a committed version: finished here from the
            # staged copy (hashed again, fsynced), as a restarted agent would.
            self._settle(owed[0])
            if not self._owed_written(owed[0], "finished from its staged copy after its rank died writing it"):
                with self._lock:
                    self.persist = {"state": "failed", "version": owed[0], "error": "the resident rank died writing "
                                    "it to disk, and its staged copy could not be switched to"}
                    self._changed.notify_all()
        with self._lock:
            flight = dict(self.in_flight or {}) if self.busy and self._flight_child is child else {}
        if flight.get("version") and flight.get("rank", 0) != 0:
            # The rank could not clean up after itself (never CURRENT or versions/ of another
            # version). Outside the lock: finishing hashes the staged copy, and the node stays busy
            # meanwhile, so no push or resolve can start.
            self._settle(str(flight["version"]))
        ended = child.poll()
        if ended is None:  # its pipe closed first: reaped within moments (bounded), for the reasons below
            with contextlib.suppress(Exception):
                ended = child.wait(timeout=2)
        with self._lock:
            if self.child is child:
                self.world_key = None
                if self.spare.get("state") == "preparing":
                    # It was the rank's idle work: said "preparing" for as long as the agent lived.
                    how = exit_text(ended) if ended is not None else "ended"
                    self.spare = {"state": "failed", "reason": f"the resident rank {how} while making it",
                                  "stopped": self.spare.get("stopped", 0)}
            if self.busy and self._flight_child is child and self.in_flight is not None:
                stopped = bool((self.in_flight or {}).get("stopped"))
                self._finish({"code": -1, "usable": False})
                if self.last is not None and not stopped:
                    self.last["failures"] = [*self.last["failures"], f"the resident rank {exit_text(ended)}"]

    def _settle(self, version: str) -> None:
        """A receiver's rank died during push of ``version``: finish it if this node has its decision,
        keep a prepared copy that may have been decided elsewhere, remove anything else."""
        sd = recovery.served_dir(self.served, self.modes)
        dec = recovery.decision(self.ranks_out, version)
        if dec is not None and self._disk_serving() != version:
            ok, _ = recovery.finish(self.served, self.ranks_out, version, str(dec.get("plan_digest")), self.modes)
            if ok:
                self._rotate_slots(version)
        elif not sd.prepared(version) or self._disk_serving() == version:
            recovery.discard(self.served, version)

    def _rotate_slots(self, version: str) -> None:
        """The new version takes the slot that was not serving; the version it held is removed."""
        if not (self.served / "SLOTS").exists():  # this node's first version
            atomic_write_text(self.served / "SLOTS", json.dumps({"A": version, "B": None, "serving": "A"}) + "\n")
            return
        slots = self.slots()
        old = str(slots.get("serving"))
        if slots.get(old) == version:
            return  # recorded already (a switch finished by _settle, then reported)
        new = "B" if old == "A" else "A"
        evicted = slots.get(new)
        slots[new], slots["serving"] = version, new
        atomic_write_text(self.served / "SLOTS", json.dumps(slots) + "\n")
        if evicted and evicted not in (version, slots.get(old)):
            # Out of versions/ at once (a rename), deleted on a thread: freeing a gigabyte took
            # 0.5 s, which a push would otherwise wait for before it is reported done.
            gone = self.served / ".trash" / f"{evicted}-{uuid.uuid4().hex[:8]}"
            gone.parent.mkdir(exist_ok=True)
            try:
                os.replace(self.served / "versions" / evicted, gone)
            except OSError:
                shutil.rmtree(self.served / "versions" / evicted, ignore_errors=True)
            else:
                _remove_in_background(gone)

    def close(self) -> None:
        # A disk write still under way is waited for (bounded): a copy in device memory would be
        # lost with its rank, and the node would restart on the version before (systemd gives a
        # stop 90 s by default).
        with contextlib.suppress(PushRefused):
            self._await_persist()
        self._stop_child()
        self._spawner.shutdown(wait=False)
        if self.device is not None:
            self.device.close()  # both slots: the agent stops
        if self._out_lock >= 0:
            os.close(self._out_lock)  # the flock goes with it: another agent may take --out now
            self._out_lock = -1

    # ------------------------------------------------------------------ the served version on the device

    def _stage_device(self, plan: Any) -> dict[str, Any] | None:
        """The slot descriptor a receiver's rank fills (None without --device cuda)."""
        if self.device is None:
            return None
        from hwtui.engine.resident.device_served import data_bytes
        from hwtui.engine.resident.device_slots import SlotError, SlotHeld

        try:
            return self.device.stage(str(plan["version"]), data_bytes(plan))
        except SlotHeld as exc:
            raise PushRefused(409, f"node {self.node}: {exc}") from None
        except SlotError as exc:
            raise PushRefused(507, f"node {self.node}: {exc}") from None

    def _device_follow_disk(self) -> None:
        """Load what the disk serves into a device slot when no push put it there (the agent's
        start, a switch finished from a staged copy). A failure is reported in the state, not fatal:
        the disk still serves the version."""
        assert self.device is not None
        try:
            cur = recovery.served_dir(self.served, self.modes).current() or {}
        except HwtuiError:
            cur = {}
        version, file = cur.get("version"), cur.get("file")
        if not isinstance(version, str) or not isinstance(file, str) or self.device.served()[0] == version:
            return
        from hwtui.engine.resident.device_slots import SlotError

        try:
            self.device.load(version, self.served / file, readers=self.readers)  # `hwtui agent --readers`
            self.device.error = None
        except (OSError, HwtuiError, RuntimeError, SlotError) as exc:  # SlotError: a consumer holds the slot
            self.device.error = redact_text(f"{version} could not be loaded onto {self.device.device}: {exc}")[:300]

    def export(self, body: dict[str, Any], holder: str) -> dict[str, Any]:
        """What a local serving process needs to consume the served version without a copy: the
        served slot's IPC handle, each tensor's place in it (from the served file's header), and
        the hold that keeps a push from being received into that slot while the consumer reads it
        (engine.resident.slot_holds: ``hold_s``, default 60 s, 0 for none).
        The caller checks who asks (app/node_api: the token, then the asking process's user)."""
        from hwtui.engine.resident.device_slots import SlotError
        from hwtui.engine.resident.slot_holds import HoldError

        device = self._device_or_404()
        hold_s = self._hold_s(body, {"hold_s"})
        with self._lock:
            try:
                got = device.export(hold_s, holder)
            except SlotError:
                raise PushRefused(404, f"node {self.node} serves no version on {device.device} yet") from None
            except HoldError as exc:
                raise PushRefused(429, f"node {self.node}: {exc}") from None
        try:
            return self._export_doc(got, hold_s)
        except BaseException:
            if got.hold is not None:
                device.holds.release(got.hold.lease)  # no document, no hold
            raise

    def _device_or_404(self) -> DeviceServed:
        if self.device is None:
            raise PushRefused(404, f"node {self.node} keeps no version in device memory (start it with --device cuda)")
        return self.device

    def _hold_s(self, body: dict[str, Any], allowed: set[str]) -> float:
        from hwtui.engine.resident.slot_holds import HoldError, check_hold_s

        try:
            extra = set(body) - allowed
            if extra:
                raise HoldError(f"this call takes {', '.join(sorted(allowed))} only, not {sorted(extra)[0][:40]!r}")
            return check_hold_s(body.get("hold_s"))
        except HoldError as exc:
            raise PushRefused(400, f"node {self.node}: {exc}") from None

    def _lease(self, body: dict[str, Any]) -> str:
        from hwtui.engine.resident.slot_holds import HoldError, check_lease

        try:
            return check_lease(body.get("lease"))
        except HoldError as exc:
            raise PushRefused(400, f"node {self.node}: {exc}") from None

    def renew_hold(self, body: dict[str, Any]) -> dict[str, Any]:
        """A consumer still reading its slot keeps it held ``hold_s`` more seconds."""
        from hwtui.engine.resident.slot_holds import HoldError

        device = self._device_or_404()
        hold_s, lease = self._hold_s(body, {"hold_s", "lease"}), self._lease(body)
        try:
            hold = device.holds.renew(lease, hold_s) if hold_s > 0 else None
        except HoldError as exc:
            raise PushRefused(404, f"node {self.node}: {exc}") from None
        if hold is None:
            return {"node": self.node, "hold": None, "released": device.holds.release(lease)}
        return {"node": self.node, "hold": {"lease": hold.lease, "slot": hold.slot, "version": hold.version,
                                            "hold_s": hold_s}}

    def release_hold(self, body: dict[str, Any]) -> dict[str, Any]:
        """A consumer's hold released (it has moved to the served version, or stopped reading)."""
        device = self._device_or_404()
        if set(body) != {"lease"}:
            raise PushRefused(400, f"node {self.node}: a release takes exactly the lease an export returned")
        return {"node": self.node, "released": device.holds.release(self._lease(body))}

    def _export_doc(self, got: Exported, hold_s: float) -> dict[str, Any]:
        assert self.device is not None
        version = got.version
        owed = self._owed
        if owed is not None and owed[0] == version and version in self._layouts:
            return self._export_answer(got, hold_s, self._layouts[version])  # the disk follows (persist)
        try:
            cur = recovery.served_dir(self.served, self.modes).current() or {}
        except HwtuiError:
            cur = {}
        if cur.get("version") != version or not isinstance(cur.get("file"), str):
            raise PushRefused(409, f"node {self.node}: the device serves {version}, the disk {cur.get('version')}; "
                                   "retry once the push in flight is over")
        layout = self._layouts.get(version)
        if layout is None:
            from hwtui.engine.resident.served_export import layout_of

            try:
                layout = layout_of(self.served / str(cur["file"]))
            except (OSError, HwtuiError) as exc:
                raise PushRefused(500, f"node {self.node}: the served file's header: {exc}") from None
            self._layouts = {version: layout}
        return self._export_answer(got, hold_s, layout)

    def _export_answer(self, got: Exported, hold_s: float, layout: dict[str, Any]) -> dict[str, Any]:
        assert self.device is not None
        version = got.version
        held = {"lease": got.hold.lease, "slot": got.slot, "hold_s": hold_s} if got.hold is not None else None
        return {"node": self.node, "version": version, "device": self.device.device, "kind": self.device.kind,
                "slot": got.slot, "bytes": got.nbytes, "run": self.device.run,
                "handle": got.handle, "layout": layout, "hold": held}
