"""The local check a node runs before it joins: the few findings that make joining pointless.

A node whose NCCL_SOCKET_IFNAME names an interface it lacks, whose net plugin is missing, or
(the store's host) whose MASTER_PORT is taken would otherwise make every other node wait for the
join timeout and then blame "the peer-to-peer ports". `hwtui --check` already knows each of these
with its exact fix, so the same probes run here (netif, nccl, rendezvous) through a Host, and only
their blocking failures are kept.

Used twice: by `hwtui cluster preflight`, which every generated launch script runs before
torchrun/srun starts anything, and by `hwtui cluster test` itself before the roll call, so a
blocked rank registers *with its finding* and rank 0 names it at once.
"""

from __future__ import annotations

from collections.abc import Mapping

from hwtui.core.finding import Finding, Status
from hwtui.engine.cluster.spec import ClusterSpec, Node
from hwtui.probes.host import Host

# Finding ids that stop a node from joining (interface, plugin, port), from probes/distributed.
BLOCKING = ("nccl.socket_ifname", "gloo.socket_ifname", "nccl.net_plugin", "rendezvous.port")
_LAUNCHER_VARS = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                  "PMI_RANK", "PMIX_RANK", "LOCAL_RANK")


def blockers(env: Mapping[str, str], *, hosts_store: bool = False, host: Host | None = None) -> list[Finding]:
    """The blocking failures on this node, empty when it may join.

    ``hosts_store``: this node will listen on MASTER_PORT (the first node under srun/mpirun, the
    rendezvous host under torchrun), so the port must be free; other nodes skip the port test,
    since the store may simply not be up yet."""
    from hwtui.probes.catalog import catalog
    from hwtui.probes.framework import run_checks
    from hwtui.probes.host import FsHost

    check_env = dict(env)
    collectors_wanted, rules_wanted = {"netif", "nccl"}, {"nccl", "nccl_socket"}
    if hosts_store:
        # The rendezvous probe bind-tests the port only for the process that will host the store.
        for name in _LAUNCHER_VARS:
            check_env.pop(name, None)
        check_env["RANK"] = "0"
        collectors_wanted.add("rendezvous")
        rules_wanted.add("rendezvous")
    collectors, rules = catalog()
    result = run_checks(host or FsHost("/", env=check_env), [c for c in collectors if c.name in collectors_wanted],
                        [r for r in rules if r.name in rules_wanted])
    return [f for f in result.findings if f.id in BLOCKING and f.status in (Status.FAIL, Status.ERROR)]


def node_environment(spec: ClusterSpec, node: Node, env: Mapping[str, str]) -> dict[str, str]:
    """The environment this node's check must see. Sourced from its env file (HWTUI_CLUSTER_NODE
    set), the environment is what the launcher will run with, edits included. Run by hand outside
    it, the spec's values for this node win: they are what the launch script will export, and a
    check of the bare shell passed without ever looking at the spec's interface."""
    from hwtui.engine.cluster.launchfiles import node_env

    if env.get("HWTUI_CLUSTER_NODE") == node.name:
        return dict(env)
    return {**env, **node_env(spec, node)}


def post_wait(spec: ClusterSpec) -> float:
    """How long a node waits for the master's store (to leave its finding there, or to check it
    may join): torchrun's own rendezvous join timeout in the launch files (join timeout + 30 s), so
    a master started up to that long after this node is still met."""
    return float(min(spec.join_timeout + 30.0, 600.0))


def one_line(finding: Finding) -> str:
    """A finding as one line: what is wrong, then the fix."""
    text = finding.title
    if finding.remedy:
        text += f"; fix: {finding.remedy}"
    return " ".join(text.split())


def interpreter_findings() -> list[Finding]:
    """The interpreter the launch files run must have torch (the test imports it on every rank)."""
    import importlib.util
    import sys

    from hwtui.core.finding import fail

    if importlib.util.find_spec("torch") is None:
        return [fail("cluster.python", f"{sys.executable} cannot import torch",
                     "The launch files run the interpreter cluster.json names; every rank imports torch.",
                     f"{_node_install('engine')} on this node, or regenerate the files with "
                     "hwtui cluster init --python /path/to/venv/bin/python")]
    return []


def post(master: str, port: int, key: str, text: str, timeout: float) -> bool:
    """Leave ``text`` in the rendezvous store under ``key`` so rank 0 can quote it; best effort,
    bounded by ``timeout`` (the store may not be up yet, or never come, or be something else)."""
    import os
    import time
    from datetime import timedelta

    from hwtui.core.net import probe_port

    # A plain connect first: TCPStore's client retries noisily (C++ warnings on stderr) for its
    # whole timeout against anything that is not a store.
    deadline = time.monotonic() + timeout
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # this process only: it exits right after
    while time.monotonic() < deadline:
        if not probe_port(master, port, deadline - time.monotonic())[0]:
            return False
        try:
            from torch.distributed import TCPStore

            store = TCPStore(master, port, None, False, timedelta(seconds=max(1.0, min(deadline - time.monotonic(), 5.0))))
            store.set(key, text[:500])
            return True
        except Exception:  # noqa: BLE001 - listening but not serving yet (or no torch): try again
            time.sleep(0.5)
    return False


def _node_install(extra: str) -> str:
    """The install command for this node's interpreter: uv's or pipx's words where they made it, else
    pip run by the very interpreter the launch files name (a bare `pip` may be another Python's)."""
    import sys

    from hwtui.core.install_hint import install_command

    hint = install_command(extra)
    return f"{sys.executable} -m {hint}" if hint.startswith("pip install") else hint


def started_key(spec: ClusterSpec) -> str:
    """Where rank 0 of a torchrun cluster test records that the test began and with which nodes
    (the c10d store's raw key space, like the preflight findings; one key per cluster)."""
    from hwtui.engine.cluster.launchfiles import rdzv_id

    return f"hwtui-cluster-started/{rdzv_id(spec)}"


def mark_started(spec: ClusterSpec, nodes: list[str] | None, world_size: int) -> bool:
    """Rank 0: record the nodes the test runs with, so a node whose launch script starts after the
    rendezvous closed is refused (engine/cluster/torchrun.py) instead of joining torchrun's next round (which
    restarted the running nodes and ended every node in DistStoreError tracebacks). Best effort."""
    import json
    import time

    from hwtui.core.net import probe_port

    if not probe_port(spec.master, spec.master_port, 2.0)[0]:
        return False
    try:
        from datetime import timedelta

        from torch.distributed import TCPStore

        store = TCPStore(spec.master, spec.master_port, None, False, timedelta(seconds=5))
        mark = {"nodes": sorted(nodes) if nodes is not None else None, "world_size": world_size,
                "at": time.strftime("%H:%M:%S")}
        store.set(started_key(spec), json.dumps(mark))
        return True
    except Exception:  # noqa: BLE001 - not a store, or gone: the late node then meets torchrun's own error
        return False


def late_refusal(host: str, port: int, run_id: str, node: str, join_timeout: float) -> str | None:
    """Why this node must not join torchrun's rendezvous at host:port now, in one line with the
    fix; None when it may. Called by the launch scripts' torchrun (engine/cluster/torchrun.py)
    just before the rendezvous, where torch is imported anyway, so it adds no start-up time (a
    slower join is itself what makes a node late). A store not up yet cannot hold the mark."""
    import json
    from datetime import timedelta

    from hwtui.core.net import probe_port

    if not probe_port(host, port, 1.0)[0]:
        return None
    try:
        from torch.distributed import TCPStore

        store = TCPStore(host, port, None, False, timedelta(seconds=5))
        key = f"hwtui-cluster-started/{run_id}"
        if not store.check([key]):
            return None
        raw = store.get(key)
        # The store is reachable by anyone on that network: a value over a mark's size is not one.
        mark = json.loads(raw.decode("utf-8", "replace")) if len(raw) <= 4096 else {}
    except Exception:  # noqa: BLE001 - no store client, or not a store: torchrun's own checks follow
        return None
    mark = mark if isinstance(mark, dict) else {}
    again = f"start every node's launch script again, all within {join_timeout:g} s (the join timeout) of the first"
    nodes = [str(n) for n in mark.get("nodes") or []]
    with_whom = ", ".join(nodes[:16]) if nodes else f"{mark.get('world_size', '?')} rank(s)"
    at = str(mark.get("at", "?"))[:8]
    # Every node of the running test joined before torchrun's rendezvous closed, and the mark is
    # only written after that: whoever reads it now comes too late for this round.
    if node in nodes:
        return f"is already running in the cluster test that began at {at}; fix: let that run finish, then {again}"
    return (f"is too late: the cluster test began at {at} without it (with {with_whom}, after the "
            f"{join_timeout:g} s join timeout); fix: let that run finish, then {again}")
