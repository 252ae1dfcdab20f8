"""Can every rank open a TCP connection to every other rank? Asked before the process group forms.

gloo and NCCL connect the ranks to each other on ephemeral ports. A node whose firewall drops
incoming connections passes the roll call (it connects *out* to the store) and then makes the
process group hang until the timeout with an error that names nobody. Here each rank listens on
the address it reaches the master from, publishes it in the store, connects to every peer with a
short timeout and publishes what happened; rank 0 turns the matrix into findings that name the
node nobody could reach and how the attempts failed (no answer = dropped, refused = rejected).

The listeners never accept: the kernel completes the handshake into the backlog, which is all a
connect test needs, so no thread serves them.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from hwtui.core.finding import Finding, fail

POLL_S = 0.1
SILENT = "silent"  # the peer never published its address


def listen(address: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.listen(256)
    return sock


def attempt(address: str, port: int, timeout: float) -> str:
    """'ok', 'no answer' (dropped), 'refused' (rejected or nothing listening) or the error text."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return "ok"
    except TimeoutError:
        return "no answer"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return exc.strerror or str(exc)


def _wait_keys(store: Any, keys: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not store.check(keys):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def check_peers(store: Any, rank: int, world: int, address: str, nodes: Mapping[int, str], *, connect_timeout: float,
                timeout: float, last_said: Callable[[int], str | None]) -> dict[str, Any]:
    """Run the all-pairs connect test; every rank returns rank 0's verdict ({"ok", "findings"})."""
    with listen(address) as sock:
        port = sock.getsockname()[1]
        store.set(f"reach/addr/{rank}", json.dumps([address, port]))
        keys = [f"reach/addr/{r}" for r in range(world)]
        _wait_keys(store, keys, timeout)
        # A peer that never published its address is "silent", never silently left out: an empty
        # row would read as "reached everyone".
        outcomes: dict[str, str] = {str(r): SILENT for r in range(world)
                                    if r != rank and not store.check([f"reach/addr/{r}"])}
        peers = {r: json.loads(store.get(f"reach/addr/{r}")) for r in range(world)
                 if r != rank and str(r) not in outcomes}
        with ThreadPoolExecutor(max_workers=min(16, max(len(peers), 1))) as pool:
            futures = {r: pool.submit(attempt, a, p, connect_timeout) for r, (a, p) in peers.items()}
            outcomes.update({str(r): f.result() for r, f in futures.items()})
        store.set(f"reach/result/{rank}", json.dumps(outcomes))
        if rank == 0:
            results: dict[int, dict[str, str]] = {}
            _wait_keys(store, [f"reach/result/{r}" for r in range(world)], connect_timeout + timeout)
            for r in range(world):
                if store.check([f"reach/result/{r}"]):
                    results[r] = json.loads(store.get(f"reach/result/{r}"))
            findings = judge(results, world, nodes, last_said)
            verdict = {"ok": not findings, "findings": [f.to_dict() for f in findings]}
            store.set("reach/verdict", json.dumps(verdict))
        else:
            try:
                store.wait(["reach/verdict"], timedelta(seconds=2 * (connect_timeout + timeout) + 5))
            except Exception:  # noqa: BLE001 - DistStoreError: a timeout
                return {"ok": False, "findings": [], "error": "rank 0 did not publish the connection test's result"}
            verdict = json.loads(store.get("reach/verdict"))
        # Keep listening until rank 0 has judged, so a slow peer's connect still finds us.
        return verdict


def judge(results: Mapping[int, Mapping[str, str]], world: int, nodes: Mapping[int, str],
          last_said: Callable[[int], str | None]) -> list[Finding]:
    """Findings naming each node others could not reach (and each rank that never reported)."""
    def name(r: int) -> str:
        return nodes.get(r) or f"rank {r}"

    findings = []
    silent = {int(t) for row in results.values() for t, o in row.items() if o == SILENT}
    for r in range(world):
        if r not in results or r in silent:
            said = last_said(r)
            findings.append(fail(f"cluster.reach[rank {r}]", f"rank {r} ({name(r)}) did not answer the connection test",
                                 f"it last said: {said!r}" if said else "it said nothing after joining",
                                 f"look at the output of the launch command on {name(r)}", rank=r, node=nodes.get(r)))
    # Grouped by node: several ranks of one node share its firewall.
    by_node: dict[str, list[tuple[str, str]]] = {}
    for src, row in results.items():
        for target, outcome in row.items():
            if outcome not in ("ok", SILENT):
                by_node.setdefault(name(int(target)), []).append((name(src), outcome))
    for node, failed in sorted(by_node.items()):
        pairs = sorted(set(failed))
        how = ", ".join(f"{s} -> {node}: {o}" for s, o in pairs)
        dropped = all(o == "no answer" for _, o in pairs)
        findings.append(fail(
            f"cluster.reach[{node}]",
            f"node {node} accepts no connections from {', '.join(sorted({s for s, _ in pairs}))}"
            + (" (dropped: a firewall?)" if dropped else ""),
            f"{how}. The store works, but gloo/NCCL connect the ranks to each other on ephemeral ports; "
            "the process group would hang here until the timeout.",
            f"on {node}: allow incoming TCP from the other nodes on the cluster interface, e.g. "
            "`nft add rule inet filter input ip saddr <cluster subnet> accept` or "
            "`firewall-cmd --zone=trusted --add-source=<cluster subnet>`",
            node=node, attempts=[{"from": s, "outcome": o} for s, o in pairs]))
    return findings
