"""Attacks on `hwtui agent --device cuda --persist after-commit` (the disk copy written after the
push is reported): requests and signals that arrive while the rank is held before its disk write
(a ``pause`` fault at phase ``persist``), on CPU with the device slots in host memory.

What a root tool must do whatever arrives meanwhile: nothing lost or half-written, the disk never
naming a torn version, every wait bounded, one clear answer, no traceback.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.agent import test_device_persist as _device_persist  # noqa: E402
from tests.agent.helpers import TOKEN  # noqa: E402
from tests.agent.procs import Agents, push, until  # noqa: E402
from tests.agent.test_device_persist import (  # noqa: E402
    AT_FLUSH,
    disk_serves,
    disk_tensors,
    lose_a_device_copy,
    paused_push,
    persisted,
)
from tests.agent.test_device_resident import DEVICE, device, served_tensors  # noqa: E402
from tests.engine.replication.helpers import assert_bytes_equal  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]

models = _device_persist.models  # the same seven versions (module-scoped fixture)
world = _device_persist.world  # two agents, node0 the source; each test starts node1 as it needs


def post(world: Agents, i: int, path: str, body: dict[str, Any], timeout: float = 200) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"http://127.0.0.1:{world.ports[i]}{path}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json",
                                                         "Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def prepared(world: Agents, i: int, version: str) -> dict[str, Any]:
    status, doc = post(world, i, "/v1/push/prepare", {"world_key": "attack-probe", "version": version}, timeout=30)
    assert status == 200, doc
    return doc


def current_file_matches(world: Agents, i: int, tensors: dict[str, Any]) -> None:
    """The disk's CURRENT names a regular file (no symlink) holding exactly ``tensors``."""
    cur = json.loads((world.served(i) / "CURRENT").read_text())
    path = world.served(i) / cur["file"]
    assert path.is_file() and not path.is_symlink(), path
    assert_bytes_equal(disk_tensors(world, i), tensors)


# ---------------------------------------------------------------- 1. resolve + the rank dying meanwhile

def test_a_resolve_waiting_for_the_write_when_the_rank_dies_leaves_the_push_committed(world, models, tmp_path):
    """A resolve (what `hwtui push --resume` sends) waits for the disk write; the rank dies
    mid-write. The agent finishes the switch from the staged copy; the resolve answers done, and
    the node's record of the last push stays the committed push it was (no phantom "failed" push,
    the node not marked free while the resolve still runs)."""
    go = tmp_path / "go"
    rep = paused_push(world, models["v1"][0], go)
    last, pushes, rank_pid = rep["last"], rep["pushes"], rep["resident"]["pid"]
    assert last["outcome"] == "committed" and rank_pid, rep
    digest = prepared(world, 1, "v1")["serving_digest"]
    answer: dict[str, Any] = {}

    def resolve() -> None:
        answer["got"] = post(world, 1, "/v1/push/resolve", {"version": "v1", "plan_digest": digest,
                                                            "decision": "commit"})

    t = threading.Thread(target=resolve, daemon=True)
    t.start()
    until("the resolve holds the node", lambda: prepared(world, 1, "v1")["busy"])
    os.kill(rank_pid, signal.SIGKILL)  # the rank dies before its disk write
    t.join(180)
    assert not t.is_alive(), "the resolve never answered"
    status, doc = answer["got"]
    assert status == 200 and doc["done"] is True and doc["serving"] == "v1", (status, doc)
    rep = world.replication(1)
    assert rep["persist"]["state"] == "done" and disk_serves(world, 1) == "v1", rep["persist"]
    assert rep["pushes"] == pushes, ("a push nobody made was counted", pushes, rep["pushes"],
                                   {k: rep["last"].get(k) for k in ("push_id", "version", "outcome", "failures")})
    assert rep["last"]["push_id"] == last["push_id"] and rep["last"]["outcome"] == "committed", rep["last"]
    current_file_matches(world, 1, models["v1"][1])


def test_a_resolve_during_the_write_waits_for_it_and_answers_done(world, models, tmp_path):
    go = tmp_path / "go"
    rep = paused_push(world, models["v1"][0], go)
    digest = prepared(world, 1, "v1")["serving_digest"]
    answer: dict[str, Any] = {}
    t = threading.Thread(target=lambda: answer.update(got=post(world, 1, "/v1/push/resolve", {
        "version": "v1", "plan_digest": digest, "decision": "commit"})), daemon=True)
    t.start()
    until("the resolve holds the node", lambda: prepared(world, 1, "v1")["busy"])
    assert "got" not in answer  # it waits for the write
    go.touch()
    t.join(180)
    assert not t.is_alive(), "the resolve never answered"
    status, doc = answer["got"]
    assert status == 200 and doc["done"] is True and doc["serving"] == "v1", (status, doc)
    rep = world.replication(1)
    assert rep["persist"]["state"] == "done" and rep["pushes"] == {"committed": 1}, rep
    current_file_matches(world, 1, models["v1"][1])


# ---------------------------------------------------------------- 2. abort, same version, --resume meanwhile

def test_an_abort_and_the_same_version_again_during_the_write_change_nothing(world, models, tmp_path):
    go = tmp_path / "go"
    rep = paused_push(world, models["v1"][0], go)
    # an abort of the push that is over: nothing to stop, the write goes on
    status, doc = post(world, 1, "/v1/push/abort", {"push_id": rep["last"]["push_id"], "reason": "attack"}, timeout=30)
    assert status == 200 and doc["aborted"] is False and doc["serving"] == "v1", doc
    assert world.replication(1)["persist"]["state"] == "writing"
    # the same version again, plain and --resume: the node serves it (from its device) already
    for extra in ((), ("--resume",)):
        again = push(models["v1"][0], world.agents(), *extra)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "Traceback" not in again.stderr
    rep = world.replication(1)
    assert rep["persist"]["state"] == "writing" and rep["serving"] == "v1", rep
    assert rep["pushes"] == {"committed": 1}, rep["pushes"]
    go.touch()
    assert persisted(world, 1, "v1")["state"] == "done"
    assert disk_serves(world, 1) == "v1" and device(world, 1)["serving"] == "v1"
    current_file_matches(world, 1, models["v1"][1])
    assert_bytes_equal(served_tensors(world, 1)[1], models["v1"][1])


# ---------------------------------------------------------------- 3. SIGTERM to the agent during the write

def test_an_agent_stopped_by_sigterm_during_the_write_exits_bounded_and_restarts_on_the_version(world, models, tmp_path):
    # Its stop waits for the write at most this bound (120 s; 1 s here), then stops the rank.
    rep = paused_push(world, models["v2"][0], tmp_path / "never", {**DEVICE, "HWTUI_TEST_PERSIST_WAIT_S": "1"})
    rank_pid = rep["resident"]["pid"]
    t0 = time.monotonic()
    log = world.kill(1, signal.SIGTERM)
    took = time.monotonic() - t0
    assert took < 30, f"the agent took {took:.1f} s to stop"
    assert "Traceback" not in log, log
    assert not Path(f"/proc/{rank_pid}").exists() or "zombie" in Path(f"/proc/{rank_pid}/status").read_text(), \
        "the rank outlived its agent"
    world.start(1, "--device", "cuda", **DEVICE)
    rep = world.replication(1)
    assert rep["serving"] == "v2" and disk_serves(world, 1) == "v2", rep
    assert device(world, 1)["serving"] == "v2"
    current_file_matches(world, 1, models["v2"][1])
    assert_bytes_equal(served_tensors(world, 1)[1], models["v2"][1])


# ---------------------------------------------------------------- 4. at-flush copy lost, then the next pushes

def test_a_copy_written_at_flush_lost_mid_write_never_leaves_a_torn_disk_and_the_next_push_persists(world, models):
    lose_a_device_copy(world, models)
    assert disk_serves(world, 1) == "v1"
    current_file_matches(world, 1, models["v1"][1])  # untouched by the lost write
    # the header-only sparse file of v2 is never something the disk names or a restart keeps as a copy
    assert not (world.served(1) / "versions" / "v2").exists()
    # The next push (the fault fires at every persist: its rank dies too) fails the same way, cleanly.
    assert push(models["v3"][0], world.agents()).returncode == 0
    state = persisted(world, 1, "v3")
    assert state["state"] == "failed", state
    assert disk_serves(world, 1) == "v1"
    current_file_matches(world, 1, models["v1"][1])
    assert device(world, 1)["serving"] == "v3"
    assert_bytes_equal(served_tensors(world, 1)[1], models["v3"][1])
    # a restart: back on what the disk holds, both disk and device, nothing torn kept
    world.kill(1)
    world.start(1, "--device", "cuda", **AT_FLUSH)
    rep = world.replication(1)
    assert rep["serving"] == "v1" and device(world, 1)["serving"] == "v1", rep
    assert rep["staged"] == [], rep["staged"]
    assert_bytes_equal(served_tensors(world, 1)[1], models["v1"][1])


def test_resume_after_a_lost_disk_copy_makes_the_disk_serve_the_version(world, models):
    """The disk copy of v2 was lost with its rank (at-flush); the node serves v2 from its device and
    its disk names v1. `hwtui push --resume` of v2 reports success: after it, the disk must serve
    v2 (or the resume must fail and say why), never leave a node that a restart silently rolls back
    to v1 while every report said v2 was committed there."""
    lose_a_device_copy(world, models)
    resumed = push(models["v2"][0], world.agents(), "--resume")
    assert "Traceback" not in resumed.stderr
    assert resumed.returncode != 0 or disk_serves(world, 1) == "v2", (
        f"--resume exit {resumed.returncode}, disk serves {disk_serves(world, 1)}, "
        f"persist {world.replication(1)['persist']}\n{resumed.stdout}{resumed.stderr}")


# ---------------------------------------------------------------- 6. a failed write, then a push that aborts

def test_a_kept_copy_of_a_failed_write_survives_the_next_push_that_aborts(world, models, tmp_path):
    """The disk write of v1 fails (ENOSPC): "the staged copy is kept (the agent finishes it at its
    next start)". The next push, of v2, aborts (its source dies before the decision). v1 was
    reported committed and is still what this node serves from its device: its restart must come
    back on v1 (finished from the kept copy), not on nothing."""
    world.start(1, "--device", "cuda", **DEVICE, HWTUI_TEST_FAULT="fail:rank=1,phase=persist")
    assert push(models["v1"][0], world.agents()).returncode == 0
    state = persisted(world, 1, "v1")
    assert state["state"] == "failed" and "the staged copy is kept" in state["error"], state
    world.kill(0)
    world.start(0, **DEVICE, HWTUI_TEST_FAULT="kill:rank=0,phase=decide")
    aborted = push(models["v2"][0], world.agents())
    assert aborted.returncode != 0, aborted.stdout + aborted.stderr
    rep = world.replication(1)
    assert rep["serving"] == "v1" and device(world, 1)["serving"] == "v1", rep
    world.kill(1)
    world.start(1, "--device", "cuda", **DEVICE)
    rep = world.replication(1)
    assert rep["serving"] == "v1" and disk_serves(world, 1) == "v1", (rep["serving"], rep["recovered"])
    assert device(world, 1)["serving"] == "v1"
    current_file_matches(world, 1, models["v1"][1])


# ---------------------------------------------------------------- 7. something planted in the staged copy meanwhile

@pytest.mark.parametrize("staging", ["mapped", "at-flush"])
def test_a_link_planted_over_the_staged_copy_during_the_write_is_never_served(world, models, tmp_path, staging):
    """While the rank waits before its write, the staged model file is replaced by a symlink to
    another file (someone's cleanup, a hostile local root tool). Let go, the disk must never name
    a link nor bytes other than the verified version's, and the link's target is never written."""
    go = tmp_path / "go"
    env = AT_FLUSH if staging == "at-flush" else DEVICE
    paused_push(world, models["v1"][0], go, env)
    staged = world.served(1) / "staging" / "v1" / "model.safetensors"
    assert staged.exists(), list(world.served(1).rglob("*"))
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(Path(str(models["v2"][0]).replace(".plan", "") + "/model.safetensors").read_bytes())
    before = victim.read_bytes()
    staged.unlink()
    staged.symlink_to(victim)
    go.touch()
    state = persisted(world, 1, "v1")
    assert victim.read_bytes() == before, "written through the planted link"
    if state["state"] == "done":
        assert disk_serves(world, 1) == "v1"
        current_file_matches(world, 1, models["v1"][1])
    else:
        assert state["error"] and "Traceback" not in state["error"], state
        assert disk_serves(world, 1) is None
    # a restart never serves the link either
    world.kill(1)
    world.start(1, "--device", "cuda", **env)
    if disk_serves(world, 1) is not None:
        current_file_matches(world, 1, models["v1"][1])


# ---------------------------------------------------------------- 8. a hostile agent's persist field

HOSTILE_PERSIST = [
    {"state": "failed", "version": "v1", "error": "\x1b]0;PWNED\x07\x1b[2J" * 20},
    {"state": "failed", "version": "v1", "error": "x" * 10_000},
    {"state": "failed", "version": "v1\x1b[31m", "error": "\u202egnp.exe\x9b31m\x00"},
    {"state": "writing", "version": ["v1"], "error": {"a": 1}, "seconds": "slow"},
    {"state": 5, "version": 7, "error": None},
    {"state": "writing\n", "version": "v1"},
    {"state": "\x1b[2Jwriting", "version": "v1"},
    {"state": "failed", "version": "v1", "error": ""},
    [], "writing", 0, {"": None},
]


@pytest.mark.parametrize("persist", HOSTILE_PERSIST, ids=range(len(HOSTILE_PERSIST)))
def test_a_hostile_persist_field_renders_clean_and_bounded(persist):
    from hwtui.app.commands.agents import _line
    from hwtui.core.terminal_text import is_clean
    from hwtui.engine.resident.summary import NodeStatus, parse_summary
    from hwtui.widgets.cluster_nodes import node_rows

    for with_device in (True, False):
        rep: dict[str, Any] = {"serving": "v1", "persist": persist}
        if with_device:
            rep["device"] = {"device": "cuda:0", "slot": "A", "error": None, "holds": []}
        doc = {"node": "n1", "devices": [{"device": "cuda:0", "util": 1.0}], "worst": "pass", "replication": rep}
        status = NodeStatus(agent="a:1", url="http://a:1", stale=False, age_s=0.1, summary=parse_summary(doc))
        line = _line(status)
        assert is_clean(line) and len(line) < 1000, repr(line)
        assert "PWNED" not in line or "\x1b" not in line
        for row in node_rows(status):
            for key, cell in row.items():
                assert is_clean(str(cell)) and len(str(cell)) < 1000, (key, repr(str(cell)))
        if not isinstance(persist, dict) or not isinstance(persist.get("state"), str):
            assert "writing v1 to disk" not in line and "[disk: writing]" not in str(node_rows(status)[0]["version"])


# ---------------------------------------------------------------- 9. a failure in the agent's handling of the write's end

def test_a_slot_record_that_cannot_be_written_never_leaves_the_write_pending(world, models, tmp_path):
    """The rank wrote and switched; the agent's record of its slots then fails (an OSError: here a
    file where its .trash directory goes, standing in for a full disk). Before, that killed the
    agent's reader thread: `persist` stayed "writing" and every later push waited and was refused."""
    import shutil

    go = tmp_path / "go"
    world.start(1, "--device", "cuda", **AT_FLUSH)
    for v in ("v1", "v2"):  # two versions, so the third's record evicts one (through .trash)
        assert push(models[v][0], world.agents()).returncode == 0
        assert persisted(world, 1, v)["state"] == "done"
    world.kill(1)
    paused_push(world, models["v3"][0], go, {**AT_FLUSH, "HWTUI_TEST_PERSIST_WAIT_S": "5"})
    trash = world.served(1) / ".trash"
    shutil.rmtree(trash, ignore_errors=True)
    trash.write_text("x")
    go.touch()
    state = persisted(world, 1, "v3")
    assert state["state"] == "done" and disk_serves(world, 1) == "v3", state
    assert "slot record could not be written" in state.get("error", ""), state
    trash.unlink()
    again = push(models["v4"][0], world.agents())  # the node still takes pushes
    assert again.returncode == 0, again.stdout + again.stderr
    assert persisted(world, 1, "v4")["state"] == "done" and disk_serves(world, 1) == "v4"
    current_file_matches(world, 1, models["v4"][1])
