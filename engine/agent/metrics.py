"""The agent's state as Prometheus text exposition (format 0.0.4).

Label values are escaped as the format demands (backslash, quote, newline), so a device name or
a version string can never break a scrape or inject a series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hwtui.core.redact import redact_text

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


def render(node: str, devices: Mapping[str, Any], check: Mapping[str, Any], replication: Mapping[str, Any],
           processes: Mapping[str, Any]) -> str:
    """``devices``/``check``/``processes`` are the refreshers' views ({value, age_s, error})."""
    lines: list[str] = []

    def family(name: str, help_: str, kind: str, samples: Iterable[tuple[Mapping[str, Any], Any]]) -> None:
        rows = [(lab, num) for lab, v in samples if (num := _number(v)) is not None]
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{_labels(lab)} {num}" for lab, num in rows)

    samples = devices.get("value") or []
    for metric, key, help_, _ in _DEVICE_GAUGES:
        family(metric, help_, "gauge",
               (({"node": node, "device": s.get("device"), "name": s.get("name")}, s.get(key)) for s in samples))
    for source, view in (("samples", devices), ("check", check), ("processes", processes)):
        family(f"hwtui_agent_{source}_age_seconds", f"Age of the last good {source} refresh", "gauge",
               [({"node": node}, view.get("age_s"))])
    summary = (check.get("value") or {}).get("summary") or {}
    family("hwtui_check_findings", "Findings of the local check by status", "gauge",
           (({"node": node, "status": k}, v) for k, v in sorted(summary.items()) if k != "worst"))
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
    return "\n".join(lines) + "\n"
