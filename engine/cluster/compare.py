"""Rank 0's comparison of the nodes' reports: every difference that breaks or slows a job.

Pure functions of the gathered rank reports (schema ``hwtui.cluster.rank/1``), so each rule is
tested on recorded reports without a cluster. One finding per comparison: PASS when the nodes
agree (the report then shows what was compared), WARN or FAIL naming the odd nodes otherwise, with
the majority value in the remedy because that is what the odd node should be brought to.

Finding ids: ``cluster.<check>``, with ``[node]`` or ``[VARIABLE]`` when a check repeats.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from hwtui.core.finding import Finding, Status, fail, passed, warn

# Differences in these are what the interface rule explains better than a bare "differs".
_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# A difference here means the ranks were not even configured to meet at the same place.
_MUST_MATCH = {"MASTER_ADDR", "MASTER_PORT", "NCCL_NET_PLUGIN", "NCCL_IB_HCA"}


def _replication_knob(var: str) -> bool:
    """The variables `hwtui replicate` reads (window, chunk, bucket size): its ranks compare their
    effective settings and refuse to start (exit 2) when one differs, so a difference is a FAIL."""
    return var.startswith("HOTWEIGHTS_") or var == "HWTUI_BUCKET_MB"


def by_node(reports: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """One report per node (its lowest rank's): node-level facts are the same for its ranks."""
    out: dict[str, Mapping[str, Any]] = {}
    for rep in sorted(reports, key=lambda r: r["rank"]):
        out.setdefault(str(rep["node"]), rep)
    return out


def _majority(values: Mapping[str, Any]) -> Any:
    counts = Counter(_key(v) for v in values.values())
    best = max(counts.values())
    for v in values.values():  # ties go to the first node (usually the master)
        if counts[_key(v)] == best:
            return v
    return None


def _key(v: Any) -> str:
    return repr(v)


def _listing(values: Mapping[str, Any], fmt: Callable[[Any], str] = lambda v: "(unset)" if v is None else str(v)) -> str:
    return "; ".join(f"{node}: {fmt(v)}" for node, v in values.items())


def _odd(values: Mapping[str, Any], reference: Any) -> list[str]:
    return [node for node, v in values.items() if _key(v) != _key(reference)]


def _distinct(values: Mapping[str, Any]) -> bool:
    return len({_key(v) for v in values.values()}) > 1


def build_of(torch_facts: Mapping[str, Any]) -> tuple[str, str | None]:
    if torch_facts.get("hip"):
        return "rocm", str(torch_facts["hip"])
    if torch_facts.get("cuda"):
        return "cuda", str(torch_facts["cuda"])
    return "cpu", None


def _index_url(build: tuple[str, str | None]) -> str:
    kind, ver = build
    if kind == "cuda" and ver:
        major, _, minor = ver.partition(".")
        return f"https://download.pytorch.org/whl/cu{major}{minor.split('.')[0]}"
    if kind == "rocm" and ver:
        return f"https://download.pytorch.org/whl/rocm{'.'.join(ver.split('.')[:2])}"
    return "https://download.pytorch.org/whl/cpu"


def rule_torch(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    versions = {n: r["torch"].get("version") for n, r in nodes.items()}
    ref = _majority(versions)
    if not _distinct(versions):
        yield passed("cluster.torch", f"torch {ref} on all {len(nodes)} node(s)")
    else:
        odd = _odd(versions, ref)
        yield fail("cluster.torch", f"torch differs between nodes: {', '.join(odd)} not on {ref}", _listing(versions),
                   f"on {', '.join(odd)}: python -m pip install 'torch=={str(ref).split('+')[0]}' "
                   f"--index-url {_index_url(build_of(nodes[next(n for n in nodes if n not in odd)]['torch']))}",
                   nodes=odd, values=versions)


def rule_build(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    builds = {n: build_of(r["torch"]) for n, r in nodes.items()}
    shown = {n: f"{k} {v}" if v else k for n, (k, v) in builds.items()}
    ref = _majority(builds)
    if not _distinct(builds):
        yield passed("cluster.torch_build", f"one torch build everywhere: {shown[next(iter(nodes))]}")
        return
    odd = _odd(builds, ref)
    kinds = {k for k, _ in builds.values()}
    if len(kinds) > 1:
        # Mixed vendors is a supported hwtui setup, but not over one NCCL/RCCL communicator.
        yield warn("cluster.torch_build", f"mixed torch builds: {_listing(shown)}",
                   "NCCL and RCCL cannot form one communicator; collectives across these nodes must use gloo.",
                   "run this test and the job with --backend gloo (hwtui train handles mixed vendors over gloo)",
                   nodes=odd, values=shown)
    else:
        yield fail("cluster.torch_build", f"torch {ref[0].upper()} builds differ: {', '.join(odd)} not on {ref[1]}",
                   _listing(shown) + ". Each build bundles its own NCCL/RCCL; mixed versions hang or crash in collectives.",
                   f"on {', '.join(odd)}: python -m pip install --force-reinstall torch --index-url {_index_url(ref)}",
                   nodes=odd, values=shown)


def rule_nccl(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    versions = {n: r["torch"].get("nccl") for n, r in nodes.items() if r["torch"].get("nccl")}
    if not versions:
        return  # CPU or ROCm builds only: nothing to compare
    ref = _majority(versions)
    if len(versions) < len(nodes) or _distinct(versions):
        full = {n: nodes[n]["torch"].get("nccl") for n in nodes}
        odd = _odd(full, ref)
        yield fail("cluster.nccl", f"NCCL differs between nodes: {', '.join(odd)} not on {ref}", _listing(full),
                   f"install the same torch wheel on every node (it bundles NCCL {ref}), or pin "
                   f"python -m pip install nvidia-nccl-cu12=={ref} on {', '.join(odd)}",
                   nodes=odd, values=full)
    else:
        yield passed("cluster.nccl", f"NCCL {ref} on all {len(nodes)} node(s)")


def rule_drivers(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    modules = sorted({m for r in nodes.values() for m in (r.get("drivers") or {})})
    for module in modules:
        versions = {n: (r.get("drivers") or {}).get(module) for n, r in nodes.items()}
        ref = _majority(versions)
        fid = f"cluster.driver[{module}]"
        if _distinct(versions):
            odd = _odd(versions, ref)
            yield warn(fid, f"{module} driver differs: {', '.join(odd)} not on {ref}", _listing(versions),
                       f"install {module} driver {ref} on {', '.join(odd)} (then reboot) so every node runs the same stack",
                       nodes=odd, values=versions)
        else:
            yield passed(fid, f"{module} driver {ref} on all {len(nodes)} node(s)")


def rule_python(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    versions = {n: r.get("python") for n, r in nodes.items()}
    minors = {n: ".".join(str(v).split(".")[:2]) for n, v in versions.items()}
    ref = _majority(minors)
    if _distinct(minors):
        odd = _odd(minors, ref)
        yield warn("cluster.python", f"Python differs: {', '.join(odd)} not on {ref}", _listing(versions),
                   f"create the venv from Python {ref} on {', '.join(odd)} (python{ref} -m venv ...) so wheels match",
                   nodes=odd, values=versions)
    else:
        detail = _listing(versions) if _distinct(versions) else ""
        yield passed("cluster.python", f"Python {ref} on all {len(nodes)} node(s)", detail)


def _ifname_matches(pattern: str, names: Sequence[str]) -> list[str]:
    """NCCL's NCCL_SOCKET_IFNAME semantics: a comma list of prefixes, ``=`` exact, ``^`` exclude."""
    if pattern.startswith("^"):
        excluded = pattern[1:].split(",")
        return [n for n in names if not any(n.startswith(e) for e in excluded)]
    exact = pattern.startswith("=")
    wanted = pattern.lstrip("=").split(",")
    return [n for n in names if any((n == w) if exact else n.startswith(w) for w in wanted)]


def rule_interfaces(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    routes = {n: (r.get("route") or {}).get("interface") for n, r in nodes.items()}
    any_configured = False
    for node, rep in nodes.items():
        names = sorted(rep.get("interfaces") or {})
        env = rep.get("env") or {}
        fid = f"cluster.interface[{node}]"
        problems = []
        for var in _IFNAME_VARS:
            pattern = env.get(var)
            if not pattern:
                continue
            any_configured = True
            matched = _ifname_matches(pattern, names)
            if not matched:
                problems.append((var, pattern))
        route = routes[node]
        if problems:
            var, pattern = problems[0]
            use = route or (names[0] if names else "<name>")
            yield fail(fid, f"node {node} has no interface matching {var}={pattern}",
                       f"{node} has: {', '.join(names) or 'no interface'}; it reaches the master over {route or '?'}. "
                       "The ranks on this node cannot bind their sockets and the whole job hangs at init.",
                       f"on {node}: export NCCL_SOCKET_IFNAME={use} GLOO_SOCKET_IFNAME={use} "
                       f"(hwtui cluster init ... --node-interface {node}={use})",
                       node=node, interfaces=names, configured={v: p for v, p in problems}, route=route)
            continue
        configured = env.get("GLOO_SOCKET_IFNAME") or env.get("NCCL_SOCKET_IFNAME")
        if configured and route and not _ifname_matches(configured, [route]):
            yield warn(fid, f"node {node} reaches the master over {route}, but its traffic is pinned to {configured}",
                       "The store connection and the collectives then take different networks; fine if both reach "
                       "every node, a hang if the pinned one does not.",
                       f"on {node}: check `ip route get <master address>`; pin NCCL_SOCKET_IFNAME to the cluster network",
                       node=node, route=route, configured=configured)
        else:
            yield passed(fid, f"node {node} uses {configured or route or '?'}",
                         f"interfaces: {', '.join(names)}", node=node, route=route)
    if not any_configured and len({r for r in routes.values() if r}) > 1:
        yield warn("cluster.interfaces", f"nodes reach the master over differently named interfaces: {_listing(routes)}",
                   "With no NCCL_SOCKET_IFNAME, NCCL picks an interface by its own ranking on each node; with "
                   "different names it can pick a management network on one node and the fabric on another.",
                   "set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME per node: hwtui cluster init --interface NAME "
                   "--node-interface NODE=NAME ...", values=routes)


def rule_env(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    names = sorted({k for r in nodes.values() for k in (r.get("env") or {})} - set(_IFNAME_VARS))
    same = 0
    for var in names:
        values = {n: (r.get("env") or {}).get(var) for n, r in nodes.items()}
        if not _distinct(values):
            same += 1
            continue
        ref = _majority(values)
        odd = _odd(values, ref)
        knob = _replication_knob(var)
        make = fail if var in _MUST_MATCH or knob else warn
        fix = f"unset {var} on {', '.join(odd)}" if ref is None else f"export {var}={ref} on {', '.join(odd)}"
        why = " `hwtui replicate` refuses to start when its ranks' settings differ." if knob else ""
        yield make(f"cluster.env[{var}]", f"{var} differs between nodes", _listing(values) + why,
                   f"{fix} (or put it in every node's env file)", nodes=odd, values=values)
    if names:
        yield passed("cluster.env", f"{same} of {len(names)} variable(s) of interest identical on every node")


def rule_plugin(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    for node, rep in nodes.items():
        plugin = rep.get("plugin")
        if not plugin:
            continue
        fid = f"cluster.plugin[{node}]"
        if plugin.get("path"):
            yield passed(fid, f"NCCL net plugin found on {node}: {plugin['path']}")
        elif "/" in str(plugin.get("value")):
            yield fail(fid, f"NCCL_NET_PLUGIN={plugin['value']} does not exist on node {node}",
                       "NCCL then falls back to its built-in IB transport; on a direct-connect mesh that fails with "
                       "'ibv_modify_qp failed with 110 Connection timed out'.",
                       f"build or copy the plugin to {plugin['value']} on {node} (cd nccl-mesh-plugin && make), "
                       "or keep it on storage every node mounts at the same path", node=node)
        else:
            yield warn(fid, f"NCCL net plugin {plugin['value']!r} not found on LD_LIBRARY_PATH on node {node}",
                       "NCCL also searches the linker's default paths, so this may still load; look for "
                       "'NET/Plugin: Loaded net plugin' with NCCL_DEBUG=INFO.",
                       f"export LD_LIBRARY_PATH=/path/to/plugin/dir:$LD_LIBRARY_PATH on {node}", node=node)


def rule_devices(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    counts = {n: r["torch"].get("device_count", 0) for n, r in nodes.items()}
    if _distinct(counts):
        ref = _majority(counts)
        odd = _odd(counts, ref)
        yield warn("cluster.devices", f"GPU count seen by torch differs: {', '.join(odd)} not {ref}", _listing(counts),
                   f"on {', '.join(odd)}: check CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES and `hwtui list-gpus`",
                   nodes=odd, values=counts)


def rule_hwtui(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    versions = {n: r.get("hwtui") for n, r in nodes.items()}
    if _distinct(versions):
        ref = _majority(versions)
        odd = _odd(versions, ref)
        yield warn("cluster.hwtui", f"hwtui differs: {', '.join(odd)} not on {ref}", _listing(versions),
                   f"python -m pip install 'hwtui=={ref}' on {', '.join(odd)}", nodes=odd, values=versions)


def rule_local_checks(nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    for node, rep in nodes.items():
        check = rep.get("check") or {}
        bad = [f for f in check.get("findings", []) if f.get("status") in (Status.FAIL.value, Status.ERROR.value)]
        fid = f"cluster.node_check[{node}]"
        if not bad:
            yield passed(fid, f"local check on {node}: {check.get('worst', 'pass')}", node=node)
            continue
        listing = "; ".join(f"{f['id']}: {f.get('title', '')}" for f in bad[:5])
        make = fail if any(f.get("status") == Status.FAIL.value for f in bad) else warn
        yield make(fid, f"local check on {node} found {len(bad)} problem(s)", listing,
                   f"on {node}: hwtui --check (each finding carries its own fix)", node=node,
                   ids=[f["id"] for f in bad])


RULES = (rule_torch, rule_build, rule_nccl, rule_drivers, rule_python, rule_interfaces, rule_env, rule_plugin,
         rule_devices, rule_hwtui, rule_local_checks)


def compare(reports: Sequence[Mapping[str, Any]]) -> list[Finding]:
    nodes = by_node(reports)
    findings: list[Finding] = []
    for rule in RULES:
        findings.extend(rule(nodes))
    return findings


def expected_nodes(registered: Sequence[str], expected: Sequence[str], join_timeout: float,
                   addresses: Mapping[str, str] | None = None, said: Mapping[str, str] | None = None) -> list[Finding]:
    """Nodes in cluster.json that no rank came from, and ranks from nodes cluster.json lacks.

    ``said``: what an absent node's launch script reported before it stopped (its local check's
    finding, posted to the store by `hwtui cluster preflight`)."""
    addresses = addresses or {}
    said = said or {}
    findings = []
    present = set(registered)
    for node in expected:
        fid = f"cluster.join[{node}]"
        if node in present:
            findings.append(passed(fid, f"node {node} joined"))
        else:
            where = f" ({addresses[node]})" if addresses.get(node) and addresses[node] != node else ""
            if said.get(node):
                findings.append(fail(fid, f"node {node}{where} never joined: it said: {said[node]}",
                                     "Its launch script ran the local check and stopped before joining.",
                                     f"fix it on {node} (the fix is in its message), then start launch-{node}.sh again",
                                     node=node, said=said[node]))
                continue
            findings.append(fail(fid, f"node {node}{where} never joined within {join_timeout:g} s",
                                 "No rank registered from this node before the rendezvous closed.",
                                 f"start the launch command on {node} (launch-{node}.sh), and check it can reach the "
                                 "master: nc -zv MASTER_ADDR MASTER_PORT", node=node))
    for node in sorted(present - set(expected)):
        findings.append(warn(f"cluster.join[{node}]", f"a rank ran on {node}, which cluster.json does not list",
                             "Ranks name their node from HWTUI_CLUSTER_NODE (set by the env files), else the host name.",
                             "source that node's env file before launching, or add it: hwtui cluster init --nodes ...",
                             node=node))
    return findings
