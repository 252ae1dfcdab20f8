"""Which processes use each accelerator, and what each costs: GPU %, device memory, CPU %, RSS, age.

Two device sources, as nvitop and nvtop use them: NVML's running-process lists and per-process
utilisation samples (``nvmlDeviceGetProcessUtilization``) for NVIDIA devices, and for every other
device the DRM ``fdinfo`` that amdgpu, i915/xe and others publish per open file (``drm-pdev``;
``drm-memory-vram`` / ``drm-total-*`` for memory; ``drm-engine-<name>`` busy nanoseconds, or xe's
``drm-cycles-*`` / ``drm-total-cycles-*``, for utilisation as the difference between two ticks).
The host side (user, command, parent, CPU %, RSS, start time) comes from psutil. Only a live host
has processes; a replayed one has none to show (the caller says so rather than showing an empty
table as if the machine were idle). A process that ends between two reads is simply left out or
shown with "?": nothing here raises for a vanished pid.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hwtui.core.terminal_text import clean
from hwtui.probes.host import Host

_DRM_MEM_KEYS = ("drm-memory-vram", "drm-total-vram0", "drm-total-local0", "drm-resident-vram0")
_UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
MAX_COMMAND = 4096  # characters of a command line kept (the table cuts it to its width anyway)
MAX_TRACKED = 4096  # processes whose counters are kept between ticks; a fork bomb cannot grow it further


@dataclass(frozen=True)
class DeviceProcess:
    device: str  # the dashboard's device key (cuda:0, or the PCI address for DRM devices)
    pid: int
    user: str
    mem_bytes: int | None
    command: str
    gpu_util: float | None = None  # percent of the device's engines this process kept busy
    cpu_percent: float | None = None  # percent of one CPU (as top), None on the first sighting
    host_mem: int | None = None  # resident set size, bytes
    elapsed_s: float | None = None  # since the process started
    ppid: int | None = None
    started: float | None = None  # psutil create_time: who this pid is (a reused pid is not it)


@dataclass
class DrmClient:
    """One DRM fdinfo file: the device, the client id, memory and engine counters."""

    pdev: str
    client_id: str | None = None
    mem: int | None = None
    engines_ns: dict[str, int] = field(default_factory=dict)  # busy nanoseconds per engine
    capacity: dict[str, int] = field(default_factory=dict)  # engines of that class (i915), default 1
    cycles: dict[str, tuple[int, int]] = field(default_factory=dict)  # xe: (busy cycles, total cycles)


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def parse_drm_client(text: str) -> DrmClient | None:
    """Everything the monitor reads from one DRM fdinfo file; None for a non-DRM file."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    pdev = fields.get("drm-pdev")
    if not pdev:
        return None
    client = DrmClient(pdev, fields.get("drm-client-id"))
    for key in _DRM_MEM_KEYS:
        number, _, unit = fields.get(key, "").partition(" ")
        if number.isdigit():
            client.mem = int(number) * _UNITS.get(unit.strip(), 1)
            break
    for key, value in fields.items():
        number = value.split(" ", 1)[0]
        if key.startswith("drm-engine-capacity-"):
            if (n := _int(number)) is not None:
                client.capacity[key.removeprefix("drm-engine-capacity-")] = max(n, 1)
        elif key.startswith("drm-engine-") and value.endswith("ns"):
            if (n := _int(number)) is not None:
                client.engines_ns[key.removeprefix("drm-engine-")] = n
        elif key.startswith("drm-cycles-"):
            engine = key.removeprefix("drm-cycles-")
            busy, total = _int(number), _int(fields.get(f"drm-total-cycles-{engine}", "").split(" ", 1)[0])
            if busy is not None and total is not None:
                client.cycles[engine] = (busy, total)
    return client


def parse_drm_fdinfo(text: str) -> tuple[str, int | None] | None:
    """``(pci address, memory bytes)`` of one DRM fdinfo file; None for a non-DRM file."""
    client = parse_drm_client(text)
    return None if client is None else (client.pdev, client.mem)


class DrmUtil:
    """Per-process GPU % from DRM engine counters: the busy time between two ticks over the wall time.

    Counters are kept per (pid, device, client id): one client opened through several fds counts
    once. An engine class with several engines (i915's capacity) is a fraction of all of them.
    The figure is the busiest engine's, as nvtop shows it.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._last: dict[tuple[int, str], tuple[float, dict[str, int], dict[str, tuple[int, int]]]] = {}

    def update(self, pid: int, device: str, clients: dict[str, DrmClient], now: float) -> float | None:
        ns: dict[str, int] = {}
        cycles: dict[str, tuple[int, int]] = {}
        capacity: dict[str, int] = {}
        for c in clients.values():
            for engine, n in c.engines_ns.items():
                ns[engine] = ns.get(engine, 0) + n
            for engine, (busy, total) in c.cycles.items():
                before = cycles.get(engine, (0, 0))
                cycles[engine] = (before[0] + busy, max(before[1], total))  # total cycles: the GPU's clock
            capacity.update(c.capacity)
        prev = self._last.get((pid, device))
        self._last[(pid, device)] = (now, ns, cycles)
        if prev is None or (not ns and not cycles):
            return None  # one reading is no rate (or the driver publishes no engine counters)
        then, prev_ns, prev_cycles = prev
        shares = []
        wall_ns = (now - then) * 1e9
        if wall_ns > 0:
            for engine, n in ns.items():
                if engine in prev_ns and n >= prev_ns[engine]:
                    shares.append((n - prev_ns[engine]) / (wall_ns * capacity.get(engine, 1)) * 100)
        for engine, (busy, total) in cycles.items():
            pb, pt = prev_cycles.get(engine, (busy, total))
            if total > pt and busy >= pb:
                shares.append((busy - pb) / (total - pt) * 100)
        return min(max(shares), 100.0) if shares else None

    def forget_except(self, alive: set[tuple[int, str]]) -> None:
        for key in [k for k in self._last if k not in alive]:
            del self._last[key]


class ProcessStats:
    """The host side of each process (psutil), with the state CPU % needs between two ticks.

    psutil's ``cpu_percent(interval=None)`` compares with the previous call on the same Process
    object, so objects are kept per (pid, start time) for the processes still shown, and dropped
    when they leave the table (at most MAX_TRACKED are kept).
    """

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self._procs: dict[int, Any] = {}

    def describe(self, pid: int) -> dict[str, Any]:
        """user, command, ppid, cpu_percent, host_mem, elapsed_s, started; "?" / None where unreadable."""
        out: dict[str, Any] = {"user": "?", "command": "?"}
        try:
            import psutil
        except ImportError:
            return out
        try:
            proc = self._procs.get(pid)
            if proc is None or not proc.is_running():  # is_running also catches a reused pid
                proc = psutil.Process(pid)
                first = True
                if len(self._procs) < MAX_TRACKED:
                    self._procs[pid] = proc
            else:
                first = False
            with proc.oneshot():
                started = proc.create_time()
                out["started"] = started
                out["elapsed_s"] = max(self.clock() - started, 0.0)
                out["ppid"] = proc.ppid()
                out["host_mem"] = int(proc.memory_info().rss)
                cpu = proc.cpu_percent(interval=None)
                out["cpu_percent"] = None if first else float(cpu)
                try:  # hidepid or another user's process: the figures above still count
                    # Any user can name a process: its command line must not drive the terminal.
                    out["command"] = clean(" ".join(proc.cmdline()) or proc.name(), MAX_COMMAND)
                    out["user"] = clean(proc.username(), 64)
                except psutil.AccessDenied:
                    pass
        except Exception:  # noqa: BLE001 - the process ended, access denied, or /proc unreadable
            self._procs.pop(pid, None)
        return out

    def forget_except(self, pids: set[int]) -> None:
        for pid in [p for p in self._procs if p not in pids]:
            del self._procs[pid]


def _row(stats: ProcessStats, described: dict[int, dict[str, Any]], device: str, pid: int, mem: int | None,
         gpu_util: float | None) -> DeviceProcess:
    info = described.get(pid)
    if info is None:
        info = described[pid] = stats.describe(pid)
    return DeviceProcess(device, pid, info["user"], mem, info["command"], gpu_util, info.get("cpu_percent"),
                         info.get("host_mem"), info.get("elapsed_s"), info.get("ppid"), info.get("started"))


def drm_processes(host: Host, pci_to_key: dict[str, str], pids: Iterable[int] | None = None,
                  stats: ProcessStats | None = None, util: DrmUtil | None = None) -> list[DeviceProcess]:
    """Processes holding a DRM file of a device in ``pci_to_key``: memory, GPU % (given ``util``
    kept between ticks), and the host figures."""
    stats = stats or ProcessStats()
    clients: dict[tuple[int, str], dict[str, DrmClient]] = {}
    for entry in pids if pids is not None else (int(p) for p in host.listdir("/proc") if p.isdigit()):
        for fd in host.listdir(f"/proc/{entry}/fdinfo"):
            client = parse_drm_client(host.read_text(f"/proc/{entry}/fdinfo/{fd}") or "")
            if client is None or client.pdev not in pci_to_key:
                continue
            per = clients.setdefault((int(entry), pci_to_key[client.pdev]), {})
            # The same client shows in every fd that shares it: count it once (by client id).
            per.setdefault(client.client_id or f"fd{fd}", client)
    now = util.clock() if util is not None else 0.0
    rows: list[DeviceProcess] = []
    described: dict[int, dict[str, Any]] = {}
    for (pid, dev), per in sorted(clients.items()):
        # The same buffer shows in every fd of one client: keep the largest, not the sum.
        mems = [c.mem for c in per.values() if c.mem is not None]
        gpu = util.update(pid, dev, per, now) if util is not None else None
        rows.append(_row(stats, described, dev, pid, max(mems) if mems else None, gpu))
    if util is not None:
        util.forget_except(set(clients))
    return rows


class NvmlProcessUtil:
    """Per-process SM % from NVML's sample buffer, asking each time only for samples newer than the last."""

    def __init__(self) -> None:
        self._since: dict[str, int] = {}

    def read(self, nvml: Any, key: str, handle: Any) -> dict[int, float] | None:
        """pid -> SM %; {} when no process ran a kernel since the last tick; None when unsupported."""
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._since.get(key, 0))
        except AttributeError:
            return None  # an nvidia-ml-py without the call
        except Exception as exc:  # noqa: BLE001 - NVMLError: NotFound means no new samples
            return {} if getattr(exc, "value", None) in (0, 6) else None
        out: dict[int, tuple[int, float]] = {}
        newest = self._since.get(key, 0)
        for s in samples or []:
            stamp = int(getattr(s, "timeStamp", 0))
            newest = max(newest, stamp)
            if int(s.pid) not in out or stamp >= out[int(s.pid)][0]:
                out[int(s.pid)] = (stamp, float(min(max(int(s.smUtil), 0), 100)))
        self._since[key] = newest
        return {pid: v for pid, (_, v) in out.items()}


def nvml_processes(nvml: Any, handles: dict[str, Any], stats: ProcessStats | None = None,
                   util: NvmlProcessUtil | None = None) -> list[DeviceProcess]:
    """NVML's compute and graphics processes per device key (``handles``: key -> NVML handle)."""
    stats = stats or ProcessStats()
    out: dict[tuple[int, str], int | None] = {}
    gpu: dict[str, dict[int, float] | None] = {}
    for key, handle in handles.items():
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                procs = getattr(nvml, getter)(handle)
            except Exception:  # noqa: BLE001 - NVMLError, or the call is missing in this driver
                continue
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                out[(int(p.pid), key)] = used if isinstance(used, int) and used >= 0 else None
        if util is not None:
            gpu[key] = util.read(nvml, key, handle)
    rows: list[DeviceProcess] = []
    described: dict[int, dict[str, Any]] = {}
    for (pid, key), mem in sorted(out.items()):
        per = gpu.get(key)
        rows.append(_row(stats, described, key, pid, mem, None if per is None else per.get(pid, 0.0)))
    return rows


def device_processes(host: Host, devices: list[Any], nvml: Any = None, handles: dict[str, Any] | None = None,
                     tracker: ProcessTracker | None = None) -> list[DeviceProcess] | None:
    """Every process on the devices of a live host; None when the host is not live (a replay)."""
    if not host.is_live:
        return None
    tracker = tracker or ProcessTracker()
    rows = nvml_processes(nvml, handles, tracker.stats, tracker.nvml) if nvml is not None and handles else []
    covered = set(handles or {})
    pci_to_key = {d.pci: d.device for d in devices if getattr(d, "pci", None) and d.device and d.device not in covered}
    if pci_to_key:
        rows += drm_processes(host, pci_to_key, stats=tracker.stats, util=tracker.drm)
    tracker.stats.forget_except({r.pid for r in rows})
    return rows


@dataclass
class ProcessTracker:
    """What the process list keeps between ticks (the monitor holds one)."""

    stats: ProcessStats = field(default_factory=ProcessStats)
    nvml: NvmlProcessUtil = field(default_factory=NvmlProcessUtil)
    drm: DrmUtil = field(default_factory=DrmUtil)


def send_signal(pid: int, started: float | None, sig: int) -> str:
    """Send ``sig`` to ``pid`` if it is still the process the table showed; one line saying what happened.

    The start time is the process's identity: a pid reused since the last tick is another
    process, and is left alone.
    """
    name = signal.Signals(sig).name
    try:
        import psutil

        proc = psutil.Process(pid)
        if started is None or abs(proc.create_time() - started) > 0.01:
            return f"pid {pid} is no longer the process shown: nothing sent"
        proc.send_signal(sig)
    except ImportError:
        try:
            os.kill(pid, sig)
        except OSError as exc:
            return f"{name} to pid {pid} failed: {exc.strerror}"
    except Exception as exc:  # noqa: BLE001 - NoSuchProcess, AccessDenied
        reason = "it has already ended" if type(exc).__name__ == "NoSuchProcess" else (
            "permission denied" if type(exc).__name__ == "AccessDenied" else str(exc))
        return f"{name} to pid {pid} not sent: {reason}"
    return f"{name} sent to pid {pid}"
