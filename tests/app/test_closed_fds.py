"""hwtui started with its standard descriptors closed (`hwtui replicate ... >&-`, a service
manager that closes them): the command runs and exits as with them open. It used to be an
internal error (exit 3, "'NoneType' object has no attribute 'write'") after the work was done, and
the next file hwtui opened took descriptor 1, where every inheriting child writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _closing(*fds: int):  # type: ignore[no-untyped-def]
    def pre() -> None:
        for fd in fds:
            os.close(fd)
    return pre


@pytest.mark.parametrize("closed", [(1,), (0, 1)], ids=["stdout", "stdin+stdout"])
def test_replicate_with_its_stdout_closed_runs_and_says_so_on_stderr(tmp_path: Path, closed: tuple[int, ...]) -> None:
    pytest.importorskip("torch")
    from tests.engine.replication.helpers import make_model, write_plan

    model = tmp_path / "model"
    model.mkdir()
    make_model(model)
    plan = tmp_path / "v1.plan"
    write_plan(model, plan, version="v1")
    report = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "hwtui.app", "replicate", "--plan", str(plan), "--nproc", "2",
                           "--report", str(report)], stderr=subprocess.PIPE, text=True, timeout=180,
                          preexec_fn=_closing(*closed), env={**os.environ, "PYTHONPATH": str(REPO)})  # noqa: PLW1509
    assert done.returncode == 0, done.stderr[-2000:]
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert json.loads(report.read_text())["ok"] is True
