"""Where the dashboard's live device figures come from, and the history its sparklines draw.

The figures come from :class:`hwtui.probes.sampling.Sampler` (NVML, amdsmi, sysfs, psutil; on a
replayed machine, what was recorded). The screen calls it from a thread worker only: NVML calls
can block for tens of milliseconds and must never stall the UI thread.
"""

from __future__ import annotations

from collections import deque
from typing import Any

SPARK_POINTS = 120


def make_sampler(host: Any, devices: list[Any]) -> Any:
    from hwtui.probes.sampling import Sampler

    return Sampler(host, devices)


class DeviceHistory:
    """The last ``SPARK_POINTS`` readings per device and metric, and the newest sample."""

    def __init__(self, points: int = SPARK_POINTS):
        self.points = points
        self.latest: dict[str, Any] = {}
        self.series: dict[str, dict[str, deque[float | None]]] = {}

    def add(self, samples: list[Any]) -> None:
        for s in map(plausible, samples):
            self.latest[s.key] = s
            per = self.series.setdefault(s.key, {m: deque(maxlen=self.points) for m in ("util", "temp_c", "power_w")})
            for metric, values in per.items():
                values.append(getattr(s, metric, None))

    def keys(self) -> list[str]:
        return list(self.latest)


class MonitorSampler:
    """One tick of the monitor: device figures, host CPU/memory/network, and device processes.

    Wraps the device sampler (which owns the NVML handles) so the process list asks NVML about
    the same handles instead of opening NVML twice.
    """

    def __init__(self, host: Any, devices: list[Any], device_sampler: Any = None, *, processes: bool = True):
        from hwtui.probes.host_counters import HostCounters
        from hwtui.probes.processes import ProcessTracker

        self.processes = processes  # the Run screen shows no process list: it does not pay for one
        self.host = host
        self.devices = devices
        self.devices_sampler = device_sampler if device_sampler is not None else make_sampler(host, devices)
        self.counters = HostCounters(host)
        self.tracker = ProcessTracker()  # CPU % and GPU % are differences between two ticks: kept here

    def _nvml_handles(self) -> tuple[Any, dict[str, Any]]:
        nvml = getattr(self.devices_sampler, "_nvml", None)
        by_pci = getattr(self.devices_sampler, "_handles", {}) or {}
        keys = {d.pci: d.device for d in self.devices if getattr(d, "pci", None) and d.device}
        return nvml, {keys[pci]: h for pci, h in by_pci.items() if pci in keys}

    def sample(self) -> tuple[list[Any], Any, list[Any] | None]:
        from hwtui.probes.processes import device_processes

        samples = list(self.devices_sampler.sample())
        host = self.counters.sample()
        if not self.processes:
            return samples, host, []
        nvml, handles = self._nvml_handles()
        try:
            procs = device_processes(self.host, self.devices, nvml, handles, tracker=self.tracker)
        except OSError:
            procs = []
        return samples, host, procs

    def close(self) -> None:
        self.devices_sampler.close()


def plausible(sample: Any) -> Any:
    """``sample`` with memory figures that cannot be true (used < 0 or > total) shown as unknown.

    A replay can pair the recorded total with another machine's available memory; a wrong figure
    drawn as if measured is worse than a blank one.
    """
    import dataclasses

    used, total = getattr(sample, "mem_used", None), getattr(sample, "mem_total", None)
    if used is not None and (used < 0 or (total is not None and used > total)):
        return dataclasses.replace(sample, mem_used=None)
    return sample
