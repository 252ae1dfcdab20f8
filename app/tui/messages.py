"""Every app-wide message, in one file.

Workers (threads) post these; screens handle them on the UI thread. High-rate ones override
``can_replace`` so a queue that backs up keeps only the newest: the data itself is already folded
into shared state (``RunState``), so dropping an intermediate "something changed" loses nothing.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message


class DevicesDetected(Message):
    """The inventory finished (``error`` set when it could not run)."""

    def __init__(self, devices: list[Any], error: str = "") -> None:
        super().__init__()
        self.devices = devices
        self.error = error


class ChecksFinished(Message):
    """A ``run_checks`` call for ``areas`` finished in a worker thread."""

    def __init__(self, areas: frozenset[str], findings: list[Any], duration_s: float, error: str = "") -> None:
        super().__init__()
        self.areas = areas
        self.findings = findings
        self.duration_s = duration_s
        self.error = error


class ExportWritten(Message):
    """``hwtui env --write FILE`` finished: ``ok`` and what it said."""

    def __init__(self, path: str, ok: bool, output: str) -> None:
        super().__init__()
        self.path = path
        self.ok = ok
        self.output = output


class SamplesReady(Message):
    """One sampler poll finished. Merged: only the newest poll matters."""

    def __init__(self, samples: list[Any], error: str = "", host: Any = None) -> None:
        super().__init__()
        self.samples = samples
        self.error = error
        self.host = host  # hwtui.probes.host_counters.HostSample, or None

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SamplesReady)


class EngineUpdated(Message):
    """The engine's stream changed ``RunState`` (events, stderr lines). Merged."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, EngineUpdated)


class EngineError(Message):
    """An ``error`` event or a failed bucket: shown as a notification too, never merged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class EngineExited(Message):
    """The engine process ended (``stage`` is "plan" for the planner step)."""

    def __init__(self, returncode: int, stage: str = "run") -> None:
        super().__init__()
        self.returncode = returncode
        self.stage = stage


class InterfacesDetected(Message):
    """The network interfaces (``probes/distributed/netif``) for the cluster form's default."""

    def __init__(self, interfaces: list[dict[str, Any]], error: str = "") -> None:
        super().__init__()
        self.interfaces = interfaces
        self.error = error


class ClusterFilesWritten(Message):
    """``hwtui cluster init --json`` finished: its parsed answer, or the one-line error."""

    def __init__(self, ok: bool, out: str = "", files: list[str] | None = None,
                 commands: dict[str, str] | None = None, error: str = "", exists: bool = False) -> None:
        super().__init__()
        self.ok = ok
        self.out = out
        self.files = files or []
        self.commands = commands or {}
        self.error = error
        self.exists = exists  # refused because cluster.json is already there (a second press overwrites)


class RunRequested(Message):
    """The Engine step saved its choices and asks the app to start a run on the Run screen."""


class MonitorTick(Message):
    """One monitor sample: device figures, the host strip and the device processes (None: not live)."""

    def __init__(self, samples: list[Any], host: Any = None, processes: list[Any] | None = None, error: str = "") -> None:
        super().__init__()
        self.samples = samples
        self.host = host
        self.processes = processes
        self.error = error
