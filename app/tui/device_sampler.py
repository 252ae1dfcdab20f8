"""Where the dashboard's live device figures come from.

``hwtui.probes.sampling.Sampler`` (NVML, amdsmi, sysfs, psutil) is the real source. Until that
module exists in a build, :class:`InventorySampler` keeps the dashboard honest with what the
inventory knows (memory totals from detection) plus live CPU figures from psutil, rather than
drawing nothing.

Also: :class:`DeviceHistory`, the bounded per-device series the sparklines draw.
"""

from __future__ import annotations

import importlib
from collections import deque
from dataclasses import dataclass
from typing import Any

SPARK_POINTS = 120


@dataclass
class Sample:
    """Field-compatible with ``hwtui.probes.sampling.DeviceSample``."""

    key: str
    name: str
    mem_used: int | None = None
    mem_total: int | None = None
    util: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None


class InventorySampler:
    def __init__(self, host: Any, devices: list[Any]):
        self.devices = [d for d in devices if getattr(d, "device", None)]
        self.live = bool(getattr(host, "is_live", False))
        if self.live:
            import psutil

            psutil.cpu_percent(None)  # prime: the first call has no interval to measure
            self._psutil = psutil

    def sample(self) -> list[Sample]:
        out = [Sample(d.device, d.name, d.vram_used, d.vram_total) for d in self.devices]
        if self.live:
            vm = self._psutil.virtual_memory()
            out.append(Sample("cpu", "CPU", vm.total - vm.available, vm.total, self._psutil.cpu_percent(None)))
        else:
            out.append(Sample("cpu", "CPU"))
        return out

    def close(self) -> None:
        pass


def make_sampler(host: Any, devices: list[Any]) -> Any:
    try:
        module = importlib.import_module("hwtui.probes.sampling")
    except ImportError:
        return InventorySampler(host, devices)
    return module.Sampler(host, devices)


class DeviceHistory:
    """The last ``SPARK_POINTS`` readings per device and metric, and the newest sample."""

    def __init__(self, points: int = SPARK_POINTS):
        self.points = points
        self.latest: dict[str, Any] = {}
        self.series: dict[str, dict[str, deque[float | None]]] = {}

    def add(self, samples: list[Any]) -> None:
        for s in samples:
            self.latest[s.key] = s
            per = self.series.setdefault(s.key, {m: deque(maxlen=self.points) for m in ("util", "temp_c", "power_w")})
            for metric, values in per.items():
                values.append(getattr(s, metric, None))

    def keys(self) -> list[str]:
        return list(self.latest)
