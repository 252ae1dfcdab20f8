"""The test harness's own promise: an agent a test started dies with the test process, even a
SIGKILLed one (they used to outlive it, holding ports and CPU on the machine)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procfs import wait_gone

DRIVER = """
import json, os, signal, sys
from pathlib import Path
from tests import cli_proc
from tests.agent.procs import Agents
if sys.argv[2] == "zygote":
    assert cli_proc.start() is None
w = Agents(Path(sys.argv[1]), 1)
w.start(0)
print(json.dumps({"agent": w.procs[0].pid, "forked": isinstance(w.procs[0], cli_proc.ForkedCli)}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("start", ["exec", "zygote"])
def test_an_agent_started_by_a_test_dies_with_the_killed_test_process(tmp_path: Path, start: str) -> None:
    """Exec'd (setpriv gives it PDEATHSIG), or forked from the tests' CLI zygote (tests/cli_proc.py:
    the zygote dies with the test process, and its children with it)."""
    if start == "exec" and shutil.which("setpriv") is None:
        pytest.skip("no setpriv here (util-linux): exec'd agents cannot get PDEATHSIG")
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), start], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "HWTUI_TEST_CLI_EXEC": ""})
    assert proc.returncode == -9, proc.stderr[-2000:]
    started = json.loads(proc.stdout.strip().splitlines()[-1])
    assert started["forked"] == (start == "zygote"), started
    agent = started["agent"]
    wait_gone([agent], "the agent outlived the test process that started it")
