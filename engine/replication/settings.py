"""The replication settings: one frozen type from the command line to every rank.

Built once -- by the launcher from ``hwtui replicate``'s flags and the environment
(:meth:`ReplicationSettings.resolve`), or by a resident receiver's agent from a push's settings --
then carried to each rank inside its ``WorkerConfig`` as typed JSON (never pickled), agreed across
ranks before any byte moves (agree.py), and written into the report. Every default and maximum
comes from ``probes/distributed/replication_defaults.py``, the one place ``hwtui replicate``,
``hwtui push``, the resident receiver and the environment checks read them.

Internally the number of buckets in flight is the *window* everywhere; ``--inflight`` and
``HOTWEIGHTS_IPC_INFLIGHT_BUCKETS`` are its names on the command line and in the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.probes.distributed.replication_defaults import (
    DEFAULT_CHUNK_MB,
    DEFAULT_TARGET_BUCKET_MS,
    DEFAULT_WINDOW,
    MAX_CHUNK_MB,
    MAX_WINDOW,
)

MB = 1 << 20
WINDOW_ENV = "HOTWEIGHTS_IPC_INFLIGHT_BUCKETS"
CHUNK_ENV = "HOTWEIGHTS_BCAST_CHUNK_MB"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class ReplicationSettings:
    """How the bytes move; every rank runs with the same (agree.py compares them)."""

    window: int = DEFAULT_WINDOW  # buckets in flight at once (--inflight)
    chunk_bytes: int = int(DEFAULT_CHUNK_MB * MB)  # largest collective (--chunk-mb)
    max_inflight_bytes: int | None = None  # a byte cap on top of the window (--max-inflight-mb)
    adaptive: bool = False  # steer the window towards target_bucket_s per bucket
    target_bucket_s: float = DEFAULT_TARGET_BUCKET_MS / 1000.0
    verify: bool = True  # every bucket's xxh3 checked on every receiver
    device: str = "cpu"  # the torch device type the weights live on

    def __post_init__(self) -> None:
        # The one check of every bound, whoever built the settings: a replicate flag, an
        # environment variable, a push's settings as a resident receiver's agent read them off the
        # network, or a rank's configuration JSON.
        if not _is_int(self.window) or not 1 <= self.window <= MAX_WINDOW:
            raise HwtuiError(f"the window (--inflight) must be 1 to {MAX_WINDOW} buckets, not {self.window!r}")
        if not _is_int(self.chunk_bytes) or not 1 <= self.chunk_bytes <= int(MAX_CHUNK_MB * MB):
            raise HwtuiError(f"the chunk (--chunk-mb) must be positive and at most {MAX_CHUNK_MB:g} MiB")
        if self.max_inflight_bytes is not None and (not _is_int(self.max_inflight_bytes) or self.max_inflight_bytes < 1):
            raise HwtuiError("--max-inflight-mb must be positive")
        if not _is_number(self.target_bucket_s):
            raise HwtuiError("the adaptive target (--target-bucket-ms) must be a number")
        if not isinstance(self.adaptive, bool) or not isinstance(self.verify, bool) or not isinstance(self.device, str):
            raise HwtuiError("replication settings: adaptive and verify are true or false, device is a name")

    @classmethod
    def resolve(cls, *, window: int | None, chunk_mb: float | None, max_inflight_mb: float | None, adaptive: bool,
                target_bucket_ms: float, verify: bool, device: str, env: Mapping[str, str]) -> ReplicationSettings:
        """``hwtui replicate``'s settings: a flag beats its environment variable, which beats the default."""
        window_from, chunk_from = f"--inflight {window}", f"--chunk-mb {chunk_mb}"
        if window is None:
            window = int(env_number(env, WINDOW_ENV, DEFAULT_WINDOW, int))
            window_from = f"{WINDOW_ENV}={window}"
        if chunk_mb is None:
            chunk_mb = env_number(env, CHUNK_ENV, DEFAULT_CHUNK_MB)
            chunk_from = f"{CHUNK_ENV}={chunk_mb:g}"
        if window < 1:
            raise HwtuiError("--inflight must be at least 1")
        if window > MAX_WINDOW:
            raise HwtuiError(f"{window_from}: at most {MAX_WINDOW} buckets in flight")
        if chunk_mb <= 0:
            raise HwtuiError("--chunk-mb must be positive")
        if chunk_mb > MAX_CHUNK_MB:
            raise HwtuiError(f"{chunk_from}: at most {MAX_CHUNK_MB:g} MiB per collective")
        if max_inflight_mb is not None and max_inflight_mb <= 0:
            raise HwtuiError("--max-inflight-mb must be positive")
        return cls(window=window, chunk_bytes=max(1, int(chunk_mb * MB)), adaptive=adaptive,
                   max_inflight_bytes=int(max_inflight_mb * MB) if max_inflight_mb else None,
                   target_bucket_s=target_bucket_ms / 1000.0, verify=verify, device=device)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> ReplicationSettings:
        """Decoded from a rank's configuration JSON: unknown or missing fields are refused, not guessed."""
        if not isinstance(raw, dict):
            raise HwtuiError("replication settings are not a JSON object")
        names = {f.name for f in fields(cls)}
        unknown, missing = sorted(set(raw) - names), sorted(names - set(raw))
        if unknown or missing:
            raise HwtuiError(f"replication settings: unknown field(s) {unknown}, missing field(s) {missing}")
        return cls(**raw)


def env_number(env: Mapping[str, str], name: str, default: float, kind: type = float) -> float:
    """A positive number from the environment, or ``default`` when the variable is unset or empty."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(kind(raw))
    except ValueError:
        raise HwtuiError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise HwtuiError(f"{name}={raw!r} must be positive")
    return value
