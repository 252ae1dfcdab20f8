"""A hostile "agent" for tests: a tiny HTTP server on loopback that answers every GET with chosen
bytes, at once or drip-fed (one byte per ``drip_s``, which keeps every per-read timeout happy while
the whole answer takes minutes). It speaks just enough HTTP/1.1 for httpx; nothing here trusts or
validates anything, on purpose.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from typing import Any


def answer(body: bytes, *, status: str = "200 OK", content_length: int | None = None,
           content_type: str = "application/json") -> bytes:
    """A whole HTTP response with ``body``; ``content_length`` may lie (-1: no such header, the body
    ends when the connection closes)."""
    length = len(body) if content_length is None else content_length
    sized = "" if length < 0 else f"Content-Length: {length}\r\n"
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{sized}Connection: close\r\n\r\n".encode()
    return head + body


def summary_bytes(node: Any = "bad", devices: Any = None, replication: Any = None, **extra: Any) -> bytes:
    """A /v1/summary document (as an agent would send it) with chosen, possibly invalid, fields.
    ``json.dumps`` writes NaN and Infinity as the bare literals Python's json (and a hostile agent) send."""
    doc = {"schema": "hwtui.agent/1", "node": node, "devices": devices if devices is not None else [],
           "devices_age_s": 0.1, "worst": "pass", "replication": replication or {"serving": None, "in_flight": None},
           **extra}
    return json.dumps(doc).encode()


class HostileAgent:
    """Answers every request with ``respond(path) -> bytes`` (a whole response), or drip-feeds it.

    ``drip_s``: seconds between two bytes (0: all at once); ``drip_from``: bytes sent at once before
    the drip starts (0 drips the status line and headers too). ``close()`` stops every drip at once."""

    def __init__(self, respond: Callable[[str], bytes] | bytes, *, drip_s: float = 0.0, drip_from: int = 0):
        self.respond = respond if callable(respond) else (lambda _path, b=respond: b)
        self.drip_s, self.drip_from = drip_s, drip_from
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        self._closed = threading.Event()
        self._conns: list[tuple[socket.socket, threading.Thread]] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._one, args=(conn,), daemon=True)
            self._conns.append((conn, t))
            t.start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            head = b""
            try:
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                path = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else "/"
                self.requests += 1
                data = self.respond(path)
                if not self.drip_s:
                    conn.sendall(data)
                    return
                conn.sendall(data[: self.drip_from])
                for i in range(self.drip_from, len(data)):
                    # The drip stops when the test closes the agent (bounded) or the client hangs up.
                    if self._closed.wait(self.drip_s):
                        return
                    conn.sendall(data[i:i + 1])
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        # close() alone does not wake a thread blocked in accept(); shutdown() does (EINVAL). The
        # thread is joined so that no test leaves it behind: the test process must stay
        # single-threaded for the in-process launchers that fork their ranks (tests/shards.py).
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(timeout=10)
        # Each connection's thread too: one blocked in recv (a client that sent nothing) or between
        # two drips would outlive the test and keep the next module's process threaded.
        for conn, t in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            t.join(timeout=10)

    def __enter__(self) -> HostileAgent:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
