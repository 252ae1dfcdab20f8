"""SVG snapshots of the screens at fixed sizes (pytest-textual-snapshot).

Determinism: the host is a replay built from tests.machines, the engine replays a recorded
stream whose timestamps are fixed, the sampler returns constant figures and polls once (the
interval is an hour), the ETA comes from event time, and the screenshot is taken only once the
run has finished. Update with ``pytest tests/app/tui/test_snapshots.py --snapshot-update`` and look
at the report before committing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.probes.host import ReplayHost
from tests.app.tui.conftest import RecordedEngine, settle, to_engine_step, wait_for

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[3]


class ConstantSampler:
    def __init__(self, host, devices):
        from hwtui.probes.sampling import DeviceSample as Sample

        self.samples = [Sample(d.device, d.name, (10 + 5 * i) * 2**30, 80 * 2**30, 30.0 + 8 * i, 45.0 + i, 200.0 + 40 * i, 700.0)
                        for i, d in enumerate(dd for dd in devices if dd.device)]
        self.samples.append(Sample("cpu", "CPU", 16 * 2**30, 64 * 2**30, 12.0, None, None, None))

    def sample(self):
        return list(self.samples)

    def close(self):
        pass


@pytest.fixture
def make(snapshots, monkeypatch, unbudgeted_charts):
    # Relative stream paths keep the command line in the log the same on every machine.
    monkeypatch.chdir(REPO)
    monkeypatch.setattr("tests.app.tui.conftest.DATA", Path("tests/app/tui/data"))

    def build(machine="h100_x8", engine=None, start_step="detect", **cfg):
        config = TuiConfig(interval=3600.0, **cfg)
        # A fixed origin: the temporary path would show in the status line and differ per run.
        host = ReplayHost(json.loads(snapshots[machine].read_text()), origin=f"{machine}.json")
        return HwtuiApp(host, config, config_file=config_path(), engine_stages=engine,
                        sampler_factory=ConstantSampler, start_step=start_step)

    return build


async def _charts_built(pilot) -> None:
    """Every chart on screen shows its newest data: a thread-built chart has built for the current
    data and size (not only "no build pending", which also holds before its first build is asked:
    under load a snapshot once caught a chart before its first build)."""
    from hwtui.widgets.plot_chart import PlotChart

    def built() -> bool:
        charts = [c for c in pilot.app.screen.query(PlotChart) if c.display and c.size.area]
        return all(not c.pending and (not c.BUILD_IN_THREAD or c._built_key == c._key()) for c in charts)

    # Bounded: the snapshot fixtures lift the chart's CPU budget (conftest.unbudgeted_charts), so
    # each build follows its data at once and this waits only on the builds themselves.
    await wait_for(pilot, built, timeout=90)
    await settle(pilot)


def _run_to_end(fill: dict[str, str], mode: str = "replicate"):
    async def run_before(pilot):
        app = pilot.app
        await wait_for(pilot, lambda: app.devices)
        await to_engine_step(pilot)
        app.screen.query_one("#mode").value = mode
        for field, value in fill.items():
            app.screen.query_one(f"#in-{field}").value = value
        await pilot.press("ctrl+s")
        run = app.screen
        await wait_for(pilot, lambda: run.state.finished and run.history.latest)
        await pilot.pause(0.3)
        run._paint()
        await pilot.pause(0.1)
        await _charts_built(pilot)

    return run_before


def test_detect_80x24(snap_compare, make):
    app = make()

    async def detected(pilot):
        await wait_for(pilot, lambda: pilot.app.devices)
        await settle(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=detected)


def test_replication_dashboard_80x24(snap_compare, make):
    app = make(engine=RecordedEngine("replicate_ok.jsonl"))
    assert snap_compare(app, terminal_size=(80, 24), run_before=_run_to_end({"plan": "README.md", "device": "cpu"}))


def test_replication_dashboard_120x40(snap_compare, make):
    app = make(engine=RecordedEngine("replicate_ok.jsonl"))
    assert snap_compare(app, terminal_size=(120, 40), run_before=_run_to_end({"plan": "README.md", "device": "cpu"}))


def test_training_dashboard_100x30_no_color(snap_compare, make, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = make(engine=RecordedEngine("train_ok.jsonl"))
    assert app.no_color
    assert snap_compare(app, terminal_size=(100, 30), run_before=_run_to_end({"gpu_ids": "cpu:0,cpu:1"}, mode="train"))


def test_engine_step_80x24(snap_compare, make):
    app = make()

    async def to_engine(pilot):
        await wait_for(pilot, lambda: pilot.app.devices)
        await to_engine_step(pilot)
        await pilot.pause(0.1)

    assert os.environ.get("NO_COLOR") is None
    assert snap_compare(app, terminal_size=(80, 24), run_before=to_engine)


def test_cluster_results_100x30_no_color(snap_compare, make, monkeypatch):
    # A recorded two-node smoke test: real bandwidth figures vary from run to run, a recording does not.
    monkeypatch.setenv("NO_COLOR", "1")
    app = make("rtx4090_rx7800xt_arc_a750", engine=RecordedEngine("cluster_two_nodes.jsonl"))
    assert snap_compare(app, terminal_size=(100, 30), run_before=_run_to_end({}, mode="cluster"))


async def _first_tick(pilot):
    await wait_for(pilot, lambda: pilot.app.screen.ticks >= 1)
    await _charts_built(pilot)  # and the tables measured


@pytest.mark.parametrize("size", [(80, 24), (120, 36), (200, 60)], ids=["80x24", "120x36", "200x60"])
def test_monitor_8gpu_replay(snap_compare, make, size):
    """What `hwtui --replay h100x8` opens on: 8 GPUs, the host strip, the process table."""
    app = make(start_step="monitor")
    assert snap_compare(app, terminal_size=size, run_before=_first_tick)


def test_monitor_8gpu_replay_120x36_no_color(snap_compare, make, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = make(start_step="monitor")
    assert snap_compare(app, terminal_size=(120, 36), run_before=_first_tick)


def test_replication_dashboard_200x60(snap_compare, make):
    app = make(engine=RecordedEngine("replicate_ok.jsonl"))
    assert snap_compare(app, terminal_size=(200, 60), run_before=_run_to_end({"plan": "README.md", "device": "cpu"}))


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_training_dashboard(snap_compare, make, size):
    app = make(engine=RecordedEngine("train_ok.jsonl"))
    assert snap_compare(app, terminal_size=size, run_before=_run_to_end({"gpu_ids": "cpu:0,cpu:1"}, mode="train"))


class _FixedPoller:
    """The nodes screen's poller with fixed answers: one node serving v7 with a push at 50 %, one stale."""

    interval = 1.0
    request_timeout = 1.0

    def __init__(self):
        self.targets = ["alpha:9477", "beta:9477"]

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None

    async def run(self, stop):
        await stop.wait()

    def snapshot(self):
        devices = [{"device": f"cuda:{i}", "util": 40.0 + 5 * i, "mem_used": (20 + i) * 2**30, "mem_total": 80 * 2**30,
                    "temp_c": 50.0 + i, "power_w": 300.0 + 10 * i} for i in range(4)]
        return [{"node": "alpha", "url": "http://alpha:9477", "stale": False, "age_s": 0.4, "devices": devices,
                 "replication": {"serving": "v7", "in_flight": {"version": "v8", "progress": 0.5}}},
                {"node": "beta:9477", "url": "http://beta:9477", "stale": True, "age_s": 12.0,
                 "error": "connection refused or unreachable", "devices": [], "replication": {}}]

    def statuses(self):
        """The nodes as the views read them: checked by the agents' one parser."""
        from hwtui.engine.resident.summary import NodeStatus, parse_summary

        return [NodeStatus(agent=n["node"], url=n["url"], stale=n["stale"], age_s=n["age_s"], error=n.get("error"),
                           summary=None if n["stale"] else parse_summary(n)) for n in self.snapshot()]


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_replication_with_agents(snap_compare, make, size):
    """The Run screen with `--agents`: every node (devices, version, push, a stale one) beside the run."""
    from hwtui.app.tui.screens.nodes import NodesScreen

    nodes = NodesScreen([])
    nodes.poller = _FixedPoller()
    app = make(engine=RecordedEngine("replicate_ok.jsonl"))
    app.nodes_screen = nodes

    async def run_before(pilot):
        await pilot.press("w")
        await _run_to_end({"plan": "README.md", "device": "cpu"})(pilot)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_rank_start_up(snap_compare, make, size):
    """Before the first byte: 'ranks ready 1/3 (world joined)' and the count per phase (the engine hangs there)."""
    app = make(engine=RecordedEngine("replicate_startup.jsonl", extra=("--hang",)))

    async def run_before(pilot):
        app = pilot.app
        await wait_for(pilot, lambda: app.devices)
        await to_engine_step(pilot)
        app.screen.query_one("#in-plan").value = "README.md"
        app.screen.query_one("#in-device").value = "cpu"
        await pilot.press("ctrl+s")
        run = app.screen
        await wait_for(pilot, lambda: run.state.repl.ranks is not None and run.state.repl.ranks.ready == 1
                       and run.history.latest)
        await pilot.pause(0.3)
        run._paint()
        await pilot.pause(0.1)
        await _charts_built(pilot)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_monitor_device_chart_80x24(snap_compare, make):
    """`g` on a narrow monitor: the selected device's history chart in place of the process table."""
    app = make(start_step="monitor")

    async def chart(pilot):
        await _first_tick(pilot)
        await pilot.press("g")
        await pilot.pause(0.1)
        await _charts_built(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=chart)


@pytest.mark.parametrize("size", [(80, 24), (120, 36), (200, 60)], ids=["80x24", "120x36", "200x60"])
def test_monitor_h200_recording(snap_compare, monkeypatch, size):
    """A real idle H200, replayed with the real sampler: its PCIe link and traffic in the detail
    line, a process table as tall as its one line, the history chart in the room left (issue 25)."""
    monkeypatch.chdir(REPO)
    path = REPO / "tests" / "data" / "recordings" / "h200.snapshot.json"
    host = ReplayHost(json.loads(path.read_text()), origin="h200.snapshot.json")
    app = HwtuiApp(host, TuiConfig(interval=3600.0), config_file=config_path(), start_step="monitor")
    assert snap_compare(app, terminal_size=size, run_before=_first_tick)
