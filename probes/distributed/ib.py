"""RDMA ports: NCCL_IB_HCA and the GID indices against /sys/class/infiniband.

A NCCL_IB_HCA that matches no ACTIVE port does not fail: NCCL quietly falls back to TCP sockets
and the job runs at a tenth of the speed. On RoCE the GID index picks the address family and RoCE
version; the wrong one gives "QP transition to RTR failed" or a connect timeout (the RDMA mesh
quick start's troubleshooting section), so it is checked against the port's GID table here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast

from hwtui.core.finding import Finding, fail, passed, skip, warn
from hwtui.probes.distributed.parsers import NcclList, parse_int, parse_nccl_list
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import Host

IB_ROOT = "/sys/class/infiniband"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
MAX_GIDS = 256


def _state(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'."""
    if not text:
        return None
    return text.strip().split(":", 1)[-1].strip() or None


def _gid_ipv4(gid: str) -> str | None:
    """An IPv4-mapped GID (::ffff:a.b.c.d) as dotted quad: the RoCE v2 entries NCCL should use."""
    parts = gid.split(":")
    if len(parts) != 8 or parts[:6] != ["0000"] * 5 + ["ffff"]:
        return None
    try:
        a, b = int(parts[6], 16), int(parts[7], 16)
    except ValueError:
        return None
    return f"{a >> 8}.{a & 255}.{b >> 8}.{b & 255}"


def _gids(host: Host, base: str) -> list[dict[str, Any]]:
    out = []
    names = host.listdir(f"{base}/gids")
    for name in sorted(names, key=lambda n: int(n) if n.isdigit() else MAX_GIDS):
        if not name.isdigit() or int(name) >= MAX_GIDS:
            continue
        gid = (host.read_text(f"{base}/gids/{name}") or "").strip()
        if not gid or gid == ZERO_GID:
            continue
        out.append({
            "index": int(name),
            "gid": gid,
            "type": (host.read_text(f"{base}/gid_attrs/types/{name}") or "").strip() or None,
            "ndev": (host.read_text(f"{base}/gid_attrs/ndevs/{name}") or "").strip() or None,
            "ipv4": _gid_ipv4(gid),
        })
    return out


def collect_infiniband(host: Host) -> dict[str, Any]:
    ports = []
    for hca in host.listdir(IB_ROOT):
        for port in host.listdir(f"{IB_ROOT}/{hca}/ports"):
            if not port.isdigit():
                continue
            base = f"{IB_ROOT}/{hca}/ports/{port}"
            ports.append({
                "hca": hca,
                "port": int(port),
                "state": _state(host.read_text(f"{base}/state")),
                "phys_state": _state(host.read_text(f"{base}/phys_state")),
                "link_layer": (host.read_text(f"{base}/link_layer") or "").strip() or None,
                "rate": (host.read_text(f"{base}/rate") or "").strip() or None,
                "gids": _gids(host, base),
            })
    return {"ports": ports}


def port_label(p: Mapping[str, Any]) -> str:
    layer = "RoCE" if p.get("link_layer") == "Ethernet" else (p.get("link_layer") or "?")
    return f"{p['hca']}:{p['port']} ({p.get('state') or '?'}, {layer}{', ' + p['rate'] if p.get('rate') else ''})"


def active_ports(ports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in ports if p.get("state") == "ACTIVE"]


def selected_ports(ports: list[dict[str, Any]], spec: NcclList | None) -> list[dict[str, Any]]:
    return [p for p in ports if spec is None or spec.matches(p["hca"], p["port"])]


def hca_findings(env: Mapping[str, str], ports: list[dict[str, Any]], multi_node: bool | None) -> Iterator[Finding]:
    raw = env.get("NCCL_IB_HCA")
    active = active_ports(ports)
    if raw is None:
        yield _unset_hca_finding(ports, active)
        return
    spec = parse_nccl_list(raw, "NCCL_IB_HCA")
    chosen = selected_ports(ports, spec)
    chosen_active = active_ports(chosen)
    hcas = sorted({p["hca"] for p in ports})
    if spec.problems:
        yield fail("ib.hca", spec.problems[0], "; ".join(spec.problems[1:]),
                   f"export NCCL_IB_HCA={_suggest(active) or '<hca>:<port>'}")
    elif not ports:
        yield fail("ib.hca", f"NCCL_IB_HCA={raw} but this node has no RDMA device",
                   "NCCL falls back to TCP sockets silently.",
                   "unset NCCL_IB_HCA, or install the RDMA driver: sudo modprobe mlx5_ib ib_uverbs")
    elif not chosen:
        yield fail("ib.hca", f"NCCL_IB_HCA={raw} matches no RDMA port",
                   f"Present: {'; '.join(port_label(p) for p in ports)}. NCCL falls back to TCP sockets.",
                   f"export NCCL_IB_HCA={_suggest(active) or '=' + hcas[0]}")
    elif not chosen_active:
        yield fail("ib.hca", f"NCCL_IB_HCA={raw} selects only inactive ports",
                   "; ".join(port_label(p) for p in chosen) + ". NCCL falls back to TCP sockets.",
                   f"export NCCL_IB_HCA={_suggest(active)}" if active else "Bring the link up: ibstat; sudo systemctl start opensm")
    else:
        yield _selected_hca_finding(raw, spec, hcas, chosen, chosen_active)


def _unset_hca_finding(ports: list[dict[str, Any]], active: list[dict[str, Any]]) -> Finding:
    if not ports:
        return skip("ib.hca", "no RDMA device in /sys/class/infiniband: NCCL uses TCP sockets between nodes")
    if active:
        return passed("ib.hca", f"NCCL_IB_HCA unset: NCCL uses all {len(active)} active RDMA port(s)",
                      "; ".join(port_label(p) for p in active))
    return warn("ib.hca", f"{len(ports)} RDMA port(s), none ACTIVE",
                "; ".join(port_label(p) for p in ports) + ". NCCL falls back to TCP sockets.",
                "Check cabling and the subnet manager: ibstat (IB) or ip link (RoCE); sudo systemctl start opensm")


def _prefix_surprises(spec: NcclList, hcas: list[str]) -> list[str]:
    """Prefix semantics: mlx5_1 also matches mlx5_10..mlx5_19."""
    surprises = []
    if not spec.exact and not spec.exclude:
        for entry in spec.entries:
            hits = spec.entry_hits(entry, hcas)
            extra = [h for h in hits if h != entry.name]
            if entry.name in hits and extra:
                surprises.append(f"{entry.name} also matches {', '.join(extra)}")
    return surprises


def _selected_hca_finding(raw: str, spec: NcclList, hcas: list[str], chosen: list[dict[str, Any]],
                          chosen_active: list[dict[str, Any]]) -> Finding:
    """NCCL_IB_HCA selects some active port: is it what was meant?"""
    surprises = _prefix_surprises(spec, hcas)
    inactive = [p for p in chosen if p not in chosen_active]
    layers = sorted({p.get("link_layer") or "?" for p in chosen_active})
    listing = "; ".join(port_label(p) for p in chosen_active)
    if surprises:
        return warn("ib.hca", f"NCCL_IB_HCA={raw} is a prefix list: {'; '.join(surprises)}", listing,
                    f"export NCCL_IB_HCA={_suggest(chosen_active)}  (the leading '=' makes names exact)")
    if inactive and not spec.exclude:
        # Named explicitly but down: NCCL skips it, so the job runs on fewer rails than planned.
        return warn("ib.hca", f"NCCL_IB_HCA selects {len(inactive)} inactive port(s)",
                    f"in use: {listing}; down: {'; '.join(port_label(p) for p in inactive)}",
                    f"export NCCL_IB_HCA={_suggest(chosen_active)}")
    if len(layers) > 1:
        return warn("ib.hca", "NCCL_IB_HCA mixes InfiniBand and RoCE ports", listing,
                    f"export NCCL_IB_HCA={_suggest([p for p in chosen_active if p.get('link_layer') == layers[0]])}")
    return passed("ib.hca", f"NCCL_IB_HCA selects {len(chosen_active)} active port(s)",
                  listing + (f"; inactive, skipped by NCCL: {', '.join(port_label(p) for p in inactive)}" if inactive else ""),
                  ports=[f"{p['hca']}:{p['port']}" for p in chosen_active])


def _suggest(ports: list[dict[str, Any]]) -> str:
    return ("=" + ",".join(f"{p['hca']}:{p['port']}" for p in ports)) if ports else ""


def best_gid(port: Mapping[str, Any]) -> dict[str, Any] | None:
    """The GID NCCL should use on a RoCE port: RoCE v2 with an IPv4-mapped address, else any v2."""
    gids: list[dict[str, Any]] = port.get("gids") or []
    v2 = [g for g in gids if "v2" in (g.get("type") or "").lower()]
    for pool in ([g for g in v2 if g.get("ipv4")], v2):
        if pool:
            return cast("dict[str, Any]", pool[0])
    return None


# (variable, finding id)
_GID_VARS = (("NCCL_IB_GID_INDEX", "ib.gid_index"), ("NCCL_MESH_GID_INDEX", "ib.mesh_gid_index"))


def gid_findings(env: Mapping[str, str], ports: list[dict[str, Any]]) -> Iterator[Finding]:
    spec = None
    if env.get("NCCL_IB_HCA") is not None:
        parsed = parse_nccl_list(env["NCCL_IB_HCA"], "NCCL_IB_HCA")
        spec = None if parsed.problems else parsed
    chosen = active_ports(selected_ports(ports, spec))
    roce = [p for p in chosen if p.get("link_layer") == "Ethernet"]
    for var, fid in _GID_VARS:
        raw = env.get(var)
        if raw is None:
            if var == "NCCL_IB_GID_INDEX" and roce:
                hints = [(p, best_gid(p)) for p in roce]
                text = "; ".join(f"{p['hca']}:{p['port']} -> {g['index']} ({g['type']}, {g.get('ipv4') or g['gid']})"
                                 for p, g in hints if g)
                yield passed(fid, "NCCL_IB_GID_INDEX unset on RoCE: NCCL picks a RoCE v2 GID itself (2.21+)",
                             "Older NCCL defaults to index 0 (often RoCE v1). Best index per port: " + (text or "none"))
            continue
        iv = parse_int(raw, var, -1)
        if not iv.ok:
            yield fail(fid, "; ".join(iv.problems), "", f"export {var}=<GID index shown by show_gids>")
        elif iv.value == -1:
            yield passed(fid, f"{var}=-1: automatic GID selection")
        elif not chosen:
            yield skip(fid, f"{var}={iv.value} but no active RDMA port is selected to check it against")
        else:
            yield _gid_index_finding(var, fid, iv.value, chosen, roce)


def _gid_index_finding(var: str, fid: str, idx: Any, chosen: list[dict[str, Any]],
                       roce: list[dict[str, Any]]) -> Finding:
    """A GID index set by hand, against the GID table of every selected active port."""
    bad, weak, good = [], [], []
    for p in chosen:
        entry = next((g for g in p.get("gids") or [] if g["index"] == idx), None)
        label = f"{p['hca']}:{p['port']}"
        if entry is None:
            bad.append(f"{label} has no GID at index {idx}")
        elif p.get("link_layer") == "Ethernet" and "v2" not in (entry.get("type") or "").lower():
            weak.append(f"{label}[{idx}] is {entry.get('type') or 'untyped'} (RoCE v1 does not cross subnets)")
        else:
            good.append(f"{label}[{idx}] {entry.get('type') or ''} {entry.get('ipv4') or entry['gid']}".strip())
    suggestion = next((g["index"] for p in roce for g in [best_gid(p)] if g), None)
    remedy = f"export {var}={suggestion}" if suggestion is not None else "show_gids lists the valid indices"
    if bad:
        return fail(fid, f"{var}={idx}: {'; '.join(bad)}",
                    "The queue pair cannot reach RTR with an empty GID ('QP transition to RTR failed').", remedy)
    if weak:
        return warn(fid, f"{var}={idx}: {'; '.join(weak)}", "", remedy)
    return passed(fid, f"{var}={idx} is valid on every selected port", "; ".join(good))


def ib_rules(facts: Facts) -> Iterator[Finding]:
    from hwtui.probes.distributed.launcher import job_shape
    from hwtui.probes.distributed.nccl import effective_env

    env = effective_env(facts)
    ports = facts["infiniband"]["ports"]
    yield from hca_findings(env, ports, job_shape(env).multi_node)
    yield from gid_findings(env, ports)


COLLECTORS = [Collector("infiniband", collect_infiniband, "env", timeout=5.0)]
RULES = [Rule("ib", ib_rules, "env", needs=("infiniband",))]
