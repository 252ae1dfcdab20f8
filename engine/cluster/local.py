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

from hwtui.core.redact import redact

SCHEMA = "hwtui.cluster.rank/1"

# Variables that change how ranks find and talk to each other. A difference between nodes in any
# of them is the classic "works on two nodes, hangs on the third".
ENV_PREFIXES = ("NCCL_", "GLOO_", "RCCL_", "HCCL_", "UCX_", "FI_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_",
                "CUDA_", "HIP_", "ROCR_", "HSA_", "MASTER_")
ENV_NAMES = ("LD_LIBRARY_PATH", "PYTHONPATH", "OMP_NUM_THREADS", "VIRTUAL_ENV", "CONDA_PREFIX")


def env_of_interest(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def interfaces() -> dict[str, dict[str, Any]]:
    """Network interfaces from /sys/class/net with state, MTU and addresses.

    Loopback stays in: a single-machine test pins gloo to ``lo``, and the interface rule must find it."""
    try:
        import psutil

        addrs = psutil.net_if_addrs()
    except Exception:  # noqa: BLE001 - addresses are a nicety; names come from sysfs
        addrs = {}
    out: dict[str, dict[str, Any]] = {}
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        names = sorted(addrs)
    for name in names:
        base = f"/sys/class/net/{name}"
        out[name] = {
            "operstate": _read(f"{base}/operstate"),
            "mtu": _int(_read(f"{base}/mtu")),
            "addresses": [a.address.split("%")[0] for a in addrs.get(name, ())
                          if a.family in (socket.AF_INET, socket.AF_INET6)],
        }
    return out


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def route_to(host: str, port: int) -> dict[str, Any]:
    """The local address and interface the kernel picks to reach ``host``.

    A connected UDP socket sends nothing; connect() only consults the routing table.
    """
    out: dict[str, Any] = {"master": host, "local_addr": None, "interface": None}
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        out["error"] = f"cannot resolve {host}: {exc}"
        return out
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(sockaddr)
            local = s.getsockname()[0]
        except OSError as exc:
            out["error"] = f"no route to {host}: {exc}"
            return out
    out["local_addr"] = local
    out["interface"] = interface_of_address(local)
    return out


def interface_of_address(address: str) -> str | None:
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address.split("%")[0] == address for a in addrs):
                return name
    except Exception:  # noqa: BLE001
        return None
    return None


def local_addresses() -> set[str]:
    found = set()
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


def local_check() -> dict[str, Any]:
    """hwtui's own check of this node, as findings plus the facts the comparison uses."""
    from hwtui.probes.catalog import catalog
    from hwtui.probes.framework import run_checks
    from hwtui.probes.host import FsHost

    collectors, rules = catalog()
    result = run_checks(FsHost("/"), collectors, rules)
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
    check = local_check()
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
        "interfaces": interfaces(),
        "route": route_to(master, master_port),
        "env": mask_env(env_of_interest(env), secrets),
        "plugin": plugin_facts(env),
        "check": check,
    }
    return redact(mask_values(cap(report), secrets.values()))
