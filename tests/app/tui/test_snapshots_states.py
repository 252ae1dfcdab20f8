"""Snapshots of the Run screen's end states and of a real machine's recording (issue 25).

Stopped (``s`` mid-run), finishing (the last merge came, train.done has not) and failed, each at
80x24, 120x36 and 200x60 (the monitor on the real H200 recording is in test_snapshots.py). Every
wait is on state. The engine is a recorded stream (tests/app/tui/stream_engine.py), ``--hang`` keeping it
alive where the state needs a running engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.probes.host import ReplayHost
from tests.app.tui.conftest import RecordedEngine, settle, to_engine_step, wait_for
from tests.app.tui.test_snapshots import REPO, ConstantSampler, _charts_built

SIZES = [(80, 24), (120, 36), (200, 60)]
IDS = ["80x24", "120x36", "200x60"]


@pytest.fixture
def make(snapshots, monkeypatch, unbudgeted_charts):
    monkeypatch.chdir(REPO)  # relative stream paths: the logged command line is the same everywhere
    monkeypatch.setattr("tests.app.tui.conftest.DATA", Path("tests/app/tui/data"))

    def build(engine, machine="h100_x8"):
        host = ReplayHost(json.loads(snapshots[machine].read_text()), origin=f"{machine}.json")
        app = HwtuiApp(host, TuiConfig(interval=3600.0), config_file=config_path(), engine_stages=engine,
                       sampler_factory=ConstantSampler)
        # No toasts: the engine's exit is posted after the state says finished, so a toast could
        # land after any clearing; the states are read from the bar and the log, which stay.
        app.notify = lambda *a, **k: None  # type: ignore[method-assign]
        return app

    return build


def _start(mode: str, fill: dict[str, str]):
    async def start(pilot):
        app = pilot.app
        await wait_for(pilot, lambda: app.devices)
        await to_engine_step(pilot)
        app.screen.query_one("#mode").value = mode
        for field, value in fill.items():
            app.screen.query_one(f"#in-{field}").value = value
        await pilot.press("ctrl+s")
        return app.screen

    return start


def _logs_at_end(pilot) -> bool:
    """Every error log on screen has rendered what it was given and, following its end, shows it:
    a loaded run's [80x24] once showed the log still at the command line, its ERROR lines below."""
    from hwtui.widgets.error_log import ErrorLog

    logs = [log for log in pilot.app.screen.query(ErrorLog) if log.display and log.size.area]
    return all(not log._deferred_renders and (not log.auto_scroll or log.scroll_y >= log.max_scroll_y) for log in logs)


async def _settle(pilot, run) -> None:
    await pilot.pause(0.2)
    run._paint()
    await pilot.pause(0.1)
    await wait_for(pilot, lambda: _logs_at_end(pilot))
    await _charts_built(pilot)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_stopped(snap_compare, make, size):
    app = make(RecordedEngine("replicate_partial.jsonl", extra=("--hang",)))

    async def run_before(pilot):
        run = await _start("replicate", {"plan": "README.md", "device": "cpu"})(pilot)
        await wait_for(pilot, lambda: run.state.repl.count("done") > 0 and run.engine_running)
        await pilot.press("s")
        await wait_for(pilot, lambda: run.state.finished and not run.engine_running)
        assert run.state.stopped and not run.state.errors, run.state.errors
        await _settle(pilot, run)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_finishing(snap_compare, make, size):
    app = make(RecordedEngine("train_finishing.jsonl", extra=("--hang",)))

    async def run_before(pilot):
        run = await _start("train", {"gpu_ids": "cpu:0,cpu:1"})(pilot)
        await wait_for(pilot, lambda: run.state.train.finishing)
        await _settle(pilot, run)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_failed(snap_compare, make, size):
    app = make(RecordedEngine("replicate_fail.jsonl", extra=("--exit", "1")))

    async def run_before(pilot):
        run = await _start("replicate", {"plan": "README.md", "device": "cpu"})(pilot)
        # The engine's exit too, not only its last event: under load the process can outlive its
        # repl.done by a moment, and the screen says so (it failed once that way in a loaded run).
        await wait_for(pilot, lambda: run.state.finished and not run.engine_running)
        await _settle(pilot, run)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


async def test_rerun_starts_from_a_clean_panel(make):
    """`r` after a finished replication: until the new run's first event the Run screen shows the
    idle view, never the previous run's 12/12 buckets, GB/s and chart (issue 25)."""
    from textual.widgets import ContentSwitcher

    from hwtui.app.tui.screens.run import RunScreen
    from hwtui.widgets.progress_eta import ProgressEta

    app = make(RecordedEngine("replicate_ok.jsonl"))
    async with app.run_test(size=(120, 36)) as pilot:
        run = await _start("replicate", {"plan": "README.md", "device": "cpu"})(pilot)
        assert isinstance(run, RunScreen)
        await wait_for(pilot, lambda: run.state.finished and run.state.done_ok)
        await pilot.pause(0.2)
        assert run.query_one("#views", ContentSwitcher).current == "view-replicate"
        # The next run says nothing until stopped: an engine still starting.
        app.engine_stages = RecordedEngine("empty.jsonl", extra=("--hang",))
        await pilot.press("r")
        await wait_for(pilot, lambda: run.engine_running)
        run._paint()
        await pilot.pause(0.1)
        assert run.query_one("#views", ContentSwitcher).current == "view-idle"
        assert run.state.mode is None and run.state.repl.count("done") == 0
        bar = run.query_one(ProgressEta)
        assert bar.fraction == 0.0 and "waiting for the engine" in bar.label
        await pilot.press("s")
        await wait_for(pilot, lambda: run.state.finished)
        assert run.state.stopped and not run.state.errors


@pytest.mark.parametrize("size", SIZES, ids=IDS)
@pytest.mark.parametrize("step", ["detect", "drivers", "environment", "engine"])
def test_wizard_step(snap_compare, make, monkeypatch, step, size):
    """Every wizard step at every size, with its findings in (the checks' duration fixed: the status
    line prints it)."""
    import hwtui.probes.framework as framework
    from hwtui.widgets.findings_list import FindingsList

    real = framework.run_checks

    def timed_fixed(*args, **kwargs):
        result = real(*args, **kwargs)
        result.duration_s = 0.5
        return result

    monkeypatch.setattr(framework, "run_checks", timed_fixed)
    app = make(None)

    async def to_step(pilot):
        await wait_for(pilot, lambda: pilot.app.devices)
        await pilot.press(*["n"] * ["detect", "drivers", "environment", "engine"].index(step))
        screen = pilot.app.screen
        await wait_for(pilot, lambda: getattr(screen, "STEP", "") == step)
        if step in ("drivers", "environment"):
            await wait_for(pilot, lambda: screen.query_one(FindingsList).row_count > 0)
        await settle(pilot)  # the device table and findings measured (a fixed pause was short under load)

    assert snap_compare(app, terminal_size=size, run_before=to_step)
