"""What a node agent serves, refreshed in the background; requests read the last good value.

Each source (live device samples, the local check, processes per device, cluster facts) has its
own daemon thread and its own period. A probe that hangs or is slow holds up only its own thread:
every request answers at once with the last value that source produced, its age in seconds and the
last error, so a client can tell "fresh", "old" and "never worked" apart.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hwtui.core.redact import redact_doc, redact_text

# /proc scans look at this many processes at most: a node with 100k tasks must not stall the agent.
MAX_PROCS_SCANNED = 20000
# Device nodes whose holders count as "a process on that device".
_DEVICE_PREFIXES = ("/dev/nvidia", "/dev/dri/renderD", "/dev/kfd", "/dev/accel", "/dev/hl")


@dataclass
class Slot:
    """The last good value of one source, when it was produced, and the last failure (if any)."""

    value: Any = None
    at: float | None = None  # monotonic time of the last good value
    error: str | None = None
    refreshes: int = 0
    seconds: float = 0.0  # how long the last refresh took

    def view(self, now: float) -> dict[str, Any]:
        return {"value": self.value, "age_s": None if self.at is None else round(now - self.at, 3),
                "error": self.error, "refresh_s": round(self.seconds, 3)}


class Refresher:
    """One source on its own thread: call ``fn`` every ``period`` s, keep the last good answer."""

    def __init__(self, name: str, fn: Callable[[], Any], period: float, stop: threading.Event):
        self.name, self.fn, self.period = name, fn, period
        self.slot = Slot()
        self._lock = threading.Lock()
        self._stop = stop
        self._kick = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"agent-{name}", daemon=True)

    def start(self) -> Refresher:
        self.thread.start()
        return self

    def kick(self) -> None:
        """Refresh now (the next loop turn) instead of at the end of the period."""
        self._kick.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                value, error = self.fn(), None
            except Exception as exc:  # noqa: BLE001 - a failing probe is reported, never fatal
                value, error = None, redact_text(f"{type(exc).__name__}: {exc}")[:500]
            done = time.monotonic()
            with self._lock:
                if error is None:
                    self.slot.value, self.slot.at, self.slot.error = value, done, None
                else:
                    self.slot.error = error
                self.slot.refreshes += 1
                self.slot.seconds = done - t
            self._kick.wait(max(0.0, self.period - (done - t)))
            self._kick.clear()

    def view(self) -> dict[str, Any]:
        with self._lock:
            return self.slot.view(time.monotonic())


def device_processes(proc_root: str = "/proc", limit: int = MAX_PROCS_SCANNED) -> list[dict[str, Any]]:
    """Processes holding a GPU/accelerator device node open: {pid, name, devices}.

    Works for every vendor (NVIDIA /dev/nvidia*, AMD /dev/kfd and render nodes, Intel render
    nodes, Gaudi /dev/accel); processes of other users are invisible without root, like in nvtop.
    """
    out: list[dict[str, Any]] = []
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()][:limit]
    except OSError:
        return out
    for pid in pids:
        fd_dir = f"{proc_root}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        devices = set()
        for fd in fds[:4096]:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith(_DEVICE_PREFIXES) and not target.endswith(("ctl", "uvm-tools", "nvidiactl")):
                devices.add(target)
        if not devices:
            continue
        try:
            with open(f"{proc_root}/{pid}/comm", encoding="utf-8", errors="replace") as fh:
                name = fh.read(256).strip()
        except OSError:
            name = "?"
        out.append({"pid": int(pid), "name": name, "devices": sorted(devices)})
    return out


class NodeState:
    """Every refresher of one agent, and the replication state provided by the resident rank."""

    def __init__(self, *, node: str, sample: Callable[[], list[dict[str, Any]]],
                 check: Callable[[], dict[str, Any]], facts: Callable[[], dict[str, Any]],
                 processes: Callable[[], list[dict[str, Any]]] = device_processes,
                 replication: Callable[[], dict[str, Any]] | None = None,
                 sample_period: float = 1.0, check_period: float = 300.0, facts_period: float = 600.0,
                 process_period: float = 5.0):
        self.node = node
        self.started = time.time()
        self._stop = threading.Event()
        self.samples = Refresher("samples", sample, sample_period, self._stop)
        self.check = Refresher("check", check, check_period, self._stop)
        self.facts = Refresher("facts", facts, facts_period, self._stop)
        self.processes = Refresher("processes", processes, process_period, self._stop)
        self._replication = replication or (lambda: {"serving": None, "in_flight": None})

    @property
    def _refreshers(self) -> tuple[Refresher, ...]:
        return (self.samples, self.check, self.facts, self.processes)

    def start(self) -> NodeState:
        for r in self._refreshers:
            r.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for r in self._refreshers:
            r.kick()

    def join(self, timeout: float) -> None:
        """Wait (each up to ``timeout`` s) for the refresher threads that :meth:`stop` ended."""
        for r in self._refreshers:
            r.thread.join(timeout)

    def replication(self) -> dict[str, Any]:
        return redact_doc(self._replication())
