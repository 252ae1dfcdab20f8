"""Test-only fault injection, driven by ``HWTUI_TEST_FAULT`` (ignored when unset).

Syntax: ``ACTION:key=value[,key=value]`` and several faults separated by ``;``:

- ``corrupt:bucket=3[,rank=1]`` a receiver flips a byte of bucket 3 after receiving it
  (every receiver when ``rank`` is omitted): checksum verification must catch and name it;
- ``kill:rank=1[,bucket=2][,phase=prepare]`` the rank SIGKILLs itself when it reaches bucket 2
  (default: its first bucket) or, with ``phase=prepare``, right after voting material is ready;
- ``hang:rank=2[,bucket=1]`` the rank stops making progress (sleeps) at that bucket;
- ``pause:rank=1,bucket=1,until=/path`` the rank waits there until ``/path`` exists (at most
  ``PAUSE_MAX_S``): a test looks at the run in a state it chose, then lets it go on;
- ``term:rank=1,phase=commit`` the rank sends itself SIGTERM there;
- ``fail:rank=2,phase=load`` the rank's next file operation fails there (an OSError, as from a
  full or immutable disk).

Phases: ``load`` (before the world forms), ``setup`` (rank 0, its /dev/shm staging copy made,
before the start barrier), ``current`` (a receiver, inside prepare, as it writes the CURRENT that
will serve the new version: a full disk there must make it vote no), ``prepare`` (prepared,
before the vote), ``decide`` (rank 0, after a unanimous vote, before the decision record is
written), ``commit`` (after the decision, before this rank switches), ``switched`` (between
the switch's two renames: ``versions/<v>`` is in place, CURRENT not yet) and ``persist`` (a
GPU-resident receiver with ``--persist after-commit``: after the push is reported, before its disk
copy is fsynced and switched to).

It exists so the tests can prove that corruption, a dead rank and a hung rank each end the run
with a named error and no commit; it costs one dict lookup per bucket when unset.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

ENV = "HWTUI_TEST_FAULT"
PAUSE_MAX_S = 120.0


@dataclass(frozen=True)
class Fault:
    action: str
    rank: int | None
    bucket: int | None
    phase: str | None
    until: str | None = None


def parse(spec: str | None) -> list[Fault]:
    faults = []
    for part in (spec or "").split(";"):
        part = part.strip()
        if not part:
            continue
        action, _, args = part.partition(":")
        kv = dict(a.split("=", 1) for a in args.split(",") if "=" in a)
        if action not in ("corrupt", "kill", "hang", "term", "fail", "pause"):
            raise ValueError(f"{ENV}: unknown fault {action!r}")
        if action == "pause" and not kv.get("until"):
            raise ValueError(f"{ENV}: pause needs until=<path>")
        faults.append(Fault(action, int(kv["rank"]) if "rank" in kv else None,
                            int(kv["bucket"]) if "bucket" in kv else None, kv.get("phase"), kv.get("until")))
    return faults


class Injector:
    def __init__(self, rank: int, spec: str | None = None):
        self.rank = rank
        self.faults = [f for f in parse(spec if spec is not None else os.environ.get(ENV))
                       if f.rank is None or f.rank == rank]

    def at_bucket(self, bucket: int) -> None:
        for f in self.faults:
            if f.phase is None and (f.bucket is None or f.bucket == bucket):
                self._fire(f)

    def at_phase(self, phase: str) -> None:
        for f in self.faults:
            if f.phase == phase:
                self._fire(f)

    def corrupts(self, bucket: int) -> bool:
        return any(f.action == "corrupt" and f.bucket == bucket for f in self.faults)

    def _fire(self, f: Fault) -> None:
        if f.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif f.action == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        elif f.action == "fail":
            raise OSError(28, f"injected by {ENV}: No space left on device")
        elif f.action == "hang":
            time.sleep(3600)
        elif f.action == "pause" and f.until:
            deadline = time.monotonic() + PAUSE_MAX_S
            while not os.path.exists(f.until) and time.monotonic() < deadline:
                time.sleep(0.02)
