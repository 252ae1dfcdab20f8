"""`hwtui replicate` forks its CPU ranks from the launcher (one `import torch`): they are still its
own children in their own sessions, and a SIGKILLed launcher takes them with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import cli_proc
from tests.engine.replication.helpers import make_model, write_plan
from tests.procfs import alive, children

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]


def torch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (got := cond()):
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("fork", ["1", "0"])
def test_sigkill_of_the_launcher_takes_every_rank(tmp_path: Path, fork: str) -> None:
    make_model(tmp_path / "m", n=4, big=1000)
    write_plan(tmp_path / "m", tmp_path / "p.plan", version="v1")
    env = {**os.environ, "HWTUI_TEST_FAULT": "hang:rank=2", "HWTUI_FORK_RANKS": fork}
    launcher = cli_proc.Popen([sys.executable, "-m", "hwtui", "replicate", "--plan", str(tmp_path / "p.plan"), "--nproc", "3"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        ranks = wait_for(lambda: (c := children(launcher.pid)) and len(c) == 3 and c, 120, "3 ranks")
        cmd = Path(f"/proc/{launcher.pid}/cmdline").read_bytes()
        # Settled: torch is mapped (an exec'd rank has exec'd by then) and setsid is done.
        wait_for(lambda: all(torch_loaded(p) for p in ranks), 120, "torch in every rank")
        wait_for(lambda: all(os.getsid(p) == p for p in ranks), 60, "each rank in its own session")
        for pid in ranks:
            # A forked rank keeps the launcher's command line; an exec'd one is `-m ...worker`.
            assert (Path(f"/proc/{pid}/cmdline").read_bytes() == cmd) == (fork == "1")
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(30)
        wait_for(lambda: not any(alive(p) for p in ranks), 60, "the ranks to die with the launcher")
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(30)
