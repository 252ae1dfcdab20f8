"""The coordinator's view of each worker process, and how one is started.

Every worker is a :class:`hwtui.core.supervisor.Child` in its own session: commands go to its
stdin, its answers come back on the supervisor's dedicated answer pipe (watched by one
:class:`~hwtui.core.supervisor.Group`), and its output lands on our stderr (the worker points its
stdout there itself, so ``--events -`` on our stdout stays clean).
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hwtui.core.supervisor import Child, encode_message
from hwtui.engine.training.queue import Unit
from hwtui.probes.vendor_envs import interpreter_for

MAX_AHEAD = 16  # the most units a worker may hold granted beyond the one it trains (worker.ahead_depth)


@dataclass
class WorkerState:
    rank: int
    ref: Any  # DeviceRef
    child: Child
    alive: bool = True
    hello: dict[str, Any] | None = None
    gen: int = -1
    pending: dict[str, Any] | None = None  # a request awaiting our answer
    held: list[Unit] = field(default_factory=list)  # chunks/pieces granted, not reported done: [training, prefetched]
    in_merge: bool = False
    samples: int = 0
    chunks_claimed: int = 0
    chunks_done: int = 0
    busy_samples: int = 0  # samples it trained (lost ones included: its speed, not its merged work)
    busy_seconds: float = 0.0
    round_busy: float = 0.0  # seconds spent training chunks in the current round
    round_first: float | None = None  # when its first chunk of the round began (monotonic clock)
    round_last: float | None = None  # when its last chunk of the round ended
    losses: list[float] = field(default_factory=list)
    mem_used: int | None = None
    mem_total: int | None = None
    lost_reason: str | None = None
    requeued: int = 0
    samples_discarded: int = 0
    last_emit: float = 0.0
    chunk_time: float | None = None  # its seconds per chunk (schedule.chunk_estimate of ``recent``)
    recent: deque[float] = field(default_factory=deque)  # its last chunk times, newest last
    started_at: float = 0.0  # when the first chunk of ``held`` began (grant if idle, else the previous done)
    start_mode: str = ""  # "forked ..." or "exec'd ...: why" (a debug line at start)

    @property
    def device(self) -> str:
        return str(self.ref.spec)

    @property
    def pending_kind(self) -> str | None:
        return None if self.pending is None else self.pending.get("kind")

    def send(self, msg: dict[str, Any]) -> None:
        proc = self.child.proc
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write(encode_message(msg))
            proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it died; the liveness check reports it

    def reply(self, msg: dict[str, Any]) -> None:
        self.pending = None
        self.send(msg)

    def exit_code(self) -> int | None:
        return self.child.poll()


def worker_env(ref: Any, cpu_threads: int) -> dict[str, str]:
    env = dict(os.environ)
    if ref.backend != "cpu":
        # So torch's cuda:N is the N the inventory printed. Not on a CPU worker, which opens no
        # device: a CUDA_* variable the launcher lacks would make it exec rather than fork.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.setdefault("GLOO_SOCKET_IFNAME", loopback_ifname())  # every rank is on this machine
    env["HF_HUB_OFFLINE"] = env["TRANSFORMERS_OFFLINE"] = "1"  # --model is local: never a hub download
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if ref.backend == "cpu":
        env["OMP_NUM_THREADS"] = str(cpu_threads)  # per worker: a forked one applies it after the fork
    return env


def start_worker(rank: int, ref: Any, cpu_threads: int, launcher_refusal: str | None = None) -> WorkerState:
    """Start one worker; its config follows with :meth:`WorkerState.send` (nothing pickled).

    A CPU worker is forked from this launcher, which preloaded what it imports
    (:mod:`~hwtui.engine.training.worker_fork`; ``launcher_refusal``: why that is off); any other
    is a fresh interpreter. ``start_mode`` says which, and why.
    """
    # Not at the top: the worker process imports this module too, and needs none of the preload.
    from hwtui.engine.training.worker_fork import exec_reason

    # HWTUI_PYTHON_<BACKEND>, else the environment `hwtui setup` recorded for it, else ours.
    python = interpreter_for(ref.backend)
    why = exec_reason(ref, python, launcher_refusal)
    child = Child([python, "-m", "hwtui.engine.training.worker", "--answer-fd", "{answer_fd}"],
                  name=f"train worker {rank} ({ref.spec})", env=worker_env(ref, cpu_threads),
                  answer_pipe=True, stdin="pipe", stdout="inherit", stderr="inherit", fork=why is None).start()
    mode = f"forked from the launcher (pid {child.pid})" if child.forked else \
        f"exec'd, not forked (pid {child.pid}): {why or child.fork_refusal}"
    return WorkerState(rank, ref, child, started_at=time.monotonic(), start_mode=mode)


def loopback_ifname() -> str:
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address == "127.0.0.1" for a in addrs):
                return str(name)
    except Exception:
        pass
    return "lo"
