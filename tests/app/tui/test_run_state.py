"""The dashboard's headless core: recorded engine streams folded into RunState."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwtui.app.tui.run_state import RunState, to_event
from hwtui.core.events import ErrorEvent, LogEvent, UnknownEvent, parse_line
from hwtui.engine.replication.events import ReplBucket, ReplCommit, ReplDone, ReplStart, ReplWindow
from hwtui.engine.training.events import TrainDone, TrainMerge, TrainStart, TrainWorker, TrainWorkerLost

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
    assert [c.phase for c in r.commits] == ["prepare", "commit"]
    assert not s.errors


def _start(n: int = 5, window: int = 2) -> ReplStart:
    return ReplStart(plan_digest="d", model="m", version="v", total_bytes=100 * n, n_buckets=n, bucket_bytes=100,
                     world_size=3, device="cpu", transport="gloo", window=window, chunk_bytes=100)


def _b(bid: int, state: str, rank: int | None) -> ReplBucket:
    return ReplBucket(bucket_id=bid, state=state, nbytes=100, rank=rank)


def test_lanes_are_the_sources_window():
    s = RunState()
    s.apply(_start(window=2))
    s.apply(_b(0, "staged", 0))
    s.apply(_b(0, "inflight", 0))
    s.apply(_b(1, "staged", 0))
    assert s.repl.lanes == [0, 1]
    s.apply(_b(0, "inflight", 1))  # a receiver posting its receive does not take a lane
    s.apply(_b(0, "done", 0))  # the source's send completed: the bucket leaves the window
    assert s.repl.lanes == [None, 1]
    assert s.repl.awaiting_receivers == 1, "sent, not yet verified everywhere: counted apart"
    s.apply(_b(2, "staged", 0))
    assert s.repl.lanes == [2, 1], "a freed lane is reused"
    s.apply(_b(0, "verifying", 1))
    s.apply(_b(0, "done", None))
    assert s.repl.awaiting_receivers == 0 and s.repl.states[0] == "done"
    assert s.repl.peak_lanes == 2 and len(s.repl.lanes) == 2


def test_a_real_replication_is_drawn_as_the_engine_reports_it(typed):
    """The recorded stream of `hwtui replicate --nproc 3 --inflight 4` (24 buckets): every frame."""
    s = RunState()
    lanes_seen = 0
    for line in (DATA / "real_replicate.jsonl").read_text().splitlines():
        raw = json.loads(line)
        s.apply(parse_line(line) if typed else UnknownEvent(kind_name=raw["kind"], payload=raw))
        busy = sum(1 for b in s.repl.lanes if b is not None)
        assert len(s.repl.lanes) <= s.repl.start.window if s.repl.start else True
        assert busy <= s.repl.window or s.repl.window == 0, "never more buckets in the lanes than the window"
        lanes_seen = max(lanes_seen, busy)
    report = s.repl.done.report
    source = next(r for r in report["ranks"] if r["rank"] == 0)
    assert lanes_seen == s.repl.peak_lanes == source["window"]["peak_occupancy"] == 4
    assert s.repl.bytes_done == report["bytes"] == s.repl.total_bytes
    assert s.repl.count("done") == report["n_buckets"] == 24
    assert s.repl.awaiting_receivers == 0 and all(b is None for b in s.repl.lanes)
    assert s.progress()[0] == 1.0 and not s.errors


def test_a_rank_cannot_declare_a_bucket_done_for_the_world():
    s = RunState()
    s.apply(_start(n=1, window=1))
    s.apply(_b(0, "verifying", 1))
    s.apply(_b(0, "done", 1))
    assert s.repl.states[0] == "verifying"
    s.apply(_b(0, "inflight", 0))
    assert s.repl.states[0] == "verifying", "a lagging rank does not move the bucket back"
    s.apply(_b(0, "done", None))
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

    # The last line says the engine's final loss as every loss is shown: 4 decimals (a real run's
    # loss is a full float: "final loss 3.000429391860962").
    long = TrainDone(ok=True, seconds=2.4, samples=1600, final_loss=3.000429391860962, report=None)
    s.apply(long if typed else UnknownEvent(kind_name=long.kind, payload=long.to_dict()))
    assert s.log[-1][1] == "training done: 1600 samples in 2.4 s, final loss 3.0004", s.log[-1]


def _train_start(steps: int = 10, ranks: int = 1, merge_every: int = 5) -> TrainStart:
    return TrainStart(workers=[{"rank": r, "device": f"cpu:{r}"} for r in range(ranks)], steps=steps, batch_size=16,
                      balance="dynamic", merge_every=merge_every, params=1, t=100.0)


def _w(rank: int, step: int, t: float) -> TrainWorker:
    return TrainWorker(rank=rank, device=f"cpu:{rank}", step=step, samples=16 * step, samples_per_s=1.0, loss=1.0,
                       mem_used=None, mem_total=None, chunks_claimed=step, t=t)


def test_training_eta_is_the_measured_rate_not_the_start_up():
    s = RunState()
    s.apply(_train_start(steps=10))
    s.apply(_w(0, 1, t=120.0))  # 20 s of start-up before the first report: not part of the rate
    assert s.progress()[1] is None, "one report is no rate yet"
    s.apply(_w(0, 3, t=122.0))  # 2 steps in 2 s
    frac, eta, label = s.progress()
    assert frac == pytest.approx(0.3) and eta == pytest.approx(7.0)
    assert label.startswith("step 3 / 10")


def test_training_progress_never_overshoots_before_done():
    s = RunState()
    s.apply(_train_start(steps=10, ranks=2, merge_every=5))
    # Dynamic balance: the fast rank takes 7 chunks of the round's 10, the slow one 3.
    s.apply(_w(0, 7, t=101.0))
    s.apply(_w(1, 3, t=102.0))
    assert s.train.step == pytest.approx(5.0), "a round of 5 steps is 10 chunks over 2 workers"
    s.apply(TrainMerge(round=1, step=5, shares=[0.7, 0.3], loss_merged=1.0, loss_workers_mean=1.0))
    s.apply(_w(0, 15, t=103.0))  # requeued chunks may push a worker's count past the total
    s.apply(_w(1, 8, t=104.0))
    frac, _, label = s.progress()
    assert frac < 1.0 and "step 9 / 10" in label, label
    s.apply(TrainDone(ok=True, seconds=4.0, samples=320, final_loss=1.0, report=None))
    assert s.progress()[0] == 1.0 and s.progress()[1] == 0.0


def test_half_chunks_at_the_end_of_a_round_count_as_half_a_step():
    """The engine's finer tail: a worker may train half a chunk (one optimizer step on half a
    batch). Progress follows samples, so the bar never runs ahead of the engine within a round."""
    s = RunState()
    s.apply(_train_start(steps=10, ranks=2, merge_every=5))
    # Rank 0: 3 whole chunks and a half; rank 1: 1 whole and the other half. 6 optimizer steps,
    # 5 chunks' worth of samples.
    s.apply(TrainWorker(rank=0, device="cpu:0", step=4, samples=16 * 3 + 8, samples_per_s=1.0, loss=1.0,
                        mem_used=None, mem_total=None, chunks_claimed=4, t=101.0))
    s.apply(TrainWorker(rank=1, device="cpu:1", step=2, samples=16 * 1 + 8, samples_per_s=1.0, loss=1.0,
                        mem_used=None, mem_total=None, chunks_claimed=2, t=102.0))
    assert s.train.step == pytest.approx(2.5), "5 chunks over 2 workers is 2.5 steps, not 6 / 2 = 3"


def test_worker_lost_is_an_error_and_marks_the_worker():
    s = RunState()
    s.apply(_train_start(ranks=2))
    s.apply(TrainWorkerLost(rank=1, device="cpu:1", reason="exit code -9", chunks_requeued=3))
    assert s.train.workers[1].lost == "exit code -9"
    assert "3 chunks requeued" in s.errors[-1]


def test_a_user_stop_is_not_an_error():
    s = RunState()
    s.apply(_start())
    s.mark_stopped()
    s.apply(ErrorEvent(message="rank 1 killed by SIGTERM", rank=1))
    s.finish(143)
    assert s.stopped and not s.errors
    assert any("stopped by the user" in text for _, text in s.log)


def test_cluster_stream(typed):
    s = fold("cluster_ok.jsonl", typed)
    assert s.mode == "cluster" and len(s.cluster.nodes) == 2 and s.cluster.done.ok
    assert any("algbw 1.90 GB/s" in text for _, text in s.log)


def test_non_json_lines_and_exit_status_reach_the_log():
    s = RunState()
    s.apply(parse_line("Traceback (most recent call last):"))
    s.finish(3)
    assert ("stderr" != s.log[0][0]) and "Traceback" in s.log[0][1]
    assert s.errors == ["engine exited with status 3"]
    assert s.log_total == 2


def test_every_form_becomes_the_engines_class():
    raw = {"kind": "repl.window", "occupancy": 1, "window": 2, "bytes_in_flight": 5, "t": 1.0}
    assert to_event(raw) == ReplWindow(occupancy=1, window=2, bytes_in_flight=5, t=1.0)
    assert to_event(UnknownEvent(kind_name="repl.window", payload=raw)) == to_event(raw)


def test_a_real_training_run_is_drawn_as_the_engine_reports_it(typed):
    """The recorded stream of `hwtui train --gpu-ids cpu:0,cpu:1 --steps 12 --merge-every 4`."""
    s = RunState()
    for line in (DATA / "real_train.jsonl").read_text().splitlines():
        raw = json.loads(line)
        s.apply(parse_line(line) if typed else UnknownEvent(kind_name=raw["kind"], payload=raw))
        if s.train.done is None and s.train.start is not None:
            frac, _, _ = s.progress()
            if s.train.merged_step < s.train.steps:
                assert s.train.step < s.train.steps and frac < 1.0, "never done before the engine says so"
            assert s.train.step >= s.train.merged_step
    report = s.train.done.report
    assert s.train.step == report["step"] == s.train.steps == 12
    assert [m.step for m in s.train.merges] == [r["step"] for r in report["rounds"]] == [4, 8, 12]
    assert sum(w.samples for w in s.train.workers.values()) == report["samples"]
    assert s.progress()[0] == 1.0 and not s.errors


def test_the_engines_human_output_is_not_logged_twice():
    ok = RunState()
    ok.apply(LogEvent(message="Using CPU broadcast transport (gloo).", source="replication.transport"))
    ok.add_stderr("Using CPU broadcast transport (gloo).")
    ok.add_stderr("        1.6 / 1.6 MB    0.02 GB/s    0.08 s")
    ok.finish(0)
    assert sum("Using CPU broadcast" in text for _, text in ok.log) == 1
    assert not any("GB/s" in text for _, text in ok.log)

    failed = RunState()
    failed.add_stderr("rank 1 lost its peer")
    failed.add_stderr("RuntimeError: gloo connection closed")
    assert ("stderr", "RuntimeError: gloo connection closed") in failed.log, "an error line shows at once"
    failed.finish(3)
    assert ("stderr", "rank 1 lost its peer") in failed.log, "a failure brings the held-back tail"


def test_rank_start_up_is_drawn_as_the_launcher_counts_it(typed):
    """repl.ranks lines between repl.start and the first bucket: 'ranks ready n/N (phase)' until bytes move."""
    s = RunState()
    seen = []
    for line in (DATA / "real_replicate_ranks.jsonl").read_text().splitlines():
        raw = json.loads(line)
        s.apply(parse_line(line) if typed else UnknownEvent(kind_name=raw["kind"], payload=raw))
        if raw["kind"] == "repl.ranks":
            label = s.progress()[2]
            assert label.endswith(f"ranks ready {raw['ready']}/{raw['world_size']} ({raw['phase']})"), label
            assert s.repl.starting_up and dict(s.repl.phase_counts()) == raw["counts"]
            seen.append(raw["ready"])
        elif raw["kind"] == "repl.bucket":
            # The first byte moved: start-up is over and the label says so no more.
            assert not s.repl.starting_up and "ranks ready" not in s.progress()[2]
    assert seen == [0, 0, 0, 1, 3]
    assert s.repl.done is not None and s.repl.done.ok and s.progress()[0] == 1.0 and not s.errors


def test_a_rank_report_before_the_start_event_is_kept():
    s = RunState()
    s.apply({"kind": "repl.ranks", "t": 1.0, "world_size": 4, "ready": 2, "phase": "world joined",
             "counts": {"started": 4, "plan loaded": 4, "world joined": 4, "ready": 2}})
    assert s.mode == "replicate" and "ranks ready 2/4 (world joined)" in s.progress()[2]
    s.apply({"kind": "repl.start", "t": 2.0, "plan_digest": "d", "model": "m", "version": "v", "total_bytes": 10,
             "n_buckets": 1, "bucket_bytes": 10, "world_size": 4, "device": "cpu", "transport": "gloo",
             "window": 2, "chunk_bytes": 10})
    assert s.repl.starting_up and "ranks ready 2/4 (world joined)" in s.progress()[2]


# -- issue 25: the screen never contradicts the engine or itself ----------------------------------

def _frames(name: str):
    """Every frame of a recorded stream: the state after each event, with the raw event."""
    s = RunState()
    for line in (DATA / name).read_text().splitlines():
        s.apply(parse_line(line))
        yield s, json.loads(line)


def test_replication_figures_agree_frame_by_frame_with_the_engines_events():
    """Window header, lanes, bucket counts, bytes and GB/s agree after every event of a real run."""
    bytes_of: dict[int, int] = {}
    world_done: set[int] = set()
    throughput = None
    for s, raw in _frames("real_replicate.jsonl"):
        r = s.repl
        if raw["kind"] == "repl.bucket":
            bytes_of[raw["bucket_id"]] = raw["nbytes"]
            if raw["rank"] is None and raw["state"] == "done":
                world_done.add(raw["bucket_id"])
        if raw["kind"] == "repl.throughput":
            throughput = raw
        if r.start is None:
            continue
        busy = [b for b in r.lanes if b is not None]
        assert r.occupancy == len(busy), "the header counts the lanes drawn under it"
        assert r.bytes_in_flight == sum(bytes_of[b] for b in busy)
        assert r.count("done") == len(world_done)
        verified = sum(bytes_of[b] for b in world_done)
        assert r.bytes_done >= verified, "the bar never shows less than 'buckets N/M' does"
        if r.done is None:
            frac = s.progress()[0]
            assert frac == pytest.approx(min(r.bytes_done / r.total_bytes, 0.999))
            assert f"{frac * 100:5.1f}" != "100.0", "100 % only once the engine says done"
            if world_done:
                assert frac > 0, "buckets done while the bar says 0.0%"
        if throughput is None:
            assert r.current_gbps is None, "no GB/s figure before the engine gave one"
        else:
            assert r.current_gbps == throughput["gbps"]


def test_the_window_header_never_disagrees_with_the_lanes_when_window_events_lag():
    s = RunState()
    s.apply(_start(n=6, window=4))
    for bid in range(4):
        s.apply(_b(bid, "staged", 0))
        s.apply(_b(bid, "inflight", 0))
    # The window event of an earlier moment arrives after the fourth bucket entered.
    s.apply(ReplWindow(occupancy=3, window=4, bytes_in_flight=300))
    assert s.repl.occupancy == 4 == sum(1 for b in s.repl.lanes if b is not None)
    assert s.repl.bytes_in_flight == 400


def test_a_stopped_replication_is_stopped_not_failed():
    """'s' during a run: the engine's own 'FAILED' after the stop is the stop (warning), no ETA."""
    s = RunState()
    s.apply(_start(n=4))
    s.apply(_b(0, "staged", 0))
    s.mark_stopped()
    s.apply(ReplDone(ok=False, seconds=11.6, bytes=0, gbps=0.0, report=None))
    s.apply(ReplCommit(version="v", phase="abort", ok=False, detail="stopped"))
    s.finish(143)
    assert not s.errors, s.errors
    assert all(level != "error" for level, _ in s.log)
    frac, eta, label = s.progress()
    assert eta is None and label.endswith("stopped") and s.phase == "stopped"


def test_a_stopped_training_is_stopped_not_failed():
    s = RunState()
    s.apply(_train_start(steps=10))
    s.apply(_w(0, 3, t=101.0))
    s.mark_stopped()
    s.apply(TrainDone(ok=False, seconds=2.0, samples=48, final_loss=None, report=None))
    s.finish(143)
    assert not s.errors and s.progress()[1] is None and s.progress()[2].endswith("stopped")


def test_a_failed_run_has_no_eta():
    s = RunState()
    s.apply(_start(n=4))
    s.apply(ReplDone(ok=False, seconds=1.0, bytes=0, gbps=0.0, report=None))
    frac, eta, label = s.progress()
    assert eta is None and label.endswith("failed") and s.errors


def test_training_is_finishing_between_the_last_merge_and_done():
    s = RunState()
    s.apply(_train_start(steps=10, ranks=1, merge_every=5))
    s.apply(_w(0, 5, t=101.0))
    s.apply(TrainMerge(round=1, step=5, shares=[1.0], loss_merged=1.0, loss_workers_mean=1.0))
    s.apply(_w(0, 10, t=102.0))
    s.apply(TrainMerge(round=2, step=10, shares=[1.0], loss_merged=1.0, loss_workers_mean=1.0))
    frac, eta, label = s.progress()
    assert s.train.finishing and s.phase == "finishing"
    assert f"{frac * 100:5.1f}" != "100.0" and eta is None and "finishing" in label
    s.apply(TrainDone(ok=True, seconds=3.0, samples=160, final_loss=1.0, report=None))
    assert s.progress()[0] == 1.0 and not s.train.finishing and s.phase == "done"


def test_real_training_shows_100_percent_only_at_done_and_one_step_number():
    """The recorded run: the loss line is labelled with the header's step; 100 % only at train.done."""
    for s, raw in _frames("real_train.jsonl"):
        if s.train.start is None:
            continue
        frac, _, label = s.progress()
        if s.train.done is None:
            assert f"{frac * 100:5.1f}" != "100.0", (raw["kind"], label)
        if raw["kind"] in ("train.worker", "train.merge", "train.done") and s.train.loss:
            assert s.train.loss[-1][0] == s.train.shown_step, raw["kind"]
            assert label.startswith(f"step {s.train.shown_step} / ")


def test_span_timings_stay_out_of_the_log(typed):
    """A real run's stream carries several repl.span timings per bucket and rank (the timeline's);
    logged, they were dict dumps that pushed the transport line and every other line out of the
    log's last 500. They are counted, not logged."""
    from hwtui.engine.replication.events import ReplSpan

    s, spans = RunState(log_lines=500), 0
    for line in (DATA / "real_replicate.jsonl").read_text().splitlines():
        raw = json.loads(line)
        s.apply(parse_line(line) if typed else UnknownEvent(kind_name=raw["kind"], payload=raw))
        if raw["kind"] == "repl.bucket" and raw.get("rank") is not None:
            for phase in ("hash", "copy", "fault") * 10:  # what a long run sends, many times over
                span = ReplSpan(rank=raw["rank"], bucket_id=raw["bucket_id"], phase=phase, seconds=0.001)
                s.apply(span if typed else UnknownEvent(kind_name=span.kind, payload=span.to_dict()))
                spans += 1
    assert spans > 500 and s.repl.spans == spans
    assert not any("repl.span" in text for _, text in s.log)
    assert any("Using CPU broadcast transport" in text for _, text in s.log), "the transport line is still there"
    assert s.repl.count("done") == 24 and s.progress()[0] == 1.0


def test_an_export_is_a_line_of_the_log_not_a_dump():
    from hwtui.engine.training.events import TrainExport

    s = RunState()
    s.apply(_train_start())
    s.apply(TrainExport(round=1, step=5, path="/out/round-1"))
    s.apply(TrainExport(round=2, step=10, path=None, error="No space left on device", final=True))
    texts = [text for _, text in s.log]
    assert "export of round 1 (step 5) -> /out/round-1" in texts
    assert ("warning", "export of round 2 (step 10) failed: No space left on device") in s.log
    assert not any("train.export" in text for text in texts)


def test_engine_text_reaches_the_log_as_one_clean_line(typed):
    """Names in engine lines come from the weights (a safetensors header's tensor names) and the
    network (a peer's host name): their ESC sequences reached the terminal through the log."""
    from hwtui.core.terminal_text import is_clean

    s = RunState()
    hostile = "tensor \x1b]0;pwned\x07name\x1b[2J with\u202e bidi\nand a second line"
    for ev in (LogEvent(message=hostile, level="info", source="replication"),
               ErrorEvent(message=hostile, rank=1, where="verify")):
        s.apply(ev if typed else UnknownEvent(kind_name=ev.kind, payload=ev.to_dict()))
    s.add_stderr(hostile)
    s.finish(1)
    assert all(is_clean(text) for _, text in s.log) and all(is_clean(e) for e in s.errors), s.log
    assert any("tensor name with bidi and a second line" in text for _, text in s.log)
