"""The worker's end of its two pipes to the coordinator: commands in on stdin, answers out on the
answer pipe that :mod:`hwtui.core.supervisor` passed it (never stdout, which libraries print to).

Messages are the supervisor's envelope: JSON objects with a ``"kind"``, one per line, read with
its bounded :class:`~hwtui.core.supervisor.LineReader` and written with ``allow_nan=False`` (a NaN
is a bug upstream, and bare NaN is not JSON). Only JSON crosses: never pickle. Every read has a
deadline.
"""

from __future__ import annotations

import os
import select
import time
from typing import Any

from hwtui.core.supervisor import AnswerPipe, LineReader, decode_message


class ChannelClosed(EOFError):
    pass


class WorkerChannel:
    """The worker's end: send on ``out_fd`` (thread-safe), receive commands from ``in_fd``."""

    def __init__(self, in_fd: int, out_fd: int):
        self.in_fd = in_fd
        self.reader = LineReader()
        self.out = AnswerPipe(out_fd)
        self.pending: list[dict[str, Any]] = []
        self.closed = False

    def send(self, msg: dict[str, Any]) -> None:
        self.out.send(msg)

    def _read(self) -> None:
        chunk = os.read(self.in_fd, 1 << 16)
        if not chunk:
            self.closed = True
        for line in self.reader.feed(chunk):
            msg = decode_message(line)
            if msg is not None and isinstance(msg.get("kind"), str):
                self.pending.append(msg)
        if self.closed and not self.pending:
            raise ChannelClosed("the coordinator went away")

    def recv(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no word from the coordinator in {timeout:.0f}s")
            ready, _, _ = select.select([self.in_fd], [], [], left)
            if ready:
                self._read()
        return self.pending.pop(0)

    def poll(self) -> dict[str, Any] | None:
        """The next command if one has already arrived, else None (never waits)."""
        if not self.pending:
            ready, _, _ = select.select([self.in_fd], [], [], 0)
            if ready:
                self._read()
        return self.pending.pop(0) if self.pending else None

    def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(msg)
        return self.recv(timeout)
