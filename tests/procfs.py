"""What /proc says about a process, for tests that watch processes they did not start directly."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    # The fields after the command name, which is in parentheses and may itself hold ") ".
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """True while ``pid`` exists and has not exited: a zombie has exited, though it still answers kill(0)."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def ppid(pid: int) -> int:
    return int(_stat_fields(pid)[1])


def children(pid: int) -> list[int]:
    """Children of ``pid``, whichever of its threads forked them (each thread has its own list)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for task in tasks:
        try:
            kids += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue  # a thread that ended while we looked
    return kids


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...)."""
    return [d for c in children(pid) for d in (c, *descendants(c))]


def wait_gone(pids: Iterable[int], what: str, limit: float = 30.0) -> None:
    """Wait (bounded) until none of ``pids`` is alive; ``what`` says who outlived whom on failure."""
    pids = list(pids)
    deadline = time.monotonic() + limit
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"{what} (still alive after {limit:.0f} s: " \
                                            f"{[p for p in pids if alive(p)]})"
        time.sleep(0.05)
