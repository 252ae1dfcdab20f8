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
  (tests/agent/test_device_persist.py, the bound's test);
- found by an attack on the first version of this change: a --resume of the stopped version after
  the newer one committed rolled the node back (it is now recorded as moved on from); a node that
  is the *source* of the newer push stopped its own write, which nothing then made (only a
  receiver stops it now); the node went on saying it served the stopped version when the newer
  one's report came after its disk switch; a consumer's hold on the next slot refused a --resume
  that takes no slot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
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


def _push_meanwhile(agents: str, plan: Path, ready: Callable[[], bool],
                    then: Callable[[subprocess.Popen[str]], object]) -> tuple[int, str]:
    """Push ``plan`` to ``agents`` in the background; once ``ready()``, ``then(push)``; the push's exit
    code and output once it ends (bounded; killed with its session if it has not)."""
    bg = push_bg(plan, agents)
    try:
        wait_for(ready, watch=bg)
        then(bg)
        out, err = bg.communicate(timeout=240)
    finally:
        if bg.poll() is None:
            os.killpg(bg.pid, signal.SIGKILL)
            bg.wait(10)
    return bg.returncode, out + err


def _asked_to_stop(world: Agents, version: str) -> Callable[[], bool]:  # noqa: F811
    """Agent 1 has asked its rank to stop the last push's disk write for a push of ``version``."""
    return lambda: world.replication(1)["persist"].get("superseded_by") == version


def test_a_device_copy_stopped_for_a_newer_push_never_reaches_the_disk(world, models, tmp_path):  # noqa: F811
    go = tmp_path / "go"
    paused_push(world, models["v1"][0], go, AT_FLUSH)
    code, out = _push_meanwhile(world.agents(), models["v2"][0], _asked_to_stop(world, "v2"), lambda _: go.touch())
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
    # v1 was served (from the device) and the node moved on: a --resume of it is going back, refused
    # as for a version the disk's slots held, never a roll-back of the node (it rolled back before).
    back = push(models["v1"][0], world.agents(), "--resume")
    assert back.returncode == 2 and "served version 'v1' before and moved on" in back.stdout + back.stderr, \
        back.stdout + back.stderr
    assert disk_serves(world, 1) == "v2" and device(world, 1)["serving"] == "v2"
    assert world.replication(1)["serving"] == "v2"


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

    def let_go_then_kill_the_source(bg: subprocess.Popen[str]) -> None:
        go.touch()
        world.wait_phase(0, "transfer", watch=bg)  # node 1 gave up v1's write: the push is under way
        world.kill(0)  # the source dies mid-transfer: v2 is decided nowhere

    code, out = _push_meanwhile(world.agents(), models["v2"][0], _asked_to_stop(world, "v2"), let_go_then_kill_the_source)
    assert code != 0 and "Traceback" not in out, out
    wait_for(lambda: world.replication(1)["in_flight"] is None)
    rep = world.replication(1)
    assert rep["persist"]["state"] == "superseded" and rep["persist"]["version"] == "v1", rep["persist"]
    assert rep["persist"]["by"] == "v2" and rep["serving"] == "v1" and device(world, 1)["serving"] == "v1", rep
    assert disk_serves(world, 1) == "v3"
    assert_bytes_equal(served_tensors(world, 1)[1], models["v1"][1])
    view = cli_proc.run([sys.executable, "-m", "hwtui.app", "agents", "--agents", f"127.0.0.1:{world.ports[1]}"],
                        capture_output=True, text=True, timeout=60, env=env(HWTUI_AGENT_TOKEN=TOKEN))
    assert view.returncode == 0 and "serving v1 on host slot" in view.stdout, view.stdout + view.stderr
    assert "its disk write stopped for a newer push (not on its disk)" in view.stdout, view.stdout
    # The source back (no fault): --resume of v1 brings the bytes to node 1's disk only.
    world.start(0, "--device", "cuda", **DEVICE)
    resumed = push(models["v1"][0], world.agents(), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert persisted(world, 1, "v1")["state"] == "done"
    assert disk_serves(world, 1) == "v1" and device(world, 1)["serving"] == "v1"
    assert_bytes_equal(disk_tensors(world, 1), models["v1"][1])
    slots = json.loads((world.served(1) / "SLOTS").read_text())
    assert slots[slots["serving"]] == "v1", slots


def test_a_push_this_node_is_the_source_of_waits_for_its_write(world, models, tmp_path):  # noqa: F811
    """Node 1 writing v1 to disk, then the source (rank 0) of a push of v2: it receives no copy of v2
    to write instead, so its v1 write is not stopped (stopped, nothing would ever write it, and a
    restart would serve the version before)."""
    go = tmp_path / "go"
    paused_push(world, models["v1"][0], go)
    source_first = f"127.0.0.1:{world.ports[1]},127.0.0.1:{world.ports[0]}"

    def never_asked_then_let_go(_: subprocess.Popen[str]) -> None:
        assert "superseded_by" not in world.replication(1)["persist"]
        go.touch()

    # node 1 has taken the push (busy) and waits for its write: never asked to stop it
    code, out = _push_meanwhile(source_first, models["v2"][0], lambda: _prepare(world, 1)["busy"], never_asked_then_let_go)
    assert code == 0, out
    state = persisted(world, 1, "v1")
    assert state["state"] == "done", state
    assert disk_serves(world, 1) == "v1" and device(world, 1)["serving"] == "v1"
    assert_bytes_equal(disk_tensors(world, 1), models["v1"][1])


def _prepare(agents: Agents, i: int) -> dict:  # type: ignore[type-arg]
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{agents.ports[i]}/v1/push/prepare",
                                 data=json.dumps({"world_key": "probe", "version": "v9"}).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_a_version_replaced_before_its_disk_copy_is_recorded_as_moved_on(tmp_path):
    """The commit of a newer version when the disk serves it already (its rank wrote and switched it
    before the agent read the push's report, which happened 1 run in 3 on this box): the version
    the device served before, whose write stopped, is owed no more and recorded as moved on from;
    the node serves the new version (it said the old one until its next push)."""
    from hwtui.engine.resident.resident import ResidentRank

    rr = ResidentRank(node="n1", out=tmp_path / "out", advertise="127.0.0.1")
    served = tmp_path / "out" / "served"
    (served / "CURRENT").write_text(json.dumps({"version": "v6", "file": "versions/v6/model.safetensors"}))
    try:
        rr._owed = ("v5", "d" * 64)
        rr.persist = {"state": "superseded", "version": "v5", "by": "v6"}
        with rr._lock:
            rr._record_commit({"version": "v6", "deferred": True, "plan_digest": "e" * 64})
        assert rr._owed is None and rr.serving() == "v6" and rr.persist == {"state": "done", "version": "v6"}
        assert json.loads((served / "MOVED_ON").read_text()) == {"versions": ["v5"]}
        assert rr._moved_on() == ["v5"]
    finally:
        rr.close()


def test_resume_of_a_version_the_device_serves_needs_no_free_slot(world, models):  # noqa: F811
    """A consumer holds the slot the next push would land in, and the device serves v1, whose disk
    write failed: `hwtui push --resume` of v1 takes no slot (its bytes go to disk only), so the
    hold does not refuse it (it did, at the pusher's prepare: "slot A still serves v3 to 1
    consumer(s)"); a push of a new version still is refused, and stops no write."""
    from tests.agent.test_device_resident import export

    world.start(1, "--device", "cuda", "--persist", "before-vote", **DEVICE)
    assert push(models["v3"][0], world.agents()).returncode == 0
    world.kill(1)
    world.start(1, "--device", "cuda", **DEVICE, HWTUI_TEST_FAULT="fail:rank=1,phase=persist")
    status, held = export(world, 1, body={"hold_s": 300})  # v3's slot (A): the slot the push after v1 lands in
    assert status == 200 and held["version"] == "v3", held
    assert push(models["v1"][0], world.agents()).returncode == 0
    assert persisted(world, 1, "v1")["state"] == "failed"
    refused = push(models["v2"][0], world.agents())
    assert refused.returncode != 0 and "still serves v3" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert world.replication(1)["persist"]["state"] == "failed"
    resumed = push(models["v1"][0], world.agents(), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert disk_serves(world, 1) == "v1" and device(world, 1)["serving"] == "v1"
    assert_bytes_equal(disk_tensors(world, 1), models["v1"][1])


@pytest.mark.parametrize("content", [b"", b"not json", b"[" * 100_000, b'{"versions": "v1"}', b'{"versions": [1, null, "v2"]}',
                                     b'{"versions": ["v1"' + b', "v1"' * 200_000 + b"]}"])
def test_a_moved_on_record_that_is_not_ours_is_read_as_nothing_or_its_names(tmp_path, content):
    """served/MOVED_ON as anything (empty, not JSON, nested past the parser, the wrong shapes, huge):
    read bounded, never an exception; only its version names count."""
    from hwtui.engine.resident.resident import ResidentRank

    rr = ResidentRank(node="n1", out=tmp_path / "out", advertise="127.0.0.1")
    try:
        (tmp_path / "out" / "served" / "MOVED_ON").write_bytes(content)
        assert rr._moved_on() == (["v2"] if b'"v2"' in content else [])
    finally:
        rr.close()
