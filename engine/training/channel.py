"""JSON lines over pipes between the coordinator and its workers.

Only JSON crosses the process boundary (never pickle): the coordinator writes commands to a
worker's stdin, the worker answers on a dedicated pipe (not stdout, which libraries print to).
Every read has a deadline.
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
from typing import Any


class ChannelClosed(EOFError):
    pass


class LineReader:
    """Non-blocking line splitter over a file descriptor."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = b""
        self.closed = False

    def feed(self) -> list[dict[str, Any]]:
        """Read what is available (call when select says readable); returns complete messages."""
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        if not data:
            self.closed = True
            return []
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for line in lines:
            if line.strip():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # a torn or foreign line: ignore rather than crash the coordinator
                if isinstance(msg, dict):
                    out.append(msg)
        return out


def encode(msg: dict[str, Any]) -> bytes:
    # allow_nan=False: bare NaN is not JSON; a non-finite number here is a bug, not data.
    return (json.dumps(msg, separators=(",", ":"), allow_nan=False) + "\n").encode()


class WorkerChannel:
    """The worker's end: send on ``out_fd`` (thread-safe), receive commands from ``in_fd``."""

    def __init__(self, in_fd: int, out_fd: int):
        self.reader = LineReader(in_fd)
        self.out_fd = out_fd
        self.lock = threading.Lock()
        self.pending: list[dict[str, Any]] = []

    def send(self, msg: dict[str, Any]) -> None:
        data = encode(msg)
        with self.lock:
            while data:
                data = data[os.write(self.out_fd, data):]

    def recv(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no word from the coordinator in {timeout:.0f}s")
            ready, _, _ = select.select([self.reader.fd], [], [], left)
            if ready:
                self.pending.extend(self.reader.feed())
                if self.reader.closed and not self.pending:
                    raise ChannelClosed("the coordinator went away")
        return self.pending.pop(0)

    def poll(self) -> dict[str, Any] | None:
        """The next command if one has already arrived, else None (never waits)."""
        if not self.pending:
            ready, _, _ = select.select([self.reader.fd], [], [], 0)
            if ready:
                self.pending.extend(self.reader.feed())
                if self.reader.closed and not self.pending:
                    raise ChannelClosed("the coordinator went away")
        return self.pending.pop(0) if self.pending else None

    def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(msg)
        return self.recv(timeout)
