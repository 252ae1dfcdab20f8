"""Which connections the agent keeps open: room for clients with the token, whatever others do.

A connection is *pending* from its accept until a request on it carries the bearer token; then it
is *trusted*. The two are bounded separately:

* Pending connections (``max_pending``) are what anyone can open, the token unread: a slow-loris
  client holding hundreds of them must not lock out the pusher. When the pool is full, a new
  connection is admitted and the **oldest** pending one is cut (shut down, its thread wakes at
  once), so an attacker's connections make room for a new client instead of turning it away; a
  client that sends its head at once (every real client) is never the oldest.
* Trusted connections (``max_trusted``) are kept-alive pollers and pushers; nothing an attacker
  without the token does can cut them. When that pool is full, a newly authenticated request is
  still answered, then its connection is closed.

Every connection is also bounded in time by the server (a deadline for each request head and
body), so the pools hold threads, never forever.
"""

from __future__ import annotations

import socket
import threading
from typing import Any


def cut(conn: Any) -> None:
    """Shut a connection down from another thread: its blocked read returns at once, its fd stays
    owned (and closed) by its own thread. ``socket.socket.shutdown`` also for a TLS socket, whose
    own ``shutdown`` would drop its TLS state under the thread still using it."""
    try:
        socket.socket.shutdown(conn, socket.SHUT_RDWR)
    except OSError:
        pass


class Admission:
    def __init__(self, max_pending: int, max_trusted: int):
        self.max_pending = max_pending
        self.max_trusted = max_trusted
        self._lock = threading.Lock()
        self._pending: dict[Any, None] = {}  # insertion order: oldest first
        self._trusted: set[Any] = set()
        self.evicted = 0

    def admit(self, conn: Any) -> None:
        """A new connection: always admitted; the oldest pending ones go when the pool is full."""
        with self._lock:
            while len(self._pending) >= self.max_pending:
                oldest = next(iter(self._pending))
                del self._pending[oldest]
                self.evicted += 1
                # Under the lock: its own thread closes it only after release(), which waits here,
                # so the fd cut is never one reused by a newer connection.
                cut(oldest)
            self._pending[conn] = None

    def promote(self, conn: Any) -> bool:
        """A request on ``conn`` carried the token: trusted (True), or False when the trusted pool
        is full or the connection was already cut (answer this request, then close)."""
        with self._lock:
            if conn in self._trusted:
                return True
            if conn not in self._pending or len(self._trusted) >= self.max_trusted:
                return False
            del self._pending[conn]
            self._trusted.add(conn)
            return True

    def release(self, conn: Any) -> None:
        """``conn`` is about to be closed by its own thread."""
        with self._lock:
            self._pending.pop(conn, None)
            self._trusted.discard(conn)

    def counts(self) -> tuple[int, int]:
        """(pending, trusted) connections open now."""
        with self._lock:
            return len(self._pending), len(self._trusted)

    def connections(self) -> list[Any]:
        with self._lock:
            return [*self._pending, *self._trusted]

    def close_all(self) -> list[Any]:
        """Forget every connection and return them (the server is stopping and closes them)."""
        with self._lock:
            conns = [*self._pending, *self._trusted]
            self._pending.clear()
            self._trusted.clear()
        return conns
