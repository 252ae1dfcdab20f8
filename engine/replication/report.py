"""The final replication report (``--report FILE``, and ``repl.done.report``)."""

from __future__ import annotations

import os
from typing import Any, TypedDict, cast

from hwtui.core.redact import redact_doc, redact_env
from hwtui.engine.replication.settings import ReplicationSettings

REPORT_SCHEMA = "hwtui.replication-report/1"


class PeakMemory(TypedDict):
    max_peak_rss_bytes: int
    max_pool_peak_bytes: int
    pool_bound_bytes: int  # the window times the largest bucket: what the pool may hold at most


class ReplicationReport(TypedDict):
    """``--report FILE`` and ``repl.done.report``: the one shape the CLI printer, the TUI and tools read.
    A rank's own row (``ranks``) stays a mapping: it is what that rank sent, checked where it is read."""

    schema: str
    ok: bool
    error: str | None
    committed: bool
    decision: str | None  # "commit" once the decision record exists, "abort", None without --commit
    serving: dict[str, str | None]  # rank -> the version it serves afterwards, read from disk
    recovered: bool
    model: str
    version: str
    prev_version: str | None
    plan_digest: str
    bytes: int
    n_buckets: int
    bucket_bytes: int
    seconds: float
    gbps: float
    wall_seconds: float
    phases_s: dict[str, float]
    peak_memory: PeakMemory
    world_size: int
    ranks: list[dict[str, Any]]
    device: str
    transport: dict[str, Any] | None
    window: int
    adaptive: bool
    chunk_bytes: int
    verify: bool
    mode: str
    env: dict[str, str]
_ENV_PREFIXES = ("HOTWEIGHTS_", "MASTER_", "NCCL_", "GLOO_", "TORCH_", "CCL_", "HCCL_", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                 "SLURM_NTASKS", "SLURM_JOB_ID")


def build_report(*, ok: bool, error: str | None, plan: dict[str, Any], settings: ReplicationSettings,
                 transport: dict[str, Any] | None, world_size: int, mode: str,
                 ranks: list[dict[str, Any]], seconds: float, wall_seconds: float, committed: bool,
                 launcher_phases: dict[str, float], serving: dict[int, str | None] | None = None,
                 decision: str | None = None, recovered: bool = False) -> ReplicationReport:
    total = int(plan["total_bytes"])
    phases: dict[str, float] = dict(launcher_phases)
    for r in ranks:
        for name, v in (r.get("phases") or {}).items():
            phases[name] = max(phases.get(name, 0.0), float(v))
    mem = [r.get("memory") or {} for r in ranks]
    pool_peaks = [((m.get("pool") or {}).get("peak_in_use_bytes") or 0) for m in mem]
    report: ReplicationReport = {
        "schema": REPORT_SCHEMA,
        "ok": ok,
        "error": error,
        "committed": committed,
        # The coordinator's decision ("commit" once decisions/<v>.json exists, "abort", None
        # without --commit) and what every receiver serves afterwards, read from disk.
        "decision": decision,
        "serving": {str(r): v for r, v in sorted((serving or {}).items())},
        "recovered": recovered,
        "model": plan["model"],
        "version": plan["version"],
        "prev_version": plan.get("prev_version"),
        "plan_digest": plan["digest"],
        "bytes": total,
        "n_buckets": len(plan["buckets"]),
        "bucket_bytes": plan["bucket_bytes"],
        "seconds": round(seconds, 6),
        "gbps": round(total / seconds / 1e9, 4) if seconds > 0 and ok and not recovered else 0.0,
        "wall_seconds": round(wall_seconds, 3),
        "phases_s": {k: round(v, 6) for k, v in phases.items()},
        "peak_memory": {
            "max_peak_rss_bytes": max((m.get("peak_rss_bytes") or 0 for m in mem), default=0),
            "max_pool_peak_bytes": max(pool_peaks, default=0),
            "pool_bound_bytes": settings.window * max((b["size"] for b in plan["buckets"]), default=0),
        },
        "world_size": world_size,
        "ranks": ranks,
        "device": settings.device,
        "transport": transport,
        "window": settings.window,
        "adaptive": settings.adaptive,
        "chunk_bytes": settings.chunk_bytes,
        "verify": settings.verify,
        "mode": mode,
        "env": redact_env({k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}),
    }
    # Redaction keeps the shape (secrets replaced by a marker string of the same key).
    return cast("ReplicationReport", redact_doc(report))
