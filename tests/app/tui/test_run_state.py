"""The dashboard's headless core: recorded engine streams folded into RunState."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwtui.app.tui.run_state import RunState, normalize
from hwtui.core.events import UnknownEvent, parse_line

DATA = Path(__file__).parent / "data"


def fold(name: str, typed: bool) -> RunState:
    state = RunState()
    for line in (DATA / name).read_text().splitlines():
        raw = json.loads(line)
        # typed: whatever parse_line makes of it (registered classes where an engine module is
        # imported); untyped: forced UnknownEvent, as before the engine packages register.
        ev = parse_line(line) if typed else UnknownEvent(kind_name=raw["kind"], payload=raw)
        state.apply(ev)
    return state


@pytest.fixture(params=[True, False], ids=["typed", "unknown"])
def typed(request) -> bool:
    if request.param:
        pytest.importorskip("hwtui.engine.replication.events")
        pytest.importorskip("hwtui.engine.training.events")
    return request.param


def test_replication_stream_folds_to_done(typed):
    s = fold("replicate_ok.jsonl", typed)
    r = s.repl
    assert s.mode == "replicate"
    assert r.n_buckets == 12 and r.count("done") == 12
    assert all(b is None for b in r.lanes), "every lane is free once every bucket is done"
    assert r.peak_gbps == max(g for _, g in r.throughput) > 0
    assert r.average_gbps == pytest.approx(12 * 8 * 2**20 / r.elapsed_s / 1e9, rel=1e-2)
    frac, eta, label = s.progress()
    assert frac == 1.0 and eta == 0.0 and label == "100.7 MB / 100.7 MB"
    assert [c["phase"] for c in r.commits] == ["prepare", "commit"]
    assert not s.errors


def test_lanes_track_the_window_mid_run():
    s = RunState()
    s.apply({"kind": "repl.start", "n_buckets": 5, "window": 2, "total_bytes": 500})
    s.apply({"kind": "repl.bucket", "bucket_id": 0, "state": "inflight", "rank": None})
    s.apply({"kind": "repl.bucket", "bucket_id": 1, "state": "staged", "rank": 0})
    assert s.repl.lanes == [0, 1]
    s.apply({"kind": "repl.bucket", "bucket_id": 2, "state": "staged", "rank": 0})
    assert s.repl.lanes == [0, 1, 2], "an active bucket beyond the window gets an overflow lane"
    s.apply({"kind": "repl.bucket", "bucket_id": 0, "state": "done", "rank": None})
    assert s.repl.lanes[0] is None
    s.apply({"kind": "repl.bucket", "bucket_id": 3, "state": "inflight", "rank": None})
    assert s.repl.lanes[0] == 3, "a freed lane is reused"


def test_a_rank_cannot_declare_a_bucket_done_for_the_world():
    s = RunState()
    s.apply({"kind": "repl.start", "n_buckets": 1, "window": 1})
    s.apply({"kind": "repl.bucket", "bucket_id": 0, "state": "verifying", "rank": 1})
    s.apply({"kind": "repl.bucket", "bucket_id": 0, "state": "done", "rank": 1})
    assert s.repl.states[0] == "verifying"
    s.apply({"kind": "repl.bucket", "bucket_id": 0, "state": "inflight", "rank": 0})
    assert s.repl.states[0] == "verifying", "a lagging rank does not move the bucket back"
    s.apply({"kind": "repl.bucket", "bucket_id": 0, "state": "done", "rank": None})
    assert s.repl.states[0] == "done"


def test_failed_replication_surfaces_every_error(typed):
    s = fold("replicate_fail.jsonl", typed)
    text = "\n".join(s.errors)
    assert "bucket 1 failed on rank 1" in text
    assert "checksum mismatch in bucket 1" in text and "rank 1 verify" in text
    assert "abort: FAILED" in text
    assert "replication FAILED" in text
    assert s.repl.states[1] == "failed"


def test_training_stream(typed):
    s = fold("train_ok.jsonl", typed)
    t = s.train
    assert s.mode == "train" and t.step == 40 and t.steps == 40
    losses = [v for _, v in t.loss]
    assert len(losses) == 40 and losses[-1] < losses[0] / 3, "the loss curve has one point per step and falls"
    assert len(t.merges) == 4 and len(t.checkpoints) == 4
    assert t.shares() == {0: 0.57, 1: 0.43}
    assert s.progress()[0] == 1.0


def test_training_eta_uses_event_time():
    s = RunState()
    s.apply({"kind": "train.start", "t": 100.0, "steps": 10, "workers": [{"rank": 0, "device": "cpu:0"}]})
    s.apply({"kind": "train.worker", "t": 102.0, "rank": 0, "step": 2, "samples": 64, "loss": 1.0})
    frac, eta, _ = s.progress()
    assert frac == pytest.approx(0.2) and eta == pytest.approx(8.0)


def test_worker_lost_is_an_error_and_marks_the_worker():
    s = RunState()
    s.apply({"kind": "train.start", "steps": 10, "workers": [{"rank": 0, "device": "cpu:0"}, {"rank": 1, "device": "cpu:1"}]})
    s.apply({"kind": "train.worker_lost", "rank": 1, "device": "cpu:1", "reason": "exit code -9", "chunks_requeued": 3})
    assert s.train.workers[1]["lost"] == "exit code -9"
    assert "3 chunks requeued" in s.errors[-1]


def test_cluster_stream(typed):
    s = fold("cluster_ok.jsonl", typed)
    assert s.mode == "cluster" and len(s.cluster.nodes) == 2 and s.cluster.done["ok"]
    assert any("algbw 1.90 GB/s" in text for _, text in s.log)


def test_non_json_lines_and_exit_status_reach_the_log():
    s = RunState()
    s.apply(parse_line("Traceback (most recent call last):"))
    s.finish(3)
    assert ("stderr" != s.log[0][0]) and "Traceback" in s.log[0][1]
    assert s.errors == ["engine exited with status 3"]
    assert s.log_total == 2


def test_normalize_accepts_all_three_forms():
    raw = {"kind": "repl.window", "occupancy": 1, "window": 2, "bytes_in_flight": 5, "t": 1.0}
    assert normalize(raw) == ("repl.window", raw)
    kind, data = normalize(UnknownEvent(kind_name="repl.window", payload=raw))
    assert kind == "repl.window" and data["window"] == 2
