"""What one rank reports about its own node before the nodes are compared.

The local check is hwtui's ordinary catalog run on ``FsHost("/")``; next to it go the facts the
cross-node comparison needs (torch build, NCCL, drivers, Python, interfaces, the interface that
reaches the master, the environment variables that steer NCCL and gloo). The result is plain JSON
and passes through ``redact`` before it leaves the process: it is sent to rank 0 and lands in
report files people attach to tickets.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping
from typing import Any

from hwtui.core.redact import redact_doc
from hwtui.probes.host import Host

SCHEMA = "hwtui.cluster.rank/1"

# Variables that change how ranks find and talk to each other. A difference between nodes in any
# of them is the classic "works on two nodes, hangs on the third".
ENV_PREFIXES = ("NCCL_", "GLOO_", "RCCL_", "HCCL_", "UCX_", "FI_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_",
                "CUDA_", "HIP_", "ROCR_", "HSA_", "MASTER_", "HOTWEIGHTS_")
# HWTUI_BUCKET_MB is HOTWEIGHTS_BUCKET_MB's other spelling: both change what `replicate` does.
ENV_NAMES = ("LD_LIBRARY_PATH", "PYTHONPATH", "OMP_NUM_THREADS", "VIRTUAL_ENV", "CONDA_PREFIX", "HWTUI_BUCKET_MB")


def env_of_interest(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def interfaces(host: Host | None = None) -> dict[str, dict[str, Any]]:
    """Network interfaces with state and addresses, read by the probes' netif collector through a
    Host (so a recorded or sysroot host works too, and there is one reader of /sys/class/net).

    Loopback stays in: a single-machine test pins gloo to ``lo``, and the interface rule must find it."""
    from hwtui.probes.distributed.netif import collect_interfaces

    netif = collect_interfaces(host or _live_host())
    addresses = netif.get("addresses") or {}
    return {i["name"]: {"operstate": i.get("operstate"), "up": i.get("up"), "type": i.get("type"),
                        "addresses": list(addresses.get(i["name"], []))}
            for i in sorted(netif.get("interfaces", []), key=lambda i: i["name"])}


def _live_host() -> Host:
    from hwtui.probes.host import FsHost

    return FsHost("/")


def route_to(host: str, port: int, ifaces: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The local address and interface the kernel picks to reach ``host`` (rendezvous probe's
    route_to: a connected UDP socket sends nothing, connect() only consults the routing table)."""
    from hwtui.probes.distributed.rendezvous import route_to as probe_route

    out: dict[str, Any] = {"master": host, "local_addr": None, "interface": None}
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as exc:
        out["error"] = f"cannot resolve {host}: {exc}"
        return out
    ip = str(infos[0][4][0])
    ifaces = interfaces() if ifaces is None else ifaces
    found = probe_route(ip, port, {name: info["addresses"] for name, info in ifaces.items()})
    if "error" in found:
        out["error"] = f"no route to {host}: {found['error']}"
        return out
    out["local_addr"], out["interface"] = found["source"], found["interface"]
    return out


def local_addresses() -> set[str]:
    found: set[str] = set()
    for info in interfaces().values():
        found.update(info["addresses"])
    return found


def torch_facts() -> dict[str, Any]:
    import torch

    nccl = None
    try:
        raw = torch.cuda.nccl.version()
        nccl = ".".join(str(p) for p in raw) if isinstance(raw, tuple) else str(raw)
    except Exception:  # noqa: BLE001 - CPU and ROCm-less builds have no NCCL binding
        nccl = None
    cuda_ok = False
    count = 0
    try:
        cuda_ok = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if cuda_ok else 0
    except Exception:  # noqa: BLE001
        pass
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "nccl": nccl,
        "cuda_available": cuda_ok,
        "device_count": count,
    }


def plugin_facts(env: Mapping[str, str]) -> dict[str, Any] | None:
    """Whether NCCL_NET_PLUGIN resolves on this node (the quick start's "Plugin not loading")."""
    value = env.get("NCCL_NET_PLUGIN")
    if not value:
        return None
    if "/" in value:
        return {"value": value, "path": value if os.path.isfile(value) else None}
    names = [value, f"libnccl-net-{value}.so", f"libnccl-net_{value}.so"]
    for directory in filter(None, env.get("LD_LIBRARY_PATH", "").split(":")):
        for name in names:
            candidate = os.path.join(directory, name)
            if os.path.isfile(candidate):
                return {"value": value, "path": candidate}
    return {"value": value, "path": None, "searched": "LD_LIBRARY_PATH"}


# Findings the local check cannot judge while this test runs: rank 0 (under srun, mpirun or a
# manual launch) already listens on MASTER_PORT with the test's own store, so a bind test there
# reports "already in use" on a healthy cluster. The store answering is the proof instead.
_OWN_STORE_IDS = ("rendezvous.port", "rendezvous.reachable")


def local_check(master_port: int | None = None) -> dict[str, Any]:
    """hwtui's own check of this node, as findings plus the facts the comparison uses.

    With ``master_port`` (the rendezvous store this test already reached), the rendezvous port
    findings are replaced by one that says so."""
    from hwtui.core.finding import passed
    from hwtui.probes.catalog import catalog
    from hwtui.probes.framework import run_checks
    from hwtui.probes.host import FsHost

    collectors, rules = catalog()
    result = run_checks(FsHost("/"), collectors, rules)
    if master_port is not None:
        kept = [f for f in result.findings if f.id not in _OWN_STORE_IDS]
        kept.append(passed("rendezvous.port", f"MASTER_PORT={master_port} serves this test's rendezvous store",
                           "Every rank reached the store before this check ran."))
        result.findings[:] = kept
    modules = (result.facts.get("modules") or {}).get("modules", {})
    drivers = {name: info.get("version") for name, info in modules.items()
               if name in ("nvidia", "amdgpu", "xe", "i915", "habanalabs") and info.get("version")}
    host = result.facts.get("host") or {}
    return {
        "worst": result.worst.value,
        "findings": [f.to_dict() for f in result.findings],
        "drivers": drivers,
        "os": host.get("os"),
        "kernel": host.get("kernel"),
        "duration_s": round(result.duration_s, 3),
    }


def _hwtui_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hwtui")
    except PackageNotFoundError:
        return "0+unknown"


def rank_report(*, rank: int, local_rank: int, world_size: int, node: str, master: str, master_port: int,
                env: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This rank's report, capped (`peer.cap`) before redaction so a huge value costs little, with
    the ``secrets`` (cluster.json's --env variables) masked by name and by value."""
    from hwtui.engine.cluster.peer import cap, mask_env, mask_values

    env = os.environ if env is None else env
    secrets = secrets or {}
    check = local_check(master_port)
    ifaces = interfaces()
    report = {
        "schema": SCHEMA,
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world_size,
        "node": node,
        "hostname": socket.gethostname(),
        "hwtui": _hwtui_version(),
        "python": platform.python_version(),
        "platform": {"machine": platform.machine(), "kernel": check.pop("kernel"), "os": check.pop("os")},
        "torch": torch_facts(),
        "drivers": check.pop("drivers"),
        "interfaces": ifaces,
        "route": route_to(master, master_port, ifaces),
        "env": mask_env(env_of_interest(env), secrets),
        "plugin": plugin_facts(env),
        "check": check,
    }
    return redact_doc(mask_values(cap(report), secrets.values()))
