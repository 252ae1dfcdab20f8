"""Agents as real processes on loopback (`hwtui agent --out DIR`), each with its own resident rank, so a
test can SIGKILL or SIGTERM an agent at a phase of a push and restart it (on a new port).

Waits are on state (an agent's reported push phase, read from ``GET /v1/replication``), each bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import cli_proc
from tests.agent.helpers import TOKEN

# An agent that imports torch for its resident rank on a loaded box: generous, and only a bound.
START_S = 120.0


def until(what: str, cond: Any, bound_s: float = 60.0, step_s: float = 0.05) -> None:
    """Wait until ``cond()`` holds: on state, bounded (an AssertionError naming ``what`` after ``bound_s``)."""
    deadline = time.monotonic() + bound_s
    while not cond():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(step_s)


def small_tmpfs(parent: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. "1m") of its own under ``parent`` (root only; skips otherwise),
    unmounted whatever the test did: a disk that fills, for the full-disk tests."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where = parent / f"tmpfs-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("HWTUI_", "MASTER_", "RANK", "WORLD_SIZE"))}
    # HWTUI_TALLY_WAIT_S: a rank killed or failed after the decision never reports what it serves,
    # and the source's rank waited the whole commit timeout for it (15 s, three times in
    # test_push_recovery); a resident rank's tally feeds no report (the pusher reads every node
    # back itself), so these tests lose nothing by a short one.
    out.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "HWTUI_AGENT_TOKEN": TOKEN,
                "HWTUI_TALLY_WAIT_S": "2", **extra})
    return out


def _die_with_us() -> list[str]:
    """A test's agent gets SIGKILL when the test process dies (a SIGKILLed pytest left its agents
    running, holding ports and CPU): ``setpriv --pdeathsig`` before the exec, where setpriv exists.
    Only from the main thread: the signal fires when the *thread* that started the child ends."""
    import shutil
    import threading

    if threading.current_thread() is threading.main_thread() and (tool := shutil.which("setpriv")):
        return [tool, "--pdeathsig", "KILL", "--"]
    return []


class Agents:
    """``n`` agents named node0..node<n-1> on 127.0.0.1, node0 the source of every push."""

    def __init__(self, tmp: Path, n: int = 3):
        self.tmp = tmp
        self.n = n
        self.token_file = tmp / "agent.token"
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o600)
        self.ports: dict[int, int] = {}
        self.procs: dict[int, subprocess.Popen[str]] = {}
        self.logs: dict[int, Path] = {}

    def out(self, i: int) -> Path:
        return self.tmp / f"node{i}"

    def served(self, i: int) -> Path:
        return self.out(i) / "served"

    def agents(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[i]}" for i in range(self.n))

    def start(self, i: int, *args: str, **extra: str) -> None:
        # A fresh port each start (``agents()`` names the current ones): reusing a dead agent's
        # port could race another test's ephemeral bind on a loaded box.
        port = 0
        self.logs[i] = self.tmp / f"node{i}.{len(list(self.tmp.glob(f'node{i}.*.log')))}.log"
        argv = [sys.executable, "-m", "hwtui.app", "agent", "--listen", f"127.0.0.1:{port}", "--token-file",
                str(self.token_file), "--node", f"node{i}", "--out", str(self.out(i)), "--check-interval", "3600",
                "--interval", "0.5", *args]
        kw: dict[str, Any] = {"env": env(**extra), "start_new_session": True}
        with open(self.logs[i], "w") as log:
            # Forked from the tests' zygote where it can be (it dies with the shard, and so do its
            # children), else exec'd under setpriv so that it dies with the test.
            wrap = [] if cli_proc.why_exec(argv, kw["env"], kw) is None else _die_with_us()
            proc = cli_proc.Popen([*wrap, *argv], stdout=subprocess.PIPE, stderr=log, text=True, **kw)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the agent's one line: bounded by its own start (or its exit)
        assert "listening on" in line, self.logs[i].read_text()
        self.ports[i] = int(line.rsplit(":", 1)[1])
        self.procs[i] = proc

    def kill(self, i: int, sig: int = signal.SIGKILL) -> str:
        """Signal agent ``i`` (its resident rank dies with it) and wait for it: its log."""
        proc = self.procs.pop(i)
        os.kill(proc.pid, sig)
        proc.wait(60)
        # The resident rank was in the agent's session: it goes with a killed agent (PR_SET_PDEATHSIG).
        return self.logs[i].read_text()

    def replication(self, i: int) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[i]}/v1/replication", timeout=10) as r:
            doc = json.loads(r.read())
        return doc.get("replication", doc) if isinstance(doc, dict) else {}

    def wait_phase(self, i: int, phase: str, bound_s: float = 120.0, watch: subprocess.Popen[str] | None = None) -> None:
        """Until agent ``i`` reports its push in flight at ``phase`` (bounded; also ends if ``watch`` exits)."""
        deadline = time.monotonic() + bound_s
        seen = None
        while time.monotonic() < deadline:
            flight = self.replication(i).get("in_flight") or {}
            seen = flight.get("phase")
            if seen == phase:
                return
            if watch is not None and watch.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"node{i} never reached phase {phase!r} (last seen {seen!r})")

    def close(self) -> None:
        for i in list(self.procs):
            self.kill(i)


# --timeout 15: the tests kill a rank mid-push, and its peers wait out this timeout in a collective
# that never completes (30 s cost 100 s of the suite); 15 s still leaves a live rank room on a busy box.
def push(plan: Path, agents: str, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return cli_proc.run([sys.executable, "-m", "hwtui.app", "push", "--plan", str(plan), "--agents", agents,
                         "--timeout", "15", "--init-timeout", "60", "--deadline", "200", *extra],
                        capture_output=True, text=True, timeout=timeout, env=env())


def push_bg(plan: Path, agents: str, *extra: str) -> subprocess.Popen[str]:
    return cli_proc.Popen([sys.executable, "-m", "hwtui.app", "push", "--plan", str(plan), "--agents", agents,
                           "--timeout", "15", "--init-timeout", "60", "--deadline", "200", *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                          start_new_session=True)


def push_and_stop(world: Agents, plan: Path, victim: int, phase: str, *extra: str, sig: int = signal.SIGKILL,
                  also: tuple[int, ...] = ()) -> tuple[int, str, str, str]:
    """Push ``plan`` in the background; once agent ``victim`` (and each of ``also``) reports the push
    at ``phase``, signal ``victim`` with ``sig``; wait for the push to end (bounded).

    Returns the push's exit code, stdout and stderr, and the victim's log. The push is SIGKILLed
    (its whole session) if it is still running when this returns, whatever failed."""
    bg = push_bg(plan, world.agents(), *extra)
    try:
        for i in (victim, *also):
            world.wait_phase(i, phase, watch=bg)
        log = world.kill(victim, sig)
        out, err = bg.communicate(timeout=120)
    finally:
        if bg.poll() is None:
            os.killpg(bg.pid, signal.SIGKILL)
            bg.wait(10)
    return bg.returncode, out, err, log
