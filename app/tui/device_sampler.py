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
        for s in samples:
            self.latest[s.key] = s
            per = self.series.setdefault(s.key, {m: deque(maxlen=self.points) for m in ("util", "temp_c", "power_w")})
            for metric, values in per.items():
                values.append(getattr(s, metric, None))

    def keys(self) -> list[str]:
        return list(self.latest)
