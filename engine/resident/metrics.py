"""The agent's state as Prometheus text exposition (format 0.0.4).

Label values are escaped as the format demands (backslash, quote, newline), so a device name or
a version string can never break a scrape or inject a series. Every family is a set of disjoint
series: ``sum()`` over any label gives a true total (no ``status="total"`` row beside the statuses).
``hwtui_build_info`` says which hwtui and Python serve the numbers, the usual way (a gauge of 1).
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Iterable, Mapping
from typing import Any

from hwtui.core.finding import Status
from hwtui.core.redact import redact_text

# The statuses a finding can have: the check summary also carries "total" (and "worst"), which as
# series would count every finding twice under sum().
_STATUSES = tuple(s.value for s in Status)

# (metric, sample key, help, scale)
_DEVICE_GAUGES = (
    ("hwtui_device_utilization_percent", "util", "Device utilisation in percent", 1.0),
    ("hwtui_device_memory_used_bytes", "mem_used", "Device memory in use", 1.0),
    ("hwtui_device_memory_total_bytes", "mem_total", "Device memory size", 1.0),
    ("hwtui_device_temperature_celsius", "temp_c", "Device temperature", 1.0),
    ("hwtui_device_power_watts", "power_w", "Device power draw", 1.0),
    ("hwtui_device_power_limit_watts", "power_limit_w", "Device power limit", 1.0),
)


def escape_label(value: Any) -> str:
    return redact_text(str(value)).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Mapping[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items()) + "}"


def _number(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if v != v or v in (float("inf"), float("-inf")):
        return None
    return repr(float(v)) if isinstance(v, float) else str(v)


@functools.lru_cache(maxsize=1)
def build_labels() -> dict[str, str]:
    """hwtui's version (from the installed distribution) and the interpreter's; read once, not per scrape."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        hwtui_version = version("hwtui")
    except PackageNotFoundError:
        hwtui_version = "0+unknown"
    return {"version": hwtui_version, "python": platform.python_version()}


def render(node: str, devices: Mapping[str, Any], check: Mapping[str, Any], replication: Mapping[str, Any],
           processes: Mapping[str, Any], build: Mapping[str, str] | None = None) -> str:
    """``devices``/``check``/``processes`` are the refreshers' views ({value, age_s, error});
    ``build`` the build-info labels (default: :func:`build_labels`)."""
    lines: list[str] = []

    def family(name: str, help_: str, kind: str, samples: Iterable[tuple[Mapping[str, Any], Any]]) -> None:
        rows = [(lab, num) for lab, v in samples if (num := _number(v)) is not None]
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{_labels(lab)} {num}" for lab, num in rows)

    family("hwtui_build_info", "hwtui version and Python serving these metrics (always 1)", "gauge",
           [({"node": node, **(build if build is not None else build_labels())}, 1)])
    samples = devices.get("value") or []
    for metric, key, help_, _ in _DEVICE_GAUGES:
        family(metric, help_, "gauge",
               (({"node": node, "device": s.get("device"), "name": s.get("name")}, s.get(key)) for s in samples))
    for source, view in (("samples", devices), ("check", check), ("processes", processes)):
        family(f"hwtui_agent_{source}_age_seconds", f"Age of the last good {source} refresh", "gauge",
               [({"node": node}, view.get("age_s"))])
    summary = (check.get("value") or {}).get("summary") or {}
    family("hwtui_check_findings", "Findings of the local check by status", "gauge",
           (({"node": node, "status": k}, summary.get(k)) for k in _STATUSES if k in summary))
    family("hwtui_device_processes", "Processes holding a device open", "gauge",
           [({"node": node}, len(processes.get("value") or []))])
    serving = replication.get("serving")
    family("hwtui_replication_serving_info", "The weight version this node serves (1 when serving)", "gauge",
           [({"node": node, "version": serving}, 1)] if serving else [])
    flight = replication.get("in_flight") or {}
    family("hwtui_replication_progress_ratio", "Progress of the push in flight (0..1)", "gauge",
           [({"node": node, "version": flight.get("version")}, flight.get("progress"))] if flight else [])
    family("hwtui_replication_pushes_total", "Pushes this agent took part in, by outcome", "counter",
           (({"node": node, "outcome": k}, v) for k, v in sorted((replication.get("pushes") or {}).items())))
    dev = replication.get("device") or {}
    if dev:
        # --device cuda: what the served version's device copy is, and what each slot holds.
        family("hwtui_resident_device_serving_info", "The version served from device memory and its slot (1 when serving)",
               "gauge", [({"node": node, "device": dev.get("device"), "slot": dev.get("slot"),
                           "version": dev.get("serving")}, 1)] if dev.get("serving") else [])
        family("hwtui_resident_device_slot_bytes", "Device memory held by each served-version slot", "gauge",
               (({"node": node, "device": dev.get("device"), "slot": name}, (info or {}).get("bytes"))
                for name, info in sorted((dev.get("slots") or {}).items())))
        family("hwtui_resident_device_allocations_total", "Device slot allocations since the agent started", "counter",
               [({"node": node, "device": dev.get("device")}, dev.get("allocs"))])
        # Consumers' holds (engine.resident.slot_holds): a slot held here refuses the push that
        # would be received into it, so an alert on a hold that never ends finds a stuck consumer.
        holds: dict[str, int] = {}
        for h in dev.get("holds") or []:
            if isinstance(h, dict) and isinstance(h.get("slot"), str):
                holds[h["slot"]] = holds.get(h["slot"], 0) + 1
        family("hwtui_resident_device_slot_holds", "Consumers holding each device slot (a push into it is refused)",
               "gauge", (({"node": node, "device": dev.get("device"), "slot": name}, holds.get(name, 0))
                         for name in sorted(dev.get("slots") or {})))
    return "\n".join(lines) + "\n"
