"""NCCL and RCCL: socket interface, net plugin, debug settings, debugging switches, conf files, peermem.

RCCL reads the same NCCL_* variables, so every check here applies to AMD too. NCCL also reads
settings from NCCL_CONF_FILE (else ~/.nccl.conf) and /etc/nccl.conf, where the environment wins
and the first file wins over the second; every check looks at that *effective* setting and says
where it came from, because "I never set NCCL_IB_DISABLE" is usually true and beside the point.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterator, Mapping
from typing import Any

from hwtui.core.finding import Finding, fail, passed, warn
from hwtui.probes.devices import build_devices
from hwtui.probes.distributed.launcher import job_shape
from hwtui.probes.distributed.parsers import (
    NCCL_SUBSYSTEMS,
    NcclList,
    parse_ld_so_conf,
    parse_nccl_conf,
    parse_nccl_debug,
    parse_nccl_debug_subsys,
    parse_nccl_list,
    parse_switch,
)
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import Host

SYSTEM_CONF = "/etc/nccl.conf"
DEFAULT_LIB_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                    "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
SWITCHES = {
    "NCCL_P2P_DISABLE": "GPU peer-to-peer (NVLink/PCIe) copies go through host memory instead",
    "NCCL_SHM_DISABLE": "intra-node traffic goes over the network stack instead of shared memory",
    "NCCL_IB_DISABLE": "RDMA is off: inter-node traffic uses TCP sockets",
}


# -- collection -----------------------------------------------------------------------------------

def conf_paths(env: Mapping[str, str]) -> list[str]:
    """The files NCCL reads, in precedence order (first wins among files; env beats all)."""
    first = env.get("NCCL_CONF_FILE")
    if not first and env.get("HOME"):
        first = posixpath.join(env["HOME"], ".nccl.conf")
    return [p for p in (first, SYSTEM_CONF) if p]


def library_dirs(host: Host, env: Mapping[str, str]) -> list[str]:
    """Where dlopen looks for a bare library name: LD_LIBRARY_PATH, the ld.so.conf dirs, the defaults."""
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    pending: list[str] = ["/etc/ld.so.conf"]
    seen_files: set[str] = set()
    while pending and len(seen_files) < 256:
        path = pending.pop(0)
        if path in seen_files:
            continue
        seen_files.add(path)
        found, includes = parse_ld_so_conf(host.read_text(path) or "")
        dirs += found
        for pattern in includes:
            if not pattern.startswith("/"):
                pattern = posixpath.join(posixpath.dirname(path), pattern)
            folder, glob = posixpath.split(pattern)
            pending += [posixpath.join(folder, n) for n in host.listdir(folder) if fnmatch.fnmatch(n, glob)]
    out: list[str] = []
    for d in dirs + list(DEFAULT_LIB_DIRS):
        if d not in out:
            out.append(d)
    return out


def plugin_candidates(value: str | None) -> list[str]:
    """Library names NCCL tries, in order, for a NCCL_NET_PLUGIN value (None: unset)."""
    if value is None:
        return ["libnccl-net.so"]
    if value.lower() == "none" or not value.strip():
        return []
    if "/" in value:
        return [value]
    names = [value] if value.endswith(".so") or ".so." in value else []
    return names + [f"libnccl-net-{value}.so"]


def resolve_plugin(host: Host, value: str | None, dirs: list[str]) -> dict[str, Any]:
    tried: list[str] = []
    for name in plugin_candidates(value):
        if "/" in name:
            tried.append(name)
            if posixpath.isabs(name) and host.exists(name):
                return {"found": name, "tried": tried}
            continue
        for d in dirs:
            path = posixpath.join(d, name)
            tried.append(path)
            if host.exists(path):
                return {"found": path, "tried": tried}
    return {"found": None, "tried": tried}


def collect_nccl(host: Host) -> dict[str, Any]:
    env = host.env
    files = []
    for path in conf_paths(env):
        text = host.read_text(path)
        parsed = parse_nccl_conf(text or "", path)
        files.append({"path": path, "exists": text is not None, "settings": parsed.settings,
                      "problems": list(parsed.problems), "from_var": path == env.get("NCCL_CONF_FILE")})
    effective = _overlay(env, files)
    dirs = library_dirs(host, env)
    plugin = resolve_plugin(host, effective.get("NCCL_NET_PLUGIN"), dirs)
    return {
        "conf_files": files,
        "plugin": {"value": effective.get("NCCL_NET_PLUGIN"), **plugin, "dirs": dirs},
        "legacy_peermem": host.exists("/sys/module/nv_peer_mem"),
    }


def _overlay(env: Mapping[str, str], files: list[dict[str, Any]]) -> dict[str, str]:
    effective = dict(env)
    for f in files:
        for key, value in f.get("settings", {}).items():
            effective.setdefault(key, value)
    return effective


def effective_env(facts: Facts) -> dict[str, str]:
    """host.env with the NCCL conf files' settings underneath (env wins, as in NCCL)."""
    env = dict(facts.host.env) if facts.host else {}
    nccl = facts.get("nccl")
    return _overlay(env, nccl["conf_files"]) if nccl else env


def origin_of(facts: Facts, name: str) -> str:
    if facts.host and name in facts.host.env:
        return "environment"
    for f in (facts.get("nccl") or {}).get("conf_files", []):
        if name in f.get("settings", {}):
            return str(f["path"])
    return "default"


# -- socket interface -------------------------------------------------------------------------------

def _if_label(i: Mapping[str, Any], addresses: Mapping[str, list[str]] | None) -> str:
    ips = (addresses or {}).get(i["name"])
    state = "up" if i["up"] else (i.get("operstate") or "down")
    return f"{i['name']} ({state}{', ' + ', '.join(ips[:2]) if ips else ''})"


def default_candidates(interfaces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What NCCL picks with no NCCL_SOCKET_IFNAME: ib* first, else anything but docker* and lo."""
    up = [i for i in interfaces if i["up"]]
    ib = [i for i in up if i["name"].startswith("ib")]
    return ib or [i for i in up if not i["name"].startswith(("docker", "lo"))] or [i for i in up if i["loopback"]]


def best_interface(interfaces: list[dict[str, Any]], addresses: Mapping[str, list[str]] | None,
                   route_if: str | None) -> str | None:
    """The interface to recommend: the one routing to MASTER_ADDR, else a real one with an address."""
    up = [i for i in interfaces if i["up"]]
    if route_if and any(i["name"] == route_if for i in up):
        return route_if
    real = [i for i in default_candidates(interfaces) if not (i["loopback"] or i["virtual"])]
    with_ip = [i for i in real if addresses is None or addresses.get(i["name"])]
    pick = (with_ip or real)
    return pick[0]["name"] if pick else None


def socket_findings(env: Mapping[str, str], netif: Mapping[str, Any], multi_node: bool | None,
                    route_if: str | None, origin: str, var: str = "NCCL_SOCKET_IFNAME") -> Iterator[Finding]:
    interfaces = netif.get("interfaces", [])
    addresses = netif.get("addresses")
    fid = "nccl.socket_ifname" if var == "NCCL_SOCKET_IFNAME" else "gloo.socket_ifname"
    raw = env.get(var)
    if raw is None:
        if var == "NCCL_SOCKET_IFNAME":
            yield _unset_socket_finding(fid, interfaces, addresses, multi_node, route_if)
        return
    spec = _socket_spec(raw, var)
    where = "" if origin == "environment" else f" (from {origin})"
    if spec.problems:
        yield fail(fid, spec.problems[0] + where, "; ".join(spec.problems[1:]),
                   f"export {var}={best_interface(interfaces, addresses, route_if) or 'eth0'}")
        return
    matched = [i for i in interfaces if spec.matches(i["name"])]
    matched_up = [i for i in matched if i["up"]]
    if not matched_up:
        yield _nothing_up_finding(fid, f"{var}={raw}{where}", var, matched, interfaces, addresses, route_if)
        return
    yield _selection_finding(fid, f"{var}={raw}{where}", var, matched_up, interfaces, addresses, multi_node, route_if)


def _unset_socket_finding(fid: str, interfaces: list[dict[str, Any]], addresses: Any, multi_node: bool | None,
                          route_if: str | None) -> Finding:
    """NCCL_SOCKET_IFNAME unset: is NCCL's own pick safe here?"""
    picks = default_candidates(interfaces)
    names = ", ".join(_if_label(i, addresses) for i in picks) or "none"
    if not picks:
        return fail(fid, "no network interface is up", "NCCL aborts with 'no socket interface found'.",
                    "sudo ip link set <interface> up")
    if multi_node and len(picks) > 1:
        best = best_interface(interfaces, addresses, route_if) or picks[0]["name"]
        return warn(fid, f"NCCL_SOCKET_IFNAME unset with {len(picks)} candidate interfaces",
                    f"NCCL picks among: {names}; a wrong pick (a management or container network) makes "
                    "the job slow or hang at init.", f"export NCCL_SOCKET_IFNAME={best}")
    if multi_node and picks[0]["loopback"]:
        return fail(fid, "only the loopback interface is up", "Other nodes cannot reach this one.",
                    "sudo ip link set <interface> up")
    return passed(fid, "NCCL_SOCKET_IFNAME unset: NCCL's default choice is fine here", f"candidates: {names}")


def _socket_spec(raw: str, var: str) -> NcclList:
    """The setting parsed as its reader parses it: NCCL's list syntax, or gloo's exact names."""
    spec = parse_nccl_list(raw, var, with_ports=var == "NCCL_SOCKET_IFNAME")
    if var == "NCCL_SOCKET_IFNAME":
        return spec
    # gloo takes exact names (comma separated since torch 2.2), no ^ or prefix.
    return NcclList(raw, spec.entries, False, True, spec.problems +
                    ((f"{var}: gloo has no '^' or '=' syntax",) if raw.strip().startswith(("^", "=")) else ()))


def _nothing_up_finding(fid: str, setting: str, var: str, matched: list[dict[str, Any]],
                        interfaces: list[dict[str, Any]], addresses: Any, route_if: str | None) -> Finding:
    up_names = ", ".join(_if_label(i, addresses) for i in interfaces if i["up"]) or "none"
    down = ", ".join(_if_label(i, addresses) for i in matched)
    best = best_interface(interfaces, addresses, route_if)
    return fail(fid, f"{setting} matches no interface that is up",
                (f"matched but down: {down}; " if down else "") + f"up: {up_names}. "
                + ("NCCL aborts with 'no socket interface found'." if var == "NCCL_SOCKET_IFNAME"
                   else "gloo fails to create its device."),
                f"export {var}={best}" if best else "sudo ip link set <interface> up")


def _selection_finding(fid: str, setting: str, var: str, matched_up: list[dict[str, Any]],
                       interfaces: list[dict[str, Any]], addresses: Any, multi_node: bool | None,
                       route_if: str | None) -> Finding:
    """The interfaces a setting selects (some are up): reachable from other nodes, with an address?"""
    bad = [i for i in matched_up if i["loopback"] or i["virtual"]]
    no_ip = [i for i in matched_up if addresses is not None and not addresses.get(i["name"])]
    listing = ", ".join(_if_label(i, addresses) for i in matched_up)
    if multi_node and bad:
        best = best_interface(interfaces, addresses, route_if) or "eth0"
        return warn(fid, f"{setting} selects {', '.join(i['name'] for i in bad)} in a multi-node job",
                    "Loopback and container bridges are not reachable from other nodes.", f"export {var}={best}")
    if no_ip and len(no_ip) == len(matched_up):
        return fail(fid, f"{setting} selects interfaces without an IP address",
                    listing, f"sudo ip addr add <address>/<prefix> dev {no_ip[0]['name']}")
    if route_if and multi_node and route_if not in {i["name"] for i in matched_up}:
        return warn(fid, f"{setting} does not include {route_if}, the interface that routes to MASTER_ADDR",
                    f"selected: {listing}. Fine when both networks reach every node; a hang at init otherwise.",
                    f"export {var}={route_if}")
    return passed(fid, f"{setting} selects {listing}", "", interfaces=[i["name"] for i in matched_up])


# -- plugin, debug, switches, conf, peermem ---------------------------------------------------------

def plugin_findings(facts: Facts, nccl: Mapping[str, Any]) -> Iterator[Finding]:
    plugin = nccl["plugin"]
    value = plugin.get("value")
    origin = origin_of(facts, "NCCL_NET_PLUGIN")
    where = "" if origin in ("environment", "default") else f" (from {origin})"
    if value is not None and (value.lower() == "none" or not value.strip()):
        yield passed("nccl.net_plugin", f"NCCL_NET_PLUGIN={value!r}{where}: external plugins disabled")
        return
    if value is None:
        if plugin.get("found"):
            yield passed("nccl.net_plugin", f"default net plugin found: {plugin['found']}",
                         "NCCL loads libnccl-net.so when NCCL_NET_PLUGIN is unset.")
        else:
            yield passed("nccl.net_plugin", "no net plugin: NCCL uses its built-in IB and socket transports")
        return
    if plugin.get("found"):
        yield passed("nccl.net_plugin", f"NCCL_NET_PLUGIN={value}{where} resolves to {plugin['found']}",
                     "Look for 'NET/Plugin: Loaded net plugin' in NCCL_DEBUG=INFO output.", path=plugin["found"])
        return
    if "/" in value and not posixpath.isabs(value):
        detail = "A relative path is resolved against each rank's working directory, which differs between launchers."
        remedy = f"export NCCL_NET_PLUGIN=$(realpath {value})"
    else:
        wanted = plugin_candidates(value)
        detail = (f"Tried {', '.join(wanted)} in {len(plugin.get('dirs', []))} library directories. NCCL falls back "
                  "to its built-in IB plugin ('NET/Plugin: Could not find'), which cannot reach a mesh's per-pair "
                  "subnets: connections then time out.")
        remedy = (f"export LD_LIBRARY_PATH=<directory holding {wanted[-1]}>:$LD_LIBRARY_PATH" if "/" not in value
                  else f"copy the plugin to {value} on every node (or point NCCL_NET_PLUGIN at a shared path)")
    yield fail("nccl.net_plugin", f"NCCL_NET_PLUGIN={value}{where}: plugin library not found on this node", detail,
               remedy, tried=plugin.get("tried", [])[:20])


def debug_findings(env: Mapping[str, str], facts: Facts) -> Iterator[Finding]:
    raw = env.get("NCCL_DEBUG")
    level = None
    if raw is not None:
        choice = parse_nccl_debug(raw)
        level = choice.value
        where = "" if origin_of(facts, "NCCL_DEBUG") == "environment" else f" (from {origin_of(facts, 'NCCL_DEBUG')})"
        if choice.value is None:
            yield warn("nccl.debug", f"NCCL_DEBUG={raw!r}{where} is not a level NCCL knows; it is ignored",
                       "Levels: VERSION, WARN, INFO, TRACE.", "export NCCL_DEBUG=WARN")
        elif choice.value == "TRACE":
            yield warn("nccl.debug", f"NCCL_DEBUG=TRACE{where}",
                       "TRACE logs every call (and needs a TRACE build); it slows collectives measurably.",
                       "export NCCL_DEBUG=INFO (or WARN for production)")
        elif choice.value == "INFO":
            yield passed("nccl.debug", f"NCCL_DEBUG=INFO{where}",
                         "Verbose: right for diagnosing init and transport choice, noisy in production.")
        else:
            yield passed("nccl.debug", f"NCCL_DEBUG={choice.value}{where}")
    sub = env.get("NCCL_DEBUG_SUBSYS")
    if sub is not None:
        parsed = parse_nccl_debug_subsys(sub)
        if parsed.problems:
            yield warn("nccl.debug_subsys", parsed.problems[0], f"Known: {', '.join(NCCL_SUBSYSTEMS)}.",
                       "export NCCL_DEBUG_SUBSYS=INIT,NET")
        elif level not in ("INFO", "TRACE"):
            yield warn("nccl.debug_subsys", f"NCCL_DEBUG_SUBSYS is set but NCCL_DEBUG is {level or 'unset'}",
                       "Subsystem filtering only affects INFO and TRACE output.", "export NCCL_DEBUG=INFO")
        else:
            yield passed("nccl.debug_subsys", f"NCCL_DEBUG_SUBSYS={'^' if parsed.exclude else ''}{','.join(parsed.names)}")


def switch_findings(env: Mapping[str, str], facts: Facts, active_rdma: int) -> Iterator[Finding]:
    for name, effect in SWITCHES.items():
        raw = env.get(name)
        if raw is None:
            continue
        fid = f"nccl.switch[{name}]"
        origin = origin_of(facts, name)
        where = "" if origin == "environment" else f" (from {origin})"
        iv = parse_switch(raw, name)
        fix = f"unset {name}" if origin == "environment" else f"remove {name} from {origin}"
        if iv.value is None:
            yield warn(fid, f"{name}={raw!r}{where} is not an integer; NCCL ignores it", "", fix)
        elif iv.value == 0:
            yield passed(fid, f"{name}=0{where} (the default)")
        elif name == "NCCL_IB_DISABLE" and active_rdma:
            yield warn(fid, f"NCCL_IB_DISABLE={raw}{where} while {active_rdma} RDMA port(s) are active",
                       f"{effect}: a tenth of the bandwidth. This is a debugging switch.", fix)
        else:
            yield warn(fid, f"{name}={raw}{where}: a debugging switch is on", f"{effect}.", fix)


def conf_findings(nccl: Mapping[str, Any], env: Mapping[str, str]) -> Iterator[Finding]:
    files = nccl["conf_files"]
    for f in files:
        problems = f.get("problems", [])
        if problems:
            yield warn(f"nccl.conf_syntax[{f['path']}]", problems[0],
                       "NCCL skips lines it cannot parse." + (f" Also: {'; '.join(problems[1:4])}" if len(problems) > 1 else ""),
                       f"edit {f['path']}: one NAME=VALUE per line, # for comments")
    loaded = [f for f in files if f["exists"]]
    parts = []
    for f in loaded:
        shadowed = [k for k in f["settings"] if k in env]
        parts.append(f"{f['path']}: {', '.join(f'{k}={v}' for k, v in f['settings'].items()) or 'empty'}"
                     + (f" (environment overrides {', '.join(shadowed)})" if shadowed else ""))
    missing = next((f for f in files if f.get("from_var") and not f["exists"]), None)
    if missing:
        yield fail("nccl.conf", f"NCCL_CONF_FILE={missing['path']} does not exist",
                   "NCCL silently reads nothing from it. " + "; ".join(parts),
                   "export NCCL_CONF_FILE=<existing file> (or unset it)")
    elif not loaded:
        yield passed("nccl.conf", "no NCCL configuration file", ", ".join(f["path"] for f in files))
    else:
        yield passed("nccl.conf", f"NCCL reads {len(loaded)} configuration file(s)", "; ".join(parts),
                     files=[f["path"] for f in loaded])


def peermem_findings(facts: Facts, nccl: Mapping[str, Any], active_rdma: int) -> Iterator[Finding]:
    nvidia = [d for d in build_devices(facts["pci"]) if d.usable and d.vendor == "NVIDIA"] if "pci" in facts else []
    if not nvidia or not active_rdma:
        return
    modules = (facts.get("modules") or {}).get("modules", {})
    if "nvidia_peermem" in modules or nccl.get("legacy_peermem"):
        yield passed("nccl.peermem", "GPUDirect RDMA available (nvidia_peermem loaded)")
    else:
        yield warn("nccl.peermem", "nvidia_peermem is not loaded: no GPUDirect RDMA",
                   f"{len(nvidia)} NVIDIA GPU(s) and {active_rdma} active RDMA port(s): without peermem (or DMA-BUF on "
                   "the open kernel modules) NCCL stages every transfer through host memory.",
                   "sudo modprobe nvidia-peermem && echo nvidia-peermem | sudo tee /etc/modules-load.d/nvidia-peermem.conf")


def nccl_rules(facts: Facts) -> Iterator[Finding]:
    env = effective_env(facts)
    nccl = facts["nccl"]
    rdma = len([p for p in (facts.get("infiniband") or {}).get("ports", []) if p.get("state") == "ACTIVE"])
    yield from conf_findings(nccl, facts.host.env if facts.host else {})
    yield from plugin_findings(facts, nccl)
    yield from debug_findings(env, facts)
    yield from switch_findings(env, facts, rdma)


def peermem_rules(facts: Facts) -> Iterator[Finding]:
    rdma = len([p for p in facts["infiniband"].get("ports", []) if p.get("state") == "ACTIVE"])
    yield from peermem_findings(facts, facts["nccl"], rdma)


def socket_rules(facts: Facts) -> Iterator[Finding]:
    env = effective_env(facts)
    shape = job_shape(env)
    rdv = facts.get("rendezvous") or {}
    route_if = (rdv.get("route") or {}).get("interface")
    yield from socket_findings(env, facts["netif"], shape.multi_node, route_if, origin_of(facts, "NCCL_SOCKET_IFNAME"))
    yield from socket_findings(env, facts["netif"], shape.multi_node, route_if, "environment", var="GLOO_SOCKET_IFNAME")


COLLECTORS = [Collector("nccl", collect_nccl, "env", timeout=5.0)]
RULES = [
    Rule("nccl", nccl_rules, "env", needs=("nccl",)),
    Rule("nccl_socket", socket_rules, "env", needs=("netif",)),
    Rule("nccl_peermem", peermem_rules, "env", needs=("nccl", "pci", "modules", "infiniband")),
]
