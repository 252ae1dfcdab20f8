"""In-process agents for tests: a real AgentServer on a loopback port with canned sources."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, TypeVar

from hwtui.app.node_api.server import AgentServer, Limits, serve_in_thread
from hwtui.engine.resident.state import NodeState

TOKEN = "t0k3n-for-tests"


def canned_samples(i: int) -> Callable[[], list[dict[str, Any]]]:
    def sample() -> list[dict[str, Any]]:
        return [{"device": "cuda:0", "name": f"GPU{i}", "mem_used": (i + 1) << 30, "mem_total": 80 << 30,
                 "util": 10.0 * i, "temp_c": 40.0 + i, "power_w": 100.0 + i, "power_limit_w": 700.0},
                {"device": "cpu", "name": "CPU", "mem_used": 1, "mem_total": 2, "util": 1.0, "temp_c": None,
                 "power_w": None, "power_limit_w": None}]

    return sample


def start_agent(node: str, i: int = 0, *, facts: Callable[[], dict[str, Any]] | None = None,
                replication: Callable[[], dict[str, Any]] | None = None, period: float = 0.2,
                post_routes: dict[str, Any] | None = None, limits: Limits | None = None,
                processes: Callable[[], list[dict[str, Any]]] | None = None) -> AgentServer:
    state = NodeState(node=node, sample=canned_samples(i),
                      check=lambda: {"worst": "pass", "findings": [], "summary": {"pass": 1}, "drivers": {"nvidia": "550.1"},
                                     "os": "Linux", "kernel": "6.8"},
                      facts=facts or (lambda: {}), processes=processes or list, replication=replication,
                      sample_period=period, check_period=60, facts_period=60, process_period=period if processes else 60)
    server = AgentServer(("127.0.0.1", 0), state, TOKEN, post_routes=post_routes, limits=limits)
    state.start()
    serve_in_thread(server)
    return server


def stop_agent(server: AgentServer) -> None:
    server.shutdown()
    server.server_close()
    server.state.stop()
    # Joined, not left to finish on their own: a test process must be single-threaded again when
    # the next test launches ranks in-process (hwtui forks only a single-threaded launcher).
    server.state.join(timeout=30)


class Silent:
    """A port that accepts connections and never answers: the slowest node there is."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


T = TypeVar("T")


def answered(ask: Callable[[], T], tries: int = 5) -> T:
    """``ask()`` again (at most ``tries`` times in all) while the agent closes its connection
    unanswered (httpx's RemoteProtocolError or ReadError, or b"" from a raw exchange).

    Why: a test agent whose head deadline is cut to 0.5 s closes a connection whose head has not
    begun by then, as it must, and on a loaded box a client can stall that long between its connect
    and its send. The property such a test checks is that the agent goes on serving; an agent that
    stopped fails every try."""
    import httpx

    for left in range(tries - 1, -1, -1):
        try:
            got = ask()
        except (httpx.RemoteProtocolError, httpx.ReadError):
            if not left:
                raise
            continue
        if got != b"" or not left:
            return got
    raise AssertionError("unreachable")


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ipc_memfds(pid: int | str = "self") -> int:
    """The host stand-in memfds (``/memfd:hwtui-ipc-*``) process ``pid`` holds, counted by file:
    Python's mmap keeps a duplicate descriptor of each, so descriptors would count some twice."""
    import os

    files = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:hwtui-ipc-"):
                files.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            pass
    return len(files)
