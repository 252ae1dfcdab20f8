"""Rendezvous reachability: MASTER_ADDR resolves, routes, and MASTER_PORT can be bound or reached.

A bad rendezvous is the classic silent hang: init_process_group waits out its timeout (30 min on
gloo by default) before saying anything. Here every step has a deadline of a few seconds:

1. resolve MASTER_ADDR (getaddrinfo in a daemon thread, abandoned at the deadline);
2. find the local interface that routes to it (a UDP ``connect`` only consults the routing table,
   it sends nothing);
3. on the master (rank 0, address local) bind the port as TCPStore will; anywhere else open a TCP
   connection with a short timeout and close it at once. No payload is ever sent.

Everything live is one ``host.fact`` so ``hwtui snapshot`` records it and ``--replay`` reproduces it.
"""

from __future__ import annotations

import errno as errno_mod
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from hwtui.core.finding import Finding, fail, passed, skip, warn
from hwtui.probes.distributed.launcher import JobShape, job_shape
from hwtui.probes.distributed.parsers import parse_host, parse_port
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import FactUnavailable, Host

FACT_KEY = "dist.rendezvous"
RESOLVE_TIMEOUT_S = 3.0
CONNECT_TIMEOUT_S = 3.0
SLOW_RESOLVE_S = 1.0


# -- live probes (run only on a live host, through host.fact) ---------------------------------------

def resolve(name: str, port: int | None, timeout: float = RESOLVE_TIMEOUT_S) -> dict[str, Any]:
    """getaddrinfo with a deadline. The lookup thread cannot be cancelled; it is a daemon and abandoned."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
            box["addresses"] = list(dict.fromkeys(info[4][0] for info in infos))
        except socket.gaierror as exc:
            box["error"] = exc.strerror or str(exc)
            box["gai_errno"] = exc.errno
        except (OSError, UnicodeError, ValueError) as exc:
            box["error"] = str(exc)
        finally:
            done.set()

    started = time.monotonic()
    threading.Thread(target=lookup, name="hwtui-resolve", daemon=True).start()
    finished = done.wait(timeout)
    elapsed = round(time.monotonic() - started, 3)
    if not finished:
        return {"ok": False, "timed_out": True, "elapsed_s": elapsed, "error": f"no answer within {timeout:g} s"}
    return {"ok": "addresses" in box, "timed_out": False, "elapsed_s": elapsed, **box}


def local_addresses() -> dict[str, list[str]]:
    from hwtui.probes.distributed.netif import _live_if_addrs

    try:
        return _live_if_addrs()
    except Exception:  # noqa: BLE001 - psutil missing or failing must not end the probe
        return {}


def route_to(ip: str, port: int | None, addrs: Mapping[str, list[str]]) -> dict[str, Any]:
    """The source address and interface the kernel would use for ``ip`` (a UDP connect sends nothing)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((ip, port or 9))
            source = s.getsockname()[0]
    except OSError as exc:
        return {"error": exc.strerror or str(exc), "errno": exc.errno}
    source = source.split("%", 1)[0]
    iface = next((name for name, ips in addrs.items() if source in ips), None)
    return {"source": source, "interface": iface}


def classify_errno(code: int | None) -> str:
    if code == errno_mod.ECONNREFUSED:
        return "refused"
    if code in (errno_mod.ETIMEDOUT, errno_mod.EAGAIN, errno_mod.EINPROGRESS):
        return "timeout"
    if code in (errno_mod.EHOSTUNREACH, errno_mod.ENETUNREACH, errno_mod.EHOSTDOWN, errno_mod.ENETDOWN):
        return "unreachable"
    return "error"


def connect_test(ip: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """Open a TCP connection and close it without sending a byte."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    started = time.monotonic()
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((ip, port))
        outcome: dict[str, Any] = {"outcome": "connected"}
    except TimeoutError:
        outcome = {"outcome": "timeout", "error": f"no answer within {timeout:g} s"}
    except OSError as exc:
        outcome = {"outcome": classify_errno(exc.errno), "errno": exc.errno, "error": exc.strerror or str(exc)}
    finally:
        s.close()
    outcome["elapsed_s"] = round(time.monotonic() - started, 3)
    return {"action": "connect", **outcome}


def bind_test(ip: str, port: int) -> dict[str, Any]:
    """Bind the port on every interface as c10d's TCPStore does (SO_REUSEADDR, wildcard address)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"  # noqa: S104 - exactly what TCPStore binds
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((wildcard, port))
        result: dict[str, Any] = {"action": "bind", "ok": True}
    except OSError as exc:
        result = {"action": "bind", "ok": False, "errno": exc.errno, "error": exc.strerror or str(exc)}
    finally:
        s.close()
    if result.get("errno") == errno_mod.EADDRINUSE:
        result["listener"] = connect_test(ip, port, 1.0)["outcome"] == "connected"
    return result


def probe(name: str, port: int | None, *, master_here: bool, resolve_timeout: float | None = None,
          connect_timeout: float | None = None) -> dict[str, Any]:
    """Everything live about the rendezvous, as one JSON-able record."""
    resolve_timeout = RESOLVE_TIMEOUT_S if resolve_timeout is None else resolve_timeout
    connect_timeout = CONNECT_TIMEOUT_S if connect_timeout is None else connect_timeout
    out: dict[str, Any] = {"target": {"host": name, "port": port, "master_here": master_here}}
    res = resolve(name, port, resolve_timeout)
    out["resolve"] = res
    if not res.get("ok"):
        return out
    addrs = res["addresses"]
    ip = next((a for a in addrs if ":" not in a), addrs[0])  # TCPStore tries IPv4 first in practice
    out["ip"] = ip
    mine = local_addresses()
    out["route"] = route_to(ip, port, mine)
    is_local = ipaddress.ip_address(ip).is_loopback or any(ip in ips for ips in mine.values())
    out["local"] = is_local
    if port is None:
        return out
    if is_local and master_here:
        out["port_test"] = bind_test(ip, port)
    else:
        out["port_test"] = connect_test(ip, port, connect_timeout)
    return out


# -- collection ------------------------------------------------------------------------------------

def _master_here(env: Mapping[str, str], shape: JobShape) -> bool:
    """Whether this process (or node, before launch) hosts the TCPStore. torchrun's agent hosts it
    for its workers (TORCHELASTIC_USE_AGENT_STORE=True), so a worker only connects."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return False
    return shape.is_rank0


def collect_rendezvous(host: Host) -> dict[str, Any]:
    env = host.env
    raw_addr, raw_port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    out: dict[str, Any] = {"addr": raw_addr, "port": raw_port}
    addr = parse_host(raw_addr) if raw_addr is not None else None
    port = parse_port(raw_port) if raw_port is not None else None
    if addr is None or addr.host is None:
        return out
    port_value = port.value if port is not None and port.ok else None
    master_here = _master_here(env, job_shape(env))
    target = {"host": addr.host, "port": port_value, "master_here": master_here}
    name = addr.host
    try:
        record = host.fact(FACT_KEY, lambda: probe(name, port_value, master_here=master_here))
    except FactUnavailable as exc:
        out["unavailable"] = str(exc)
        return out
    if record.get("target") != target:
        out["unavailable"] = f"the recorded probe was for {record.get('target')}, not {target}"
        return out
    out.update(record)
    return out


# -- rules -----------------------------------------------------------------------------------------

def _addr_findings(env: Mapping[str, str], rdv: Mapping[str, Any], shape: JobShape) -> Iterator[Finding]:
    raw = env.get("MASTER_ADDR")
    fid = "rendezvous.master_addr"
    if raw is None:
        if shape.multi_process:
            yield fail(fid, f"MASTER_ADDR is unset in a job of {shape.world_size} processes",
                       "env:// rendezvous needs the address of rank 0's node.",
                       "export MASTER_ADDR=<rank 0's host name or IP> (torchrun --master-addr sets it)")
        else:
            yield skip(fid, "MASTER_ADDR unset: single-process run")
        return
    parsed = parse_host(raw)
    if parsed.host is None:
        fix = f"export MASTER_ADDR={parsed.suggestion}" if parsed.suggestion else "export MASTER_ADDR=<host name or IP>"
        yield fail(fid, parsed.problems[0], "torch builds tcp://MASTER_ADDR:MASTER_PORT from the bare values.", fix)
        return
    if parsed.is_loopback and shape.multi_node:
        yield fail(fid, f"MASTER_ADDR={raw} is loopback in a multi-node job",
                   "Each node would look for the master on itself.", "export MASTER_ADDR=<rank 0's routable IP>")
        return
    if "unavailable" in rdv:
        yield skip(fid, f"MASTER_ADDR={raw}: reachability not probed here", rdv["unavailable"])
        return
    res = rdv.get("resolve") or {}
    if res.get("timed_out"):
        yield fail(fid, f"MASTER_ADDR={raw} did not resolve within {RESOLVE_TIMEOUT_S:g} s",
                   "The DNS server does not answer; every rank would stall here at init.",
                   f"Use the IP address (export MASTER_ADDR=<ip>) or add '<ip> {raw}' to /etc/hosts on every node")
        return
    if not res.get("ok"):
        yield fail(fid, f"MASTER_ADDR={raw} does not resolve: {res.get('error', 'unknown error')}", "",
                   f"Use the IP address (export MASTER_ADDR=<ip>) or add '<ip> {raw}' to /etc/hosts on every node")
        return
    addrs = res.get("addresses", [])
    loop = [a for a in addrs if ipaddress.ip_address(a.split("%")[0]).is_loopback]
    if loop and not parsed.is_loopback and shape.multi_node:
        yield warn(fid, f"MASTER_ADDR={raw} resolves to loopback {loop[0]} on this node",
                   "Distributions map the host's own name to 127.0.1.1 in /etc/hosts; other nodes resolve it "
                   "differently, and the master may advertise an address nobody else can reach.",
                   "export MASTER_ADDR=<routable IP of rank 0>")
    elif res.get("elapsed_s", 0) > SLOW_RESOLVE_S:
        yield warn(fid, f"MASTER_ADDR={raw} took {res['elapsed_s']:.1f} s to resolve", "Every rank pays this at init.",
                   f"Add '<ip> {raw}' to /etc/hosts, or export MASTER_ADDR=<ip>")
    else:
        yield passed(fid, f"MASTER_ADDR={raw} resolves to {', '.join(addrs[:3])}",
                     f"in {res.get('elapsed_s', 0) * 1000:.0f} ms", addresses=addrs)
    route = rdv.get("route") or {}
    if route.get("error"):
        yield fail("rendezvous.route", f"no route to {rdv.get('ip')}: {route['error']}",
                   "The kernel has no route to the master's network from this node.",
                   f"ip route get {rdv.get('ip')}  (add a route or fix the interface's address)")
    elif route:
        via = route.get("interface") or "an unknown interface"
        yield passed("rendezvous.route", f"{rdv.get('ip')} is reached via {via} (source {route.get('source')})",
                     interface=route.get("interface"))


def _port_findings(env: Mapping[str, str], rdv: Mapping[str, Any], shape: JobShape) -> Iterator[Finding]:
    raw = env.get("MASTER_PORT")
    if raw is None:
        if shape.multi_process:
            yield fail("rendezvous.port", "MASTER_PORT is unset", "env:// rendezvous needs a TCP port on rank 0's node.",
                       "export MASTER_PORT=29500")
        return
    port = parse_port(raw)
    if not port.ok:
        yield fail("rendezvous.port", "; ".join(port.problems), "", "export MASTER_PORT=29500")
        return
    value = port.value
    assert value is not None  # port.ok means a value
    test = rdv.get("port_test")
    if not test:
        if value < 1024 and shape.is_rank0:
            yield warn("rendezvous.port", f"MASTER_PORT={value} is privileged", "Only root may bind ports below 1024.",
                       "export MASTER_PORT=29500")
        elif "unavailable" not in rdv and rdv.get("resolve", {}).get("ok"):
            yield passed("rendezvous.port", f"MASTER_PORT={value}")
        return
    addr = f"{rdv.get('ip')}:{value}"
    if test["action"] == "bind":
        if test.get("ok"):
            yield passed("rendezvous.port", f"MASTER_PORT={value} is free on this node (the master)",
                         "Bound and released at once, as TCPStore will bind it.")
        elif test.get("errno") == errno_mod.EADDRINUSE:
            who = "a process is listening on it" if test.get("listener") else "it is held by another socket"
            yield fail("rendezvous.port", f"MASTER_PORT={value} is already in use on the master: {who}",
                       "A stale job or another service owns the port; TCPStore fails with 'address already in use'.",
                       f"ss -ltnp 'sport = :{value}'  (stop it), or export MASTER_PORT=<another free port>")
        elif test.get("errno") == errno_mod.EACCES:
            yield fail("rendezvous.port", f"MASTER_PORT={value} needs root to bind", "", "export MASTER_PORT=29500")
        else:
            yield fail("rendezvous.port", f"cannot bind MASTER_PORT={value}: {test.get('error')}", "",
                       "export MASTER_PORT=29500")
        return
    yield passed("rendezvous.port", f"MASTER_PORT={value}")
    outcome = test.get("outcome")
    if outcome == "connected":
        yield passed("rendezvous.reachable", f"{addr} accepts TCP connections",
                     f"connected in {test.get('elapsed_s', 0) * 1000:.0f} ms and closed without sending data")
    elif outcome == "refused":
        yield warn("rendezvous.reachable", f"{addr} refused the connection: nothing listens there yet",
                   "Normal when rank 0 has not started yet (ranks retry until the timeout). If rank 0 is running, "
                   "it listens on another port or address, or a firewall rejects the connection.",
                   f"start rank 0 first; on the master: ss -ltn 'sport = :{value}'")
    elif outcome == "timeout":
        yield fail("rendezvous.reachable", f"{addr} did not answer within {CONNECT_TIMEOUT_S:g} s",
                   "Packets are dropped on the way: a firewall (DROP rule, cloud security group) or an address on a "
                   "network this node cannot reach. init_process_group would hang until its timeout.",
                   f"on the master: sudo iptables -I INPUT -p tcp --dport {value} -j ACCEPT (or open TCP {value} in "
                   "the security group)")
    elif outcome == "unreachable":
        yield fail("rendezvous.reachable", f"{addr} is unreachable: {test.get('error')}",
                   "The kernel or a router reports no path to the master (ICMP host/network unreachable).",
                   f"ip route get {rdv.get('ip')}; check the master is up and on a network this node reaches")
    else:
        yield fail("rendezvous.reachable", f"connecting to {addr} failed: {test.get('error')}", "",
                   f"ip route get {rdv.get('ip')}")


def rendezvous_rules(facts: Facts) -> Iterator[Finding]:
    env = facts.host.env if facts.host else {}
    rdv = facts["rendezvous"]
    shape = job_shape(env)
    yield from _addr_findings(env, rdv, shape)
    yield from _port_findings(env, rdv, shape)
    if shape.rank == 0 and rdv.get("local") is False and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        yield warn("rendezvous.master_here", "RANK=0 runs here but MASTER_ADDR is not an address of this node",
                   "Rank 0 hosts the store on its own node; the others connect to MASTER_ADDR and find nobody "
                   "(fine only behind NAT or a Kubernetes service).", "export MASTER_ADDR=<this node's IP>")


COLLECTORS = [Collector("rendezvous", collect_rendezvous, "env", timeout=RESOLVE_TIMEOUT_S + CONNECT_TIMEOUT_S + 4.0)]
RULES = [Rule("rendezvous", rendezvous_rules, "env", needs=("rendezvous",))]
