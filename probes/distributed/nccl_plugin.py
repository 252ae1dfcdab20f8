"""Does the NCCL net plugin actually load, and are the mesh plugin's NCCL_MESH_* settings sane?

Finding the file (probes/distributed/nccl.py) is not enough: a truncated copy, a plugin built for
another architecture, one whose libibverbs is missing, or a random file named libnccl-net.so all
exist and all make NCCL fall back to its built-in transports (on a direct-connect mesh that means
"Connection timed out" minutes later). So the plugin is dlopen()ed the way NCCL does it
(RTLD_NOW | RTLD_LOCAL) in a child process (a bad constructor may crash it; hwtui must not), and
its ``ncclNetPlugin_vN`` symbols are looked up: the newest version exported and the transport
name it declares (the first field of every ncclNet_vN_t is ``const char* name``; the mesh plugin
says "Mesh"). The answer is a host fact, so snapshots and --replay carry it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast

from hwtui.core.finding import Finding, fail, passed, skip, warn
from hwtui.probes.child import ChildError, run_in_child
from hwtui.probes.distributed.nccl import collect_nccl, effective_env
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import FactUnavailable, Host

NEWEST_API = 12  # looked up from here down; NCCL 2.27 knows up to v10
MESH_VARS = {"NCCL_MESH_GID_INDEX": "RoCE GID index (try 0-3)", "NCCL_MESH_DEBUG": "plugin debug level 0, 1 or 2"}


# -- inside the child ----------------------------------------------------------------------------

def _symbol_name(lib: Any, symbol: str) -> str | None:
    import ctypes

    try:
        raw = ctypes.c_char_p.in_dll(lib, symbol).value
    except ValueError:  # symbol absent
        return None
    text = (raw or b"").decode("utf-8", "replace")[:64]
    return text if text.isprintable() else repr(text)


def dlopen_plugin(path: str) -> dict[str, Any]:
    """Runs in a child: load ``path`` like NCCL does and list the plugin API versions it exports."""
    import ctypes
    import os

    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        return {"loaded": False, "error": str(exc)[:400]}
    net: dict[str, str] = {}
    coll: dict[str, str] = {}
    for version in range(NEWEST_API, 1, -1):
        for table, prefix in ((net, "ncclNetPlugin_v"), (coll, "ncclCollNetPlugin_v")):
            try:
                getattr(lib, f"{prefix}{version}")  # cheap existence test before reading through it
            except AttributeError:
                continue
            name = _symbol_name(lib, f"{prefix}{version}")
            if name is not None:
                table[str(version)] = name
    return {"loaded": True, "net": net, "collnet": coll}


# -- collection ----------------------------------------------------------------------------------

def load_in_child(path: str, timeout: float = 20.0) -> dict[str, Any]:
    try:
        return cast("dict[str, Any]", run_in_child("hwtui.probes.distributed.nccl_plugin:dlopen_plugin", {"path": path},
                                                   timeout=timeout))
    except ChildError as exc:
        return {"loaded": False, "error": str(exc), "child": exc.kind, "stderr": exc.stderr_tail[-400:]}


def collect_nccl_plugin(host: Host) -> dict[str, Any]:
    plugin = collect_nccl(host)["plugin"]
    path = plugin.get("found")
    out: dict[str, Any] = {"value": plugin.get("value"), "path": path, "load": None}
    if path:
        try:
            out["load"] = host.fact(f"nccl_plugin_load:{path}", lambda: load_in_child(path))
        except FactUnavailable:
            out["load"] = None  # a recorded tree without the answer: say so, don't guess
    return out


# -- verdicts ------------------------------------------------------------------------------------

def plugin_load_findings(info: Mapping[str, Any]) -> Iterator[Finding]:
    path = info.get("path")
    if not path:
        return  # nccl.net_plugin already says whether a plugin is configured and found
    load = info.get("load")
    fid = "nccl.net_plugin.load"
    if load is None:
        yield skip(fid, f"{path}: whether it loads was not recorded with this machine")
        return
    if not load.get("loaded"):
        crashed = load.get("child") == "crash"
        yield fail(fid, f"{path} does not load" + (" (loading it crashed the process)" if crashed else ""),
                   (load.get("error") or "") + ". NCCL logs 'NET/Plugin: Could not find' or 'Failed to open' and falls back "
                   "to its built-in transports.",
                   f"rebuild the plugin on this node (make clean && make) and check `ldd {path}` for 'not found'")
        return
    net = load.get("net") or {}
    if not net:
        yield fail(fid, f"{path} loads but exports no ncclNetPlugin_vN symbol: it is not an NCCL net plugin",
                   "NCCL ignores it and uses its built-in transports.",
                   "point NCCL_NET_PLUGIN at the plugin's libnccl-net.so (nm -D <file> | grep ncclNetPlugin)")
        return
    newest = max(net, key=int)
    yield passed(fid, f"{path} loads: net plugin {net[newest]!r} (v{newest})",
                 f"API versions exported: {', '.join('v' + v for v in sorted(net, key=int, reverse=True))}; NCCL uses the "
                 f"newest it knows and logs 'NET/Plugin: Loaded net plugin {net[newest]} (v{newest})'.",
                 name=net[newest], version=int(newest), versions=sorted(int(v) for v in net))


def mesh_findings(env: Mapping[str, str], info: Mapping[str, Any] | None) -> Iterator[Finding]:
    names = sorted(k for k in env if k.startswith("NCCL_MESH_"))
    if not names:
        return
    net = ((info or {}).get("load") or {}).get("net") or {}
    plugin_names = {v.lower() for v in net.values()}
    if not (info or {}).get("path"):
        yield warn("nccl.mesh.plugin", f"{', '.join(names)} set but no NCCL net plugin is loaded",
                   "Only the mesh plugin reads NCCL_MESH_*; NCCL's built-in IB transport ignores them (and cannot cross "
                   "the mesh's per-pair subnets).", "export NCCL_NET_PLUGIN=/path/to/nccl-mesh-plugin/libnccl-net.so")
    elif net and "mesh" not in plugin_names:
        yield warn("nccl.mesh.plugin", f"{', '.join(names)} set but the loaded plugin is {', '.join(sorted(set(net.values())))}",
                   "NCCL_MESH_* only affect the mesh plugin.", "export NCCL_NET_PLUGIN=/path/to/nccl-mesh-plugin/libnccl-net.so")
    for name in names:
        if name not in MESH_VARS:
            yield warn(f"nccl.mesh[{name}]", f"{name} is not a mesh plugin setting", f"Known: {', '.join(MESH_VARS)}.",
                       f"unset {name}")
    raw = env.get("NCCL_MESH_DEBUG")
    if raw is not None:
        if raw.strip() not in ("0", "1", "2"):
            yield warn("nccl.mesh[NCCL_MESH_DEBUG]", f"NCCL_MESH_DEBUG={raw!r} is not 0, 1 or 2", "", "export NCCL_MESH_DEBUG=1")
        else:
            yield passed("nccl.mesh[NCCL_MESH_DEBUG]", f"NCCL_MESH_DEBUG={raw.strip()}")
    # NCCL_MESH_GID_INDEX against the ports' GID tables is ib.mesh_gid_index (probes/distributed/ib.py).


def plugin_rules(facts: Facts) -> Iterator[Finding]:
    yield from plugin_load_findings(facts["nccl_plugin"])


def mesh_rules(facts: Facts) -> Iterator[Finding]:
    yield from mesh_findings(effective_env(facts), facts.get("nccl_plugin"))


COLLECTORS = [Collector("nccl_plugin", collect_nccl_plugin, "env", timeout=30.0)]
RULES = [Rule("nccl_plugin", plugin_rules, "env", needs=("nccl_plugin",)),
         Rule("nccl_mesh", mesh_rules, "env", needs=("nccl_plugin",))]
