"""Network interfaces from /sys/class/net, plus their addresses (a live fact: sysfs has none).

Shared by the NCCL socket checks, the rendezvous route check and the exports.
"""

from __future__ import annotations

from typing import Any

from hwtui.probes.framework import Collector
from hwtui.probes.host import FactUnavailable, Host

NET_ROOT = "/sys/class/net"
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
ARPHRD = {1: "ether", 32: "infiniband", 772: "loopback", 65534: "none", 776: "sit", 768: "ipip", 778: "gre"}
# Interfaces a multi-node job must not bootstrap over: loopback and container/VM bridges whose
# addresses exist only on this host.
VIRTUAL_PREFIXES = ("lo", "docker", "veth", "virbr", "br-", "cni", "podman", "flannel", "cali", "tun", "tap")


def _live_if_addrs() -> dict[str, list[str]]:
    import socket

    import psutil

    out: dict[str, list[str]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        ips = [a.address.split("%", 1)[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
        out[name] = ips
    return out


def _hex(text: str | None) -> int | None:
    try:
        return int((text or "").strip(), 16)
    except ValueError:
        return None


def collect_interfaces(host: Host) -> dict[str, Any]:
    interfaces = []
    for name in host.listdir(NET_ROOT):
        base = f"{NET_ROOT}/{name}"
        if not host.is_dir(base):
            continue  # bonding_masters and other plain files
        operstate = (host.read_text(f"{base}/operstate") or "").strip() or None
        flags = _hex(host.read_text(f"{base}/flags"))
        arptype = host.read_int(f"{base}/type")
        admin_up = bool(flags & IFF_UP) if flags is not None else operstate == "up"
        interfaces.append({
            "name": name,
            "operstate": operstate,
            "flags": flags,
            "type": ARPHRD.get(arptype or -1, str(arptype) if arptype is not None else None),
            "address": (host.read_text(f"{base}/address") or "").strip() or None,
            # "unknown" is what loopback and many virtual devices report while working.
            "up": admin_up and operstate in ("up", "unknown", None),
            "loopback": name == "lo" or arptype == 772 or bool(flags and flags & IFF_LOOPBACK),
            "virtual": name.startswith(VIRTUAL_PREFIXES),
        })
    try:
        addresses = host.fact("dist.if_addrs", _live_if_addrs)
    except FactUnavailable:
        addresses = None
    return {"interfaces": interfaces, "addresses": addresses}


COLLECTORS = [Collector("netif", collect_interfaces, "env", timeout=5.0)]
