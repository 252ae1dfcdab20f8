"""The receiver's spare staging file is idle work: made only where the next push can use it, and
given up the moment a push arrives (engine.resident.spare, resident_child._make_spare).

Real agents on loopback. Before, a receiver zero-filled and fsynced a spare of the whole model
after every committed push, also where pushes stage in device memory and never take one, and a
push that arrived meanwhile waited in the rank's command channel for it (0.27 s of a 0.96 s warm
push of 256 MiB, back to back, on this box).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.agent.procs import Agents, push, until  # noqa: E402
from tests.agent.test_device_persist import tiny_versions  # noqa: E402
from tests.agent.test_device_resident import DEVICE, served_tensors  # noqa: E402
from tests.engine.replication.helpers import assert_bytes_equal  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]


def _spare_settled(world: Agents, i: int) -> dict[str, Any]:
    def spare() -> dict[str, Any]:
        return dict(world.replication(i).get("spare") or {})

    until(f"node{i}'s spare settled", lambda: spare().get("state") not in (None, "none", "preparing"), bound_s=120.0,
          step_s=0.02)
    return spare()


def _spare_file(world: Agents, i: int) -> Path:
    return world.served(i) / "spare" / "model.safetensors"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_versions(tmp_path_factory.mktemp("models"), 2)


@pytest.fixture
def world(tmp_path):
    (tmp_path / "agents").mkdir()
    w = Agents(tmp_path / "agents", 2)
    try:
        yield w
    finally:
        w.close()


def test_a_host_staged_receiver_makes_a_spare_of_the_served_size_and_the_next_push_takes_it(world, models):
    world.start(0)
    world.start(1)
    for v in ("v1", "v2"):
        done = push(models[v][0], world.agents())
        assert done.returncode == 0, done.stdout + done.stderr
        spare = _spare_settled(world, 1)
        assert spare["state"] == "ready" and spare["stopped"] == 0, spare
        served = world.served(1) / "versions" / v / "model.safetensors"
        assert spare["bytes"] == _spare_file(world, 1).stat().st_size == served.stat().st_size
        st = os.lstat(_spare_file(world, 1))
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid()
        assert not (world.served(1) / "spare" / ".spare.tmp").exists()


def test_a_receiver_whose_pushes_stage_in_device_memory_makes_no_spare(world, models):
    """A GPU receiver's staging copy lives in device memory and writes its file whole at its flush
    (``HWTUI_TEST_STAGING=at-flush`` gives a CPU receiver that copy): a spare would never be used."""
    at_flush = {**DEVICE, "HWTUI_TEST_STAGING": "at-flush"}
    world.start(0, **DEVICE)
    world.start(1, "--device", "cuda", **at_flush)
    done = push(models["v1"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
    spare = _spare_settled(world, 1)
    assert spare["state"] == "skipped" and "device memory" in spare["reason"], spare
    assert not _spare_file(world, 1).exists() and not (world.served(1) / "spare" / ".spare.tmp").exists()
    version, tensors = served_tensors(world, 1)
    assert version == "v1"
    assert_bytes_equal(tensors, models["v1"][1])


def test_a_push_arriving_while_the_spare_is_made_stops_it_and_runs_at_once(world, models):
    """``HWTUI_TEST_SPARE_HOLD`` holds the making of each spare until a command is waiting (30 s at
    most): the second push must stop it (counted in ``spare.stopped``) instead of waiting for it, and
    commit. Were the stop not seen, the held spare would be finished (``ready``) and counted 0."""
    world.start(0)
    world.start(1, HWTUI_TEST_SPARE_HOLD="1")
    done = push(models["v1"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
    done = push(models["v2"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
    spare = world.replication(1)["spare"]
    # v1's spare was given up for v2; v2's own is held now (until the agent stops).
    assert spare["stopped"] == 1 and spare["state"] == "preparing", spare
    assert not _spare_file(world, 1).exists()
    served = world.served(1) / "versions" / "v2" / "model.safetensors"
    from safetensors.torch import load_file

    assert_bytes_equal(load_file(str(served)), models["v2"][1])


def test_an_agent_starting_removes_half_made_and_stopped_spares_a_killed_rank_left(world):
    """A rank killed mid-spare leaves its temporary file, or a stopped spare renamed away whose
    unlink had not run: a gigabyte each. The agent's start removes both, and nothing else there."""
    spare_dir = world.served(1) / "spare"
    spare_dir.mkdir(parents=True)
    for name in (".spare.tmp", ".spare.discard.4242.139872", "model.safetensors"):
        (spare_dir / name).write_bytes(b"\0" * 4096)
    world.start(1)
    world.replication(1)  # answering: its start-up recovery is done
    assert sorted(p.name for p in spare_dir.iterdir()) == ["model.safetensors"]


def test_a_rank_that_dies_making_its_spare_is_a_failed_spare_not_preparing_for_ever(world, models):
    """The spare is the rank's idle work: a rank killed while making it (the OOM killer, an
    operator) left the agent saying "preparing" for as long as it lived."""
    import signal

    world.start(0)
    world.start(1, HWTUI_TEST_SPARE_HOLD="1")  # the spare waits for a command: the rank is caught making it
    done = push(models["v1"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
    state = world.replication(1)
    assert state["spare"]["state"] == "preparing", state["spare"]
    os.kill(state["resident"]["pid"], signal.SIGKILL)
    spare = _spare_settled(world, 1)
    assert spare["state"] == "failed" and "killed by SIGKILL while making it" in spare["reason"], spare
    # The next push starts a new rank and commits.
    done = push(models["v2"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
