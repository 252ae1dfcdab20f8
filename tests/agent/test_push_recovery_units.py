"""The agent's recovery by the decision record, without processes: a staged copy is switched to only
when it still hashes to its manifest and the decision is for its plan; hostile requests are refused;
an agent's start removes what a dead push left and keeps what a decision still needs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hwtui.engine.replication.commit import write_decision  # noqa: E402
from hwtui.engine.replication.plan import build_plan_from_files, manifest_of, write_json_atomic  # noqa: E402
from hwtui.engine.resident import recovery  # noqa: E402
from hwtui.engine.resident.resident import PushRefused, ResidentRank  # noqa: E402
from tests.engine.replication.helpers import make_model  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]


def stage(tmp: Path, out: Path, version: str, seed: int = 1) -> str:
    """A prepared staged copy of ``version`` under agent dir ``out``, as a receiver leaves it after
    its yes vote; returns the plan digest."""
    make_model(tmp / f"m{seed}", seed=seed, big=5000, n=4)
    src = tmp / f"m{seed}" / "model.safetensors"
    plan = build_plan_from_files([str(src)], model="tiny", version=version, bucket_bytes=4096, align=1)
    staged = out / "served" / "staging" / version
    staged.mkdir(parents=True)
    shutil.copyfile(src, staged / "model.safetensors")
    write_json_atomic(staged / "manifest.json", manifest_of(plan))
    return str(plan["digest"])


def current(out: Path) -> str | None:
    path = out / "served" / "CURRENT"
    return json.loads(path.read_text())["version"] if path.exists() else None


def test_a_decided_staged_copy_is_switched_to_only_if_it_still_matches(tmp_path):
    out = tmp_path / "a"
    digest = stage(tmp_path, out, "v1")
    served, ranks = out / "served", out / "ranks"
    assert recovery.finish(served, ranks, "v1", "0" * 32)[0] is False  # a decision for another plan
    assert not (served / "staging" / "v1").exists()  # ... and the copy that is not its plan is gone
    digest = stage(tmp_path, out, "v1")
    blob = served / "staging" / "v1" / "model.safetensors"
    data = bytearray(blob.read_bytes())
    data[-7] ^= 0xFF  # one flipped byte since the vote
    blob.write_bytes(bytes(data))
    ok, why = recovery.finish(served, ranks, "v1", digest)
    assert not ok and "needs the bytes again" in why and current(out) is None
    digest = stage(tmp_path, out, "v1")
    ok, why = recovery.finish(served, ranks, "v1", digest)
    assert ok and current(out) == "v1" and recovery.decision(ranks, "v1") is not None, why
    assert recovery.finish(served, ranks, "v1", digest) == (True, "already serves it")


def test_resolve_refuses_hostile_requests_and_never_discards_a_decided_copy(tmp_path):
    node = ResidentRank(node="n", out=tmp_path / "n", advertise="127.0.0.1")
    try:
        for body in ({"version": "../../etc", "plan_digest": "ab" * 16, "decision": "commit"},
                     {"version": "v1", "plan_digest": "../x", "decision": "commit"},
                     {"version": "v1", "plan_digest": "ab" * 16, "decision": "maybe"},
                     {"version": ["v1"], "plan_digest": "ab" * 16, "decision": "abort"}):
            with pytest.raises(PushRefused) as err:
                node.resolve(body)
            assert err.value.status == 400
        digest = stage(tmp_path, node.out, "v2")
        write_decision(node.ranks_out, "v2", digest, [1])
        kept = node.resolve({"version": "v2", "plan_digest": digest, "decision": "abort"})
        assert not kept["done"] and (node.served / "staging" / "v2").is_dir()
        done = node.resolve({"version": "v2", "plan_digest": digest, "decision": "commit"})
        assert done["done"] and done["serving"] == "v2" and json.loads((node.served / "SLOTS").read_text())["A"] == "v2"
        # An undecided prepared copy is removed by an abort.
        digest3 = stage(tmp_path, node.out, "v3", seed=3)
        gone = node.resolve({"version": "v3", "plan_digest": digest3, "decision": "abort"})
        assert gone["done"] and not (node.served / "staging").exists()
    finally:
        node.close()


def test_an_agent_start_finishes_decided_copies_and_removes_a_dead_push_s_leftovers(tmp_path):
    out = tmp_path / "n"
    d1 = stage(tmp_path, out, "v1")
    write_decision(out / "ranks", "v1", d1, [1])  # decided: switched to at start
    stage(tmp_path, out, "v2", seed=2)  # prepared, undecided here: kept for the pusher to settle
    half = out / "served" / "staging" / "v3"  # a transfer cut short: can never commit
    half.mkdir(parents=True)
    (half / "model.safetensors").write_bytes(b"\0" * 4096)
    (out / "pushes").mkdir(parents=True)
    for name in ("20260101T000000-deadbeef.plan", ".incoming-1.plan", "upload-" + "ab" * 16 + ".plan"):
        (out / "pushes" / name).write_bytes(b"x")
    stray = out / "served" / "versions" / "v0"  # in neither slot
    stray.mkdir(parents=True)
    node = ResidentRank(node="n", out=out, advertise="127.0.0.1")
    try:
        assert current(out) == "v1"
        assert sorted(p.name for p in (out / "served" / "staging").iterdir()) == ["v2"]
        assert sorted(p.name for p in (out / "pushes").iterdir()) == ["upload-" + "ab" * 16 + ".plan"]
        assert sorted(p.name for p in (out / "served" / "versions").iterdir()) == ["v1"]
        state = node.state()
        assert [s["version"] for s in state["staged"]] == ["v2"] and state["staged"][0]["prepared"]
        assert any(r.startswith("v1: finished") for r in state["recovered"]), state["recovered"]
    finally:
        node.close()


def test_resume_with_nothing_decided_is_refused_and_removes_undecided_copies(tmp_path, monkeypatch, capsys):
    """A prepared copy whose push was never decided (its agent died mid-vote, then restarted) is a
    leftover: `--resume` says there is nothing to resume, and its read-back removes that copy."""
    from hwtui.app.cli import main
    from hwtui.app.node_api.push_routes import make_routes
    from tests.agent.helpers import TOKEN, start_agent, stop_agent
    from tests.engine.replication.helpers import write_plan

    make_model(tmp_path / "p", seed=9, big=2000, n=3)
    write_plan(tmp_path / "p", tmp_path / "p.plan", version="v1", bucket_kib=4)
    nodes = [ResidentRank(node=f"n{i}", out=tmp_path / f"n{i}", advertise="127.0.0.1") for i in range(2)]
    stage(tmp_path, nodes[1].out, "v1")
    servers = [start_agent(f"n{i}", post_routes=make_routes(n), replication=n.state) for i, n in enumerate(nodes)]
    monkeypatch.setenv("HWTUI_AGENT_TOKEN", TOKEN)
    try:
        rc = main(["push", "--plan", str(tmp_path / "p.plan"), "--agents",
                   ",".join(f"127.0.0.1:{s.port}" for s in servers), "--resume"])
    finally:
        for s in servers:
            stop_agent(s)
        for n in nodes:
            n.close()
    err = capsys.readouterr().err
    assert rc == 2 and "nothing to resume" in err and err.count("\n") == 1, err
    assert not (nodes[1].served / "staging").exists()


def test_a_version_a_node_moved_on_from_is_not_switched_back_by_a_resume(tmp_path):
    """Re-running an old push is not a missed switch: a node that served v1 and now serves v2 keeps v2."""
    out = tmp_path / "n"
    for v in ("v1", "v2"):
        (out / "served" / "versions" / v).mkdir(parents=True)
    (out / "served" / "CURRENT").write_text(json.dumps({"version": "v2", "plan_digest": "cd" * 16,
                                                        "file": "versions/v2/model.safetensors"}))
    (out / "served" / "SLOTS").write_text(json.dumps({"A": "v1", "B": "v2", "serving": "B"}))
    write_decision(out / "ranks", "v1", "ab" * 16, [1])
    node = ResidentRank(node="n", out=out, advertise="127.0.0.1")
    try:
        answer = node.resolve({"version": "v1", "plan_digest": "ab" * 16, "decision": "commit"})
        assert not answer["done"] and "moved on" in answer["what"] and node.serving() == "v2"
        assert sorted(p.name for p in (out / "served" / "versions").iterdir()) == ["v1", "v2"]
    finally:
        node.close()


def test_a_switch_finished_from_a_staged_copy_keeps_the_agent_s_serve_group(tmp_path):
    """`hwtui agent --serve-group G`: a version put in place by recovery (at the agent's start, or a
    --resume's resolve) is group-readable like one the rank commits; it was 0600 whatever the group."""
    import grp
    import os
    import stat

    group = next((g for g in grp.getgrall() if g.gr_gid != os.getegid()
                  and (os.geteuid() == 0 or g.gr_gid in os.getgroups())), None)
    if group is None:
        pytest.skip("no second group this user may give files to")
    out = tmp_path / "g"
    d1 = stage(tmp_path, out, "v1")
    write_decision(out / "ranks", "v1", d1, [1])
    node = ResidentRank(node="g", out=out, advertise="127.0.0.1", serve_group=group.gr_name)
    try:
        assert current(out) == "v1"
        cur = json.loads((out / "served" / "CURRENT").read_text())
        f = (out / "served" / cur["file"]).stat()
        assert stat.S_IMODE(f.st_mode) == 0o640 and f.st_gid == group.gr_gid, (oct(f.st_mode), f.st_gid)
        d = (out / "served" / cur["file"]).parent.stat()
        assert stat.S_IMODE(d.st_mode) == 0o750 and d.st_gid == group.gr_gid
    finally:
        node.close()
