"""Replication defaults in one place: the engine, the CLI help and the environment checks read them.

The window (4) and the knob names come from the vendor guide; the chunk size is what measured best
on loopback gloo (benchmarks/bench_replication.py); 32 MiB buckets keep a 4-deep window at 128 MiB.
"""

DEFAULT_INFLIGHT = 4
DEFAULT_CHUNK_MB = 64.0
DEFAULT_BUCKET_MB = 32.0


def largest_collective_mb(chunk_mb: float, bucket_mb: float, inflight: int) -> float:
    """The most MiB one broadcast carries on the CPU path: file-contiguous buckets travel together up
    to the chunk size, but at most half the window's buckets at once (so one group arrives while the
    previous one is verified); see source_reader.collective_groups."""
    return min(chunk_mb, max(bucket_mb, (inflight // 2) * bucket_mb))
