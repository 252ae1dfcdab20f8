"""A push of a newer version stops the write of the last push's disk copy (``hwtui agent --persist
after-commit``), on CPU with the device slots in host memory (``HWTUI_TEST_IPC=host``), real agents
on loopback.

Why: a GPU-resident receiver writes its disk copy after the push is reported, 1.4-1.7 s per GiB on
the H200 runs, and a push arriving meanwhile waited for all of it; a trainer pushing faster than
the disk writes was held to the disk's pace. Now the device serves the newest version at once and
the disk is brought to the newest version the pushes leave time for:

- a copy written whole at flush (a GPU receiver's device copy, ``HWTUI_TEST_STAGING=at-flush``)
  stopped for the next push: never switched to, no decision record, no file left; the newer
  version on disk byte for byte;
- the push that stopped it failing: the node serves the version from its device and says its disk
  is behind (`hwtui agents`, the live view), a restart serves what the disk holds, and `hwtui push
  --resume` brings the version to disk;
- a push refused while it waited for the rank to stop (its bound): the write goes on and ends done
  (tests/agent/test_device_persist.py, the bound's test).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests import cli_proc  # noqa: E402
from tests.agent.helpers import TOKEN  # noqa: E402
from tests.agent.procs import Agents, env, push, push_bg  # noqa: E402
from tests.agent.test_device_persist import (  # noqa: E402
    AT_FLUSH,
    disk_serves,
    disk_tensors,
    models,  # noqa: F401 - the module's fixture
    paused_push,
    persisted,
    wait_for,
    world,  # noqa: F401 - the module's fixture
)
from tests.agent.test_device_resident import DEVICE, device, served_tensors  # noqa: E402
from tests.engine.replication.helpers import assert_bytes_equal  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]


def _superseding_push(agents: Agents, plan: Path, go: Path) -> tuple[int, str]:
    """Push ``plan`` while agent 1's rank is held before the last push's disk write (``go``): once
    agent 1 has asked its rank to stop that write, let the rank go; the push's exit code and output."""
    bg = push_bg(plan, agents.agents())
    try:
        wait_for(lambda: agents.replication(1)["persist"].get("superseded_by") == plan.stem, watch=bg)
        go.touch()
        out, err = bg.communicate(timeout=240)
    finally:
        if bg.poll() is None:
            os.killpg(bg.pid, signal.SIGKILL)
            bg.wait(10)
    return bg.returncode, out + err


def test_a_device_copy_stopped_for_a_newer_push_never_reaches_the_disk(world, models, tmp_path):  # noqa: F811
    go = tmp_path / "go"
    paused_push(world, models["v1"][0], go, AT_FLUSH)
    code, out = _superseding_push(world, models["v2"][0], go)
    assert code == 0, out
    assert persisted(world, 1, "v2")["state"] == "done"
    assert disk_serves(world, 1) == "v2" and device(world, 1)["serving"] == "v2"
    assert_bytes_equal(disk_tensors(world, 1), models["v2"][1])
    assert_bytes_equal(served_tensors(world, 1)[1], models["v2"][1])
    # v1's copy was written whole at flush, and its flush was stopped: nothing of it on this disk
    assert not (world.served(1) / "versions" / "v1").exists()
    assert not (world.out(1) / "ranks" / "decisions" / "v1.json").exists()
    assert not (world.served(1) / "staging" / "v1").exists()
    assert "Traceback" not in world.logs[1].read_text()


def test_a_superseding_push_that_fails_leaves_the_disk_behind_said_and_resume_settles_it(world, models, tmp_path):  # noqa: F811
    """The push that stopped v1's write dies with its source: the device serves v1 (its slot was
    never given up), the disk the version before, and every view says so; `hwtui push --resume`
    of v1 brings it to disk without touching the device."""
    go, hold = tmp_path / "go", tmp_path / "hold"
    world.start(1, "--device", "cuda", "--persist", "before-vote", **DEVICE)
    assert push(models["v3"][0], world.agents()).returncode == 0  # v3 on both disks: "the version before"
    world.kill(1)
    # The source held at its second bucket of every push while ``hold`` is missing.
    hold.touch()
    world.kill(0)
    world.start(0, "--device", "cuda", **DEVICE, HWTUI_TEST_FAULT=f"pause:rank=0,bucket=1,until={hold}")
    paused_push(world, models["v1"][0], go)
    hold.unlink()
    bg = push_bg(models["v2"][0], world.agents())
    try:
        wait_for(lambda: world.replication(1)["persist"].get("superseded_by") == "v2", watch=bg)
        go.touch()
        world.wait_phase(0, "transfer", watch=bg)  # node 1 gave up v1's write: the push is under way
        world.kill(0)  # the source dies mid-transfer: v2 is decided nowhere
        out, err = bg.communicate(timeout=240)
    finally:
        if bg.poll() is None:
            os.killpg(bg.pid, signal.SIGKILL)
            bg.wait(10)
    assert bg.returncode != 0 and "Traceback" not in err, out + err
    wait_for(lambda: world.replication(1)["in_flight"] is None)
    rep = world.replication(1)
    assert rep["persist"]["state"] == "superseded" and rep["persist"]["version"] == "v1", rep["persist"]
    assert rep["persist"]["by"] == "v2" and rep["serving"] == "v1" and device(world, 1)["serving"] == "v1", rep
    assert disk_serves(world, 1) == "v3"
    assert_bytes_equal(served_tensors(world, 1)[1], models["v1"][1])
    view = cli_proc.run([sys.executable, "-m", "hwtui.app", "agents", "--agents", f"127.0.0.1:{world.ports[1]}"],
                        capture_output=True, text=True, timeout=60, env=env(HWTUI_AGENT_TOKEN=TOKEN))
    assert view.returncode == 0 and "serving v1 on host slot" in view.stdout, view.stdout + view.stderr
    assert "its disk write stopped for a newer push (the disk serves the version before)" in view.stdout, view.stdout
    # The source back (no fault): --resume of v1 brings the bytes to node 1's disk only.
    world.start(0, "--device", "cuda", **DEVICE)
    resumed = push(models["v1"][0], world.agents(), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert persisted(world, 1, "v1")["state"] == "done"
    assert disk_serves(world, 1) == "v1" and device(world, 1)["serving"] == "v1"
    assert_bytes_equal(disk_tensors(world, 1), models["v1"][1])
    slots = json.loads((world.served(1) / "SLOTS").read_text())
    assert slots[slots["serving"]] == "v1", slots
