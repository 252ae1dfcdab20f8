"""Holds on a served device slot: a push never overwrites weights a serving process said it reads.

The agent's A/B slots rotate (engine.resident.device_slots): after the next commit, the slot a
consumer was given (``POST /v1/served/export``) is the one the push after that is received into.
A consumer that has not yet moved to the new version would read weights being overwritten under
it: a mix of two versions, with no error anywhere. So an export *holds* its slot for ``hold_s``
seconds (default :data:`DEFAULT_HOLD_S`, at most :data:`MAX_HOLD_S`; 0 takes no hold), and a push
that would be received into a held slot is refused with who holds it and until when, instead of
overwriting it. The consumer renews its hold (the same export call with its ``lease``) for as
long as it reads the slot, and releases it (``POST /v1/served/release``) once it has moved to the
newer version; a hold it forgets lapses at its expiry, so a consumer that died never blocks the
fleet's pushes for longer than the hold it asked for.

A lease id is a 128-bit secret given only to the process that exported (the token, loopback and
its user were checked first, app/node_api/peer.py): holding it is the right to renew or release.
At most :data:`MAX_HOLDS` holds live at once (a bounded table, whatever a local caller sends).
The clock is monotonic: a wall-clock step moves no expiry.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_HOLD_S = 60.0
MAX_HOLD_S = 3600.0
MAX_HOLDS = 64


class HoldError(Exception):
    """A hold asked for wrongly (bad seconds, unknown or foreign lease, table full): one line."""


@dataclass
class Hold:
    lease: str
    slot: str
    version: str
    until: float  # monotonic
    holder: str  # who asked, in words (the uid), for the refusal message and the state


def check_hold_s(value: Any) -> float:
    """``hold_s`` from an export request: a number 0..MAX_HOLD_S (absent: the default)."""
    if value is None:
        return DEFAULT_HOLD_S
    if type(value) not in (int, float) or value != value or not 0 <= value <= MAX_HOLD_S:
        raise HoldError(f"hold_s must be a number of seconds from 0 to {MAX_HOLD_S:.0f}, not {str(value)[:20]!r}")
    return float(value)


def check_lease(value: Any) -> str:
    if not isinstance(value, str) or len(value) != 32 or any(c not in "0123456789abcdef" for c in value):
        raise HoldError("lease must be the 32 hex digits an export returned")
    return value


class SlotHolds:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._holds: dict[str, Hold] = {}
        self._lock = threading.Lock()

    def _prune(self) -> None:
        now = self._clock()
        for lease in [k for k, h in self._holds.items() if h.until <= now]:
            del self._holds[lease]

    def hold(self, slot: str, version: str, seconds: float, holder: str) -> Hold | None:
        """A new hold on ``slot`` (serving ``version``) for ``seconds``; None when ``seconds`` is 0."""
        with self._lock:
            self._prune()
            if seconds <= 0:
                return None
            if len(self._holds) >= MAX_HOLDS:
                raise HoldError(f"{MAX_HOLDS} holds are live on this agent: release one (POST /v1/served/release) first")
            h = Hold(secrets.token_hex(16), slot, version, self._clock() + seconds, holder)
            self._holds[h.lease] = h
            return h

    def renew(self, lease: str, seconds: float) -> Hold:
        """``lease`` held for ``seconds`` from now, on the slot it was granted on: the consumer still
        reads that one until it has moved, whatever the agent serves now."""
        with self._lock:
            self._prune()
            held = self._holds.get(lease)
            if held is None:
                raise HoldError("that lease is not held here (it lapsed, was released, or was never this agent's)")
            held.until = self._clock() + seconds
            return held

    def release(self, lease: str) -> bool:
        with self._lock:
            self._prune()
            return self._holds.pop(lease, None) is not None

    def refusal(self, slot: str) -> str | None:
        """Why a push may not be received into ``slot`` now, or None."""
        with self._lock:
            self._prune()
            live = [h for h in self._holds.values() if h.slot == slot]
            if not live:
                return None
            last = max(live, key=lambda h: h.until)
            who = sorted({h.holder for h in live})
            return (f"slot {slot} still serves {last.version} to {len(live)} consumer(s) holding it ({', '.join(who)}); "
                    f"the last hold ends in {last.until - self._clock():.0f} s unless renewed. They release it "
                    "(POST /v1/served/release) once they have moved to the served version")

    def state(self) -> list[dict[str, Any]]:
        """The live holds without their lease ids (the state is readable by any token holder)."""
        with self._lock:
            self._prune()
            now = self._clock()
            return [{"slot": h.slot, "version": h.version, "left_s": round(h.until - now, 1), "holder": h.holder}
                    for h in sorted(self._holds.values(), key=lambda h: h.until)]
