"""Every rank's effective settings, compared before any byte moves.

Under torchrun or SLURM each rank resolves its own settings (``HOTWEIGHTS_*`` from its own
environment, its own torch and hwtui install). Ranks that disagree on the window, the chunk size
or the plan do not fail cleanly by themselves: their collectives stop matching and end in a gloo
size mismatch or a timeout that names nothing. So right after the world forms every rank sends
its record to every other (one all-gather of a fixed-size JSON slot, no pickling) and all of them
compare against rank 0's; a difference is bad input naming the rank, the setting and both values.
"""

from __future__ import annotations

import json
from typing import Any

from hwtui.core.errors import HwtuiError

SLOT_BYTES = 4096
# In the order a difference is reported: the first one found is the one named.
KEYS = ("hwtui", "torch", "plan_digest", "bucket_bytes", "window", "chunk_bytes", "max_inflight_bytes", "verify",
        "commit", "transport")


def hwtui_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hwtui")
    except PackageNotFoundError:
        return "0+unknown"


def settings_record(**values: Any) -> dict[str, Any]:
    missing = [k for k in KEYS if k not in values]
    if missing:
        raise ValueError(f"settings record lacks {missing}")
    return {k: values[k] for k in KEYS}


def encode_slot(record: dict[str, Any]) -> bytes:
    blob = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    if len(blob) > SLOT_BYTES:
        raise HwtuiError(f"settings record of {len(blob)} bytes exceeds {SLOT_BYTES}")
    return blob + b"\0" * (SLOT_BYTES - len(blob))


def decode_slot(raw: bytes, rank: int) -> dict[str, Any]:
    try:
        rec = json.loads(raw.rstrip(b"\0"))
    except ValueError:
        raise HwtuiError(f"rank {rank} sent an unreadable settings record (a different hwtui?)") from None
    if not isinstance(rec, dict):
        raise HwtuiError(f"rank {rank} sent a settings record that is not an object")
    return rec


def first_difference(records: list[dict[str, Any]]) -> str | None:
    """One line naming the first rank whose settings differ from rank 0's, or None when all agree."""
    ref = records[0]
    for rank, rec in enumerate(records[1:], start=1):
        for key in KEYS:
            if rec.get(key) != ref.get(key):
                return (f"rank {rank} runs with {key}={rec.get(key)!r} but rank 0 with {key}={ref.get(key)!r}; "
                        "every rank must agree on its settings before any byte moves")
    return None


# ---------------------------------------------------------------- where each rank takes its bytes from


def host_facts(paths: list[str]) -> dict[str, Any]:
    """This rank's host identity and its view of the source files (never compared as settings).

    A host is its boot id plus its network namespace: ranks in different network namespaces are
    treated as different hosts even on one kernel (containers, and the tests' simulated hosts).
    A file is (device, inode, size, mtime): the same path on another machine is another file.
    """
    import os

    def read(path: str) -> str | None:
        try:
            with open(path, encoding="ascii") as fh:
                return fh.read(64).strip()
        except OSError:
            return None

    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = None
    files: list[list[int] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
            files.append([st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns])
        except OSError:
            files.append(None)
    # The user: a host leader's staging copy is readable by its own user only (0600).
    return {"boot_id": read("/proc/sys/kernel/random/boot_id"), "netns": netns, "files": files, "uid": os.geteuid()}


def same_host_reason(mine: dict[str, Any], source: dict[str, Any]) -> tuple[bool, str]:
    """(uses the source's page cache, why) for a receiver with facts ``mine`` against the source's."""
    if not mine.get("boot_id") or mine.get("boot_id") != source.get("boot_id"):
        return False, "another host (boot id differs)"
    if mine.get("netns") != source.get("netns"):
        return False, "another network namespace (treated as another host)"
    if None in mine.get("files", [None]) or mine.get("files") != source.get("files"):
        return False, "same host, but the source file is not the same file here (device/inode/size/mtime)"
    return True, "same boot id and the same source file (device/inode/size/mtime)"
