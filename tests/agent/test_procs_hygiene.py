"""The test harness's own promise: an agent a test started dies with the test process, even a
SIGKILLed one (they used to outlive it, holding ports and CPU on the machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procfs import wait_gone

DRIVER = """
import json, os, signal, sys
from pathlib import Path
from tests.agent.procs import Agents
w = Agents(Path(sys.argv[1]), 1)
w.start(0)
print(json.dumps({"agent": w.procs[0].pid}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv here (util-linux): agents cannot get PDEATHSIG")
def test_an_agent_started_by_a_test_dies_with_the_killed_test_process(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == -9, proc.stderr[-2000:]
    agent = json.loads(proc.stdout.strip().splitlines()[-1])["agent"]
    wait_gone([agent], "the agent outlived the test process that started it")
