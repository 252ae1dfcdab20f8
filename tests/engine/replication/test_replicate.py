"""Real replication worlds: worker processes on gloo over 127.0.0.1, every byte checked on every rank.

The worlds build on each other (module-scoped fixtures) to keep the area's runtime small:
v1 full push to 3 ranks -> v2 delta -> failed attempts at v3 that must leave v2 served everywhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import save_file

from hwtui.core.events import ErrorEvent, LogEvent
from hwtui.engine.replication.events import ReplBucket, ReplCommit, ReplDone, ReplStart, ReplThroughput, ReplWindow
from hwtui.engine.replication.launcher import ReplicationOptions, run_replication
from hwtui.engine.replication.plan import manifest_of, write_json_atomic
from hwtui.engine.replication.report import PeakMemory, ReplicationReport
from tests import cli_proc
from tests.engine.replication.helpers import assert_bytes_equal, make_model, served, write_plan
from tests.typed_shape import assert_shape

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]


def replicate(plan: Path, *, nproc: int, fault: str | None = None, **kw):
    """These worlds test the network pipeline (window, pool, chunks, faults): every rank is on one
    host, and a version with a torch pickle would otherwise take the shm path (test_shm_path.py)."""
    kw.setdefault("same_host", False)
    env = dict(os.environ)
    env.pop("HWTUI_TEST_FAULT", None)
    if fault:
        env["HWTUI_TEST_FAULT"] = fault
    events = []
    opts = ReplicationOptions(plan=str(plan), nproc=nproc, env=env, **kw)
    t = time.monotonic()
    result = run_replication(opts, on_event=events.append)
    return result, events, time.monotonic() - t


def of(events, cls):
    return [e for e in events if isinstance(e, cls)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("repl")
    return {"root": root, "src": root / "src", "out": root / "out"}


@pytest.fixture(scope="module")
def v1(world):
    expected = make_model(world["src"], seed=1)
    plan = write_plan(world["src"], world["root"] / "v1.json", version="v1", bucket_kib=64)
    write_json_atomic(world["root"] / "v1.manifest.json", manifest_of(plan))
    result, events, secs = replicate(world["root"] / "v1.json", nproc=3, commit=True, out=str(world["out"]), window=3)
    return {"plan": plan, "expected": expected, "result": result, "events": events}


def test_full_push_to_3_ranks_every_byte(world, v1):
    assert v1["result"].ok, v1["result"].error
    for rank in (1, 2):
        version, tensors = served(world["out"], rank)
        assert version == "v1"
        assert_bytes_equal(tensors, v1["expected"])
    assert not (world["out"] / "rank1" / "staging").exists()


def test_full_push_events_follow_the_contract(v1):
    ev, plan = v1["events"], v1["plan"]
    log = of(ev, LogEvent)[0]
    assert log.message.startswith("Using CPU broadcast transport (gloo).") and "embedded default" in log.message
    start = of(ev, ReplStart)[0]
    assert (start.world_size, start.n_buckets, start.total_bytes, start.transport, start.window) == \
        (3, len(plan["buckets"]), plan["total_bytes"], "gloo", 3)
    world_done = [e for e in of(ev, ReplBucket) if e.rank is None]
    assert sorted(e.bucket_id for e in world_done) == list(range(len(plan["buckets"])))
    per_rank = {(e.rank, e.bucket_id, e.state) for e in of(ev, ReplBucket) if e.rank is not None}
    for b in range(len(plan["buckets"])):
        assert {(0, b, "staged"), (0, b, "inflight"), (0, b, "done")} <= per_rank
        for r in (1, 2):
            assert {(r, b, "inflight"), (r, b, "verifying"), (r, b, "done")} <= per_rank
    windows = of(ev, ReplWindow)
    assert windows and max(w.occupancy for w in windows) <= 3 and all(w.window == 3 for w in windows)
    tp = of(ev, ReplThroughput)
    assert tp[-1].bytes_done == tp[-1].total_bytes == plan["total_bytes"] and tp[-1].gbps > 0
    commits = [(c.phase, c.ok) for c in of(ev, ReplCommit)]
    assert commits == [("prepare", True), ("commit", True)]
    done = of(ev, ReplDone)[-1]
    assert ev[-1] is done and done.ok and done.bytes == plan["total_bytes"] and done.gbps > 0
    rep = done.report
    assert rep["committed"] and rep["world_size"] == 3 and rep["transport"]["name"] == "gloo"
    assert {"init", "transfer", "prepare", "commit"} <= set(rep["phases_s"])
    json.dumps(rep)  # the report is plain JSON
    assert_shape(rep, ReplicationReport)
    assert_shape(rep["peak_memory"], PeakMemory)


@pytest.fixture(scope="module")
def v2(world, v1):
    new = dict(v1["expected"])
    new["layers.5.weight"] = new["layers.5.weight"] * 2
    new["embed.big"] = new["embed.big"].clone()
    new["embed.big"][100_000] = 42.0  # a one-element change in a tensor split across buckets
    del new["layers.6.weight"]
    st = {k: v for k, v in new.items() if not k.startswith("head.")}
    save_file(st, str(world["src"] / "model.safetensors"))
    plan = write_plan(world["src"], world["root"] / "v2.json", version="v2", bucket_kib=64,
                      prev=world["root"] / "v1.manifest.json")
    result, events, _ = replicate(world["root"] / "v2.json", nproc=3, commit=True, out=str(world["out"]))
    return {"plan": plan, "expected": new, "result": result, "events": events}


def test_delta_push_sends_only_changes_and_serves_the_full_new_version(world, v1, v2):
    assert v2["result"].ok, v2["result"].error
    plan = v2["plan"]
    assert sorted(t["name"] for t in plan["tensors"] if t["send"]) == ["embed.big", "layers.5.weight"]
    assert plan["deleted"] == ["layers.6.weight"]
    assert plan["total_bytes"] == sum(v2["expected"][n].numel() * 4 for n in ("embed.big", "layers.5.weight"))
    for rank in (1, 2):
        version, tensors = served(world["out"], rank)
        assert version == "v2"
        assert_bytes_equal(tensors, v2["expected"])
        assert (world["out"] / f"rank{rank}" / "versions" / "v1" / "model.safetensors").exists()  # old kept for rollback


@pytest.fixture(scope="module")
def v3_plan(world, v2):
    new = dict(v2["expected"])
    new["layers.7.weight"] = new["layers.7.weight"] - 1
    new["embed.big"] = -new["embed.big"]
    save_file({k: v for k, v in new.items() if not k.startswith("head.")}, str(world["src"] / "model.safetensors"))
    write_json_atomic(world["root"] / "v2.manifest.json", manifest_of(v2["plan"]))
    plan = write_plan(world["src"], world["root"] / "v3.json", version="v3", bucket_kib=64,
                      prev=world["root"] / "v2.manifest.json")
    assert len(plan["buckets"]) >= 4
    return world["root"] / "v3.json"


def _still_v2_everywhere(world, v2):
    for rank in (1, 2):
        version, tensors = served(world["out"], rank)
        assert version == "v2"
        assert_bytes_equal(tensors, v2["expected"])
        assert not (world["out"] / f"rank{rank}" / "versions" / "v3").exists()
        assert not (world["out"] / f"rank{rank}" / "staging" / "v3").exists()


def test_corrupted_bucket_is_named_and_nobody_commits(world, v2, v3_plan):
    from hwtui.engine.replication.plan import load_plan
    from hwtui.engine.replication.source_reader import collective_groups

    # With the default window (4) bucket 3 travels in one collective with bucket 2: the corruption
    # must still be caught per bucket, inside the group.
    groups = collective_groups(load_plan(v3_plan), chunk_bytes=64 << 20, max_group=2, enabled=True)
    assert any(3 in g and len(g) == 2 for g in groups), groups
    result, events, secs = replicate(v3_plan, nproc=3, commit=True, out=str(world["out"]), fault="corrupt:bucket=3,rank=2")
    assert not result.ok and result.exit_code == 1
    assert "bucket 3" in result.error and "rank 2" in result.error
    assert any(e.bucket_id == 3 and e.state == "failed" and e.rank == 2 for e in of(events, ReplBucket))
    assert [(c.phase, c.ok) for c in of(events, ReplCommit)] == [("prepare", False), ("abort", True)]
    _still_v2_everywhere(world, v2)  # rank 1 verified everything too, and still serves v2


def test_killed_rank_ends_the_run_within_seconds(world, v2, v3_plan):
    result, events, secs = replicate(v3_plan, nproc=3, commit=True, out=str(world["out"]), fault="kill:rank=1,bucket=2")
    assert not result.ok and result.exit_code == 1
    assert "rank 1" in result.error and "SIGKILL" in result.error
    assert secs < 30
    assert not any(c.phase == "commit" for c in of(events, ReplCommit))
    assert of(events, ErrorEvent)[-1].message == result.error
    _still_v2_everywhere(world, v2)


def test_rank_dying_after_prepare_means_no_commit_anywhere(world, v2, v3_plan):
    result, events, secs = replicate(v3_plan, nproc=3, commit=True, out=str(world["out"]), fault="kill:rank=2,phase=prepare",
                                     timeout=3)
    assert not result.ok and "rank 2" in result.error
    _still_v2_everywhere(world, v2)


def test_hung_rank_is_named_within_seconds(world, v2, v3_plan):
    result, events, secs = replicate(v3_plan, nproc=3, commit=True, out=str(world["out"]), fault="hang:rank=2,bucket=1",
                                     timeout=2)
    assert not result.ok and result.exit_code == 1
    assert "rank 2 hung" in result.error, result.error
    assert secs < 30
    _still_v2_everywhere(world, v2)


def test_two_ranks_window_bound_with_packed_buckets(tmp_path):
    expected = make_model(tmp_path / "src", seed=5)
    # align 64 pads tensors inside buckets, so the source must pack from the pool as well
    plan = write_plan(tmp_path / "src", tmp_path / "p.json", version="w1", bucket_kib=32, align=64)
    bucket = max(b["size"] for b in plan["buckets"])
    result, events, _ = replicate(tmp_path / "p.json", nproc=2, window=2, chunk_mb=0.01, commit=True,
                                  out=str(tmp_path / "out"))
    assert result.ok, result.error
    assert_bytes_equal(served(tmp_path / "out", 1)[1], expected)
    for r in result.report["ranks"]:
        pool = r["memory"]["pool"]
        assert 0 < pool["peak_in_use_bytes"] <= 2 * bucket and pool["allocated_bytes"] <= 2 * bucket
        assert r["window"]["peak_occupancy"] <= 2
    assert max(w.occupancy for w in of(events, ReplWindow)) == 2
    chunk = int(0.01 * (1 << 20))
    assert all(r["collectives"] == sum(-(-b["size"] // chunk) for b in plan["buckets"]) for r in result.report["ranks"])
    assert result.report["peak_memory"]["max_pool_peak_bytes"] <= result.report["peak_memory"]["pool_bound_bytes"]
    # A changed file of the same size is caught by the source's checksum: bad input, nothing committed.
    raw = bytearray((tmp_path / "src" / "model.safetensors").read_bytes())
    raw[-5] ^= 0x55
    (tmp_path / "src" / "model.safetensors").write_bytes(bytes(raw))
    plan2 = write_plan(tmp_path / "src", tmp_path / "p2.json", version="w2", bucket_kib=32)
    raw[-5] ^= 0x0F
    (tmp_path / "src" / "model.safetensors").write_bytes(bytes(raw))
    result, events, _ = replicate(tmp_path / "p2.json", nproc=2, commit=True, out=str(tmp_path / "out"))
    assert not result.ok and result.exit_code == 2 and "changed since planning" in result.error
    assert plan2["version"] == "w2" and served(tmp_path / "out", 1)[0] == "w1"


def test_cli_events_on_stdout_and_sigterm_aborts(tmp_path):
    make_model(tmp_path / "src", seed=9, big=50_000, n=5)
    write_plan(tmp_path / "src", tmp_path / "p.json", version="s1", bucket_kib=16)
    env = dict(os.environ, HWTUI_TEST_FAULT="hang:rank=1,bucket=2")
    proc = cli_proc.Popen([sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(tmp_path / "p.json"),
                           "--nproc", "2", "--events", "-", "--commit", "--out", str(tmp_path / "out"), "--timeout", "60"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(json.loads(line))  # stdout carries JSON lines only
        if lines[-1].get("kind") == "repl.bucket" and lines[-1].get("bucket_id") == 1 and lines[-1].get("state") == "done":
            break
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - t < 10
    lines += [json.loads(x) for x in out.splitlines() if x.strip()]
    assert proc.returncode == 128 + signal.SIGTERM
    kinds = [x["kind"] for x in lines]
    assert kinds[0] == "log" and "repl.start" in kinds and kinds[-1] == "repl.done"
    assert any(x["kind"] == "error" and "SIGTERM" in x["message"] for x in lines)
    assert any(x["kind"] == "repl.commit" and x["phase"] == "abort" for x in lines)
    assert "Using CPU broadcast transport" in err and "SIGTERM" in err
    assert served(tmp_path / "out", 1)[0] is None


def test_joins_a_torchrun_world(tmp_path):
    expected = make_model(tmp_path / "src", seed=11, big=30_000, n=8)
    write_plan(tmp_path / "src", tmp_path / "p.json", version="t1", bucket_kib=32)
    from hwtui.core.net import free_loopback_port as free_port

    hwtui = str(Path(sys.executable).parent / "hwtui")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "HWTUI_TEST_FAULT")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                           "127.0.0.1", "--master-port", str(free_port()), "--no-python", hwtui, "replicate", "--plan",
                           str(tmp_path / "p.json"), "--commit", "--out", str(tmp_path / "out"), "--adaptive",
                           "--report", str(tmp_path / "rep{rank}.json")],
                          capture_output=True, text=True, timeout=90, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    version, tensors = served(tmp_path / "out", 1)
    assert version == "t1"
    assert_bytes_equal(tensors, expected)
    reports = [json.loads((tmp_path / f"rep{r}.json").read_text()) for r in (0, 1)]
    assert all(r["mode"] == "join" and r["world_size"] == 2 and r["ok"] and r["committed"] for r in reports)
    assert [r["ranks"][0]["rank"] for r in reports] == [0, 1]


def test_sigterm_while_ranks_start_ends_every_rank_at_once(tmp_path):
    """`q`/`s` in the TUI during rank start-up (issue 25): ranks that have not joined the world are
    killed at once (one blocked in the rendezvous does not even run Python's handler), the launcher
    exits by itself with 143, and no rank outlives it."""
    import psutil

    make_model(tmp_path / "src", seed=12, big=20_000, n=4)
    write_plan(tmp_path / "src", tmp_path / "p.json", version="q1", bucket_kib=16)
    # Rank 1 sleeps before its world forms; rank 0 then waits in the rendezvous for it.
    env = dict(os.environ, HWTUI_TEST_FAULT="hang:rank=1,phase=load")
    proc = cli_proc.Popen([sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(tmp_path / "p.json"),
                           "--nproc", "2", "--events", "-", "--commit", "--out", str(tmp_path / "out"), "--timeout", "120"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(json.loads(line))
        ev = lines[-1]
        if ev.get("kind") == "repl.ranks" and ev["counts"].get("plan loaded", 0) >= 1:
            break  # rank 0 loaded its plan and went on to the rendezvous; rank 1 is held before it
    assert lines and lines[-1].get("kind") == "repl.ranks", "the ranks never reported their start-up"
    ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)]
    assert len(ranks) >= 2
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, "the launcher ended by itself, not by a SIGKILL"
    alive = [p.pid for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"ranks outlived the launcher: {alive}"
    lines += [json.loads(x) for x in out.splitlines() if x.strip()]
    stops = [x["message"] for x in lines if x["kind"] == "log" and x["message"].startswith("stop: ")]
    # Rank 1, held before its plan, is killed. Rank 0 too, unless it is already past the world's
    # formation: rank 1's world forms on a thread of its own while its main thread is held, so
    # under load rank 0 can have joined by the time the SIGTERM is acted on, and is then told.
    assert stops in (["stop: rank(s) 0, 1 killed while starting"],
                     ["stop: rank(s) 1 killed while starting; rank(s) 0 told to abort (SIGTERM)"]), stops
    assert lines[-1]["kind"] == "repl.done" and not lines[-1]["ok"]
    assert served(tmp_path / "out", 1)[0] is None
