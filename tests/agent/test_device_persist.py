"""A GPU-resident receiver's disk copy made durable after the commit (``hwtui agent --persist``),
on CPU with the device slots in host memory (``HWTUI_TEST_IPC=host``), real agents on loopback.

- after-commit (the default with --device cuda): the push is reported committed while the rank is
  still held before its disk write (a ``pause`` fault at phase ``persist``): the node serves the
  version from its device slot, its disk still names the previous one, and a push of a newer
  version stops that write (never switched to) and runs; the disk then serves the newer one byte
  for byte and the state says how long it took (tests/agent/test_persist_superseded.py: the rest);
- the rank killed while it writes: the agent finishes the switch from the staged copy;
- the agent killed while the rank writes: its restart finishes it (decision + staged copy);
- a copy written whole at flush, as a GPU receiver's device copy is (``HWTUI_TEST_STAGING=at-flush``):
  its manifest and this node's decision record come with its write, the export answers from its
  header meanwhile, and when its rank dies before the write the disk stays on the last version
  (the device serves the new one) until ``hwtui push --resume``;
- before-vote: the disk serves the version before the push is reported, as before;
- ``--persist`` without ``--device cuda`` is one line, exit 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests import cli_proc  # noqa: E402
from tests.agent.helpers import TOKEN  # noqa: E402
from tests.agent.procs import Agents, env, push, push_bg  # noqa: E402
from tests.agent.test_device_resident import DEVICE, device, served_tensors  # noqa: E402
from tests.engine.replication.helpers import assert_bytes_equal  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]


def tiny_versions(d: Path, n: int = 7) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Versions v1..vn of a small model (six tensors, 16 KiB buckets) and their plans, under ``d``."""
    from safetensors.torch import save_file

    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

    g = torch.Generator().manual_seed(11)
    out: dict[str, tuple[Path, dict[str, Any]]] = {}
    for i in range(1, n + 1):
        v = f"v{i}"
        t = {f"layers.{k}.weight": torch.randn(4000 + 7 * k, generator=g) for k in range(6)}
        (d / v).mkdir()
        save_file(t, str(d / v / "model.safetensors"))
        plan = build_plan_from_files([str(d / v / "model.safetensors")], model="tiny", version=v,
                                     bucket_bytes=16 << 10, align=1)
        write_json_atomic(d / f"{v}.plan", plan)
        out[v] = (d / f"{v}.plan", t)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_versions(tmp_path_factory.mktemp("models"))


@pytest.fixture
def world(tmp_path):
    (tmp_path / "agents").mkdir()
    w = Agents(tmp_path / "agents", 2)
    w.start(0, **DEVICE)
    try:
        yield w
    finally:
        w.close()


def disk_serves(world: Agents, i: int) -> str | None:
    try:
        return json.loads((world.served(i) / "CURRENT").read_text())["version"]
    except FileNotFoundError:
        return None


def disk_tensors(world: Agents, i: int) -> dict[str, Any]:
    from safetensors.torch import load_file

    cur = json.loads((world.served(i) / "CURRENT").read_text())
    return load_file(str(world.served(i) / cur["file"]))


def persisted(world: Agents, i: int, version: str, bound_s: float = 120.0) -> dict[str, Any]:
    """Agent ``i``'s persist state once it has left "writing" for ``version`` (bounded)."""
    deadline = time.monotonic() + bound_s
    while True:
        state = world.replication(i).get("persist") or {}
        if state.get("version") == version and state.get("state") != "writing":
            return state
        assert time.monotonic() < deadline, f"node{i} never finished writing {version}: {state}"
        time.sleep(0.05)


def test_the_push_is_reported_before_the_disk_copy_and_a_newer_push_stops_its_write(world, models, tmp_path):
    go = tmp_path / "go"
    rep = paused_push(world, models["v1"][0], go)
    assert rep["serving"] == "v1" and rep["last"]["outcome"] == "committed" and rep["last"]["serving"] == "v1"
    assert disk_serves(world, 1) is None  # nothing durable on disk yet: the device serves it
    assert device(world, 1)["serving"] == "v1"
    # `hwtui agents` (the live view's rows come from the same summary) says the disk copy is owed
    view = cli_proc.run([sys.executable, "-m", "hwtui.app", "agents", "--agents", f"127.0.0.1:{world.ports[1]}"],
                        capture_output=True, text=True, timeout=60, env=env(HWTUI_AGENT_TOKEN=TOKEN))
    assert view.returncode == 0 and "serving v1 on host slot A" in view.stdout, view.stdout + view.stderr
    assert "writing v1 to disk" in view.stdout, view.stdout
    assert_bytes_equal(served_tensors(world, 1)[1], models["v1"][1])
    # A push of a newer version while v1's disk copy is being written: the agent asks the rank to
    # stop that write (v1 would be replaced on disk at once), the rank stops before its next chunk
    # (here: once let go of the fault), and the push runs. v1 never reaches the disk.
    bg = push_bg(models["v2"][0], world.agents())
    try:
        wait_for(lambda: world.replication(1)["persist"].get("superseded_by") == "v2", watch=bg)
        assert world.replication(1)["persist"]["state"] == "writing"
        go.touch()
        out, err = bg.communicate(timeout=240)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait()
    assert bg.returncode == 0, out + err
    state = persisted(world, 1, "v2")
    assert state["state"] == "done" and state["seconds"] >= 0, state
    assert disk_serves(world, 1) == "v2" and world.replication(1)["serving"] == "v2"
    assert_bytes_equal(disk_tensors(world, 1), models["v2"][1])
    assert_bytes_equal(served_tensors(world, 1)[1], models["v2"][1])
    slots = json.loads((world.served(1) / "SLOTS").read_text())
    assert slots[slots["serving"]] == "v2" and "v1" not in slots.values(), slots
    assert not (world.served(1) / "versions" / "v1").exists()  # its write was stopped, never switched to
    assert not list((world.served(1) / "staging").glob("*")) if (world.served(1) / "staging").exists() else True


def wait_for(ok: Any, bound_s: float = 120.0, watch: Any = None) -> None:
    """Until ``ok()`` (bounded; fails at once if ``watch``, a process, ends first)."""
    deadline = time.monotonic() + bound_s
    while not ok():
        assert watch is None or watch.poll() is None, "the push ended first"
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.05)


def test_a_rank_killed_writing_the_disk_copy_is_finished_by_its_agent(world, models):
    world.start(1, "--device", "cuda", **DEVICE, HWTUI_TEST_FAULT="kill:rank=1,phase=persist")
    done = push(models["v3"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
    state = persisted(world, 1, "v3")
    assert state["state"] == "done", state
    assert disk_serves(world, 1) == "v3"
    assert_bytes_equal(disk_tensors(world, 1), models["v3"][1])
    assert device(world, 1)["serving"] == "v3"


def test_an_agent_killed_while_its_rank_writes_finishes_at_its_restart(world, models, tmp_path):
    paused_push(world, models["v4"][0], tmp_path / "never")
    world.kill(1)  # its rank dies with it, before anything reached the disk's CURRENT
    assert disk_serves(world, 1) is None
    world.start(1, "--device", "cuda", **DEVICE)
    rep = world.replication(1)
    assert rep["serving"] == "v4" and any(r.startswith("v4: finished the switch") for r in rep["recovered"]), rep
    assert_bytes_equal(disk_tensors(world, 1), models["v4"][1])
    assert device(world, 1)["serving"] == "v4"
    assert_bytes_equal(served_tensors(world, 1)[1], models["v4"][1])


def test_before_vote_makes_the_disk_copy_durable_before_the_push_is_reported(world, models):
    world.start(1, "--device", "cuda", "--persist", "before-vote", **DEVICE,
                HWTUI_TEST_FAULT="kill:rank=1,phase=persist")  # never reached in this mode
    done = push(models["v5"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
    assert disk_serves(world, 1) == "v5" and world.replication(1)["persist"] == {"state": "none"}
    assert_bytes_equal(disk_tensors(world, 1), models["v5"][1])
    assert world.replication(1)["resident"]["starts"] == 1  # the rank was never killed


def test_persist_goes_with_device_cuda(tmp_path):
    done = cli_proc.run([sys.executable, "-m", "hwtui.app", "agent", "--out", str(tmp_path / "o"), "--persist",
                         "after-commit", "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60,
                        env=env())
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "--persist goes with --device cuda" in done.stderr and "Traceback" not in done.stderr


# A GPU receiver's staging copy is in device memory: no file until its flush writes it whole, so its
# manifest, CURRENT and this node's decision record are written with it, after the commit.
# HWTUI_TEST_STAGING=at-flush gives a CPU receiver that copy (kept in memory, written at flush).
AT_FLUSH = {**DEVICE, "HWTUI_TEST_STAGING": "at-flush"}


def paused_push(world: Agents, plan: Path, go: Path, env: dict[str, str] = DEVICE) -> dict[str, Any]:
    """Agent 1 (re)started with its rank held before its disk write until ``go`` exists, then ``plan``
    pushed: reported committed while the write waits. Agent 1's replication state then."""
    world.start(1, "--device", "cuda", **env, HWTUI_TEST_FAULT=f"pause:rank=1,phase=persist,until={go}")
    done = push(plan, world.agents())
    assert done.returncode == 0, done.stdout + done.stderr  # reported while the rank waits before its disk write
    rep = world.replication(1)
    assert rep["persist"]["state"] == "writing" and rep["persist"]["version"] == plan.stem, rep["persist"]  # <v>.plan
    return rep


def lose_a_device_copy(world: Agents, models: dict[str, Any]) -> None:
    """v1 written; then v2 committed with its rank killed before its copy (in memory, written at
    flush, as a GPU's is) reached the disk: the device serves v2, the disk v1."""
    world.start(1, "--device", "cuda", **AT_FLUSH)
    assert push(models["v1"][0], world.agents()).returncode == 0
    assert persisted(world, 1, "v1")["state"] == "done"
    world.kill(1)
    world.start(1, "--device", "cuda", **AT_FLUSH, HWTUI_TEST_FAULT="kill:rank=1,phase=persist")
    done = push(models["v2"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr  # committed: the device serves it
    state = persisted(world, 1, "v2")
    assert state["state"] == "failed", state


def test_a_copy_written_at_flush_is_prepared_and_decided_with_its_write(world, models, tmp_path):
    go = tmp_path / "go"
    rep = paused_push(world, models["v1"][0], go, AT_FLUSH)
    assert rep["serving"] == "v1", rep
    # nothing of v1 on this node's disk yet: no copy, no manifest, no decision record
    assert disk_serves(world, 1) is None
    assert not list(world.served(1).glob("staging/v1/manifest.json"))
    assert not (world.out(1) / "ranks" / "decisions" / "v1.json").exists()
    assert device(world, 1)["serving"] == "v1"
    # the export answers meanwhile: the tensors' places come from the copy's header, written first
    assert_bytes_equal(served_tensors(world, 1)[1], models["v1"][1])
    go.touch()
    assert persisted(world, 1, "v1")["state"] == "done"
    assert disk_serves(world, 1) == "v1" and (world.out(1) / "ranks" / "decisions" / "v1.json").exists()
    assert_bytes_equal(disk_tensors(world, 1), models["v1"][1])
    assert_bytes_equal(served_tensors(world, 1)[1], models["v1"][1])


def test_a_copy_written_at_flush_lost_with_its_rank_leaves_the_disk_on_the_last_version(world, models):
    lose_a_device_copy(world, models)
    state = persisted(world, 1, "v2")
    # The copy died with the rank before any of it reached the disk: nothing to finish from.
    assert state["state"] == "failed" and "could not be switched to" in state["error"], state
    rep = world.replication(1)
    assert rep["serving"] == "v2" and device(world, 1)["serving"] == "v2" and disk_serves(world, 1) == "v1", rep
    assert_bytes_equal(served_tensors(world, 1)[1], models["v2"][1])
    # A restart serves what the disk holds; the pusher's --resume sends v2 again.
    world.kill(1)
    world.start(1, "--device", "cuda", **AT_FLUSH)
    assert world.replication(1)["serving"] == "v1" and device(world, 1)["serving"] == "v1"
    assert_bytes_equal(served_tensors(world, 1)[1], models["v1"][1])
    resumed = push(models["v2"][0], world.agents(), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert persisted(world, 1, "v2")["state"] == "done"
    assert disk_serves(world, 1) == "v2" and device(world, 1)["serving"] == "v2"
    assert_bytes_equal(disk_tensors(world, 1), models["v2"][1])


def test_a_disk_copy_that_cannot_be_written_is_reported_and_the_next_push_persists(world, models):
    world.start(1, "--device", "cuda", **DEVICE, HWTUI_TEST_FAULT="fail:rank=1,phase=persist")
    done = push(models["v1"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
    state = persisted(world, 1, "v1")
    assert state["state"] == "failed" and "No space left on device" in state["error"], state
    assert "the staged copy is kept" in state["error"]
    rep = world.replication(1)
    assert rep["serving"] == "v1" and device(world, 1)["serving"] == "v1" and disk_serves(world, 1) is None, rep
    assert_bytes_equal(served_tensors(world, 1)[1], models["v1"][1])
    # The kept copy and this node's decision record let a restart finish v1; the next version persists.
    world.kill(1)
    world.start(1, "--device", "cuda", **DEVICE)  # its restart finishes v1 from the kept copy
    assert disk_serves(world, 1) == "v1" and any(r.startswith("v1: finished") for r in world.replication(1)["recovered"])
    assert push(models["v2"][0], world.agents()).returncode == 0
    assert persisted(world, 1, "v2")["state"] == "done" and disk_serves(world, 1) == "v2"
    assert_bytes_equal(disk_tensors(world, 1), models["v2"][1])


def test_a_copy_torn_before_it_was_durable_is_discarded_at_the_restart(world, models, tmp_path):
    """A power loss before the write: what reached the disk fails the hash against the plan, and
    the node comes back on the version before (device and disk), never on a torn copy."""
    world.start(1, "--device", "cuda", **DEVICE)
    assert push(models["v1"][0], world.agents()).returncode == 0
    assert persisted(world, 1, "v1")["state"] == "done"
    world.kill(1)
    paused_push(world, models["v2"][0], tmp_path / "never")
    world.kill(1)  # before the write: the staged copy is whole only in the page cache
    staged = world.served(1) / "staging" / "v2" / "model.safetensors"
    with open(staged, "r+b") as fh:  # what a power loss leaves of unwritten pages
        fh.seek(-4096, os.SEEK_END)
        fh.write(bytes(4096))
    world.start(1, "--device", "cuda", **DEVICE)
    rep = world.replication(1)
    assert rep["serving"] == "v1" and disk_serves(world, 1) == "v1" and device(world, 1)["serving"] == "v1", rep
    assert any(r.startswith("v2: its staged copy was discarded") for r in rep["recovered"]), rep["recovered"]
    assert not staged.exists()
    assert_bytes_equal(served_tensors(world, 1)[1], models["v1"][1])
    resumed = push(models["v2"][0], world.agents(), "--resume")  # the decided version, sent again
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert persisted(world, 1, "v2")["state"] == "done" and disk_serves(world, 1) == "v2"
    assert_bytes_equal(served_tensors(world, 1)[1], models["v2"][1])


def test_a_push_waiting_longer_than_its_bound_for_the_write_is_refused_in_one_line(world, models, tmp_path):
    """The wait for the last push's disk copy is bounded (120 s; 1 s here): past it the next push is
    refused with one line naming the write, and nothing of the node changes (the write goes on)."""
    go = tmp_path / "go"
    world.start(1, "--device", "cuda", **DEVICE, HWTUI_TEST_PERSIST_WAIT_S="1",
                HWTUI_TEST_FAULT=f"pause:rank=1,phase=persist,until={go}")
    assert push(models["v1"][0], world.agents()).returncode == 0
    refused = push(models["v2"][0], world.agents())
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "still writing version v1 to disk after 1 s; try again when it is done" in refused.stdout + refused.stderr
    rep = world.replication(1)
    assert rep["persist"]["state"] == "writing" and rep["serving"] == "v1" and rep["in_flight"] is None, rep
    assert "superseded_by" not in rep["persist"], rep["persist"]  # the refused push withdrew its stop
    assert (world.served(1) / "staging" / "v1").is_dir()  # the copy being written is untouched
    go.touch()
    assert persisted(world, 1, "v1")["state"] == "done" and disk_serves(world, 1) == "v1"
    assert push(models["v2"][0], world.agents()).returncode == 0  # and the node takes the next push
    assert persisted(world, 1, "v2")["state"] == "done"
    assert_bytes_equal(disk_tensors(world, 1), models["v2"][1])


def test_a_stopping_agent_waits_for_a_device_copys_write(world, models, tmp_path):
    """A copy in device memory dies with its rank: an agent stopped (SIGTERM: systemd's restart)
    while its rank writes it waits for the write, so the restart serves the version from disk."""
    import signal
    import subprocess

    go = tmp_path / "go"
    paused_push(world, models["v1"][0], go, AT_FLUSH)
    proc = world.procs[1]
    os.kill(proc.pid, signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(3)  # (not a wait on state: it shows the stop waiting for the write past the rank's 2 s grace)
    go.touch()
    proc.wait(60)  # and then it stops (bounded)
    world.procs.pop(1)
    assert "Traceback" not in world.logs[1].read_text()
    assert disk_serves(world, 1) == "v1"
    world.start(1, "--device", "cuda", **AT_FLUSH)
    assert world.replication(1)["serving"] == "v1" and device(world, 1)["serving"] == "v1"
    assert_bytes_equal(disk_tensors(world, 1), models["v1"][1])


def test_resume_brings_a_lost_device_copy_to_disk_without_a_restart(world, models):
    """The device serves v2 and its disk copy was lost with its rank: `hwtui push --resume` sends the
    bytes to the disk only (the device serves them already), and the disk then serves v2."""
    lose_a_device_copy(world, models)
    resumed = push(models["v2"][0], world.agents(), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rep = world.replication(1)
    assert disk_serves(world, 1) == "v2" and rep["serving"] == "v2" and rep["persist"]["state"] == "done", rep
    assert device(world, 1)["serving"] == "v2"
    assert_bytes_equal(disk_tensors(world, 1), models["v2"][1])
    assert_bytes_equal(served_tensors(world, 1)[1], models["v2"][1])
