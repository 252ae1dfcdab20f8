"""Host CPU, memory and network throughput for the monitor, read through the Host seam.

Pure parsing of ``/proc/stat``, ``/proc/meminfo`` and ``/proc/net/dev`` plus the difference of
two readings: a live host gives rates, a replayed one gives what was recorded (one reading, so
no rates: ``None``, never a made-up zero). Loopback is left out of the network figure: it is
traffic the machine has with itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hwtui.probes.host import FactUnavailable, Host


@dataclass(frozen=True)
class HostSample:
    cpu_percent: float | None
    mem_used: int | None
    mem_total: int | None
    rx_bytes_per_s: float | None
    tx_bytes_per_s: float | None


def parse_cpu_times(stat: str) -> tuple[int, int] | None:
    """``(busy, total)`` jiffies from the aggregate ``cpu`` line of /proc/stat."""
    for line in stat.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            values = [int(v) for v in parts[1:] if v.isdigit()]
            if len(values) < 4:
                return None
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            total = sum(values[:8])  # guest time is already inside user/nice
            return total - idle, total
    return None


def parse_meminfo(text: str) -> tuple[int | None, int | None]:
    """``(used, total)`` bytes; used is total - MemAvailable, None when either is missing or absurd."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    if total is None or available is None or not 0 <= available <= total:
        return None, total
    return total - available, total


def parse_net_dev(text: str) -> tuple[int, int]:
    """``(rx, tx)`` bytes summed over every interface but loopback."""
    rx = tx = 0
    for line in text.splitlines():
        if ":" not in line:
            continue
        name, rest = line.split(":", 1)
        cols = rest.split()
        if name.strip() == "lo" or len(cols) < 9:
            continue
        rx += int(cols[0])
        tx += int(cols[8])
    return rx, tx


def host_memory(host: Host) -> tuple[int | None, int | None]:
    """(used, total) bytes, both from one source: /proc/meminfo, else the recorded runtime fact.

    The host strip and the device panel's ``cpu`` row both read it: on the 8x H100 replay the strip
    (meminfo alone: ``mem ?/62.5G``) once contradicted the row (the runtime fact: 584.4G/2015.0G).

    Why one source: a snapshot can hold MemTotal but no MemAvailable (an old kernel, a trimmed
    tree), and pairing its total with the recorder's own MemAvailable drew another machine's
    "used" figure. Figures that do not parse or do not add up are unknown, not a crash.
    """
    used, total = parse_meminfo(host.read_text("/proc/meminfo") or "")
    if used is not None:
        return used, total
    try:
        rt: dict[str, Any] = host.fact("host_runtime", lambda: {}) or {}
    except FactUnavailable:
        rt = {}
    rt_total, rt_available = rt.get("mem_total"), rt.get("mem_available")
    if isinstance(rt_total, int) and isinstance(rt_available, int) and 0 <= rt_available <= rt_total:
        return rt_total - rt_available, rt_total
    return None, total if total is not None else (rt_total if isinstance(rt_total, int) else None)


class HostCounters:
    """Successive readings of one host; rates come from the difference with the previous one."""

    def __init__(self, host: Host, clock: Callable[[], float] | None = None):
        self.host = host
        self._clock = clock or time.monotonic
        self._cpu: tuple[int, int] | None = None
        self._net: tuple[float, int, int] | None = None

    def sample(self) -> HostSample:
        now = self._clock()
        cpu_pct = None
        times = parse_cpu_times(self.host.read_text("/proc/stat") or "")
        if times is not None and self._cpu is not None:
            busy = times[0] - self._cpu[0]
            total = times[1] - self._cpu[1]
            cpu_pct = 100.0 * busy / total if total > 0 else None
        self._cpu = times
        used, total_mem = host_memory(self.host)
        rx_rate = tx_rate = None
        net = self.host.read_text("/proc/net/dev")
        if net is not None:
            rx, tx = parse_net_dev(net)
            if self._net is not None and now > self._net[0]:
                dt = now - self._net[0]
                rx_rate = max(rx - self._net[1], 0) / dt
                tx_rate = max(tx - self._net[2], 0) / dt
            self._net = (now, rx, tx)
        return HostSample(cpu_pct, used, total_mem, rx_rate, tx_rate)
