"""The replication engine's knobs from the vendor guide, parsed and checked against free memory.

HOTWEIGHTS_IPC_INFLIGHT_BUCKETS (the window), the bucket size (``--bucket-mb``; as a variable
HWTUI_BUCKET_MB or HOTWEIGHTS_BUCKET_MB), HOTWEIGHTS_BCAST_CHUNK_MB and HOTWEIGHTS_UCX_NET_DEVICES
(which mirrors NCCL_IB_HCA when unset). The window holds ``window x bucket`` bytes at once on each
receiver; when that does not fit in free device memory (or host memory, where staging happens) the
run dies with an out-of-memory error half-way through a replication.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hwtui.core.finding import Finding, fail, passed, skip, warn
from hwtui.probes.distributed.ib import active_ports, selected_ports
from hwtui.probes.distributed.parsers import parse_int, parse_nccl_list, parse_positive_number, parse_ucx_devices
from hwtui.probes.distributed.replication_defaults import (
    DEFAULT_BUCKET_MB,
    DEFAULT_CHUNK_MB,
    DEFAULT_WINDOW,
    MAX_WINDOW,
    largest_collective_mb,
)
from hwtui.probes.framework import Facts, Rule
from hwtui.probes.inventory import devices_from_facts

MIB = 1 << 20
BUCKET_VARS = ("HWTUI_BUCKET_MB", "HOTWEIGHTS_BUCKET_MB")
# Leave half of the free memory to the model and the framework's own caches.
SAFE_FRACTION = 0.5


def _int_knob(env: Mapping[str, str], name: str, lo: int, hi: int) -> tuple[int | None, list[str]]:
    raw = env.get(name)
    if raw is None:
        return None, []
    iv = parse_int(raw, name, lo, hi)
    return (iv.value if iv.ok else None), list(iv.problems)


def knob_values(env: Mapping[str, str]) -> dict[str, Any]:
    """Effective knob values (defaults where unset or invalid) and the problems found."""
    problems: dict[str, list[str]] = {}
    window, p = _int_knob(env, "HOTWEIGHTS_IPC_INFLIGHT_BUCKETS", 1, MAX_WINDOW)
    problems["HOTWEIGHTS_IPC_INFLIGHT_BUCKETS"] = p
    bucket, bucket_var = None, None
    for name in BUCKET_VARS:
        if name in env:
            bucket, p = _int_knob(env, name, 1, 1 << 20)
            problems[name] = p
            bucket_var = name
            break
    chunk = None
    if "HOTWEIGHTS_BCAST_CHUNK_MB" in env:
        nv = parse_positive_number(env["HOTWEIGHTS_BCAST_CHUNK_MB"], "HOTWEIGHTS_BCAST_CHUNK_MB")
        chunk, problems["HOTWEIGHTS_BCAST_CHUNK_MB"] = nv.value, list(nv.problems)
    return {"window": window or DEFAULT_WINDOW, "bucket_mb": bucket or DEFAULT_BUCKET_MB, "chunk_mb": chunk,
            "bucket_var": bucket_var, "problems": {k: v for k, v in problems.items() if v}}


def _free_memory(facts: Facts, env: Mapping[str, str]) -> tuple[int | None, str]:
    """Smallest free memory among this node's accelerators, else host available memory."""
    free = []
    for dev in devices_from_facts(facts):
        if dev.usable and dev.vram_total:
            free.append((dev.vram_total - (dev.vram_used or 0), f"{dev.device} {dev.name}"))
    if free:
        amount, who = min(free)
        return amount, f"free memory on {who}"
    avail = (facts.get("host") or {}).get("mem_available")
    if avail:
        return int(avail), "available host memory (device memory not reported)"
    return None, ""


def knob_rules(facts: Facts) -> Iterator[Finding]:
    env = facts.host.env if facts.host else {}
    k = knob_values(env)
    for name, problems in k["problems"].items():
        yield fail(f"knobs.{name.lower()}", problems[0], "The engine refuses the value at start.",
                   f"export {name}=<positive {'number' if name.endswith('CHUNK_MB') else 'integer'}>")
    for name in ("HOTWEIGHTS_IPC_INFLIGHT_BUCKETS", "HOTWEIGHTS_BCAST_CHUNK_MB", *BUCKET_VARS):
        if name in env and name not in k["problems"]:
            yield passed(f"knobs.{name.lower()}", f"{name}={env[name].strip()}")
    reach = largest_collective_mb(k["chunk_mb"] or DEFAULT_CHUNK_MB, k["bucket_mb"], k["window"])
    if k["chunk_mb"] and k["chunk_mb"] > reach:
        yield warn("knobs.chunk", f"HOTWEIGHTS_BCAST_CHUNK_MB={k['chunk_mb']:g} is larger than any broadcast can be "
                   f"({reach:g} MB)", f"With {k['bucket_mb']:g} MB buckets and a window of {k['window']}, at most "
                   f"{reach:g} MB travel in one broadcast, so the extra size has no effect.",
                   f"export HOTWEIGHTS_BCAST_CHUNK_MB={reach:g}")
    window = k["window"] * k["bucket_mb"] * MIB
    desc = f"{k['window']} bucket(s) x {k['bucket_mb']:g} MB = {window / MIB:.0f} MB in flight"
    free, what = _free_memory(facts, env)
    if free is None:
        yield skip("knobs.window_memory", f"{desc}; free memory not known here")
        return
    fits = max(1, int(free * SAFE_FRACTION) // (k["bucket_mb"] * MIB))
    data = {"window_bytes": window, "free_bytes": free, "max_inflight": fits}
    if window > free:
        yield fail("knobs.window_memory", f"{desc}: more than the {free / MIB:.0f} MB {what}",
                   "The receivers run out of memory during replication.",
                   f"export HOTWEIGHTS_IPC_INFLIGHT_BUCKETS={fits} (or lower --bucket-mb)", **data)
    elif window > free * SAFE_FRACTION:
        yield warn("knobs.window_memory", f"{desc}: over half of the {free / MIB:.0f} MB {what}",
                   "Little headroom is left for the model and the allocator's cache.",
                   f"export HOTWEIGHTS_IPC_INFLIGHT_BUCKETS={fits}", **data)
    else:
        yield passed("knobs.window_memory", f"{desc} fits in the {free / MIB:.0f} MB {what}", **data)


def mirrored_ucx_devices(env: Mapping[str, str], ports: list[dict[str, Any]]) -> str | None:
    """HOTWEIGHTS_UCX_NET_DEVICES as mirrored from NCCL_IB_HCA: the active ports it selects."""
    raw = env.get("NCCL_IB_HCA")
    if raw is None:
        return None
    spec = parse_nccl_list(raw, "NCCL_IB_HCA")
    if spec.problems:
        return None
    chosen = active_ports(selected_ports(ports, spec))
    return ",".join(f"{p['hca']}:{p['port']}" for p in chosen) or None


# Said in every UCX finding: the seeds promised a "UCX fallback"; hwtui has none, and a finding
# that only validated the variable let users believe it had an effect.
NO_UCX_PATH = ("hwtui has no UCX path: replication and training move bytes over NCCL/RCCL, gloo or oneCCL, and "
               "nothing in hwtui reads HOTWEIGHTS_UCX_NET_DEVICES. For a program that does use UCX, NCCL_IB_HCA maps to "
               "UCX_NET_DEVICES as the ACTIVE ports it selects, written device:port (NCCL_IB_HCA=mlx5_0 -> "
               "UCX_NET_DEVICES=mlx5_0:1).")


def ucx_rules(facts: Facts) -> Iterator[Finding]:
    from hwtui.probes.distributed.nccl import effective_env

    env = effective_env(facts)
    ports = facts["infiniband"]["ports"]
    netifs = {i["name"] for i in facts["netif"]["interfaces"]}
    raw = env.get("HOTWEIGHTS_UCX_NET_DEVICES")
    mirrored = mirrored_ucx_devices(env, ports)
    fid = "knobs.ucx_net_devices"
    ucx_hint = f"for a UCX program: export UCX_NET_DEVICES={mirrored or 'all'}"
    if raw is None:
        if mirrored:
            yield passed(fid, f"no UCX path in hwtui; for UCX programs NCCL_IB_HCA maps to UCX_NET_DEVICES={mirrored}",
                         NO_UCX_PATH, ucx_net_devices=mirrored)
        return
    unused = f"unset HOTWEIGHTS_UCX_NET_DEVICES (hwtui never reads it); {ucx_hint}"
    parsed = parse_ucx_devices(raw)
    if parsed.problems:
        yield fail(fid, parsed.problems[0], "UCX would reject the list. " + NO_UCX_PATH, unused)
        return
    if parsed.all:
        yield warn(fid, "HOTWEIGHTS_UCX_NET_DEVICES=all is set, but hwtui has no UCX path: nothing reads it",
                   NO_UCX_PATH, unused)
        return
    by_name = {(p["hca"], p["port"]): p for p in ports}
    missing, down = [], []
    for e in parsed.entries:
        if e.port is not None and (e.name, e.port) in by_name:
            if by_name[(e.name, e.port)].get("state") != "ACTIVE":
                down.append(f"{e.name}:{e.port}")
        elif e.port is None and e.name in netifs:
            continue
        else:
            missing.append(f"{e.name}{':' + str(e.port) if e.port is not None else ''}")
    if missing or down:
        yield fail(fid, f"HOTWEIGHTS_UCX_NET_DEVICES names {'missing ' + ', '.join(missing) if missing else ''}"
                   f"{'; ' if missing and down else ''}{'inactive ' + ', '.join(down) if down else ''}",
                   "UCX devices are exact names with a port for RDMA devices (mlx5_0:1) or network interfaces (eth0). "
                   + NO_UCX_PATH, unused)
    elif mirrored and set(mirrored.split(",")) != {f"{e.name}:{e.port}" for e in parsed.entries if e.port is not None}:
        yield warn(fid, f"HOTWEIGHTS_UCX_NET_DEVICES={raw} differs from NCCL_IB_HCA's ports ({mirrored}), and hwtui "
                   "has no UCX path to use it", "A UCX program and NCCL would use different NICs. " + NO_UCX_PATH, unused)
    else:
        yield warn(fid, f"HOTWEIGHTS_UCX_NET_DEVICES={raw} is valid, but hwtui has no UCX path: nothing reads it",
                   NO_UCX_PATH, unused)


RULES = [
    Rule("knobs", knob_rules, "env", needs=("pci", "host")),
    Rule("knobs_ucx", ucx_rules, "env", needs=("infiniband", "netif")),
]
