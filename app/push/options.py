"""The settings of one push, typed and frozen: built once (by ``hwtui push`` from its arguments,
by ``hwtui train --push-to`` from its own), read by the orchestration and never changed by it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PushOptions:
    plan: str  # the plan file, its weights' paths as the source agent sees them
    agents: str  # SOURCE,RECEIVER,...: as given (the resume command repeats it)
    timeout: float  # per-bucket and commit wait (s)
    init_timeout: float  # wait for a new process group to form (s)
    deadline: float | None  # the whole push (s); None: init timeout + 2 min + 1 min per GB
    inflight: int  # buckets in flight
    chunk_mb: float  # largest collective (MiB)
    resume: bool = False  # finish a split (a decided version not switched everywhere)
    token_file: str | None = None
    cacert: str | None = None
    readers: int | None = None  # --readers: the source's file reader threads (None: the source agent's setting)
    direct_io: str | None = None  # --direct-io: auto, on, off (None: the source agent's setting)
    wait_holds: float = 0.0  # --wait-holds: how long to wait for consumers to release a held device slot (s)

    def deadline_for(self, total_bytes: int) -> float:
        """The push's deadline in seconds: the one given, else one that grows with the plan's size."""
        if self.deadline is not None:
            return self.deadline
        return self.init_timeout + 120 + 60 * total_bytes / 1e9

    def rank_settings(self) -> dict[str, Any]:
        """What every resident rank is started with (the agent checks each value's type and range)."""
        settings: dict[str, Any] = {"timeout": self.timeout, "init_timeout": self.init_timeout,
                                    "inflight": self.inflight, "chunk_mb": self.chunk_mb}
        # Only when given: otherwise the source agent's own --readers / --direct-io apply.
        settings.update({k: v for k, v in (("readers", self.readers), ("direct_io", self.direct_io)) if v is not None})
        return settings

    def resume_command(self) -> str:
        """The exact command that finishes (or settles) this push: the same plan and agents, --resume."""
        extra = [f"--{k.replace('_', '-')}={v}" for k, v in (("token_file", self.token_file), ("cacert", self.cacert)) if v]
        return shlex.join(["hwtui", "push", "--plan", self.plan, "--agents", self.agents, *extra, "--resume"])
