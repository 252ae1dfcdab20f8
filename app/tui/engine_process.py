"""The engine as a child process: command lines, a line reader, and a clean stop.

The engine runs in its own processes (a crash or a hung collective must not take the TUI with
it) and in its own session, so stopping it signals the whole process group, spawned ranks
included. This module knows nothing of Textual: the Run screen drives it from a thread worker.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwtui.app.tui.config import TuiConfig
from hwtui.core.supervisor import STOP_GRACE_S, Child


@dataclass(frozen=True)
class Stage:
    name: str  # "plan" | "run"
    argv: list[str]


def build_stages(cfg: TuiConfig, defaults: dict[str, Any], workdir: Path) -> list[Stage]:
    """The commands for the user's choices: ``hwtui plan`` first when they picked weights."""
    hw = [sys.executable, "-m", "hwtui.app"]
    if cfg.mode == "cluster":
        return [cluster_test_stage(cfg, defaults)]
    nproc = cfg.nproc or int(defaults["nproc"])
    if cfg.mode == "train":
        gpu_ids = cfg.gpu_ids or str(defaults["gpu_ids"])
        model = ["--model", cfg.train_model] if cfg.train_model else []
        data = ["--data", os.path.expanduser(cfg.train_data)] if cfg.train_data else []
        return [Stage("run", [*hw, "train", "--gpu-ids", gpu_ids, "--steps", str(cfg.steps), *model, *data,
                              "--events", "-"])]
    stages: list[Stage] = []
    plan = cfg.plan
    if cfg.source == "weights":
        plan = str(workdir / "model.plan")  # binary hwtui.plan/2: `hwtui plan` warns about a *.json name
        bucket_mb = cfg.bucket_mb or int(defaults["bucket_mb"])
        stages.append(Stage("plan", [*hw, "plan", "--weights", cfg.weights, "--bucket-mb", str(bucket_mb), "-o", plan]))
    stages.append(Stage("run", [
        *hw, "replicate", "--plan", plan, "--device", cfg.device or str(defaults["device"]),
        "--nproc", str(nproc), "--inflight", str(cfg.window or defaults["window"]),
        "--chunk-mb", str(cfg.chunk_mb or defaults["chunk_mb"]), "--events", "-",
    ]))
    return stages


ENGINE_EXTRA = 'pip install "hwtui[engine]"'  # under pip; engine_extra_problem() says uv's or pipx's words there
# The modules the engine extra brings (app/cli.py's ENGINE_EXTRA_MODULES names the same; not
# imported from there because the CLI imports the TUI: that would be an import cycle).
ENGINE_MODULES = ("torch", "xxhash", "safetensors", "numpy")


def missing_engine_modules() -> list[str]:
    """The engine extra's modules this interpreter cannot import (the CLI names the same ones)."""
    import importlib.util

    return [m for m in ENGINE_MODULES if importlib.util.find_spec(m) is None]


def engine_extra_problem() -> str:
    """One line saying what to install before a run, or "" when the engine can run."""
    from hwtui.core.install_hint import install_command

    missing = missing_engine_modules()
    return f"the engine needs {', '.join(missing)}: {install_command('engine')}" if missing else ""


def hardware_not_here(cfg: TuiConfig, defaults: dict[str, Any]) -> str:
    """Why a run of these choices needs devices a replayed machine has and this one has not ("" if none).

    A replay shows another machine's figures; only CPU ranks can run here on its behalf.
    """
    if cfg.mode == "cluster":
        return ""  # the smoke test runs ranks on whatever this machine has (CPU ranks over gloo at least)
    if cfg.mode == "train":
        ids = [i.strip() for i in (cfg.gpu_ids or str(defaults["gpu_ids"])).split(",") if i.strip()]
        foreign = [i for i in ids if not i.startswith("cpu")]
        return f"devices {','.join(foreign)} belong to the replayed machine" if foreign else ""
    device = cfg.device or str(defaults["device"])
    return f"device {device} belongs to the replayed machine" if device != "cpu" else ""


def cluster_test_stage(cfg: TuiConfig, defaults: dict[str, Any]) -> Stage:
    """The smoke test as this machine can run it: ``hwtui cluster test --events -``.

    One device per node: alone, which `cluster test` treats as a one-rank local check. More: under
    ``torchrun --standalone`` with that many ranks, so the correctness all-reduce and the bandwidth
    sweep have a link to measure. The other nodes are never started from here (the launch files
    from `cluster init` do that on each node), and ``--spec`` is left out on purpose: a lone run
    would otherwise try to rendezvous at the cluster's master address instead of on this host.
    """
    per_node = cfg.cluster_devices or int(defaults.get("devices_per_node") or 1)
    test = ["-m", "hwtui.app", "cluster", "test", "--events", "-"]
    if cfg.cluster_max_bytes:
        test += ["--max-bytes", cfg.cluster_max_bytes]
    if per_node > 1:
        # --max-restarts=0: a rank that fails is reported as it is, not hidden by a silent retry.
        return Stage("run", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                             f"--nproc-per-node={per_node}", "--max-restarts=0", *test])
    return Stage("run", [sys.executable, *test])


class EngineProcess:
    """One engine child (through hwtui.core.supervisor): stdout read line by line, stderr forwarded.

    The supervisor's :class:`Child` gives it its own session (one signal reaches every rank it
    spawned), the parent's hwtui tree on PYTHONPATH, and termination with grace; this class only
    adds the stderr pump and the lock that makes stop-before-start safe.
    """

    def __init__(self, argv: list[str], on_stderr: Callable[[str], None], env: dict[str, str] | None = None):
        self.argv = argv
        self._on_stderr = on_stderr
        self.child = Child(argv, name="engine", env={**os.environ, **(env or {})}, stdout="pipe", stderr="pipe", text=True)
        self._stderr_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.stopped = False

    def start(self) -> None:
        with self._lock:
            if self.stopped:
                raise RuntimeError("stopped before it started")
            self.child.start()
        self._stderr_thread = threading.Thread(target=self._pump_stderr, name="engine-stderr", daemon=True)
        self._stderr_thread.start()

    def _pump_stderr(self) -> None:
        stream = self.child.stderr_stream()
        assert stream is not None
        for line in stream:
            line = line.rstrip("\n")
            if line.strip():
                self._on_stderr(line)

    def lines(self) -> Iterator[str]:
        """stdout lines until the process closes it (exits or is stopped)."""
        yield from self.child.stdout_lines()

    def wait(self, timeout: float | None = None) -> int:
        rc = self.child.wait(timeout)
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=2.0)  # the last stderr lines explain a failure
        return rc

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the process group, wait ``grace_s``, then SIGKILL it. Returns the exit status."""
        with self._lock:
            self.stopped = True
        return self.child.terminate(grace_s)

    @property
    def running(self) -> bool:
        return self.child.running
