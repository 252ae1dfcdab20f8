"""A push that does not end cleanly tells the truth and can be finished (issue 22, F3 F4 F10).

Three agents as real processes on loopback (node0 the source, node1 and node2 receivers), killed
at a phase of a push by waiting on the phase the agent reports (never on time):

- the push's report says what each node serves, read back from the nodes; one that cannot be
  read is named unknown (the source SIGKILLed at ``committing`` left both receivers serving the
  new version while the report said "nothing committed");
- a split (decided, switched on some receivers only) is named with the exact command that
  finishes it; that command (``--resume``), or a re-run, finishes it from the staged copy or by
  sending the version again, and a restarted agent finishes it by its decision record;
- a dead push's leftovers (its staging copy, its plan file) are gone after the agent restarts,
  and an agent stopped mid-transfer logs no traceback.

One world, shared by the cases in order (each case starts the agents it needs as it needs them).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests import cli_proc
from tests.agent.procs import Agents, env, push, push_and_stop  # noqa: E402
from tests.engine.replication.helpers import assert_bytes_equal, make_model, write_plan  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    out = {}
    for i, v in enumerate(("v1", "v2", "v3", "v4", "v5", "v6", "v7"), start=1):
        expected = make_model(d / v, seed=i, big=120_000, n=12)
        write_plan(d / v, d / f"{v}.plan", version=v, bucket_kib=64)
        out[v] = (d / f"{v}.plan", expected)
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = Agents(tmp_path_factory.mktemp("agents"), 3)
    try:
        yield w
    finally:
        w.close()


def restart(world: Agents, i: int, **fault: str) -> None:
    """Agent ``i`` afresh (with ``fault``); any other agent not running is started too, plainly."""
    if i in world.procs:
        world.kill(i)
    world.start(i, **fault)
    for j in range(world.n):
        if j not in world.procs:
            world.start(j)


def serves(world: Agents, i: int) -> tuple[str | None, dict]:
    from safetensors.torch import load_file

    root = world.served(i)
    if not (root / "CURRENT").exists():
        return None, {}
    meta = json.loads((root / "CURRENT").read_text())
    return meta["version"], load_file(str(root / meta["file"]))


def leftovers(world: Agents, i: int) -> dict[str, list[str]]:
    """What a node holds beyond its served versions: staged copies and plan files of pushes."""
    def names(p: Path) -> list[str]:
        return sorted(os.listdir(p)) if p.is_dir() else []

    return {"staging": names(world.served(i) / "staging"),
            "plans": [n for n in names(world.out(i) / "pushes") if not n.startswith("upload-")],
            "versions": names(world.served(i) / "versions")}


def final(done: subprocess.CompletedProcess[str] | tuple[str, str]) -> str:
    out = done.stdout if isinstance(done, subprocess.CompletedProcess) else done[0]
    return out.strip().splitlines()[-1]


def test_a_receiver_killed_at_committing_is_a_split_its_restart_finishes(world, models):
    """F4: node1's agent is SIGKILLed after the decision, before its rank's switch."""
    for i in range(3):
        restart(world, i, **({"HWTUI_TEST_FAULT": "hang:rank=1,phase=commit"} if i == 1 else {}))
    plan, expected = models["v1"]
    rc, out, err, _ = push_and_stop(world, plan, 1, "committing", "--json")
    assert rc == 1, out + err
    doc = json.loads(out)
    by = {n["node"]: n for n in doc["nodes"]}
    assert by["node1"]["outcome"] == "died" and by["node2"]["outcome"] == "committed", doc
    # Read back: node2 serves v1; node1 cannot be read: unknown, never assumed.
    assert by["node2"]["read_back"] and by["node2"]["serving"] == "v1"
    assert by["node1"]["read_back"] is False and by["node1"]["serving"] is None
    assert doc["state"] == "split" and "--resume" in doc["resume"], doc

    # Its agent restarted: the decision record it holds makes it finish the switch from its
    # verified staged copy, before it takes any request.
    world.start(1)
    have, tensors = serves(world, 1)
    assert have == "v1"
    assert_bytes_equal(tensors, expected)
    assert leftovers(world, 1) == {"staging": [], "plans": [], "versions": ["v1"]}
    assert any("finished the switch" in r for r in world.replication(1)["recovered"])

    # The command the report gave settles the rest: nothing left to do, every node serves v1.
    done = push(plan, world.agents(), "--resume", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    again = json.loads(done.stdout)
    assert again["ok"] and again["state"] == "committed"
    assert {n["node"]: n.get("how") for n in again["nodes"]}["node1"] == "already served it"


def test_a_split_is_named_with_its_command_and_that_command_finishes_it(world, models):
    """F4: node1's switch fails after the decision (its agent lives): the report names the split
    and the command; running it switches node1 from its verified staged copy, moving no byte."""
    restart(world, 1, HWTUI_TEST_FAULT="fail:rank=1,phase=commit")
    plan, expected = models["v2"]
    done = push(plan, world.agents())
    assert done.returncode == 1, done.stdout + done.stderr
    line = final(done)
    assert "SPLIT" in line and "node2 serves v2" in line and "node1 serves v1" in line, line
    command = line.split("finish it with: ", 1)[1]
    argv = shlex.split(command)
    assert argv[:2] == ["hwtui", "push"] and argv[-1] == "--resume" and str(plan) in argv, command
    assert world.served(1).joinpath("staging", "v2", "manifest.json").is_file()  # kept: decided

    resumed = cli_proc.run([*env_python(), "-m", "hwtui.app", *argv[1:], "--json"], capture_output=True,
                           text=True, timeout=240, env=env())
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    doc = json.loads(resumed.stdout)
    by = {n["node"]: n for n in doc["nodes"]}
    assert doc["ok"] and "staged copy" in by["node1"]["how"] and by["node2"]["how"] == "already served it", doc
    assert not any(str(k).startswith("seen_") for k in doc["timeline"])  # no rank ran: nothing was sent
    have, tensors = serves(world, 1)
    assert have == "v2"
    assert_bytes_equal(tensors, expected)
    assert leftovers(world, 1) == {"staging": [], "plans": [], "versions": ["v1", "v2"]}


def test_a_node_that_lost_its_staged_copy_receives_the_decided_version_again(world, models):
    """F4: a re-run of the same push sends a decided version to the node that has no copy of it,
    and only to it."""
    plan, expected = models["v3"]
    done = push(plan, world.agents())  # node1 still fails its switch
    assert done.returncode == 1 and "SPLIT" in final(done), done.stdout + done.stderr
    world.kill(1)
    import shutil

    shutil.rmtree(world.served(1) / "staging")  # the copy is gone (a disk replaced, a hand cleanup)
    world.start(1)
    assert serves(world, 1)[0] == "v2"
    again = push(plan, world.agents(), "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    doc = json.loads(again.stdout)
    by = {n["node"]: n for n in doc["nodes"]}
    assert by["node2"]["how"] == "already served it" and by["node1"]["outcome"] == "committed", doc
    assert "seen_1" in doc["timeline"] and "seen_2" not in doc["timeline"], doc["timeline"]  # a world of 2
    have, tensors = serves(world, 1)
    assert have == "v3"
    assert_bytes_equal(tensors, expected)
    # Two slots: v3 serving, v2 the other; v1 was evicted.
    assert leftovers(world, 1) == {"staging": [], "plans": [], "versions": ["v2", "v3"]}


def test_the_source_killed_at_committing_the_report_reads_back_what_each_node_serves(world, models):
    """F3: the source's agent SIGKILLed after the decision: the receivers switched, and the report
    says so (read back), naming the source unknown, never "nothing committed"."""
    restart(world, 0, HWTUI_TEST_FAULT="hang:rank=0,phase=commit")
    restart(world, 1)
    plan, _ = models["v4"]
    rc, out, err, _ = push_and_stop(world, plan, 0, "committing")
    assert rc == 1, out + err
    line = out.strip().splitlines()[-1]
    assert "nothing committed" not in line, line
    assert "node1 serves v4" in line and "node2 serves v4" in line and "node0 unknown" in line, line
    assert serves(world, 1)[0] == serves(world, 2)[0] == "v4"


def test_a_dead_push_leaves_nothing_and_a_stopped_rank_no_traceback(world, models):
    """F10: node2's agent SIGKILLed mid-transfer leaves its staging copy and its push's plan; the
    restarted agent removes them. SIGTERM of an agent whose rank is transferring logs no traceback.
    Across these aborted pushes no node holds more than its two versions."""
    restart(world, 0)
    restart(world, 2, HWTUI_TEST_FAULT="hang:rank=2,bucket=3")
    plan, _ = models["v5"]
    for how in (signal.SIGTERM, signal.SIGKILL):
        _, _, _, log = push_and_stop(world, plan, 2, "transfer", sig=how)
        assert "Traceback" not in log and "BrokenPipeError" not in log, log
        if how == signal.SIGKILL:
            assert (world.served(2) / "staging" / "v5").exists()  # what the dead agent left
        world.start(2, HWTUI_TEST_FAULT="hang:rank=2,bucket=3")
        assert leftovers(world, 2) == {"staging": [], "plans": [], "versions": ["v3", "v4"]}, how
        assert leftovers(world, 1) == {"staging": [], "plans": [], "versions": ["v3", "v4"]}, how
        assert serves(world, 2)[0] == serves(world, 1)[0] == "v4"
    # And a clean push afterwards still works (and evicts the older slot).
    restart(world, 2)
    plan, expected = models["v6"]
    done = push(plan, world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
    for i in (1, 2):
        assert leftovers(world, i) == {"staging": [], "plans": [], "versions": ["v4", "v6"]}
        assert_bytes_equal(serves(world, i)[1], expected)


def test_a_push_aborted_at_the_vote_leaves_no_prepared_copy_behind(world, models):
    """F10: node2's agent dies after node1 prepared (fsynced its copy and voted yes): node1 keeps its
    copy (it cannot know there is no decision), so the pusher's read-back, finding no decision at
    the source, removes it; node2's own prepared copy, kept undecided by its restarted agent, goes
    with the next `--resume` (nothing to resume)."""
    restart(world, 2, HWTUI_TEST_FAULT="hang:rank=2,phase=prepare")
    plan, _ = models["v7"]
    rc, out, err, _ = push_and_stop(world, plan, 2, "voting", "--json", also=(1,))
    assert rc == 1, out + err
    doc = json.loads(out)
    assert doc["state"] == "not committed" or doc["state"] == "unknown", doc
    assert leftovers(world, 1) == {"staging": [], "plans": [], "versions": ["v4", "v6"]}
    world.start(2)
    assert leftovers(world, 2)["staging"] == ["v7"]  # prepared, undecided here: kept for the pusher
    done = push(plan, world.agents(), "--resume")
    assert done.returncode == 2 and "nothing to resume" in done.stderr, done.stdout + done.stderr
    for i in (1, 2):
        assert leftovers(world, i) == {"staging": [], "plans": [], "versions": ["v4", "v6"]}
        assert serves(world, i)[0] == "v6"
    # A re-run of an older push is no missed switch: the nodes moved on from v4; going back is refused.
    back = push(models["v4"][0], world.agents())
    assert back.returncode == 2 and "moved on" in back.stderr, back.stdout + back.stderr
    assert serves(world, 1)[0] == serves(world, 2)[0] == "v6"


def env_python() -> list[str]:
    import sys

    return [sys.executable]
