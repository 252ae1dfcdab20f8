"""Engine defaults from the detected hardware (the Engine step's pre-filled values).

Why these numbers: a bucket should be a small fraction of the smallest device's memory so
``window`` of them in flight plus the model fit with room to spare, while staying large enough
that per-bucket overhead is amortised (the reference measurements show 25 MB buckets reach
~3x the throughput of per-tensor sends on gloo). Without an accelerator the engine runs on 2 CPU
ranks over gloo with the engine's own defaults (probes/distributed/replication_defaults.py), which
are what measured fastest there.
"""

from __future__ import annotations

from typing import Any

from hwtui.probes.distributed.replication_defaults import DEFAULT_BUCKET_MB, DEFAULT_CHUNK_MB, DEFAULT_WINDOW

MIB = 1024**2


def engine_defaults(devices: list[Any]) -> dict[str, Any]:
    usable = [d for d in devices if getattr(d, "usable", False) and getattr(d, "device", None)]
    backends = sorted({d.backend for d in usable})
    if len(backends) == 1 and backends[0] in ("cuda", "xpu", "hip"):
        # ROCm's torch speaks "cuda"; the engine takes the torch device type.
        device = "cuda" if backends[0] == "hip" else backends[0]
        nproc = len(usable)
    else:
        device, nproc = "cpu", 2
    vram = [d.vram_total for d in usable if getattr(d, "vram_total", None)]
    if device != "cpu" and vram:
        bucket_mb = max(32, min(512, min(vram) // (256 * MIB)))
        window, chunk_mb = DEFAULT_WINDOW, int(DEFAULT_CHUNK_MB)
    else:
        bucket_mb, window, chunk_mb = DEFAULT_BUCKET_MB, DEFAULT_WINDOW, int(DEFAULT_CHUNK_MB)
    gpu_ids = ",".join(d.device for d in usable) if usable else "cpu:0,cpu:1"
    # A cluster node runs one rank per accelerator; a CPU-only box runs the one-rank local check.
    devices_per_node = nproc if device != "cpu" else 1
    return {"device": device, "nproc": nproc, "devices_per_node": devices_per_node, "bucket_mb": int(bucket_mb), "window": window,
            "chunk_mb": chunk_mb, "gpu_ids": gpu_ids}
