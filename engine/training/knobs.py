"""Test-only knobs, read from the environment of the worker processes. Never needed in real use.

``HWTUI_TEST_SLOWDOWN=RANK:FACTOR[,RANK:FACTOR]``
    Make worker RANK take FACTOR times as long per batch and per held-out evaluation (it sleeps
    ``(FACTOR-1) x`` the wall time of each -- for batches the mean of its last 9, so one batch
    that waited for a busy core is not stretched FACTOR times -- waits for a busy core included,
    so beside a fast worker that waits the same it is FACTOR times slower; calibration reports
    FACTOR times less).
    The balancing benchmark uses it to build unequal workers on a CPU-only machine and prints
    the slow/fast ratio it actually got; sleeping rather than spinning keeps the core free.

``HWTUI_TEST_FAULT=RANK:ACTION:WHEN[,...]``
    ACTION is ``kill`` (the worker SIGKILLs itself: an abrupt death, like an OOM kill or a driver
    reset), ``stall`` (it SIGSTOPs itself: a hang, heartbeats stop too) or ``nan`` (it writes NaN
    into its first weight: a diverged model, which must stop the run without a checkpoint). WHEN is ``chunk=N``
    (after its N-th trained chunk) or ``merge=N`` (on entering merge round N, while the others sit
    in the collective).

``HWTUI_TEST_PREFETCH=0``
    Workers claim one chunk at a time (each chunk waits for a round trip through the
    coordinator), as before prefetching existed: the balancing benchmark's ``--no-prefetch``
    uses it to measure what prefetching buys.

``HWTUI_TEST_HALVES=1``
    Read by the coordinator: with ``--balance dynamic`` the last chunk of every round is handed
    out in two halves (the finer tail), whatever the timing says, so a short test run surely
    records and replays pieces.

``HWTUI_TEST_CHECKPOINT_DELAY=SECONDS``
    Sleep between writing a checkpoint's tensors and committing it, so a test can kill the
    writer in the middle of a checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    action: str  # kill | stall | nan
    trigger: str  # chunk | merge
    at: int


def slowdown(rank: int, env: Mapping[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    for part in filter(None, env.get("HWTUI_TEST_SLOWDOWN", "").split(",")):
        r, _, factor = part.partition(":")
        if r.strip() == str(rank):
            return max(1.0, float(factor))
    return 1.0


def faults(rank: int, env: Mapping[str, str] | None = None) -> list[Fault]:
    env = os.environ if env is None else env
    out = []
    for part in filter(None, env.get("HWTUI_TEST_FAULT", "").split(",")):
        r, action, when = part.split(":")
        trigger, _, at = when.partition("=")
        if r.strip() == str(rank) and action in ("kill", "stall", "nan") and trigger in ("chunk", "merge"):
            out.append(Fault(action, trigger, int(at)))
    return out


def checkpoint_delay(env: Mapping[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    return float(env.get("HWTUI_TEST_CHECKPOINT_DELAY", "0") or 0)


def prefetch(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("HWTUI_TEST_PREFETCH", "1").strip() != "0"


def halves(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("HWTUI_TEST_HALVES", "0").strip() == "1"
