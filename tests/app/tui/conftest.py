"""Fixtures for the TUI tests: replayed machines, an isolated config dir, a recorded engine.

Replay snapshots are built the way ``hwtui snapshot`` builds them: a recorded sysfs tree
(tests.machines) read through FsHost, wrapped in RecordingHost while every check runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hwtui.app.tui.engine_process import Stage
from tests import machines

DATA = Path(__file__).parent / "data"
EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"


def build_snapshot(machine: str, root: Path) -> dict:
    from hwtui.probes.catalog import catalog
    from hwtui.probes.framework import run_checks
    from hwtui.probes.host import RecordingHost
    from hwtui.probes.inventory import detect_devices

    fs = machines.MACHINES[machine](root)
    rec = RecordingHost(fs.host({"PATH": "/usr/bin:/bin", "HOME": "/home/alice"}))
    collectors, rules = catalog()
    run_checks(rec, collectors, rules)
    detect_devices(rec)
    return rec.snapshot()


@pytest.fixture(scope="session")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """machine name -> snapshot JSON path (docs/examples ones when they exist)."""
    out = {}
    base = tmp_path_factory.mktemp("snapshots")
    for name in ("h100_x8", "vfio_passthrough", "rtx4090_rx7800xt_arc_a750"):
        path = base / f"{name}.json"
        path.write_text(json.dumps(build_snapshot(name, base / name)))
        out[name] = path
    for name, example in (("h100_x8", "h100x8"), ("rtx4090_rx7800xt_arc_a750", "mixed3")):
        published = EXAMPLES / f"{example}.snapshot.json"
        out[f"example:{name}"] = published if published.exists() else out[name]
    return out


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own $XDG_CONFIG_HOME: nothing leaks into the user's real config."""
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


@pytest.fixture
def unbudgeted_charts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread-built chart builds as soon as its data changes, not when its CPU budget allows.

    Why: the budget (plot_chart.CPU_BUDGET, 0.6 % of a core) spaces builds by cost / budget, so on a
    loaded 2-core CI box a 200x60 build of 0.2 CPU-s held the next one 33 s, and two or three
    chained builds ran a snapshot past its 90 s wait (CI, round nine). A snapshot is of the final
    picture: how often a chart is redrawn is tested by the budget's own tests, not here.
    """
    monkeypatch.setattr("hwtui.widgets.plot_chart.CPU_BUDGET", 1.0)


@dataclass
class RecordedEngine:
    """Stages that run tests/app/tui/stream_engine.py over a recorded stream instead of the engine."""

    stream: str
    delay: float = 0.0
    extra: tuple[str, ...] = ()
    calls: int = 0

    def __call__(self, cfg, defaults, workdir) -> list[Stage]:
        self.calls += 1
        self.cfg, self.defaults = cfg, defaults
        argv = [sys.executable, "-m", "tests.app.tui.stream_engine", str(DATA / self.stream), "--delay", str(self.delay), *self.extra]
        return [Stage("run", argv)]


class FixedSampler:
    """Deterministic device figures: a function of the poll number, so snapshots are stable."""

    def __init__(self, host, devices, n: int | None = None):
        from hwtui.probes.sampling import DeviceSample as Sample

        self.Sample = Sample
        self.keys = [(d.device, d.name) for d in devices if d.device][: n or None] or []
        self.polls = 0
        self.closed = False

    def sample(self):
        self.polls += 1
        p = self.polls
        out = [self.Sample(key, name, (20 + 7 * i) * 2**30, 80 * 2**30, float((p * 13 + i * 17) % 100),
                           40.0 + (p + i) % 30, 150.0 + (p * 31 + i * 11) % 500, 700.0)
               for i, (key, name) in enumerate(self.keys)]
        out.append(self.Sample("cpu", "CPU", 16 * 2**30, 64 * 2**30, float((p * 7) % 100), None, None, None))
        return out

    def close(self):
        self.closed = True


async def wait_for(pilot, predicate, timeout: float = 20.0, step: float = 0.05) -> None:
    """Pause the pilot until ``predicate()`` holds; fail with a clear message after ``timeout``."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(step)


async def to_engine_step(pilot) -> None:
    """From the detect step to the engine step (n, n, n), once its form is mounted: under load the
    step became current before its form was there, and a test that set a field at once met
    NoMatches (the app itself now waits for its form: screens/engine.py)."""
    await pilot.press("n", "n", "n")
    await wait_for(pilot, lambda: type(pilot.app.screen).__name__ == "EngineScreen"
                   and bool(pilot.app.screen.query("#in-plan")) and bool(pilot.app.screen.query("#mode")))


def tables_settled(pilot) -> bool:
    """Every table on the active screen has measured the rows and cells it was given.

    A DataTable adds rows at once but sizes its columns (and its height) later, in its idle
    handler: a screenshot taken in between shows the rows under header-wide columns. Under load a
    fixed pause after the rows appear was sometimes too short (issue 26); this is the state the
    picture needs. (Textual 8's DataTable keeps that pending work in these three attributes.)"""
    from textual.widgets import DataTable

    return all(not (t._require_update_dimensions or t._new_rows or t._updated_cells)
               for t in pilot.app.screen.query(DataTable))


async def settle(pilot) -> None:
    """Wait until the screen's tables are measured (see tables_settled); the caller's screenshot
    (or pilot.pause()) then lays them out.

    Then every table's render caches are dropped and it is repainted: a DataTable can keep a line
    (its header) rendered before its columns were measured under a cache key the measurement does
    not change, and a loaded run's snapshot once showed the rows measured under a header-wide header
    (test_wizard_step[detect-200x60], -n 3). A live screen repaints it on its next update; a
    screenshot taken at this moment must not depend on that."""
    from textual.widgets import DataTable

    await wait_for(pilot, lambda: tables_settled(pilot))
    for table in pilot.app.screen.query(DataTable):
        table._clear_caches()
        table.refresh()
    await pilot.pause()
    await wait_for(pilot, lambda: tables_settled(pilot))
