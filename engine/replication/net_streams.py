"""How many TCP streams carry the network group's buckets (gloo), and the interface list that gives them.

A host leader receives every bucket over one gloo connection to the source: one TCP stream, one
kernel receive path, one core's worth of the network's copies. Gloo opens one connection per
*device* of a process group, and torch's ProcessGroupGloo makes one device per entry of
``GLOO_SOCKET_IFNAME`` (a comma-separated list; the same interface twice gives two devices, each
with its own I/O thread), gives the group two worker threads per device, and runs collective
number ``tag`` on device ``tag % devices`` (``ProcessGroupGloo::getContext(nextTag())``). So with N
devices, N buckets in flight travel on N connections at once: the window keeps two or more groups
of buckets posted (transfer.py), which is what lets two streams overlap. On the 2 x 2 namespace
bench (docs/replication.md) two streams took the leader's receive from 1.8 to ~2.2 GB/s.

Only the network group gets them (created with the list in the environment for the duration of
``new_group``, then the variable is put back): the world and the host groups keep one device.
``HWTUI_NET_STREAMS`` (1 to 8, default 2) sets N; it applies where ``GLOO_SOCKET_IFNAME`` names exactly
one interface (a list the user wrote is used as written; with the variable unset gloo binds to what
the host name resolves to, which cannot be named twice: one stream). Every rank reports the
device count it will use and the agreement refuses a difference (the group's connections would
never pair up). A list with an empty entry or an interface this host lacks is refused in one
line before the world forms, instead of a gloo error after the rendezvous.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping

from hwtui.core.errors import HwtuiError

STREAMS_ENV = "HWTUI_NET_STREAMS"
IFNAME_ENV = "GLOO_SOCKET_IFNAME"
DEFAULT_STREAMS = 2
MAX_STREAMS = 8


def check_streams(raw: str, said: str) -> int:
    """A stream count, 1 to 8, from the environment or ``--net-streams``; ``said`` names where it came from."""
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_STREAMS:
        raise HwtuiError(f"{said}: the network streams must be a whole number 1 to {MAX_STREAMS}")
    return int(raw)


def requested_streams(env: Mapping[str, str]) -> int:
    """``HWTUI_NET_STREAMS``: a whole number 1 to 8, or the default when unset or empty."""
    raw = env.get(STREAMS_ENV, "").strip()
    return check_streams(raw, f"{STREAMS_ENV}={raw!r}") if raw else DEFAULT_STREAMS


def interfaces(env: Mapping[str, str], present: set[str] | None = None) -> list[str]:
    """The interfaces ``GLOO_SOCKET_IFNAME`` names ([] when unset), each checked to exist on this host."""
    raw = env.get(IFNAME_ENV, "")
    # torch ignores a value of one character or less (ProcessGroupGloo's options): so do we.
    if len(raw) <= 1:
        return []
    names = raw.split(",")
    if any(not n.strip() or n != n.strip() for n in names):
        raise HwtuiError(f"{IFNAME_ENV}={raw!r}: an empty or padded interface name in the list; "
                         "write interface names separated by single commas")
    have = present if present is not None else {name for _, name in socket.if_nameindex()}
    missing = [n for n in names if n not in have]
    if missing:
        raise HwtuiError(f"{IFNAME_ENV}={raw!r}: this host has no interface {missing[0]!r} "
                         f"(it has {', '.join(sorted(have)) or 'none'})")
    return names


def network_ifnames(env: Mapping[str, str], gloo: bool, present: set[str] | None = None) -> list[str] | None:
    """The ``GLOO_SOCKET_IFNAME`` list the network group is made with, or None: as the world is.

    N copies of the one interface named; None for another backend, for one stream, with the
    variable unset (the default device), or for a list the user already wrote.
    """
    names = interfaces(env, present)
    n = requested_streams(env)
    if not gloo or n == 1 or len(names) != 1:
        return None
    return names * n


def device_count(env: Mapping[str, str], gloo: bool, present: set[str] | None = None) -> int:
    """How many gloo devices (TCP connections per peer) the network group will have: what ranks agree on."""
    if not gloo:
        return 1
    listed = network_ifnames(env, gloo, present)
    return len(listed) if listed is not None else max(1, len(interfaces(env, present)))


@contextlib.contextmanager
def gloo_interfaces(names: list[str] | None) -> Iterator[None]:
    """``GLOO_SOCKET_IFNAME`` set to ``names`` while a process group is made, then put back as it was.

    torch reads the variable when it constructs a gloo group (not later), and glibc never frees an
    environment string it handed out, so the gloo threads already running are unaffected.
    """
    if names is None:
        yield
        return
    before = os.environ.get(IFNAME_ENV)
    os.environ[IFNAME_ENV] = ",".join(names)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(IFNAME_ENV, None)
        else:
            os.environ[IFNAME_ENV] = before
