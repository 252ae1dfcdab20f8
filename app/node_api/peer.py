"""Who is asking, for the one request that hands out device memory: the served slot's export.

The token says a client may talk to the agent; an IPC handle is more than that: whoever opens it
reads (and could write) the served weights in place. So the export is answered only over loopback,
and only to a process of the agent's own user or of a member of its ``--serve-group`` (the users
who may read the served files, docs/agent.md). A loopback TCP peer's user is the owner of the
client's socket: the kernel's socket table (``/proc/net/tcp``, ``tcp6``) lists it with its uid,
keyed by the connection's two addresses. A peer that cannot be found there is refused.
"""

from __future__ import annotations

import grp
import ipaddress
import os
import pwd
from typing import Any

MAX_TABLE_LINES = 1_000_000  # a node with a million sockets is answered "unknown", never scanned forever


def _forms(host: str, port: int) -> list[tuple[str, str]]:
    """(the /proc/net file, the ``ADDR:PORT`` form the kernel prints) for each table the client's
    socket may be listed in: an IPv4-mapped address (a dual-stack listener) is an IPv4 client's
    socket in ``tcp``, or an IPv6 socket's in ``tcp6``."""
    ip = ipaddress.ip_address(host.split("%")[0])
    out = []
    v4 = ip if isinstance(ip, ipaddress.IPv4Address) else ip.ipv4_mapped
    if v4 is not None:
        out.append(("tcp", f"{int.from_bytes(v4.packed, 'little'):08X}:{port:04X}"))
    if isinstance(ip, ipaddress.IPv6Address):
        packed = ip.packed  # the kernel prints four 32-bit words, each in host (little-endian) order
        words = "".join(f"{int.from_bytes(packed[i:i + 4], 'little'):08X}" for i in range(0, 16, 4))
        out.append(("tcp6", f"{words}:{port:04X}"))
    return out


def peer_uid(peer: tuple[Any, ...], local: tuple[Any, ...], proc_net: str = "/proc/net") -> int | None:
    """The uid owning the client socket of the connection ``peer`` -> ``local``, or None."""
    try:
        clients, servers = _forms(str(peer[0]), int(peer[1])), dict(_forms(str(local[0]), int(local[1])))
    except (ValueError, IndexError, TypeError):
        return None
    for table, want_local in clients:
        want_remote = servers.get(table)
        if want_remote is None:
            continue
        uid = _lookup(f"{proc_net}/{table}", want_local, want_remote)
        if uid is not None:
            return uid
    return None


def _lookup(path: str, want_local: str, want_remote: str) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            next(fh, None)  # the column titles
            for n, line in enumerate(fh):
                if n >= MAX_TABLE_LINES:
                    return None
                cols = line.split()
                if len(cols) > 7 and cols[1] == want_local and cols[2] == want_remote:
                    return int(cols[7])
    except (OSError, ValueError):
        return None
    return None


def may_consume(uid: int, agent_uid: int, serve_gid: int | None) -> bool:
    """The agent's own user, or a member of its --serve-group (primary or supplementary)."""
    if uid == agent_uid:
        return True
    if serve_gid is None:
        return False
    try:
        user = pwd.getpwuid(uid)
        group = grp.getgrgid(serve_gid)
    except KeyError:
        return False
    return user.pw_gid == serve_gid or user.pw_name in group.gr_mem


def export_refusal(peer: tuple[Any, ...], local: tuple[Any, ...], serve_gid: int | None,
                   proc_net: str = "/proc/net") -> str | None:
    """Why this connection may not have the export, or None when it may."""
    from hwtui.app.node_api.server import is_loopback

    if not is_loopback(str(peer[0])):
        return "the served slot is exported only to a process on this node (over loopback)"
    uid = peer_uid(peer, local, proc_net)
    if uid is None:
        return "the asking process's user could not be found"
    if not may_consume(uid, os.geteuid(), serve_gid):
        return (f"uid {uid} is neither the agent's user nor a member of its --serve-group"
                if serve_gid is not None else f"uid {uid} is not the agent's user (start it with --serve-group to share)")
    return None
