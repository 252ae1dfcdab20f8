"""Replication defaults and maximums in one place: ``hwtui replicate``, ``hwtui push``, the resident
receiver, the TUI, the CLI help and the environment checks all read them (engine.replication.settings
holds the settings type built from them).

The window (4) and the knob names come from the vendor guide; the chunk size is what measured best
on loopback gloo (benchmarks/bench_replication.py); 32 MiB buckets keep a 4-deep window at 128 MiB.
The maximums bound what any entry point accepts, a push's settings read off the network included:
``window x bucket`` bytes are in flight on every receiver.
"""

DEFAULT_WINDOW = 4  # buckets in flight (--inflight, HOTWEIGHTS_IPC_INFLIGHT_BUCKETS)
MAX_WINDOW = 1024
DEFAULT_CHUNK_MB = 64.0  # largest collective (--chunk-mb, HOTWEIGHTS_BCAST_CHUNK_MB)
MAX_CHUNK_MB = 4096.0
DEFAULT_BUCKET_MB = 32.0
DEFAULT_TARGET_BUCKET_MS = 50.0  # the adaptive window's target per bucket (--target-bucket-ms)
DEFAULT_TIMEOUT_S = 20.0  # any bucket's (and the commit's) wait (--timeout)
DEFAULT_INIT_TIMEOUT_S = 60.0  # forming the world (--init-timeout)
MAX_TIMEOUT_S = 86400.0  # every timeout, and a push's --deadline
# `hwtui agent --persist`: when a GPU-resident receiver's disk copy becomes durable. "after-commit"
# (its default): the vote waits for the device copy only, the disk copy is fsynced and switched to
# once the push is reported; "before-vote": as a disk-serving receiver, fsynced before its yes vote.
PERSIST_MODES = ("after-commit", "before-vote")


def largest_collective_mb(chunk_mb: float, bucket_mb: float, window: int) -> float:
    """The most MiB one broadcast carries on the CPU path: file-contiguous buckets travel together up
    to the chunk size, but at most half the window's buckets at once (so one group arrives while the
    previous one is verified); see source_reader.collective_groups."""
    return min(chunk_mb, max(bucket_mb, (window // 2) * bucket_mb))
