"""The ``export`` lines that make this node ready: the seeds' "configure environment" step, filled in.

Values come from what was detected, never from templates: the interface that routes to
MASTER_ADDR, the RDMA ports that are ACTIVE (named exactly, with ``=``, so ``mlx5_1`` cannot
also pick ``mlx5_10``), the RoCE v2 GID index the port's table offers, the largest in-flight
window that fits in free memory. A setting the user already has is kept when the checks found
nothing wrong with it. Per-rank variables (RANK, LOCAL_RANK, WORLD_SIZE) are the launcher's job
and are never written here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from hwtui.core.finding import Finding, Status
from hwtui.probes.devices import build_devices
from hwtui.probes.distributed.ib import active_ports, best_gid, selected_ports
from hwtui.probes.distributed.knobs import MIB, SAFE_FRACTION, _free_memory, knob_values
from hwtui.probes.distributed.launcher import job_shape
from hwtui.probes.distributed.nccl import best_interface, effective_env
from hwtui.probes.distributed.parsers import parse_host, parse_int, parse_nccl_debug, parse_nccl_list, parse_port
from hwtui.probes.distributed.vendor_ccl import ONEAPI_SETVARS, ONECCL_BINDINGS_SETVARS_PATH
from hwtui.probes.framework import Facts


@dataclass(frozen=True)
class Line:
    kind: str  # "export", "unset", "source" or "comment"
    name: str
    value: str = ""
    why: str = ""

    def render(self) -> str:
        # The file is meant to be sourced: every value is quoted, and comments (which carry values
        # from the environment, a replayed snapshot or the file system) can never end their line.
        head = f"{comment(self.why)}\n" if self.why else ""
        if self.kind == "export":
            return f"{head}export {self.name}={shlex.quote(self.value)}"
        if self.kind == "unset":
            return f"{head}unset {shlex.quote(self.name)}"
        if self.kind == "source":
            return f"{head}source {shlex.quote(self.value)}"
        return comment(self.name)


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")


def comment(text: str) -> str:
    """A shell comment line holding ``text``: control characters (newlines above all) are shown
    escaped, so a value such as ``x\ntouch pwned`` stays inside the comment."""
    return "# " + _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _exact_if(name: str, all_names: list[str]) -> str:
    """NCCL treats a bare name as a prefix; pin it with '=' when another interface shares it."""
    return f"={name}" if any(n != name and n.startswith(name) for n in all_names) else name


def _bad(findings: list[Finding], prefix: str) -> bool:
    return any(f.id.startswith(prefix) and f.status in (Status.FAIL, Status.WARN, Status.ERROR) for f in findings)


def _network_lines(facts: Facts, env: dict[str, str], findings: list[Finding]) -> list[Line]:
    lines = _rendezvous_lines(env, findings)
    lines += _socket_lines(facts, env, findings)
    ports = (facts.get("infiniband") or {}).get("ports", [])
    hca_lines, hca_ports = _hca_lines(ports, env, findings)
    lines += hca_lines
    lines += _gid_lines(hca_ports, env, findings)
    # hwtui has no UCX path, so no UCX variable is exported (one that nothing reads only misleads);
    # the mapping is left as a comment for programs that do use UCX.
    if hca_ports:
        ucx = ",".join(f"{p['hca']}:{p['port']}" for p in hca_ports)
        lines.append(Line("comment", f"hwtui has no UCX path; for a UCX program the same ports are UCX_NET_DEVICES={ucx}"))
    if "HOTWEIGHTS_UCX_NET_DEVICES" in env:
        lines.append(Line("comment", "HOTWEIGHTS_UCX_NET_DEVICES is set, but nothing in hwtui reads it (no UCX path)"))
    return lines


def _rendezvous_lines(env: dict[str, str], findings: list[Finding]) -> list[Line]:
    """Keep good values, repair the common mistakes (a URL or host:port in MASTER_ADDR)."""
    lines: list[Line] = []
    if "MASTER_ADDR" in env:
        parsed = parse_host(env["MASTER_ADDR"])
        host = parsed.host or parsed.suggestion
        if host:
            lines.append(Line("export", "MASTER_ADDR", host, "rank 0's address" +
                              (f" (was {env['MASTER_ADDR']!r})" if host != env["MASTER_ADDR"] else "")))
    else:
        lines.append(Line("comment", "MASTER_ADDR: rank 0's host name or IP (torchrun --master-addr sets it)"))
    port = parse_port(env["MASTER_PORT"]) if "MASTER_PORT" in env else None
    if port is not None and port.ok and not _bad(findings, "rendezvous.port"):
        lines.append(Line("export", "MASTER_PORT", str(port.value), "rendezvous port"))
    else:
        lines.append(Line("comment", "MASTER_PORT: a free TCP port on rank 0's node, e.g. 29500"
                          + (" (the current one failed the check)" if port is not None else "")))
    return lines


def _socket_lines(facts: Facts, env: dict[str, str], findings: list[Finding]) -> list[Line]:
    """The socket interface for NCCL and gloo bootstrap."""
    lines: list[Line] = []
    shape = job_shape(env)
    rdv = facts.get("rendezvous") or {}
    netif = facts.get("netif") or {"interfaces": []}
    interfaces = netif.get("interfaces", [])
    up = {i["name"]: i for i in interfaces if i["up"]}
    chosen: str | None = None
    if "NCCL_SOCKET_IFNAME" in env and not _bad(findings, "nccl.socket_ifname"):
        lines.append(Line("export", "NCCL_SOCKET_IFNAME", env["NCCL_SOCKET_IFNAME"], "current setting checks out"))
        spec = parse_nccl_list(env["NCCL_SOCKET_IFNAME"], "NCCL_SOCKET_IFNAME")
        chosen = next((n for n, i in up.items() if spec.matches(n) and not i["virtual"]), None)
    else:
        chosen, why = _choose_interface(interfaces, netif.get("addresses"), rdv, up, shape.multi_node)
        if chosen:
            names = [i["name"] for i in interfaces]
            lines.append(Line("export", "NCCL_SOCKET_IFNAME", _exact_if(chosen, names), f"bootstrap over {why}"))
    if "GLOO_SOCKET_IFNAME" in env and not _bad(findings, "gloo.socket_ifname"):
        lines.append(Line("export", "GLOO_SOCKET_IFNAME", env["GLOO_SOCKET_IFNAME"], "current setting checks out"))
    elif chosen:
        lines.append(Line("export", "GLOO_SOCKET_IFNAME", chosen, "gloo takes one exact interface name"))
    return lines


def _choose_interface(interfaces: list[dict[str, Any]], addresses: Any, rdv: dict[str, Any], up: dict[str, Any],
                      multi_node: bool | None) -> tuple[str | None, str]:
    """(interface, why) when nothing is set: the route to MASTER_ADDR, else one that is up with an
    address, else loopback on a single node."""
    route_if = (rdv.get("route") or {}).get("interface")
    best = best_interface(interfaces, addresses, route_if)
    if best and best == route_if:
        return route_if, f"the interface that routes to MASTER_ADDR ({rdv.get('ip')})"
    if best:
        return best, "an interface that is up with an address (not loopback or a container bridge)"
    if "lo" in up and not multi_node:
        return "lo", "single node: loopback is enough"
    return None, ""


def _hca_lines(ports: list[dict[str, Any]], env: dict[str, str],
               findings: list[Finding]) -> tuple[list[Line], list[dict[str, Any]]]:
    """NCCL_IB_HCA; (lines, the RDMA ports it selects)."""
    active = active_ports(ports)
    if "NCCL_IB_HCA" in env and not _bad(findings, "ib.hca"):
        spec = parse_nccl_list(env["NCCL_IB_HCA"], "NCCL_IB_HCA")
        return ([Line("export", "NCCL_IB_HCA", env["NCCL_IB_HCA"], "current setting checks out")],
                active_ports(selected_ports(ports, spec)))
    if "NCCL_IB_HCA" in env and not active:
        return [Line("unset", "NCCL_IB_HCA", why="no ACTIVE RDMA port on this node: NCCL uses sockets anyway")], []
    if not active:
        return [], []
    layer = max({p.get("link_layer") for p in active}, key=lambda ll: sum(p.get("link_layer") == ll for p in active))
    hca_ports = [p for p in active if p.get("link_layer") == layer]
    value = "=" + ",".join(f"{p['hca']}:{p['port']}" for p in hca_ports)
    kind = "RoCE" if layer == "Ethernet" else (layer or "RDMA")
    return [Line("export", "NCCL_IB_HCA", value, f"the {len(hca_ports)} ACTIVE {kind} port(s), named exactly")], hca_ports


# (variable, the finding that judges it)
_GID_VARS = (("NCCL_IB_GID_INDEX", "ib.gid_index"), ("NCCL_MESH_GID_INDEX", "ib.mesh_gid_index"))


def _gid_lines(hca_ports: list[dict[str, Any]], env: dict[str, str], findings: list[Finding]) -> list[Line]:
    """GID indices: kept when they check out, else the RoCE v2 index the selected ports agree on."""
    lines: list[Line] = []
    roce = [p for p in hca_ports if p.get("link_layer") == "Ethernet"]
    hints = {g["index"] for p in roce for g in [best_gid(p)] if g}
    gid_hint = next(iter(hints)) if len(hints) == 1 else None
    for var, fid in _GID_VARS:
        if var in env and not _bad(findings, fid) and parse_int(env[var]).value is not None:
            lines.append(Line("export", var, env[var].strip(), "current setting checks out"))
        elif (var in env or (var == "NCCL_IB_GID_INDEX" and roce)) and gid_hint is not None:
            lines.append(Line("export", var, str(gid_hint),
                              "RoCE v2 GID with an IPv4-mapped address on the selected ports"))
    return lines


def _nccl_lines(facts: Facts, env: dict[str, str], findings: list[Finding]) -> list[Line]:
    lines: list[Line] = []
    nccl = facts.get("nccl") or {}
    plugin = nccl.get("plugin") or {}
    if plugin.get("value") and plugin.get("found"):
        lines.append(Line("export", "NCCL_NET_PLUGIN", plugin["value"], f"resolves to {plugin['found']}"))
    elif plugin.get("value"):
        lines.append(Line("comment", f"NCCL_NET_PLUGIN={plugin['value']} is not found on this node: install it, "
                                     "then export NCCL_NET_PLUGIN and LD_LIBRARY_PATH"))
    level = parse_nccl_debug(env["NCCL_DEBUG"]).value if "NCCL_DEBUG" in env else None
    lines.append(Line("export", "NCCL_DEBUG", level if level in ("VERSION", "WARN", "INFO") else "WARN",
                      "INFO while diagnosing, WARN otherwise"))
    host_env = facts.host.env if facts.host else {}
    for name in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE"):
        if name in host_env and (parse_int(host_env[name]).value or 0) != 0:
            lines.append(Line("unset", name, why="a debugging switch; off for real runs"))
    return lines


def _vendor_lines(facts: Facts, env: dict[str, str], findings: list[Finding]) -> list[Line]:
    lines: list[Line] = []
    devices = [d for d in build_devices(facts["pci"]) if d.usable] if "pci" in facts else []
    backends = {d.backend for d in devices}
    if "cuda" in backends:
        lines.append(Line("export", "CUDA_DEVICE_ORDER", "PCI_BUS_ID", "cuda:N follows PCI order, as nvidia-smi and hwtui"))
    if "xpu" in backends and _bad(findings, "ccl.oneccl"):
        host = facts.host
        setvars = next((p for p in ONEAPI_SETVARS if host and host.exists(p)), None)
        lines.append(Line("source", "setvars", setvars or ONECCL_BINDINGS_SETVARS_PATH, "oneCCL runtime for the 'ccl' backend"))
    if "tpu" in backends:
        lines.append(Line("export", "PJRT_DEVICE", "TPU", "torch_xla runtime"))
        lines.append(Line("export", "PL_TORCH_DISTRIBUTED_BACKEND", "xla", "Lightning on TPU (hardware guide)"))
    return lines


def _knob_lines(facts: Facts, env: dict[str, str], findings: list[Finding]) -> list[Line]:
    lines: list[Line] = []
    k = knob_values(env)
    free, what = _free_memory(facts, env)
    if "HOTWEIGHTS_IPC_INFLIGHT_BUCKETS" in env and not _bad(findings, "knobs.window_memory") and not k["problems"]:
        lines.append(Line("export", "HOTWEIGHTS_IPC_INFLIGHT_BUCKETS", str(k["window"]), "current setting fits"))
    elif free is not None and _bad(findings, "knobs"):
        fits = max(1, int(free * SAFE_FRACTION) // (k["bucket_mb"] * MIB))
        lines.append(Line("export", "HOTWEIGHTS_IPC_INFLIGHT_BUCKETS", str(min(fits, 64)),
                          f"{k['bucket_mb']} MB buckets within half the {free / MIB:.0f} MB {what}"))
    ck = (facts.get("checkpoint") or {}).get("path")
    if ck and not _bad(findings, "hygiene.checkpoint_dir"):
        lines.append(Line("export", "HWTUI_CHECKPOINT_DIR", ck, "checked: writable" +
                          (", shared" if (facts.get("checkpoint") or {}).get("mount") else "")))
    return lines


def build_lines(facts: Facts, findings: list[Finding]) -> list[Line]:
    env = effective_env(facts)
    return (_network_lines(facts, env, findings) + _nccl_lines(facts, env, findings)
            + _vendor_lines(facts, env, findings) + _knob_lines(facts, env, findings))


def render(lines: list[Line], header: list[str]) -> str:
    out = [comment(h) for h in header]
    body = [line.render() for line in lines]
    return "\n".join(out + [""] + body) + "\n"


def summary(findings: list[Finding]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.status.value] = counts.get(f.status.value, 0) + 1
    return counts
