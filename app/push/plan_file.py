"""A plan file as the pusher sends it: its own bytes, and the four facts it needs from its header."""

from __future__ import annotations

import json
import struct
from typing import Any, TypedDict

from hwtui.core.errors import HwtuiError


class PlanFacts(TypedDict):
    digest: str
    model: Any  # as the plan names it (the report repeats it)
    version: str
    total_bytes: int


def plan_payload(path: str) -> bytes:
    """The plan file's own bytes: the agents load exactly the file that was validated here, and
    refuse it if its digest is not the validated one (a file replaced between the two reads
    included). Bounded by what an agent accepts as one plan (``MAX_PLAN_BYTES``)."""
    from hwtui.engine.resident import resident

    try:
        with open(path, "rb") as fh:
            raw = fh.read(resident.MAX_PLAN_BYTES)
            if fh.read(1):
                raise HwtuiError(f"plan {path} is larger than an agent accepts ({resident.MAX_PLAN_BYTES >> 20} MiB)")
    except OSError as exc:
        raise HwtuiError(f"cannot read plan {path}: {exc.strerror or exc}") from None
    return raw


def plan_facts(raw: bytes, path: str) -> PlanFacts:
    """What the pusher needs from a plan file (digest, model, version, total bytes), read from its
    header alone: no numpy, no tables (0.3-0.4 s of every push's start-up). The plan is validated
    where its weights are, by the source's agent, when it is uploaded (``validate=1``) and before
    any rank starts; every agent checks that the bytes are this digest."""
    try:
        if raw[:8] == b"HWTPLAN2":  # hwtui.plan/2: magic, u64 header length, JSON header (plan_format.py)
            (hlen,) = struct.unpack("<Q", raw[8:16])
            head = json.loads(raw[16:16 + hlen]) if 16 + hlen <= len(raw) else None
        else:  # an hwtui.plan/1 JSON plan
            head = json.loads(raw)
    except (ValueError, struct.error, RecursionError):
        head = None
    if not isinstance(head, dict) or (raw[:8] != b"HWTPLAN2" and head.get("schema") != "hwtui.plan/1"):
        raise HwtuiError(f"plan {path} is not an hwtui plan (write one with `hwtui plan`)")
    digest, model, version, total = (head.get(k) for k in ("digest", "model", "version", "total_bytes"))
    if not (isinstance(digest, str) and isinstance(version, str) and type(total) is int and total >= 0):
        raise HwtuiError(f"plan {path} is malformed: its header lacks a digest, version or total_bytes")
    return {"digest": digest, "model": model, "version": version,
            "total_bytes": total}
