"""Start (or join) the replication world and turn per-rank messages into the world's events.

Local mode: N workers, each a fresh interpreter (``python -m hwtui.engine.replication.worker``;
that is the spawn start method without multiprocessing's pickled bootstrap), on 127.0.0.1 with a
free port. Each worker writes JSON lines to its own pipe; nothing is pickled. The launcher watches
the pipes and the processes: a rank that dies is seen at once, a rank that stops making progress
is named when its peers time out (or by the launcher's own watchdog), and then every worker is
terminated. Workers carry PR_SET_PDEATHSIG so they die with the launcher.

Join mode: ``torchrun``/SLURM already started one ``hwtui replicate`` per rank with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT; each process runs its rank in-process and reports its
own view (the commit vote is still world-wide).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hwtui.core.errors import EXIT_FAILED, EXIT_USAGE, HwtuiError
from hwtui.core.events import ErrorEvent, Event, LogEvent, from_dict
from hwtui.core.net import free_loopback_port
from hwtui.core.private_file import create_private
from hwtui.core.supervisor import Child, Group, exit_text, python_module
from hwtui.engine.replication.commit import OutLock, ServedDir, read_decision
from hwtui.engine.replication.config import Timeouts, WorkerConfig
from hwtui.engine.replication.events import (
    RANK_PHASES,
    ReplBucket,
    ReplCommit,
    ReplDone,
    ReplRanks,
    ReplStart,
    ReplThroughput,
)
from hwtui.engine.replication.plan import Plan, load_plan, preflight_sources
from hwtui.engine.replication.report import build_report
from hwtui.engine.replication.served_files import serve_modes
from hwtui.engine.replication.shm import shm_dir, sweep_dead_run_dirs
from hwtui.engine.replication.transport import choose_transport, detect_facts, validate_device
from hwtui.probes.distributed.replication_defaults import DEFAULT_CHUNK_MB, DEFAULT_INFLIGHT

MB = 1 << 20
# At most 64 MiB per collective: on gloo over loopback every collective costs setup and thread
# hand-off, and many small concurrent broadcasts cost more in contention than they win in overlap
# (measured: 8 MiB chunks x 4 buckets ran ~25% slower than 32 MiB ones). Buckets that are contiguous
# on both sides go out in pairs (see worker.collective_groups), so with the default 32 MiB buckets
# and window 4 one collective carries 64 MiB while the pair before it is being verified. NCCL
# pipelines inside a collective anyway. HOTWEIGHTS_BCAST_CHUNK_MB / --chunk-mb change it.
_FORWARDED = {"repl.bucket", "repl.window", "log", "error"}


@dataclass
class ReplicationOptions:
    plan: str
    device: str = "cpu"
    nproc: int | None = None  # None: join an existing world if the environment describes one, else 2
    inflight: int | None = None  # None: HOTWEIGHTS_IPC_INFLIGHT_BUCKETS, else 4
    max_inflight_mb: float | None = None
    adaptive: bool = False
    target_bucket_ms: float = 50.0
    chunk_mb: float | None = None  # None: HOTWEIGHTS_BCAST_CHUNK_MB, else DEFAULT_CHUNK_MB
    transport: str | None = None
    verify: bool = True
    same_host: bool = True
    commit: bool = False
    out: str | None = None
    serve_group: str | None = None  # --serve-group: served files 0640 and owned by this group (default: 0600)
    timeout: float = 20.0  # per bucket wait
    init_timeout: float = 60.0
    commit_timeout: float | None = None  # None: same as timeout
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass
class ReplicationResult:
    ok: bool
    exit_code: int
    error: str | None
    report: dict[str, Any]


def _env_number(env: dict[str, str], name: str, default: float, kind: type = float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise HwtuiError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise HwtuiError(f"{name}={raw!r} must be positive")
    return value


def resolve_settings(opts: ReplicationOptions) -> dict[str, Any]:
    inflight = opts.inflight if opts.inflight is not None else int(_env_number(opts.env, "HOTWEIGHTS_IPC_INFLIGHT_BUCKETS", DEFAULT_INFLIGHT, int))
    chunk_mb = opts.chunk_mb if opts.chunk_mb is not None else _env_number(opts.env, "HOTWEIGHTS_BCAST_CHUNK_MB", DEFAULT_CHUNK_MB)
    if inflight < 1:
        raise HwtuiError("--inflight must be at least 1")
    if chunk_mb <= 0:
        raise HwtuiError("--chunk-mb must be positive")
    if opts.max_inflight_mb is not None and opts.max_inflight_mb <= 0:
        raise HwtuiError("--max-inflight-mb must be positive")
    if min(opts.timeout, opts.init_timeout, opts.commit_timeout or opts.timeout) <= 0:
        raise HwtuiError("timeouts must be positive")
    if opts.commit and not opts.out:
        raise HwtuiError("--commit needs --out DIR (where each receiver keeps the version it serves)")
    if opts.serve_group is not None and not opts.commit:
        raise HwtuiError("--serve-group applies to what --commit --out serves: add --commit --out DIR")
    serve_modes(opts.serve_group)  # an unknown group is bad input before anything starts
    return {"window": inflight, "chunk_bytes": max(1, int(chunk_mb * MB)), "adaptive": opts.adaptive,
            "max_inflight_bytes": int(opts.max_inflight_mb * MB) if opts.max_inflight_mb else None,
            "target_bucket_s": opts.target_bucket_ms / 1000.0, "verify": opts.verify, "device": opts.device}


def joined_world(env: dict[str, str]) -> dict[str, Any] | None:
    """RANK/WORLD_SIZE from torchrun (or SLURM's or Open MPI's equivalents), or None when not under a launcher."""
    if "RANK" in env and "WORLD_SIZE" in env:
        get = env.get
        rank, world, local = get("RANK"), get("WORLD_SIZE"), get("LOCAL_RANK", get("RANK"))
        local_world = get("LOCAL_WORLD_SIZE", world)
    elif "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:  # mpirun (Open MPI)
        rank, world = env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"]
        local = env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")
        local_world = env.get("OMPI_COMM_WORLD_LOCAL_SIZE", world)
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world, local = env["SLURM_PROCID"], env["SLURM_NTASKS"], env.get("SLURM_LOCALID", "0")
        local_world = env.get("SLURM_NTASKS_PER_NODE", world).split("(")[0]
    else:
        return None
    try:
        info: dict[str, Any] = {"rank": int(rank or ""), "world_size": int(world or ""), "local_rank": int(local or ""),
                                "local_world_size": int(local_world or "")}
    except (TypeError, ValueError):
        raise HwtuiError("RANK/WORLD_SIZE/LOCAL_RANK in the environment are not integers") from None
    if not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
        raise HwtuiError("joining a launcher's world needs MASTER_ADDR and MASTER_PORT in the environment")
    info["master_addr"], info["master_port"] = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    return info


def preflight(opts: ReplicationOptions, world_ranks: list[int]) -> Plan:
    """Everything in the input that makes it bad, checked before anything is written (not even --out)."""
    plan = load_plan(opts.plan)
    if 0 in world_ranks:
        preflight_sources(plan)
    if plan["prev_version"] is not None and not (opts.commit and opts.out):
        raise HwtuiError(f"plan {opts.plan} is a delta from {plan['prev_version']!r}: it needs --commit --out DIR "
                         "where every receiver serves that version")
    return plan


def preflight_out(opts: ReplicationOptions, world_ranks: list[int], plan: Plan) -> bool:
    """What ``--out`` holds, checked under its lock before any process starts.

    Returns ``recover``: True when this very version was already decided (``decisions/<v>.json``):
    the run then only finishes the switch where a rank did not make it, and moves no byte.
    """
    if not (opts.out and opts.commit):
        return False
    decision = read_decision(opts.out, plan["version"])
    if decision is not None:
        if decision.get("plan_digest") != plan.digest:
            raise HwtuiError(f"version {plan['version']!r} was already committed under {opts.out} from another plan "
                             f"(digest {str(decision.get('plan_digest'))[:16]}, this plan {plan.digest[:16]}); "
                             "plan a new version")
        return True
    for r in world_ranks:
        if r == 0:
            continue
        served = ServedDir(opts.out, r, serve_modes(opts.serve_group))
        try:
            served.ensure_root()
            probe = served.root / ".write-probe"
            os.close(create_private(probe, replace=True))  # never through a planted link
            probe.unlink()
        except OSError as exc:
            raise HwtuiError(f"rank {r} cannot write under {served.root}: {exc.strerror or exc}") from None
        have = served.current_version()
        if plan["prev_version"] is not None and have != plan["prev_version"]:
            raise HwtuiError(f"rank {r} serves version {have!r} under {served.root}, but the plan is a delta from "
                             f"{plan['prev_version']!r}")
        if (served.root / "versions" / plan["version"]).exists():
            raise HwtuiError(f"rank {r} already holds version {plan['version']!r} under {served.root}")
    return False


UNREPORTED = "(unreported: it did not answer within the commit timeout)"


def serving_text(serving: dict[int, str | None]) -> str:
    """"rank 1 serves v2, rank 2 serves v1": the per-rank truth, read from disk."""
    return ", ".join(f"rank {r} serves {v if v is not None else 'nothing'}" for r, v in sorted(serving.items()))


def _serving(out: str, ranks: list[int]) -> dict[int, str | None]:
    out_map: dict[int, str | None] = {}
    for r in ranks:
        if r == 0:
            continue
        try:
            out_map[r] = ServedDir(out, r).current_version()
        except HwtuiError:
            out_map[r] = None
    return out_map


class Coordinator:
    """Turns per-rank messages into world events and the final result."""

    def __init__(self, plan: Plan, ranks: list[int], sink: Callable[[Event], None], world_size: int | None = None):
        self.plan, self.ranks, self.sink = plan, ranks, sink
        self.world_size = world_size if world_size is not None else len(ranks)
        self.rank_phase: dict[int, int] = {}  # rank -> index in RANK_PHASES of the furthest phase it reported
        self.done_ranks: dict[int, set[int]] = {}
        self.first_seen: dict[int, float] = {}
        self.bytes_done = 0
        self.transfer_t0: float | None = None
        self.last_sample = (0.0, 0)
        self.results: dict[int, dict[str, Any]] = {}
        self.errors: list[ErrorEvent] = []
        self.progress: dict[int, tuple[float, str]] = {r: (time.monotonic(), "starting") for r in ranks}
        self.decided: dict[str, Any] | None = None
        self.prepared: dict[int, dict[str, Any]] = {}
        self.reached: dict[int, int] = {}  # highest bucket id each rank has reported
        self.tally: dict[str, Any] | None = None  # joined rank 0: what every receiver serves (worker._tally)

    def feed(self, raw: dict[str, Any]) -> None:
        now = time.monotonic()
        kind = raw.get("kind")
        rank = raw.get("rank")
        if isinstance(rank, int) and rank in self.progress:
            self.progress[rank] = (now, self._describe(raw))
            if kind == "repl.bucket":
                self.reached[rank] = max(self.reached.get(rank, -1), int(raw.get("bucket_id", -1)))
        if kind == "_rank":
            self._internal(raw, now)
            return
        if kind not in _FORWARDED:
            return
        ev = from_dict(raw)
        if isinstance(ev, ErrorEvent):
            self.errors.append(ev)
        self.sink(ev)
        if isinstance(ev, ReplBucket):
            self._bucket(ev, now)

    @staticmethod
    def _describe(raw: dict[str, Any]) -> str:
        if raw.get("kind") == "repl.bucket":
            return f"bucket {raw.get('bucket_id')} {raw.get('state')}"
        if raw.get("kind") == "_rank":
            return str(raw.get("what"))
        return str(raw.get("kind"))

    def _bucket(self, ev: ReplBucket, now: float) -> None:
        self.first_seen.setdefault(ev.bucket_id, now)
        if ev.state != "done":
            return
        done = self.done_ranks.setdefault(ev.bucket_id, set())
        done.add(ev.rank if ev.rank is not None else -1)
        if len(done) < len(self.ranks):
            return
        self.sink(ReplBucket(bucket_id=ev.bucket_id, state="done", nbytes=ev.nbytes,
                             seconds=round(now - self.first_seen[ev.bucket_id], 6), rank=None))
        self.bytes_done += ev.nbytes
        t0 = self.transfer_t0 if self.transfer_t0 is not None else now
        last_t, last_b = self.last_sample
        last_t = last_t or t0
        finished = self.bytes_done >= self.plan["total_bytes"]
        if now - last_t >= 0.2 or finished:
            dt = max(now - last_t, 1e-9)
            self.sink(ReplThroughput(gbps=round((self.bytes_done - last_b) / dt / 1e9, 4), bytes_done=self.bytes_done,
                                     total_bytes=self.plan["total_bytes"], elapsed_s=round(now - t0, 6)))
            self.last_sample = (now, self.bytes_done)

    def _internal(self, raw: dict[str, Any], now: float) -> None:
        what, rank = raw.get("what"), raw.get("rank")
        if not isinstance(rank, int):
            return
        if what == "phase":
            self._rank_phase(rank, raw.get("phase"))
        elif what == "transfer_start" and self.transfer_t0 is None:
            self.transfer_t0 = now
            self.last_sample = (now, 0)
        elif what == "prepared":
            self.prepared[rank] = raw
        elif what == "decided" and self.decided is None:
            # Only the vote is reported here; what each rank serves afterwards is read from disk
            # by the launcher (a rank may still fail between the decision and its switch).
            self.decided = raw
            ok = bool(raw.get("unanimous"))
            detail = "every rank verified every bucket" if ok else self._first_failure()
            self.sink(ReplCommit(version=self.plan["version"], phase="prepare", ok=ok, detail=detail))
            if not ok:
                self.sink(ReplCommit(version=self.plan["version"], phase="abort", ok=True,
                                     detail=f"every rank keeps serving {self.plan['prev_version'] or 'what it had'}"))
        elif what == "result":
            self.results[rank] = raw
        elif what == "tally":
            self.tally = raw

    def _rank_phase(self, rank: int, phase: Any) -> None:
        """A rank reached a start-up phase: send the world's counts (only what ranks said, never a guess)."""
        if phase not in RANK_PHASES or rank not in self.progress:
            return
        idx = RANK_PHASES.index(phase)
        if idx <= self.rank_phase.get(rank, -1):
            return
        self.rank_phase[rank] = idx
        counts = {p: sum(1 for v in self.rank_phase.values() if v >= i) for i, p in enumerate(RANK_PHASES)}
        # The furthest phase every rank of the world has reached ("started" until all have).
        common = [p for p in RANK_PHASES if counts[p] >= self.world_size]
        self.sink(ReplRanks(world_size=self.world_size, ready=counts["ready"], phase=common[-1] if common else RANK_PHASES[0],
                            counts=counts))

    def _first_failure(self) -> str:
        for r in sorted(self.prepared):
            if not self.prepared[r].get("ok"):
                return self.prepared[r].get("detail") or f"rank {r} voted no"
        return "a rank voted no"


class _Stop:
    """SIGTERM/SIGINT (main thread only) or an external threading.Event end the run as an abort."""

    def __init__(self, external: threading.Event | None):
        self.external = external
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Stop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    @property
    def requested(self) -> bool:
        return self.signum is not None or bool(self.external and self.external.is_set())

    def describe(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}" if self.signum else "stopped on request"


def run_replication(opts: ReplicationOptions, on_event: Callable[[Event], None] | None = None,
                    stop: threading.Event | None = None) -> ReplicationResult:
    """Run a replication; raises HwtuiError for bad input (nothing started, nothing written)."""
    sink = on_event or (lambda ev: None)
    t_wall = time.perf_counter()
    settings = resolve_settings(opts)
    # The device first: a torch that cannot drive it is bad input before any transport line.
    opts.device = validate_device(opts.device)
    settings["device"] = opts.device
    joined = joined_world(opts.env) if opts.nproc is None else None
    world = joined["world_size"] if joined else (opts.nproc or 2)
    if world < 2:
        raise HwtuiError("replication needs at least 2 ranks (a source and a receiver): --nproc 2 or more")
    ranks = [joined["rank"]] if joined else list(range(world))
    plan = preflight(opts, ranks)
    lock = OutLock(opts.out, ranks, serve_modes(opts.serve_group)).acquire() if opts.out else None
    try:
        recover = preflight_out(opts, ranks, plan)
        if recover:
            assert opts.out is not None
            return _finish_decided(opts, plan, ranks, settings, world, "join" if joined else "local", sink, t_wall)
        return _replicate(opts, plan, ranks, world, joined, settings, sink, stop, t_wall)
    finally:
        if lock is not None:
            lock.release()


def _replicate(opts: ReplicationOptions, plan: Plan, ranks: list[int], world: int, joined: dict[str, Any] | None,
               settings: dict[str, Any], sink: Callable[[Event], None], stop: threading.Event | None,
               t_wall: float) -> ReplicationResult:
    facts = {"rocm": False, "multi_node": False, "xccl_available": False}
    if opts.device != "cpu":
        facts = detect_facts(opts.device, {**opts.env, **({} if joined else {"WORLD_SIZE": str(world)})})
    choice = choose_transport(opts.device, opts.transport, **facts)
    settings.update({"transport": choice.to_dict(), "world_size": world, "mode": "join" if joined else "local"})

    sink(LogEvent(message=choice.decision_line(), source="replication.transport"))
    sink(ReplStart(plan_digest=plan.digest, model=plan["model"], version=plan["version"], total_bytes=plan["total_bytes"],
                   n_buckets=len(plan.buckets), bucket_bytes=plan["bucket_bytes"], world_size=world, device=opts.device,
                   transport=choice.name, window=settings["window"], chunk_bytes=settings["chunk_bytes"]))
    coord = Coordinator(plan, ranks, sink, world_size=world)
    cfg_base = WorkerConfig(
        plan=os.path.abspath(opts.plan), plan_digest=plan.digest, device=opts.device, transport=choice, world_size=world, rank=0,
        inflight=settings["window"], max_inflight_bytes=settings["max_inflight_bytes"], adaptive=opts.adaptive,
        target_bucket_s=settings["target_bucket_s"], chunk_bytes=settings["chunk_bytes"], verify=opts.verify,
        same_host=opts.same_host, commit=opts.commit, out=os.path.abspath(opts.out) if opts.out else None,
        serve_group=opts.serve_group,
        timeouts=Timeouts(init=opts.init_timeout, bucket=opts.timeout, commit=opts.commit_timeout or opts.timeout),
        fault=opts.env.get("HWTUI_TEST_FAULT"))
    launcher_phases: dict[str, float] = {}
    decided = False
    with _Stop(stop) as stopper:
        if joined:
            error, exit_code = _run_joined(cfg_base, joined, coord, stopper)
        else:
            error, exit_code = _run_local(cfg_base, world, coord, stopper, opts, launcher_phases)
        if opts.out and opts.commit:
            decided = read_decision(opts.out, plan["version"]) is not None
            if error is not None and not decided and not joined:
                # Every local worker is gone now; a rank that was killed could not remove its own
                # staging copy. Only staging/<version> goes: CURRENT and versions/ are never touched.
                # With a decision recorded the prepared copies are what a re-run finishes from.
                for r in ranks[1:]:
                    ServedDir(opts.out, r).abort(plan["version"])

    results = [coord.results.get(r, {"rank": r}) for r in ranks]
    ok = error is None and all(r.get("ok") for r in results) and len(coord.results) == len(ranks)
    serving = _serving(opts.out, ranks) if opts.out and opts.commit else {}
    if joined and coord.tally is not None:
        # Rank 0 of a joined world: the receivers are other processes, often on other nodes, so
        # what each serves comes from its own report, not from this node's disk.
        serving = {int(r): v for r, v in coord.tally.get("serving", {}).items()}
        serving.update({int(r): UNREPORTED for r in coord.tally.get("unknown", [])})
    if decided:
        # The decision is the commit point: the outcome is what every rank serves now.
        lagging = {r: v for r, v in serving.items() if v != plan["version"]}
        ok = not lagging
        if ok:
            error, exit_code = None, 0
            n = len(serving)
            sink(ReplCommit(version=plan["version"], phase="commit", ok=True,
                            detail=f"all {n} receiver{'s' if n != 1 else ''} switched to {plan['version']}"
                                   + (f" ({serving_text(serving)})" if n else "")))
        else:
            why = _failure_text(coord)
            error = (f"version {plan['version']} is committed (decision recorded) but {serving_text(lagging)}"
                     + (f" ({why})" if why else "") + ": re-run the same command to finish the switch")
            exit_code = EXIT_FAILED
            sink(ReplCommit(version=plan["version"], phase="commit", ok=False, detail=serving_text(serving)))
    elif opts.commit and ok:
        # Joined rank 0 on another host, or a world without receivers here: no record on this disk.
        sink(ReplCommit(version=plan["version"], phase="commit", ok=True, detail=f"switched to {plan['version']}"))
    if error is None and not ok:
        error = _failure_text(coord) or "the run did not complete on every rank"
        exit_code = EXIT_USAGE if any(r.get("bad_input") for r in results) else EXIT_FAILED
    if error is not None and not decided and (coord.decided is None or coord.decided.get("unanimous")):
        sink(ReplCommit(version=plan["version"], phase="abort", ok=True,
                        detail=f"nothing committed; every rank keeps serving {plan['prev_version'] or 'what it had'}"))
    transfer = max((float((r.get("phases") or {}).get("transfer", 0.0)) for r in results), default=0.0)
    seconds = transfer if transfer > 0 else time.perf_counter() - t_wall
    committed = bool(ok and opts.commit and (decided or joined))
    rank_rows = [{k: v for k, v in r.items() if k not in ("kind", "what", "t")} for r in results]
    report = build_report(ok=ok, error=error, plan=plan.raw, settings=settings, ranks=rank_rows, seconds=seconds,
                          wall_seconds=time.perf_counter() - t_wall, committed=committed, launcher_phases=launcher_phases,
                          serving=serving, decision="commit" if decided else ("abort" if opts.commit else None))
    if error is not None:
        sink(ErrorEvent(message=error, rank=None, where="replication"))
    sink(ReplDone(ok=ok, bytes=plan["total_bytes"] if ok else coord.bytes_done, seconds=round(seconds, 6),
                  gbps=report["gbps"], report=report))
    return ReplicationResult(ok=ok, exit_code=0 if ok else exit_code, error=error, report=report)


def _finish_decided(opts: ReplicationOptions, plan: Plan, ranks: list[int], settings: dict[str, Any], world: int,
                    mode: str, sink: Callable[[Event], None], t_wall: float) -> ReplicationResult:
    """Re-run of a decided version: finish the switch on every rank that did not make it; no byte moves."""
    assert opts.out is not None
    out, version, modes = opts.out, plan["version"], serve_modes(opts.serve_group)
    sink(LogEvent(message=f"version {version} is already committed under {out} (decisions/{version}.json): "
                          "finishing the switch where a rank did not make it; nothing is transferred",
                  source="replication.commit"))
    done: dict[int, str] = {}
    errors: list[str] = []
    for r in ranks:
        if r == 0:
            continue
        try:
            done[r] = ServedDir(out, r, modes).finish(version, plan.digest, plan["tensors"])
        except (OSError, HwtuiError) as exc:
            errors.append(f"rank {r}: {getattr(exc, 'strerror', None) or exc}")
    serving = _serving(out, ranks)
    lagging = {r: v for r, v in serving.items() if v != version}
    ok = not lagging and not errors
    # A rank that still lags names the command that finishes it, like the first run's split does.
    error = None if ok else (f"version {version} is committed (decision recorded) but "
                             f"{serving_text(lagging) or 'a rank could not finish'}"
                             + (f" ({'; '.join(errors)})" if errors else "") + ": re-run the same command to finish the switch")
    sink(ReplCommit(version=version, phase="commit", ok=ok,
                    detail="; ".join(f"rank {r} {what}" for r, what in sorted(done.items())) + f" ({serving_text(serving)})"))
    settings.update({"transport": None, "world_size": world, "mode": mode})
    rows = [{"rank": r, "ok": r in done or r == 0, "serves": serving.get(r), "recovery": done.get(r)} for r in ranks]
    report = build_report(ok=ok, error=error, plan=plan.raw, settings=settings, ranks=rows, seconds=0.0,
                          wall_seconds=time.perf_counter() - t_wall, committed=ok, launcher_phases={},
                          serving=serving, decision="commit", recovered=True)
    if error is not None:
        sink(ErrorEvent(message=error, rank=None, where="replication"))
    sink(ReplDone(ok=ok, bytes=0, seconds=0.0, gbps=0.0, report=report))
    return ReplicationResult(ok=ok, exit_code=0 if ok else EXIT_FAILED, error=error, report=report)


def _failure_text(coord: Coordinator, rank: int | None = None) -> str | None:
    """The most useful error (of one rank, or of any): bad input, then a verification failure, then anything else."""
    for where in ("input", "source", "verify", "commit", "transport", "signal", "internal"):
        for ev in coord.errors:
            if ev.where == where and (rank is None or ev.rank == rank):
                return ev.message
    return None


def _worker_env(opts: ReplicationOptions, rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(opts.env)
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)})
    # N busy ranks on a few cores: keep torch's intra-op pools from oversubscribing them.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    return env  # the supervisor puts this tree's hwtui first on PYTHONPATH


def _run_local(cfg_base: WorkerConfig, world: int, coord: Coordinator, stopper: _Stop, opts: ReplicationOptions,
               phases: dict[str, float]) -> tuple[str | None, int]:
    port = free_loopback_port()
    t_launch = time.perf_counter()
    # Shared-memory staging left by a run that was killed outright (this launcher's predecessor
    # SIGKILLed: its ranks died with it) goes now; a live run's is locked and stays.
    base = shm_dir(opts.env)
    sweep_dead_run_dirs(base)
    try:
        with Group() as group:
            children: dict[int, Child] = {}
            for rank in range(world):
                cfg = cfg_base.for_rank(rank, master_addr="127.0.0.1", master_port=port, parent_pid=os.getpid())
                # stdout is null: with `--events -` the launcher's stdout is the event stream, and a
                # vendor library's print must never land in it. stderr stays the user's.
                children[rank] = group.add(Child(
                    python_module("hwtui.engine.replication.worker", "{answer_fd}", cfg.to_json()),
                    name=f"rank {rank}", env=_worker_env(opts, rank, world, port), answer_pipe=True,
                    stdout="null", stderr="inherit"))
            return _watch(group, children, coord, stopper, cfg_base.timeouts, phases, t_launch)
    finally:
        # Every rank has exited or was terminated with its group, so its staging directory's lock
        # is free: no shared-memory staging copy outlives the run, whichever way it ended (a
        # SIGKILLed rank cannot remove its own).
        sweep_dead_run_dirs(base)


def _watch(group: Group, children: dict[int, Child], coord: Coordinator, stopper: _Stop, timeouts: Timeouts,
           phases: dict[str, float], t_launch: float) -> tuple[str | None, int]:
    failure: tuple[str, int] | None = None
    fail_at: float | None = None
    all_exited_at: float | None = None
    transport_err_at: float | None = None
    ready: set[int] = set()
    rank_of = {c: r for r, c in children.items()}
    # The watchdog: peers normally name a hung rank through their own timeouts; this catches the rest.
    init_stall = timeouts.init + 60.0  # includes interpreter start and `import torch` on a loaded host
    run_stall = max(timeouts.bucket, timeouts.commit) + 5.0
    while True:
        for m in group.poll(0.05):
            raw = m.msg
            if raw is None:
                continue
            if raw.get("kind") == "_rank" and raw.get("what") == "ready":
                ready.add(rank_of[m.child])
                if len(ready) == len(children):
                    phases["launch_to_ready"] = time.perf_counter() - t_launch
            coord.feed(raw)
        now = time.monotonic()
        exited = {r: c.poll() for r, c in children.items()}
        if failure is None:
            if stopper.requested:
                failure = (stopper.describe(), 128 + (stopper.signum or signal.SIGTERM))
                _stop_ranks(children, coord)
            for r, code in exited.items():
                timed_out_on_peer = any(e.rank == r and e.where == "transport" for e in coord.errors)
                if (failure is None and code is not None and code != 0 and not (coord.results.get(r) or {}).get("clean")
                        and not (timed_out_on_peer and code > 0)):
                    # A rank that fell over ends the run at once, whatever phase it was in: before
                    # the world forms its peers would otherwise only notice at the init timeout.
                    # (A rank that gave up waiting for a peer is a witness, not the culprit: the
                    # transport branch below names the peer.)
                    if (coord.results.get(r) or {}).get("bad_input"):
                        failure = (_failure_text(coord, r) or f"rank {r}: bad input", EXIT_USAGE)
                    else:
                        said = _failure_text(coord, r)
                        failure = (f"rank {r} {exit_text(code)} (last reported: {coord.progress[r][1]}"
                                   + (f"; it said: {said}" if said else "") + ")", EXIT_FAILED)
            if transport_err_at is None and any(ev.where == "transport" for ev in coord.errors):
                transport_err_at = now
            # A peer sees a dead rank's socket close a moment before the dead rank can be reaped:
            # wait briefly so a death is reported as a death, not as a hang.
            if failure is None and transport_err_at is not None and now - transport_err_at > 0.5:
                suspects = [r for r, c in exited.items() if c is None and r not in {e.rank for e in coord.errors}]
                if suspects or all(c is not None for c in exited.values()):
                    failure = (_hung_text(coord, suspects) if suspects else _failure_text(coord) or "transport failure",
                               EXIT_FAILED)
            for r, code in exited.items():
                last, what = coord.progress[r]
                limit = run_stall if r in ready else init_stall
                if failure is None and code is None and now - last > limit:
                    failure = (_hung_text(coord, [r]), EXIT_FAILED)
            if failure is not None:
                fail_at = now
        if all(code is not None for code in exited.values()):
            all_exited_at = all_exited_at or now
            # Drain what the ranks wrote before exiting (bounded: a grandchild may hold a pipe open).
            if not group.open_pipes or now - all_exited_at > 1.0:
                break
        if failure is not None and fail_at is not None and now - fail_at > 1.0:
            break  # a short grace for the others to report what they saw; then tear down
    if failure is None:
        return None, 0
    return failure


def _stop_ranks(children: dict[int, Child], coord: Coordinator) -> None:
    """The user's stop, acted on at once (the TUI's `q` and `s` wait on it).

    A rank still starting (before its world joined: importing torch, loading the plan, blocked in
    the rendezvous, where a C++ wait does not even run Python's signal handler) has nothing to
    undo: it is killed. A rank past that gets SIGTERM now, so its abort runs while the launcher
    waits, not after the launcher's grace and the group's (1 s + 2 s: `q` during start-up took
    5.7 s, ended by the TUI's SIGKILL fallback). What a killed rank leaves in /dev/shm the launcher
    sweeps as it always does.
    """
    joined = RANK_PHASES.index("world joined")
    killed, told = [], []
    for rank, child in children.items():
        if child.poll() is not None:
            continue
        if coord.rank_phase.get(rank, -1) < joined:
            child.signal_group(signal.SIGKILL)
            killed.append(rank)
        else:
            child.signal_group(signal.SIGTERM)
            told.append(rank)
    parts = ([f"rank(s) {', '.join(map(str, killed))} killed while starting"] if killed else []) + (
        [f"rank(s) {', '.join(map(str, told))} told to abort (SIGTERM)"] if told else [])
    if parts:
        coord.sink(LogEvent(message="stop: " + "; ".join(parts), level="warn", source="replication"))


def _hung_text(coord: Coordinator, suspects: list[int]) -> str:
    """Name the rank(s) that fell behind: among the silent ones, those that reached the fewest buckets
    (a peer waiting for the hung rank is silent too, but further along)."""
    now = time.monotonic()
    if len(suspects) > 1:
        least = min(coord.reached.get(r, -1) for r in suspects)
        suspects = [r for r in suspects if coord.reached.get(r, -1) == least]
    parts = []
    for r in suspects:
        last, what = coord.progress[r]
        parts.append(f"rank {r} hung (no progress for {now - last:.1f} s, last: {what})")
    others = sorted({e.rank for e in coord.errors if e.where == "transport" and e.rank is not None})
    tail = f"; rank(s) {', '.join(map(str, others))} timed out waiting for it" if others else ""
    return "; ".join(parts) + tail + "; nothing was committed"


def _run_joined(cfg_base: WorkerConfig, joined: dict[str, Any], coord: Coordinator, stopper: _Stop) -> tuple[str | None, int]:
    from hwtui.engine.replication import worker

    cfg = cfg_base.for_rank(joined["rank"], joined["local_rank"], master_addr=joined["master_addr"],
                            master_port=joined["master_port"])

    def emit(raw: dict[str, Any]) -> None:
        coord.feed(json.loads(json.dumps(raw, default=str)))  # the same JSON round trip as local mode

    # In-process, a signal must interrupt the worker rather than only set a flag.
    def on_signal(signum: int, _frame: Any) -> None:
        if stopper.signum is not None:
            return  # a second signal must not cut the first one's clean-up short
        stopper.signum = signum
        worker.GATE.deliver(signum)

    old = {}
    if threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = worker.run_worker(cfg, emit)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if code == worker.EXIT_OK:
        return None, 0
    if code == worker.EXIT_INTERRUPTED:
        return stopper.describe(), 128 + (stopper.signum or signal.SIGTERM)
    text = _failure_text(coord) or f"rank {joined['rank']} failed"
    return text, EXIT_USAGE if code == worker.EXIT_BAD_INPUT else EXIT_FAILED
