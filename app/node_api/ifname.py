"""Which interface the agent's resident ranks bind gloo (and NCCL) to.

Without ``GLOO_SOCKET_IFNAME`` gloo binds to whatever the host name resolves to: on most machines
127.0.0.1 or a management address, so a push from another host fails deep inside gloo with a
truncated "connectFullMesh ... Connection refused". The agent already knows the address the other
nodes reach it at (``--advertise``, else the ``--listen`` host): the interface holding that address
is the one to use. When no such address is known (a wildcard listen) or it is not on this host,
the agent refuses to start with the fix rather than fail at the first push.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, MutableMapping
from typing import Any

VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class IfnameError(ValueError):
    """No interface can be derived; the message is one line naming the fix."""


def _addresses_of(host: str) -> list[str]:
    """The IP addresses ``host`` stands for (a literal is itself; a name is resolved once)."""
    host = host.strip("[]")
    try:
        return [str(ipaddress.ip_address(host.split("%")[0]))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise IfnameError(f"--advertise {host!r} does not resolve ({exc}): pass this node's IP address on the "
                          "cluster network") from None
    return list(dict.fromkeys(str(ipaddress.ip_address(str(i[4][0]).split("%")[0])) for i in infos))


def interface_holding(host: str, interfaces: Mapping[str, Mapping[str, Any]]) -> str:
    """The interface whose addresses include ``host``'s; IfnameError naming the fix otherwise."""
    wanted = _addresses_of(host)
    if any(ipaddress.ip_address(a).is_unspecified for a in wanted):
        raise IfnameError(f"--listen {host} serves every interface, so the agent cannot tell which one the other nodes "
                          "reach its resident ranks on: pass --advertise ADDR (this node's address on the cluster "
                          "network), or set GLOO_SOCKET_IFNAME=<interface> in its environment")
    for name, info in interfaces.items():
        have = set()
        for a in info.get("addresses") or []:
            try:
                have.add(str(ipaddress.ip_address(str(a).split("%")[0])))
            except ValueError:
                continue
        if have & set(wanted):
            return name
    listing = "; ".join(f"{n} {', '.join(i.get('addresses') or []) or '-'}" for n, i in interfaces.items())
    raise IfnameError(f"--advertise {host} is not an address of this node (it has: {listing}): pass one of them as "
                      "--advertise, or set GLOO_SOCKET_IFNAME=<interface> in the agent's environment")


def derive(host: str, env: MutableMapping[str, str], interfaces: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME in ``env`` to the interface holding ``host``.

    A value the operator set is kept (it is a decision, e.g. a list for NCCL); returns the derived
    interface, or None when both were already set."""
    if all(env.get(v) for v in VARS):
        return None
    if env.get("GLOO_SOCKET_IFNAME") and not env.get("NCCL_SOCKET_IFNAME"):
        # Gloo's choice made by hand: NCCL follows it rather than a guess.
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"]
        return env["GLOO_SOCKET_IFNAME"]
    iface = interface_holding(host, interfaces)
    for var in VARS:
        if not env.get(var):
            env[var] = iface
    return iface
