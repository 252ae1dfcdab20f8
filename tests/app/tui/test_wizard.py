"""Pilot tests: walk the wizard on replayed machines and watch a recorded run on the dashboard.

The engine here is tests/app/tui/stream_engine.py replaying a recorded JSONL stream through a real
child process; test_real_engine.py runs the real `hwtui replicate` / `hwtui train`.
"""

from __future__ import annotations

import json

import pytest

from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.probes.host import ReplayHost
from hwtui.widgets.bucket_lanes import BucketLanes
from hwtui.widgets.device_panel import DevicePanel
from hwtui.widgets.device_table import DeviceTable
from hwtui.widgets.error_log import ErrorLog
from hwtui.widgets.finding_detail import FindingDetail
from hwtui.widgets.findings_list import FindingsList
from hwtui.widgets.progress_eta import ProgressEta
from hwtui.widgets.throughput_chart import ThroughputChart
from hwtui.widgets.worker_table import WorkerTable
from tests.app.tui.conftest import FixedSampler, RecordedEngine, to_engine_step, wait_for

pytestmark = pytest.mark.timeout(120)


def make_app(snapshot, engine=None, **kw) -> HwtuiApp:
    return HwtuiApp(ReplayHost.load(snapshot), TuiConfig.load(), config_file=config_path(), engine_stages=engine,
                    sampler_factory=kw.pop("sampler_factory", FixedSampler), **kw)


def log_text(app) -> str:
    return "\n".join(t for _, t in app.get_screen("run").state.log)


async def test_walk_the_wizard_and_watch_a_replication(snapshots, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    engine = RecordedEngine("replicate_ok.jsonl", delay=0.005)
    app = make_app(snapshots["h100_x8"], engine)
    async with app.run_test(size=(100, 30)) as pilot:
        # 1 Detect: all eight H100s with their per-backend ids.
        await wait_for(pilot, lambda: app.devices)
        table = app.screen.query_one(DeviceTable)
        assert table.row_count == 8
        assert [str(table.get_row_at(i)[5]) for i in range(8)] == [f"cuda:{i}" for i in range(8)]
        assert "8 usable" in str(app.screen.query_one("#status").render())
        # 2 Drivers
        await pilot.press("n")
        assert app.screen.name == "drivers" or app.screen.STEP == "drivers"
        await wait_for(pilot, lambda: app.screen.query_one(FindingsList).row_count > 0)
        ids = [f.id for f in app.screen.query_one(FindingsList).findings]
        assert "pci.driver[0000:18:00.0]" in ids
        # 3 Environment
        await pilot.press("n")
        assert app.screen.STEP == "environment"
        await wait_for(pilot, lambda: "findings" in str(app.screen.query_one("#status").render()))
        # 4 Engine: defaults come from the 8 H100s; run a CPU replication of our plan.
        await pilot.press("n")
        assert app.screen.STEP == "engine"
        assert app.screen.query_one("#in-nproc").placeholder.startswith("8 ")
        assert app.screen.query_one("#in-device").placeholder.startswith("cuda")
        app.screen.query_one("#in-plan").value = str(plan)
        app.screen.query_one("#in-device").value = "cpu"
        app.screen.query_one("#in-nproc").value = "2"
        await pilot.press("ctrl+s")
        # 5 Run
        assert app.screen.STEP == "run"
        run = app.screen
        await wait_for(pilot, lambda: run.state.finished)
        await pilot.pause(0.3)
        assert engine.cfg.plan == str(plan) and engine.cfg.device == "cpu" and engine.cfg.nproc == 2
        assert run.query_one("#views").current == "view-replicate"
        lanes = run.query_one(BucketLanes)
        assert lanes.picture is not None and lanes.picture.done == 12
        assert "buckets 12/12" in str(lanes.render())
        chart = run.query_one(ThroughputChart)
        assert chart.peak > 0 and chart.average > 0 and "peak" in str(chart.render())
        progress = run.query_one(ProgressEta)
        assert progress.status == "done" and progress.fraction == 1.0
        assert "100.0%" in str(progress.render())
        # Devices sampled live by the sampler worker: 8 GPUs and the CPU.
        await wait_for(pilot, lambda: len(run.query_one(DevicePanel).keys) == 9)
        # Choices were remembered.
        saved = json.loads(config_path().read_text())
        assert saved["plan"] == str(plan) and saved["device"] == "cpu" and saved["nproc"] == 2
        # Back and Next move between steps; r on Run re-runs the same engine.
        await pilot.press("b")
        assert app.screen.STEP == "engine"
        await pilot.press("escape")
        assert app.screen.STEP == "environment"
        await pilot.press("n")
        assert app.screen.STEP == "engine"
        await pilot.press("n")  # Next on the Engine step moves on; only ctrl+s (or r here) starts a run
        assert app.screen.STEP == "run" and engine.calls == 1
        await pilot.press("r")
        await wait_for(pilot, lambda: engine.calls == 2 and run.state.finished)
        await pilot.press("r")
        await wait_for(pilot, lambda: engine.calls == 3 and run.state.finished)
        assert run.query_one(BucketLanes).picture.done == 12


async def test_copy_a_remedy(snapshots):
    app = make_app(snapshots["vfio_passthrough"])
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("n")
        findings = app.screen.query_one(FindingsList)
        await wait_for(pilot, lambda: findings.row_count > 0)
        first = findings.current()
        assert first.id == "pci.driver[0000:02:00.0]" and first.remedy, "worst finding first: the passed-through GPU"
        detail = app.screen.query_one(FindingDetail)
        assert detail.query_one("#remedy").text == first.remedy, "the remedy is shown in a selectable text area"
        await pilot.press("c")
        assert app.clipboard == first.remedy
        # Moving to a finding without a remedy hides the area; c then says so instead of copying.
        await pilot.press("down")
        assert findings.current().id != first.id and not findings.current().remedy
        assert not detail.remedy and detail.query_one("#remedy").has_class("-empty")
        await pilot.press("c")
        assert app.clipboard == first.remedy


async def test_rerun_a_step(snapshots, monkeypatch):
    import hwtui.probes.inventory as inventory

    calls = []
    real = inventory.detect_devices
    monkeypatch.setattr(inventory, "detect_devices", lambda host: (calls.append(1), real(host))[1])
    app = make_app(snapshots["h100_x8"])
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(calls) == 1 and app.devices)
        await pilot.press("r")
        await wait_for(pilot, lambda: len(calls) == 2)
        await pilot.press("n", "b")
        await pilot.pause(0.2)
        assert len(calls) == 2, "going back shows what was found, it does not probe again"


async def test_engine_form_validation(snapshots, tmp_path):
    app = make_app(snapshots["h100_x8"], RecordedEngine("replicate_ok.jsonl"))
    async with app.run_test(size=(80, 24)) as pilot:
        await to_engine_step(pilot)
        assert app.screen.STEP == "engine"
        screen = app.screen
        screen.query_one("#in-plan").value = str(tmp_path / "missing.json")
        screen.query_one("#in-window").value = "-3"
        await pilot.press("ctrl+s")
        assert app.screen.STEP == "engine", "a bad form does not start anything"
        problems = str(screen.query_one("#problems").render())
        assert "does not exist" in problems and "Window" in problems
        assert screen.query_one("#in-window").has_class("-invalid")
        # Switch to training with the keyboard: the plan is no longer needed.
        screen.query_one("#in-window").value = ""
        screen.query_one("#mode").focus()
        await pilot.press("right")
        assert screen.query_one("#mode").value == "train"
        assert screen.query_one("#in-plan").has_class("-off")
        # Tab goes through training's own fields only: replication's are dimmed and skipped.
        order = []
        for _ in range(5):
            await pilot.press("tab")
            order.append(app.focused.id)
        assert order == ["in-gpu_ids", "in-steps", "in-model", "in-data", "in-interval"], order
        screen.query_one("#mode").focus()
        await pilot.press("left")  # back to replicate: its fields are in the tab order again
        await pilot.press("tab", "tab")
        assert app.focused.id == "in-plan"
        screen.query_one("#mode").focus()
        await pilot.press("right")
        # The user's model and text are checked as `hwtui train` checks them, before a run.
        no_config = tmp_path / "my-model"
        no_config.mkdir()
        for model, data, field, needle in [
            (str(tmp_path / "nowhere"), "", "model", "Model: no such directory"),
            (str(no_config), "", "model", "Model: no config.json"),
            ("", str(tmp_path / "missing.txt"), "data", "Text data: " + str(tmp_path / "missing.txt") + " does not exist"),
        ]:
            screen.query_one("#in-model").value, screen.query_one("#in-data").value = model, data
            await pilot.press("ctrl+s")
            assert app.screen.STEP == "engine", "a bad form does not start anything"
            assert needle in str(screen.query_one("#problems").render())
            assert screen.query_one(f"#in-{field}").has_class("-invalid")


async def test_training_run_on_the_dashboard(snapshots):
    engine = RecordedEngine("train_ok.jsonl", delay=0.003)
    app = make_app(snapshots["h100_x8"], engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await to_engine_step(pilot)
        app.screen.query_one("#mode").value = "train"
        app.screen.query_one("#in-gpu_ids").value = "cpu:0,cpu:1"
        await pilot.press("ctrl+s")
        run = app.screen
        await wait_for(pilot, lambda: run.state.finished)
        await pilot.pause(0.3)
        assert run.query_one("#views").current == "view-train"
        table = run.query_one(WorkerTable)
        assert table.row_count == 2
        row0 = [str(c) for c in table.get_row("0")]
        assert row0[1] == "cpu:0" and row0[2] == "40" and "57%" in row0[4]
        loss = str(run.query_one("#loss").render())
        assert "step 40" in loss
        assert "#4" in str(run.query_one("#merges").render())
        assert app.config.mode == "train" and app.config.gpu_ids == "cpu:0,cpu:1"
        # 30 rows is short: the chart cannot be drawn, so it takes its two lines of figures and
        # why, and no blank rows (it had 6, 4 of them empty, while the log had no room).
        assert run.has_class("-short")
        chart = run.query_one("#loss")
        assert chart.size.height == 2 and loss.splitlines()[1].startswith("(chart hidden")


async def test_engine_errors_are_shown_never_swallowed(snapshots, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    engine = RecordedEngine("replicate_fail.jsonl", extra=("--stderr", "RuntimeError: gloo connection closed", "--exit", "3"))
    app = make_app(snapshots["h100_x8"], engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await to_engine_step(pilot)
        app.screen.query_one("#in-plan").value = str(plan)
        await pilot.press("ctrl+s")
        run = app.screen
        await wait_for(pilot, lambda: run.state.finished)
        await pilot.pause(0.3)
        text = log_text(app)
        assert "checksum mismatch in bucket 1" in text
        assert "RuntimeError: gloo connection closed" in text, "stderr is captured into the log"
        assert "engine exited with status 3" in text
        assert run.query_one(ProgressEta).status == "FAILED"
        assert "error" in str(run.query_one("#log-box").border_title)
        messages = [n.message for n in app._notifications]
        assert any("checksum mismatch" in m for m in messages)
        assert any("exited with status 3" in m for m in messages)
        assert run.query_one(ErrorLog).seen == run.state.log_total


async def test_quit_stops_a_running_engine(snapshots, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    engine = RecordedEngine("replicate_ok.jsonl", extra=("--hang",))
    app = make_app(snapshots["h100_x8"], engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await to_engine_step(pilot)
        app.screen.query_one("#in-plan").value = str(plan)
        await pilot.press("ctrl+s")
        run = app.screen
        await wait_for(pilot, lambda: run.engine_running and run.state.repl.done is not None)
        proc = run.engine.child.proc
        await pilot.press("q")
        await wait_for(pilot, lambda: proc.poll() is not None, timeout=10)
    assert proc.returncode == -15, "SIGTERM was enough; the engine did not need SIGKILL"
    assert app.return_value == 0


async def test_stop_key_and_sampler_never_overlaps(snapshots, tmp_path):
    import threading
    import time

    class SlowSampler(FixedSampler):
        active = 0
        overlaps = 0

        def sample(self):
            SlowSampler.active += 1
            if SlowSampler.active > 1:
                SlowSampler.overlaps += 1
            time.sleep(0.15)  # slower than the interval: polls must still not overlap
            assert threading.current_thread() is not threading.main_thread()
            SlowSampler.active -= 1
            return super().sample()

    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    app = make_app(snapshots["h100_x8"], RecordedEngine("replicate_ok.jsonl", extra=("--hang",)),
                   sampler_factory=SlowSampler)
    async with app.run_test(size=(80, 24)) as pilot:
        await to_engine_step(pilot)
        app.screen.query_one("#in-plan").value = str(plan)
        await pilot.press("ctrl+s")
        run = app.screen
        app.config.interval = 0.05  # below what the form accepts: the poll takes 3x the interval
        await wait_for(pilot, lambda: run.engine_running)
        # Wait on the state (four polls done), not on a time: a loaded box polls slower.
        await wait_for(pilot, lambda: run._sampler is not None and run._sampler.devices_sampler.polls >= 4, timeout=30)
        assert SlowSampler.overlaps == 0, (run._sampler.devices_sampler.polls, SlowSampler.overlaps)
        await pilot.press("s")
        await wait_for(pilot, lambda: run.state.finished, timeout=10)
        assert "engine stopped" in log_text(app)
        assert run.query_one(ProgressEta).status == "stopped"
        assert not run.state.errors, "a user stop is not a failure"


async def test_help_opens_and_closes(snapshots):
    app = make_app(snapshots["h100_x8"])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        assert app.screen.STEP == "detect"


async def test_remembered_choices_prefill_the_engine_step(snapshots):
    TuiConfig(mode="train", gpu_ids="cpu:0,cpu:1", steps=9).save()
    app = make_app(snapshots["h100_x8"])
    async with app.run_test(size=(80, 24)) as pilot:
        await to_engine_step(pilot)
        assert app.screen.query_one("#mode").value == "train"
        assert app.screen.query_one("#in-gpu_ids").value == "cpu:0,cpu:1"
        assert app.screen.query_one("#in-steps").value == "9"


async def test_engine_step_names_the_extra_before_a_run(snapshots, monkeypatch, tmp_path):
    monkeypatch.setattr("hwtui.app.tui.engine_process.missing_engine_modules", lambda: ["torch", "xxhash"])
    engine = RecordedEngine("replicate_ok.jsonl")
    app = make_app(snapshots["h100_x8"], engine)
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    async with app.run_test(size=(100, 30)) as pilot:
        await to_engine_step(pilot)
        problems = str(app.screen.query_one("#problems").render())
        assert 'pip install "hwtui[engine]"' in problems and "torch, xxhash" in problems
        app.screen.query_one("#in-plan").value = str(plan)
        await pilot.press("ctrl+s")
        assert app.screen.STEP == "engine" and engine.calls == 0, "no run without the engine extra"


async def test_choices_and_steps_are_clickable(snapshots):
    app = make_app(snapshots["h100_x8"])
    async with app.run_test(size=(100, 30)) as pilot:
        await to_engine_step(pilot)
        mode = app.screen.query_one("#mode")
        assert mode.value == "replicate"
        # "(•) replicate  ( ) train": the train option starts after "(•) replicate  " (1 cell of padding first).
        assert await pilot.click("#mode", offset=(1 + len("(•) replicate  ") + 2, 0))
        await wait_for(pilot, lambda: mode.value == "train")
        assert await pilot.click("StepBar", offset=(len(" hwtui  ") + 1, 0))  # "[1 Detect]" at 100 columns
        await wait_for(pilot, lambda: getattr(app.screen, "STEP", "") == "detect")


async def test_rank_start_up_shows_ranks_ready_and_the_phase(snapshots, tmp_path):
    """The launcher's repl.ranks reports, drawn before the first byte moves (the engine hangs there)."""
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    app = make_app(snapshots["h100_x8"], RecordedEngine("replicate_startup.jsonl", extra=("--hang",)))
    async with app.run_test(size=(80, 24)) as pilot:
        await to_engine_step(pilot)
        app.screen.query_one("#in-plan").value = str(plan)
        app.screen.query_one("#in-device").value = "cpu"
        await pilot.press("ctrl+s")
        run = app.screen
        await wait_for(pilot, lambda: run.state.repl.ranks is not None and run.state.repl.ranks.ready == 1)
        run._paint()
        await pilot.pause(0.05)
        progress = str(run.query_one(ProgressEta).render())
        assert progress.startswith("running") and "0.0%" in progress
        assert progress.endswith("ranks ready 1/3 (world joined)"), progress
        lanes = str(run.query_one(BucketLanes).render()).splitlines()
        assert lanes[1].split() == ["ranks", "started", "3/3", "plan", "loaded", "3/3", "world", "joined", "3/3",
                                    "ready", "1/3"], lanes
        assert not run.state.errors
