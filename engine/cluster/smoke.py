"""What every rank runs under the launcher: `hwtui cluster test`.

The order is chosen so that each failure is explained where it happens:

0. **Local check** (`preflight`): the interface, plugin and port findings that would make joining
   pointless. A blocked rank still registers, with its finding, so rank 0 names it at once.
1. **Reach the store** (rank 0 hosts it unless torchrun's agent does). Before handing the address
   to TCPStore a plain TCP connect probe runs, because only it can tell "connection refused"
   (nothing listening yet, or a firewall REJECT) from "no answer" (a firewall DROP / blocked port).
2. **Roll call**: each rank registers its node name in the store; rank 0 waits at most the join
   timeout and publishes a verdict naming the ranks and nodes that never came. Only then is a
   process group formed, so a missing node costs ``join_timeout`` seconds, not gloo's 30 minutes.
2b. **Reach test** (`reach`): every rank connects to every other over TCP, so a firewalled node is
   named in seconds instead of the process group timing out with no names.
3. **Process group** on a prefix of the same store, with ``timeout=`` so no collective waits forever.
4. **Local check** on every rank, reports gathered as JSON (``gather``), nodes compared (``compare``).
5. **Correctness** all-reduce of known values, then the **bandwidth** sweep.

Each rank keeps what it is doing under ``said/<rank>`` in the store, so a failure can name the
ranks that did not get as far and what they last said.

Every rank computes the same verdict (the reports are all-gathered, the timings all-reduced), so
every rank exits with the same code and the launcher's summary agrees with rank 0's report.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict, cast

from hwtui.core.events import Event
from hwtui.core.finding import Finding, FindingDict, Status, fail, passed, skip
from hwtui.core.net import free_loopback_port, probe_port
from hwtui.core.redact import redact_doc
from hwtui.engine.cluster import compare as cmp
from hwtui.engine.cluster.bandwidth import OPS, BandwidthResult, Correctness, correctness, floor_failures, measure
from hwtui.engine.cluster.events import BandwidthEvent, CorrectnessEvent, DoneEvent, MismatchEvent, NodeEvent
from hwtui.engine.cluster.spec import ClusterSpec

if TYPE_CHECKING:  # torch is imported inside the rank (start-up time of the CLI that imports this)
    from torch.distributed import PrefixStore, Store

REPORT_SCHEMA = "hwtui.cluster.report/1"
POLL_S = 0.2


class ClusterFailure(Exception):
    """The test could not run (store unreachable, process group did not form); one-line message."""


@dataclass
class SmokeOptions:
    spec: ClusterSpec | None = None
    node: str | None = None
    backend: str = "auto"
    join_timeout: float = 60.0
    timeout: float = 60.0
    sizes: list[int] = field(default_factory=lambda: [1024, 64 * 1024, 1024 * 1024, 16 * 1024 * 1024])
    ops: tuple[str, ...] = OPS
    iters: int = 10
    warmup: int = 3
    min_busbw: float | None = None
    sweep: bool = True


@dataclass
class LaunchContext:
    launcher: str  # torchrun | slurm | mpirun | env | single
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    agent_store: bool  # torchrun's agent hosts the store; every rank is a client
    run_key: str

    @property
    def fixed_layout(self) -> bool:
        """True when rank r is known to run on node r // devices (not torchrun's elastic assignment)."""
        return self.launcher in ("slurm", "mpirun", "env")


class ClusterNodeRow(TypedDict):
    node: str
    ranks: list[int]
    summary: str  # torch build, python, route and local check worst, in one line


class _ClusterReportBody(TypedDict):
    schema: str
    launcher: str
    world_size: int
    backend: str
    master: str  # host:port of the rendezvous
    join_timeout: float
    timeout: float
    ok: bool
    # A test that ran: one row per node. A test stopped before the process group (a node missing
    # or unreachable): the names of the nodes that joined.
    nodes: list[ClusterNodeRow] | list[str]
    findings: list[FindingDict]
    duration_s: float


class ClusterReport(_ClusterReportBody, total=False):
    """``cluster test --report``: rank 0's report. The test's own figures exist when it ran; ``missing``
    when it stopped because nodes never joined."""

    missing: list[dict[str, Any]]
    correctness: dict[str, Any]
    bandwidth: list[dict[str, Any]]
    min_busbw: float | None
    sizes: list[int]
    iters: int
    warmup: int
    ranks: list[dict[str, Any]]  # every rank's own report, as gathered (peer.py checks it)


@dataclass
class SmokeResult:
    rank: int
    exit_code: int
    message: str
    report: ClusterReport | None = None  # rank 0 only


def _int_env(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            shown = repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"
            if not value.isascii() or not value.strip().isdigit() or len(value) > 12:
                raise ClusterFailure(f"{name}={shown} is not a number")
            return int(value)
    return None


def detect_launch(env: Mapping[str, str], spec: ClusterSpec | None) -> LaunchContext:
    """Rank, world size and rendezvous address from whichever launcher started us."""
    if env.get("TORCHELASTIC_RUN_ID") is not None or env.get("TORCHELASTIC_USE_AGENT_STORE") is not None:
        launcher = "torchrun"
        rank, world, local = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE"), _int_env(env, "LOCAL_RANK")
    elif env.get("SLURM_PROCID") is not None and env.get("SLURM_NTASKS") is not None:
        launcher = "slurm"
        rank, world, local = _int_env(env, "SLURM_PROCID"), _int_env(env, "SLURM_NTASKS"), _int_env(env, "SLURM_LOCALID")
    elif env.get("OMPI_COMM_WORLD_RANK") is not None or env.get("PMI_RANK") is not None or env.get("PMIX_RANK") is not None:
        launcher = "mpirun"
        rank = _int_env(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
        world = _int_env(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
        local = _int_env(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK")
    elif env.get("RANK") is not None and env.get("WORLD_SIZE") is not None:
        launcher = "env"
        rank, world, local = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE"), _int_env(env, "LOCAL_RANK")
    else:
        launcher, rank, world, local = "single", 0, 1, 0
    if world is None or rank is None:
        raise ClusterFailure(f"launched by {launcher} but the rank or world size is missing from the environment")
    if world < 1 or not 0 <= rank < world:
        raise ClusterFailure(f"rank {rank} is outside a world of {world}")
    if local is None:
        local = rank % spec.devices_per_node if spec else 0
    addr = env.get("MASTER_ADDR") or (spec.master if spec else None)
    port = _int_env(env, "MASTER_PORT") or (spec.master_port if spec else None)
    if launcher == "single":
        addr, port = addr or "127.0.0.1", port or free_loopback_port()
    if not addr or not port:
        raise ClusterFailure("no rendezvous address: set MASTER_ADDR and MASTER_PORT (the env files from "
                             "`hwtui cluster init` do) or pass --spec cluster.json")
    if not 1 <= int(port) <= 65535:
        raise ClusterFailure(f"MASTER_PORT={port} is not a TCP port (1-65535)")
    run_key = "-".join(filter(None, [env.get("TORCHELASTIC_RUN_ID"), env.get("TORCHELASTIC_RESTART_COUNT"),
                                     env.get("SLURM_JOB_ID")])) or "run"
    return LaunchContext(launcher, rank, world, local, addr, int(port),
                         env.get("TORCHELASTIC_USE_AGENT_STORE") == "True", run_key)


def identify_node(env: Mapping[str, str], explicit: str | None, spec: ClusterSpec | None) -> str:
    """This rank's node name: --node, then HWTUI_CLUSTER_NODE (env files set it), then matching
    the host name or a local address against cluster.json, then the host name."""
    if explicit:
        return explicit
    if env.get("HWTUI_CLUSTER_NODE"):
        return env["HWTUI_CLUSTER_NODE"]
    hostname = socket.gethostname()
    if spec:
        short = hostname.split(".")[0]
        for node in spec.nodes:
            if node.name in (hostname, short) or node.addr in (hostname, short):
                return node.name
        from hwtui.engine.cluster.local import local_addresses

        mine = local_addresses()
        for node in spec.nodes:
            if node.addr in mine:
                return node.name
    return hostname


# -- reaching the store ------------------------------------------------------------------------

def connect_store(ctx: LaunchContext, node: str, timeout: float, master_node: str | None) -> PrefixStore:
    from torch.distributed import PrefixStore, TCPStore

    where = f"{ctx.master_addr}:{ctx.master_port}"
    td = timedelta(seconds=timeout)
    if ctx.rank == 0 and not ctx.agent_store:
        try:
            store = TCPStore(ctx.master_addr, ctx.master_port, None, True, td, wait_for_workers=False)
        except Exception as exc:  # noqa: BLE001 - RuntimeError/DistStoreError, by torch version
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            hint = ("another job (or a stale test) holds it: pick another with --master-port, or find it with "
                    f"`ss -ltnp | grep {ctx.master_port}`") if "in use" in text.lower() else "check MASTER_ADDR is an address of this node"
            raise ClusterFailure(f"rank 0 on {node} cannot listen on port {ctx.master_port}: {text}; {hint}") from None
    else:
        ok, why = probe_port(ctx.master_addr, ctx.master_port, timeout)
        if not ok:
            host = f" (node {master_node})" if master_node else ""
            raise ClusterFailure(
                f"rank {ctx.rank} on node {node} cannot reach the rendezvous store at {where}{host} within {timeout:g} s: "
                f"{why}. Is `hwtui cluster test` running on the master? From {node}: nc -zv {ctx.master_addr} "
                f"{ctx.master_port}; on the master: allow tcp/{ctx.master_port} in the firewall")
        try:
            store = TCPStore(ctx.master_addr, ctx.master_port, None, False, td)
        except Exception as exc:  # noqa: BLE001
            raise ClusterFailure(f"rank {ctx.rank} on node {node}: the store at {where} accepted a connection but "
                                 f"did not answer: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    return PrefixStore(f"hwtui-cluster/{ctx.run_key}", store)


# -- roll call -----------------------------------------------------------------------------------

def _missing_label(rank: int, ctx: LaunchContext, spec: ClusterSpec | None) -> dict[str, Any]:
    node = spec.node_of_rank(rank) if (spec and ctx.fixed_layout) else None
    return {"rank": rank, "node": node.name if node else None, "address": node.addr if node else None}


def roll_call(store: Store, ctx: LaunchContext, me: dict[str, Any], join_timeout: float, spec: ClusterSpec | None,
              backend: str) -> dict[str, Any]:
    """Register, then (rank 0) wait for everyone or (others) wait for rank 0's verdict."""
    store.set(f"join/{ctx.rank}", json.dumps(me))
    if ctx.rank != 0:
        try:
            store.wait(["verdict"], timedelta(seconds=join_timeout + 15))
        except Exception:  # noqa: BLE001 - DistStoreError: a timeout
            raise ClusterFailure(f"rank 0 did not publish the roll call within {join_timeout + 15:g} s "
                                 f"(rank {ctx.rank} on {me['node']} gave up)") from None
        return cast("dict[str, Any]", json.loads(store.get("verdict")))  # rank 0 wrote it (below)

    keys = [f"join/{r}" for r in range(ctx.world_size)]
    started = time.monotonic()
    while not store.check(keys) and time.monotonic() - started < join_timeout:
        time.sleep(POLL_S)
    joined = {}
    for r, key in enumerate(keys):
        if store.check([key]):
            joined[r] = json.loads(store.get(key))
    missing = [_missing_label(r, ctx, spec) for r in range(ctx.world_size) if r not in joined]
    if backend == "auto":
        backend = "nccl" if joined and all(j.get("cuda") for j in joined.values()) and not missing else "gloo"
    blocked = {str(r): j["blocked"] for r, j in joined.items() if j.get("blocked")}
    verdict = {"ok": not missing and not blocked, "missing": missing, "blocked": blocked,
               "joined": {str(r): j for r, j in joined.items()},
               "waited_s": round(time.monotonic() - started, 2), "join_timeout": join_timeout, "backend": backend}
    store.set("verdict", json.dumps(verdict))
    return verdict


def missing_findings(verdict: dict[str, Any], spec: ClusterSpec | None = None,
                     said: Mapping[str, str] | None = None) -> list[Finding]:
    """One finding per rank that never registered; ``said`` holds what an absent node's launch
    script reported before it gave up (`hwtui cluster preflight` posts its finding to the store)."""
    said = said or {}
    out = []
    came = {j.get("node") for j in verdict["joined"].values()}
    absent = [n.name for n in spec.nodes if n.name not in came] if spec else []
    for m in verdict["missing"]:
        if m.get("node"):
            where = f" (node {m['node']}, {m['address']})"
        elif absent:
            # torchrun assigns ranks to nodes itself, so the rank's node is one of those with no rank.
            where = f" (no rank came from node {', '.join(absent)})"
        else:
            where = ""
        suspects = [m["node"]] if m.get("node") else absent
        heard = [f"{n} said: {said[n]}" for n in suspects if said.get(n)]
        remedy = (f"start the launch command on {', '.join(suspects)}; if it runs, its own error line says why it could "
                  f"not register (from there: nc -zv MASTER_ADDR MASTER_PORT)" if suspects
                  else "start every rank; check each node reaches MASTER_ADDR:MASTER_PORT")
        out.append(fail(f"cluster.join[rank {m['rank']}]",
                        f"rank {m['rank']}{where} never joined within {verdict['join_timeout']:g} s"
                        + (f"; {'; '.join(heard)}" if heard else ""),
                        f"{len(verdict['joined'])} of {len(verdict['joined']) + len(verdict['missing'])} ranks registered "
                        f"in the rendezvous store; the test stops before forming a process group.",
                        remedy, rank=m["rank"], node=m.get("node"), candidates=absent, said={n: said[n] for n in suspects
                                                                                               if n in said}))
    return out


def blocked_findings(verdict: dict[str, Any]) -> list[Finding]:
    """One finding per node whose local check stopped it before joining, with that check's fix."""
    out: dict[str, Finding] = {}
    for r, found in sorted(verdict.get("blocked", {}).items(), key=lambda kv: int(kv[0])):
        node = verdict["joined"][r]["node"]
        if node in out:
            continue
        first = Finding.from_dict(found[0])
        out[node] = fail(f"cluster.preflight[{node}]", f"node {node} stopped before joining: {first.title}",
                         first.detail + (f" ({len(found) - 1} more)" if len(found) > 1 else ""),
                         f"on {node}: {first.remedy}" if first.remedy else f"on {node}: hwtui --check --only env",
                         node=node, rank=int(r), ids=[f.get("id") for f in found])
    return list(out.values())


def preflight_key(node: str) -> str:
    """Where a node's launch script leaves the finding that stopped it (the store's raw key space:
    the script runs before any launcher has assigned a rank or run id)."""
    return f"hwtui-cluster-preflight/{node}"


def _absent_said(spec: ClusterSpec | None, present: set[str]) -> dict[str, str]:
    """What the launch scripts of nodes with no rank left in the rendezvous store before stopping.

    They post to the endpoint cluster.json names (`hwtui cluster preflight`): under torchrun
    that is the c10d rendezvous store, not the agent store the workers use, so a client is
    opened there, and only when some node is absent (a healthy run never pays for it)."""
    absent = [n.name for n in spec.nodes if n.name not in present] if spec else []
    if not spec or not absent or not probe_port(spec.master, spec.master_port, 1.0)[0]:
        return {}
    said = {}
    try:
        from torch.distributed import TCPStore

        store = TCPStore(spec.master, spec.master_port, None, False, timedelta(seconds=5))
        for name in absent:
            if store.check([preflight_key(name)]):
                said[name] = store.get(preflight_key(name)).decode("utf-8", "replace")[:500]
    except Exception:  # noqa: BLE001 - a failing store must not hide the finding we already have
        return said
    return said


# -- the run -------------------------------------------------------------------------------------

def _summary(rep: Mapping[str, Any]) -> str:
    t = rep.get("torch", {})
    build = "cuda " + t["cuda"] if t.get("cuda") else ("rocm " + t["hip"] if t.get("hip") else "cpu")
    route = rep.get("route") or {}
    return (f"torch {t.get('version')} ({build}), python {rep.get('python')}, "
            f"{route.get('interface') or '?'} {route.get('local_addr') or '?'}, local check: {rep.get('check', {}).get('worst')}")


def _wait_done(store: Store, ctx: LaunchContext, timeout: float, ranks: list[int] | None = None) -> None:
    """Rank 0 hosts the store in fixed layouts: it must outlive the other ranks' last store call."""
    store.set(f"done/{ctx.rank}", "1")
    if ctx.rank == 0 and not ctx.agent_store:
        deadline = time.monotonic() + timeout
        keys = [f"done/{r}" for r in (range(ctx.world_size) if ranks is None else ranks)]
        while not store.check(keys) and time.monotonic() < deadline:
            time.sleep(POLL_S)


@dataclass
class _Run:
    """What every step of one rank's run reads: who it is, where it reports, what it has heard."""

    opts: SmokeOptions
    ctx: LaunchContext
    node: str
    store: Any
    say: Callable[[Event], None]  # rank 0 emits; the other ranks say nothing
    secrets: dict[str, str]
    base: dict[str, Any]  # the report's fields known before the test
    started: float
    verdict: dict[str, Any]  # the roll call's
    blocked: list[Finding]  # this node's local check findings that stop it


def run(opts: SmokeOptions, emit: Callable[[Event], None], env: Mapping[str, str] | None = None) -> SmokeResult:
    import torch

    env = dict(os.environ if env is None else env)
    started = time.monotonic()
    spec = opts.spec
    secrets = dict(spec.extra_env) if spec else {}
    ctx = detect_launch(env, spec)
    node = identify_node(env, opts.node, spec)
    host_node = spec.master_node() if spec else None
    master_node = host_node.name if host_node else None

    # The local check first: a node that cannot work (interface, plugin) says so before it joins,
    # and registers with its finding so rank 0 names it at once instead of after the timeout.
    from hwtui.engine.cluster.preflight import blockers, mark_started, one_line

    marking = ctx.launcher == "torchrun" and ctx.rank == 0 and spec is not None
    if marking and spec is not None:
        # torchrun's rendezvous has closed: a node that comes now must be refused by its launch
        # script's torchrun (engine/cluster/torchrun.py reads this mark), not join torchrun's next
        # round, which restarts the running nodes. First thing, to keep that window short.
        mark_started(spec, None, ctx.world_size)
    blocked = blockers(env)
    store = connect_store(ctx, node, opts.join_timeout, master_node)
    cuda = bool(torch.cuda.is_available())
    me = {"node": node, "hostname": socket.gethostname(), "local_rank": ctx.local_rank, "pid": os.getpid(), "cuda": cuda,
          "blocked": [f.to_dict() for f in blocked]}
    _say(store, ctx.rank, "registered" if not blocked else f"stopped by its local check: {one_line(blocked[0])}")
    verdict = roll_call(store, ctx, me, opts.join_timeout, spec, opts.backend)
    backend = verdict["backend"]
    if marking and spec is not None:  # now with the names of the nodes it runs with, for the late node's message
        mark_started(spec, sorted({str(j["node"]) for j in verdict["joined"].values()}), ctx.world_size)

    base = {"schema": REPORT_SCHEMA, "launcher": ctx.launcher, "world_size": ctx.world_size, "backend": backend,
            "master": f"{ctx.master_addr}:{ctx.master_port}", "join_timeout": opts.join_timeout, "timeout": opts.timeout}
    r = _Run(opts, ctx, node, store, emit if ctx.rank == 0 else (lambda ev: None), secrets, base, started, verdict,
             blocked)

    if not verdict["ok"]:
        came = {j["node"] for j in verdict["joined"].values()}
        absent = missing_findings(verdict, spec, _absent_said(spec, came)) + blocked_findings(verdict)
        return _stop(r, absent, {"missing": verdict["missing"]}, [int(k) for k in verdict["joined"]])

    nodes_by_rank = {int(k): j["node"] for k, j in verdict["joined"].items()}
    unreachable = _unreachable(r, nodes_by_rank)
    if unreachable:
        return _stop(r, unreachable, {}, None)

    auto_iface = _pin_gloo_interface(backend, env, ctx)
    device = _form_group(r, backend, nodes_by_rank)
    _say(store, ctx.rank, "process group formed; gathering node reports")
    reports, findings, check, results = _test(r, env, device, auto_iface)
    return _finish(r, reports, findings, check, results)


def _stop(r: _Run, findings: list[Finding], extra: dict[str, Any], ranks: list[int] | None) -> SmokeResult:
    """End the test before the process group: rank 0 reports the findings, every rank exits 1."""
    from hwtui.engine.cluster.preflight import one_line

    ctx = r.ctx
    mine = [f for f in findings if f.data.get("rank") == ctx.rank or f.data.get("node") == r.node]
    own = f"local check on node {r.node} failed before joining: {one_line(r.blocked[0])}" if r.blocked else None
    msg = own or "; ".join(f.title for f in (mine or findings))
    report = None
    if ctx.rank == 0:
        nodes = sorted({j["node"] for j in r.verdict["joined"].values()})
        for f in findings:
            r.say(MismatchEvent(finding=f.to_dict()))
        r.say(DoneEvent(ok=False, world_size=ctx.world_size, nodes=nodes, findings=[f.to_dict() for f in findings]))
        report = _public({**r.base, "ok": False, "nodes": nodes, "findings": [f.to_dict() for f in findings], **extra,
                          "duration_s": round(time.monotonic() - r.started, 2)}, r.secrets)
    _wait_done(r.store, ctx, 5.0, ranks)
    return SmokeResult(ctx.rank, 1, msg, report)


def _unreachable(r: _Run, nodes_by_rank: dict[int, str]) -> list[Finding]:
    """Every rank opens a TCP connection to every other before the process group: the findings of
    the pairs that failed (none in a world of one)."""
    from hwtui.engine.cluster.local import route_to
    from hwtui.engine.cluster.reach import check_peers

    ctx, store = r.ctx, r.store
    if ctx.world_size <= 1:
        return []
    _say(store, ctx.rank, "testing connections to its peers")
    address = route_to(ctx.master_addr, ctx.master_port).get("local_addr") or "0.0.0.0"  # noqa: S104
    reach = check_peers(store, ctx.rank, ctx.world_size, address, nodes_by_rank,
                        connect_timeout=min(3.0, r.opts.timeout), timeout=r.opts.join_timeout,
                        last_said=lambda rank: _heard(store, rank))
    if reach["ok"]:
        return []
    unreachable = [Finding.from_dict(f) for f in reach["findings"]]
    if not unreachable:
        raise ClusterFailure(f"rank {ctx.rank} on {r.node}: {reach.get('error', 'the connection test failed')}")
    return unreachable


def _pin_gloo_interface(backend: str, env: Mapping[str, str], ctx: LaunchContext) -> str | None:
    """Gloo binds to the address the host name resolves to unless told otherwise; on a machine whose
    host name points at another network (or at nothing, in a container) that fails obscurely.
    Pin it to the interface that routes to the master, which is the one the store just used."""
    from hwtui.engine.cluster.local import route_to

    auto_iface = None
    if backend == "gloo" and not env.get("GLOO_SOCKET_IFNAME") and ctx.world_size > 1:
        auto_iface = route_to(ctx.master_addr, ctx.master_port).get("interface")
        if auto_iface:
            os.environ["GLOO_SOCKET_IFNAME"] = auto_iface
    return auto_iface


def _form_group(r: _Run, backend: str, nodes_by_rank: dict[int, str]) -> Any:
    """init_process_group over the store; the device the collectives run on."""
    import torch
    import torch.distributed as dist
    from torch.distributed import PrefixStore

    ctx, store, timeout = r.ctx, r.store, r.opts.timeout
    device: Any = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", ctx.local_rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
    _say(store, ctx.rank, f"forming the {backend} process group")
    try:
        dist.init_process_group(backend, store=PrefixStore("pg", store), rank=ctx.rank, world_size=ctx.world_size,
                                timeout=timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001
        behind = _behind(store, ctx, nodes_by_rank, f"forming the {backend} process group")
        raise ClusterFailure(
            f"rank {ctx.rank} on {r.node}: the {backend} process group did not form within {timeout:g} s: "
            f"{str(exc).splitlines()[0][:300] if str(exc) else exc!r}. Every rank reached every other over TCP just "
            f"before, so suspect the transport settings (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME, NCCL_NET_PLUGIN)"
            + (f"; last heard: {behind}" if behind else "")) from None
    return device


_Tested = tuple[list[dict[str, Any]], list[Finding], Correctness, list[BandwidthResult]]


def _test(r: _Run, env: Mapping[str, str], device: Any, auto_iface: str | None) -> _Tested:
    """Inside the process group: gather the node reports, compare them, check an all-reduce, sweep
    the bandwidth. A peer that dies or a link that drops is one ClusterFailure naming the stage."""
    import torch.distributed as dist

    from hwtui.engine.cluster.gather import GatherError
    from hwtui.engine.cluster.peer import PeerReportError

    ctx, opts, store = r.ctx, r.opts, r.store
    stage = "gathering the node reports"
    try:
        reports = _gather_reports(r, env, device, auto_iface)
        findings = _node_findings(r, reports)

        stage = "the correctness all-reduce"
        _say(store, ctx.rank, "running the correctness all-reduce")
        check = correctness(ctx.rank, ctx.world_size, device)
        r.say(CorrectnessEvent(ok=check.ok, expected=check.expected, got=check.got))
        findings.append(_correctness_finding(check, reports))

        stage = "the bandwidth sweep"
        _say(store, ctx.rank, "running the bandwidth sweep")
        results: list[BandwidthResult] = []
        if opts.sweep and ctx.world_size > 1 and check.ok:
            results = _sweep(r, device)
            findings += _bandwidth_findings(results, opts.min_busbw)
        elif opts.sweep:
            reason = "a world of one rank has no link to measure" if ctx.world_size == 1 else "the correctness test failed"
            findings.append(skip("cluster.bandwidth", f"bandwidth sweep skipped: {reason}"))
    except (RuntimeError, GatherError, PeerReportError) as exc:  # DistBackendError & co. derive from RuntimeError
        # A peer that dies or a link that drops mid-test surfaces here after `timeout` at most.
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterFailure(f"rank {ctx.rank} on {r.node}: {stage} failed after at most {opts.timeout:g} s: {first[:300]}. "
                             "Another rank died or the network between the nodes dropped; its own output says which") from None
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return reports, findings, check, results


def _gather_reports(r: _Run, env: Mapping[str, str], device: Any, auto_iface: str | None) -> list[dict[str, Any]]:
    """Every rank's report, on every rank; rank 0 emits one NodeEvent per rank."""
    from hwtui.engine.cluster.gather import all_gather_json
    from hwtui.engine.cluster.local import SCHEMA as RANK_SCHEMA
    from hwtui.engine.cluster.local import rank_report
    from hwtui.engine.cluster.peer import cap, checked_report

    ctx = r.ctx
    mine = rank_report(rank=ctx.rank, local_rank=ctx.local_rank, world_size=ctx.world_size, node=r.node,
                       master=ctx.master_addr, master_port=ctx.master_port, env={**env, **os.environ},
                       secrets=r.secrets)
    if auto_iface:
        mine["gloo_socket_ifname_auto"] = auto_iface
    # Peers' reports are capped and shape-checked before anything reads them (peer.py).
    reports = [checked_report(cap(rep), slot, RANK_SCHEMA)
               for slot, rep in enumerate(all_gather_json(mine, device=device))]
    for rep in reports:
        r.say(NodeEvent(rank=rep["rank"], node=rep["node"], ok=rep["check"]["worst"] not in ("fail", "error"),
                        summary=_summary(rep)))
    return reports


def _node_findings(r: _Run, reports: list[dict[str, Any]]) -> list[Finding]:
    """The nodes that came against the description, and the reports against each other."""
    spec = r.opts.spec
    findings: list[Finding] = []
    if spec:
        registered = [rep["node"] for rep in reports]
        findings += cmp.expected_nodes(registered, [n.name for n in spec.nodes], r.opts.join_timeout,
                                       {n.name: n.addr for n in spec.nodes}, _absent_said(spec, set(registered)))
    findings += cmp.compare(reports)
    for f in findings:
        if f.status not in (Status.PASS, Status.SKIP):
            r.say(MismatchEvent(finding=f.to_dict()))
    return findings


def _sweep(r: _Run, device: Any) -> list[BandwidthResult]:
    ctx, opts = r.ctx, r.opts
    results: list[BandwidthResult] = []
    for op in opts.ops:
        for size in opts.sizes:
            res = measure(op, size, ctx.rank, ctx.world_size, device, opts.iters, opts.warmup)
            results.append(res)
            r.say(BandwidthEvent(op=op, size_bytes=size, algbw=res.algbw, busbw=res.busbw, seconds=res.seconds))
    return results


def _finish(r: _Run, reports: list[dict[str, Any]], findings: list[Finding], check: Correctness,
            results: list[BandwidthResult]) -> SmokeResult:
    """Rank 0 reports; every rank waits until the others are done with the store, then exits."""
    ctx, opts = r.ctx, r.opts
    ok = not any(f.status in (Status.FAIL, Status.ERROR) for f in findings)
    report = None
    if ctx.rank == 0:
        node_list = list(cmp.by_node(reports))
        r.say(DoneEvent(ok=ok, world_size=ctx.world_size, nodes=node_list, findings=[f.to_dict() for f in findings]))
        report = _public({
            **r.base, "ok": ok, "nodes": [{"node": n, "ranks": [rep_["rank"] for rep_ in reports if rep_["node"] == n],
                                           "summary": _summary(rep)} for n, rep in cmp.by_node(reports).items()],
            "findings": [f.to_dict() for f in findings], "correctness": check.to_dict(),
            "bandwidth": [res.to_dict() for res in results], "min_busbw": opts.min_busbw,
            "sizes": opts.sizes, "iters": opts.iters, "warmup": opts.warmup,
            "ranks": reports, "duration_s": round(time.monotonic() - r.started, 2)}, r.secrets)
    _say(r.store, ctx.rank, "finished")
    _wait_done(r.store, ctx, 10.0)
    bad = [f.title for f in findings if f.status in (Status.FAIL, Status.ERROR)]
    return SmokeResult(ctx.rank, 0 if ok else 1, "; ".join(bad) or "cluster test passed", report)


def _say(store: Any, rank: int, text: str) -> None:
    """What this rank is doing now, kept in the store so a failure elsewhere can quote it."""
    with contextlib.suppress(Exception):
        store.set(f"said/{rank}", text[:500])


def _heard(store: Any, rank: int) -> str | None:
    """The last thing ``rank`` said (non-blocking: check first, the store may be failing)."""
    try:
        return store.get(f"said/{rank}").decode("utf-8", "replace") if store.check([f"said/{rank}"]) else None
    except Exception:  # noqa: BLE001
        return None


def _behind(store: Any, ctx: LaunchContext, nodes: Mapping[int, str], stage: str) -> str:
    """The other ranks whose last word is not ``stage``: the ones the failure is waiting for."""
    out = []
    for r in range(ctx.world_size):
        said = _heard(store, r)
        if r != ctx.rank and said != stage:
            out.append(f"rank {r} ({nodes.get(r, '?')}) said {said!r}" if said else f"rank {r} ({nodes.get(r, '?')}) said nothing")
    return "; ".join(out[:8])


def _public(report: dict[str, Any], secrets: Mapping[str, str]) -> ClusterReport:
    """The report as it may leave rank 0: --env values masked wherever they appear, then redacted
    (both keep its keys and shape)."""
    from hwtui.engine.cluster.peer import mask_values

    return cast("ClusterReport", redact_doc(mask_values(report, secrets.values())))


def _correctness_finding(check: Correctness, reports: list[dict[str, Any]]) -> Finding:
    if check.ok:
        return passed("cluster.correctness", f"all-reduce of rank+1 gave {check.expected:g} on every rank; broadcast exact",
                      expected=check.expected)
    where = ", ".join(f"rank {r} ({reports[r]['node']}): {check.got[r]:g}" for r in check.bad_ranks)
    return fail("cluster.correctness", f"collectives returned wrong data on {len(check.bad_ranks)} rank(s)",
                f"expected {check.expected:g}; got {where}; broadcast exact: {check.broadcast_ok}",
                "run again with NCCL_DEBUG=INFO; wrong sums with no error mean a broken transport or plugin "
                "(try NCCL_NET_PLUGIN unset, NCCL_P2P_DISABLE=1, NCCL_IB_DISABLE=1 to bisect)",
                expected=check.expected, got=check.got, bad_ranks=check.bad_ranks)


def _bandwidth_findings(results: list[BandwidthResult], floor: float | None) -> list[Finding]:
    out = []
    low = {r.op for r in floor_failures(results, floor)} if floor is not None else set()
    for op in dict.fromkeys(r.op for r in results):
        largest = max((r for r in results if r.op == op), key=lambda r: r.size_bytes)
        figure = f"{largest.busbw:.3f} GB/s busbw ({largest.algbw:.3f} GB/s algbw) at {largest.size_bytes} B"
        if op in low:
            out.append(fail(f"cluster.bandwidth[{op}]", f"{op}: {figure}, below the {floor:g} GB/s floor",
                            "Measured at the largest message size of the sweep, where the link, not latency, limits.",
                            "check the interface in use (NCCL_SOCKET_IFNAME), NCCL_DEBUG=INFO for the transport "
                            "('NET/IB' vs 'NET/Socket'), and the link speed: ethtool <iface>",
                            busbw=largest.busbw, floor=floor, size_bytes=largest.size_bytes))
        else:
            extra = f" (floor {floor:g} GB/s)" if floor is not None else ""
            out.append(passed(f"cluster.bandwidth[{op}]", f"{op}: {figure}{extra}",
                              busbw=largest.busbw, size_bytes=largest.size_bytes))
    return out
