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
from dataclasses import dataclass, field, replace
from typing import Any

from hwtui.core.errors import EXIT_FAILED, EXIT_USAGE, HwtuiError
from hwtui.core.events import ErrorEvent, Event, LogEvent
from hwtui.core.net import free_loopback_port
from hwtui.core.private_file import create_private
from hwtui.core.supervisor import Child, Group, python_module
from hwtui.engine.rank_fork import preload_for_ranks
from hwtui.engine.replication.commit import OutLock, ServedDir, read_decision
from hwtui.engine.replication.config import Timeouts, WorkerConfig
from hwtui.engine.replication.coordinator import Coordinator, RankResult, failure_text
from hwtui.engine.replication.events import (
    ReplCommit,
    ReplDone,
    ReplStart,
)
from hwtui.engine.replication.monitor import Monitor, RunOutcome, Stop
from hwtui.engine.replication.plan import Plan, load_plan, preflight_sources
from hwtui.engine.replication.reader import check_direct, check_readers
from hwtui.engine.replication.report import ReplicationReport, build_report
from hwtui.engine.replication.served_files import serve_modes
from hwtui.engine.replication.settings import ReplicationSettings
from hwtui.engine.replication.shm import shm_dir, sweep_dead_run_dirs
from hwtui.engine.replication.transport import TransportChoice, choose_transport, detect_facts, validate_device
from hwtui.probes.distributed.replication_defaults import (
    DEFAULT_INIT_TIMEOUT_S,
    DEFAULT_TARGET_BUCKET_MS,
    DEFAULT_TIMEOUT_S,
    MAX_TIMEOUT_S,
)

MB = 1 << 20
# At most 64 MiB per collective: on gloo over loopback every collective costs setup and thread
# hand-off, and many small concurrent broadcasts cost more in contention than they win in overlap
# (measured: 8 MiB chunks x 4 buckets ran ~25% slower than 32 MiB ones). Buckets that are contiguous
# on both sides go out in pairs (see source_reader.collective_groups), so with the default 32 MiB buckets
# and window 4 one collective carries 64 MiB while the pair before it is being verified. NCCL
# pipelines inside a collective anyway. HOTWEIGHTS_BCAST_CHUNK_MB / --chunk-mb change it.


@dataclass
class ReplicationOptions:
    plan: str
    device: str = "cpu"
    nproc: int | None = None  # None: join an existing world if the environment describes one, else 2
    window: int | None = None  # --inflight; None: HOTWEIGHTS_IPC_INFLIGHT_BUCKETS, else DEFAULT_WINDOW
    max_inflight_mb: float | None = None
    adaptive: bool = False
    target_bucket_ms: float = DEFAULT_TARGET_BUCKET_MS
    chunk_mb: float | None = None  # None: HOTWEIGHTS_BCAST_CHUNK_MB, else DEFAULT_CHUNK_MB
    transport: str | None = None
    verify: bool = True
    same_host: bool = True
    commit: bool = False
    out: str | None = None
    serve_group: str | None = None  # --serve-group: served files 0640 and owned by this group (default: 0600)
    timeout: float = DEFAULT_TIMEOUT_S  # per bucket wait
    init_timeout: float = DEFAULT_INIT_TIMEOUT_S
    commit_timeout: float | None = None  # None: same as timeout
    readers: int | None = None  # --readers: the source's file reader threads (None: from the cores)
    direct_io: str = "auto"  # --direct-io: O_DIRECT for the source's reads (auto: files larger than free memory)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass
class ReplicationResult:
    ok: bool
    exit_code: int
    error: str | None
    report: ReplicationReport


def resolve_settings(opts: ReplicationOptions) -> ReplicationSettings:
    """The run's settings, built once (flag, else environment, else default) after every option is checked."""
    settings = ReplicationSettings.resolve(window=opts.window, chunk_mb=opts.chunk_mb, max_inflight_mb=opts.max_inflight_mb,
                                           adaptive=opts.adaptive, target_bucket_ms=opts.target_bucket_ms,
                                           verify=opts.verify, device=opts.device, env=opts.env)
    timeouts = (opts.timeout, opts.init_timeout, opts.commit_timeout or opts.timeout)
    if min(timeouts) <= 0:
        raise HwtuiError("timeouts must be positive")
    if max(timeouts) > MAX_TIMEOUT_S:
        raise HwtuiError(f"timeouts are at most {MAX_TIMEOUT_S:g} seconds")
    if opts.commit and not opts.out:
        raise HwtuiError("--commit needs --out DIR (where each receiver keeps the version it serves)")
    if opts.serve_group is not None and not opts.commit:
        raise HwtuiError("--serve-group applies to what --commit --out serves: add --commit --out DIR")
    serve_modes(opts.serve_group)  # an unknown group is bad input before anything starts
    return settings


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


def run_replication(opts: ReplicationOptions, on_event: Callable[[Event], None] | None = None,
                    stop: threading.Event | None = None) -> ReplicationResult:
    """Run a replication; raises HwtuiError for bad input (nothing started, nothing written)."""
    sink = on_event or (lambda ev: None)
    t_wall = time.perf_counter()
    if opts.readers is not None:
        check_readers(opts.readers)
    check_direct(opts.direct_io)
    settings = resolve_settings(opts)
    # The device first: a torch that cannot drive it is bad input before any transport line.
    opts.device = validate_device(opts.device)
    settings = replace(settings, device=opts.device)
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
               settings: ReplicationSettings, sink: Callable[[Event], None], stop: threading.Event | None,
               t_wall: float) -> ReplicationResult:
    facts = {"rocm": False, "multi_node": False, "xccl_available": False}
    if opts.device != "cpu":
        facts = detect_facts(opts.device, {**opts.env, **({} if joined else {"WORLD_SIZE": str(world)})})
    choice = choose_transport(opts.device, opts.transport, **facts)

    sink(LogEvent(message=choice.decision_line(), source="replication.transport"))
    sink(ReplStart(plan_digest=plan.digest, model=plan["model"], version=plan["version"], total_bytes=plan["total_bytes"],
                   n_buckets=len(plan.buckets), bucket_bytes=plan["bucket_bytes"], world_size=world, device=opts.device,
                   transport=choice.name, window=settings.window, chunk_bytes=settings.chunk_bytes))
    coord = Coordinator(plan, ranks, sink, world_size=world)
    cfg_base = _worker_config(opts, plan, choice, world, settings)
    launcher_phases: dict[str, float] = {}
    outcome, decided = _run_ranks(opts, plan, ranks, joined, cfg_base, coord, stop, launcher_phases)
    results = [coord.result_of(r) for r in ranks]
    serving = _serving_now(opts, ranks, joined, coord)
    ok, outcome = _settle(opts, plan, coord, results, outcome, decided, serving)
    transfer = max((r.transfer_s for r in results), default=0.0)
    seconds = transfer if transfer > 0 else time.perf_counter() - t_wall
    committed = bool(ok and opts.commit and (decided or joined))
    report = build_report(ok=ok, error=outcome.error, plan=plan.raw, settings=settings, transport=choice.to_dict(),
                          world_size=world, mode="join" if joined else "local", ranks=[dict(r.row) for r in results],
                          seconds=seconds, wall_seconds=time.perf_counter() - t_wall, committed=committed,
                          launcher_phases=launcher_phases, serving=serving,
                          decision="commit" if decided else ("abort" if opts.commit else None))
    if outcome.error is not None:
        sink(ErrorEvent(message=outcome.error, rank=None, where="replication"))
    sink(ReplDone(ok=ok, bytes=plan["total_bytes"] if ok else coord.bytes_done, seconds=round(seconds, 6),
                  gbps=report["gbps"], report=report))
    return ReplicationResult(ok=ok, exit_code=0 if ok else outcome.exit_code, error=outcome.error, report=report)


def _worker_config(opts: ReplicationOptions, plan: Plan, choice: TransportChoice, world: int,
                   settings: ReplicationSettings) -> WorkerConfig:
    """Rank 0's config; every rank's is this one with its own rank and rendezvous (for_rank)."""
    return WorkerConfig(
        plan=os.path.abspath(opts.plan), plan_digest=plan.digest, transport=choice, world_size=world, rank=0,
        settings=settings, same_host=opts.same_host, commit=opts.commit, out=os.path.abspath(opts.out) if opts.out else None,
        serve_group=opts.serve_group,
        timeouts=Timeouts(init=opts.init_timeout, bucket=opts.timeout, commit=opts.commit_timeout or opts.timeout),
        fault=opts.env.get("HWTUI_TEST_FAULT"), readers=opts.readers, direct_io=opts.direct_io)


def _run_ranks(opts: ReplicationOptions, plan: Plan, ranks: list[int], joined: dict[str, Any] | None,
               cfg_base: WorkerConfig, coord: Coordinator, stop: threading.Event | None,
               launcher_phases: dict[str, float]) -> tuple[RunOutcome, bool]:
    """Run the ranks (local processes, or this process's rank of a joined world) to their end:
    (how they ended, whether the commit was decided)."""
    decided = False
    with Stop(stop) as stopper:
        if joined:
            outcome = _run_joined(cfg_base, joined, coord, stopper)
        else:
            outcome = _run_local(cfg_base, cfg_base.world_size, coord, stopper, opts, launcher_phases)
        if opts.out and opts.commit:
            decided = read_decision(opts.out, plan["version"]) is not None
            if not outcome.ok and not decided and not joined:
                # Every local worker is gone now; a rank that was killed could not remove its own
                # staging copy. Only staging/<version> goes: CURRENT and versions/ are never touched.
                # With a decision recorded the prepared copies are what a re-run finishes from.
                for r in ranks[1:]:
                    ServedDir(opts.out, r).abort(plan["version"])
    return outcome, decided


def _serving_now(opts: ReplicationOptions, ranks: list[int], joined: dict[str, Any] | None,
                 coord: Coordinator) -> dict[int, str | None]:
    """What every receiver serves after the run: read from --out, or (joined rank 0) from their reports."""
    serving = _serving(opts.out, ranks) if opts.out and opts.commit else {}
    if joined and coord.tally is not None:
        # Rank 0 of a joined world: the receivers are other processes, often on other nodes, so
        # what each serves comes from its own report, not from this node's disk.
        serving = {int(r): v for r, v in coord.tally.get("serving", {}).items()}
        serving.update({int(r): UNREPORTED for r in coord.tally.get("unknown", [])})
    return serving


def _settle(opts: ReplicationOptions, plan: Plan, coord: Coordinator, results: list[RankResult], outcome: RunOutcome,
            decided: bool, serving: dict[int, str | None]) -> tuple[bool, RunOutcome]:
    """The run's verdict (ok, and the outcome it reports) and the commit events that say it."""
    sink, version = coord.sink, plan["version"]
    ok = outcome.ok and all(r.ok for r in results) and len(coord.results) == len(results)
    if decided:
        # The decision is the commit point: the outcome is what every rank serves now.
        lagging = {r: v for r, v in serving.items() if v != version}
        ok = not lagging
        if ok:
            outcome = RunOutcome()
            n = len(serving)
            sink(ReplCommit(version=version, phase="commit", ok=True,
                            detail=f"all {n} receiver{'s' if n != 1 else ''} switched to {version}"
                                   + (f" ({serving_text(serving)})" if n else "")))
        else:
            why = failure_text(coord)
            outcome = RunOutcome(f"version {version} is committed (decision recorded) but {serving_text(lagging)}"
                                 + (f" ({why})" if why else "") + ": re-run the same command to finish the switch",
                                 EXIT_FAILED)
            sink(ReplCommit(version=version, phase="commit", ok=False, detail=serving_text(serving)))
    elif opts.commit and ok:
        # Joined rank 0 on another host, or a world without receivers here: no record on this disk.
        sink(ReplCommit(version=version, phase="commit", ok=True, detail=f"switched to {version}"))
    if outcome.ok and not ok:
        outcome = RunOutcome(failure_text(coord) or "the run did not complete on every rank",
                             EXIT_USAGE if any(r.bad_input for r in results) else EXIT_FAILED)
    if not outcome.ok and not decided and (coord.decided is None or coord.decided.get("unanimous")):
        sink(ReplCommit(version=version, phase="abort", ok=True,
                        detail=f"nothing committed; every rank keeps serving {plan['prev_version'] or 'what it had'}"))
    return ok, outcome


def _finish_decided(opts: ReplicationOptions, plan: Plan, ranks: list[int], settings: ReplicationSettings, world: int,
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
    rows = [{"rank": r, "ok": r in done or r == 0, "serves": serving.get(r), "recovery": done.get(r)} for r in ranks]
    report = build_report(ok=ok, error=error, plan=plan.raw, settings=settings, transport=None, world_size=world, mode=mode,
                          ranks=rows, seconds=0.0,
                          wall_seconds=time.perf_counter() - t_wall, committed=ok, launcher_phases={},
                          serving=serving, decision="commit", recovered=True)
    if error is not None:
        sink(ErrorEvent(message=error, rank=None, where="replication"))
    sink(ReplDone(ok=ok, bytes=0, seconds=0.0, gbps=0.0, report=report))
    return ReplicationResult(ok=ok, exit_code=0 if ok else EXIT_FAILED, error=error, report=report)


def _worker_env(opts: ReplicationOptions, rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(opts.env)
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)})
    # N busy ranks on a few cores: keep torch's intra-op pools from oversubscribing them.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    return env  # the supervisor puts this tree's hwtui first on PYTHONPATH


def _run_local(cfg_base: WorkerConfig, world: int, coord: Coordinator, stopper: Stop, opts: ReplicationOptions,
               phases: dict[str, float]) -> RunOutcome:
    port = free_loopback_port()
    t_launch = time.perf_counter()
    # Shared-memory staging left by a run that was killed outright (this launcher's predecessor
    # SIGKILLed: its ranks died with it) goes now; a live run's is locked and stays.
    base = shm_dir(opts.env)
    sweep_dead_run_dirs(base)
    # One `import torch` here, forked into every rank, instead of one per rank (engine/rank_fork.py).
    # Before any thread of ours starts: a process with threads is never forked.
    if (why := preload_for_ranks(opts.device, opts.env)) is not None:
        coord.sink(LogEvent(message=f"ranks are exec'd, not forked: {why}", level="debug", source="replication.launch"))
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
                    stdout="null", stderr="inherit", fork=True))
                if why is None and children[rank].fork_refusal is not None:
                    coord.sink(LogEvent(message=f"rank {rank} is exec'd, not forked: {children[rank].fork_refusal}",
                                        level="debug", source="replication.launch"))
            return Monitor(group, children, coord, stopper, cfg_base.timeouts, phases, t_launch).watch()
    finally:
        # Every rank has exited or was terminated with its group, so its staging directory's lock
        # is free: no shared-memory staging copy outlives the run, whichever way it ended (a
        # SIGKILLed rank cannot remove its own).
        sweep_dead_run_dirs(base)


def _run_joined(cfg_base: WorkerConfig, joined: dict[str, Any], coord: Coordinator, stopper: Stop) -> RunOutcome:
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
        return RunOutcome()
    if code == worker.EXIT_INTERRUPTED:
        return RunOutcome(stopper.describe(), 128 + (stopper.signum or signal.SIGTERM))
    text = failure_text(coord) or f"rank {joined['rank']} failed"
    return RunOutcome(text, EXIT_USAGE if code == worker.EXIT_BAD_INPUT else EXIT_FAILED)
