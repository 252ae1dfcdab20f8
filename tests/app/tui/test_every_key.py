"""Every bound key on every screen, pressed as a person would: nothing raises, nothing exits (issue 25).

`?` on the cluster view once crashed the app (NoMatches on the monitor's mount) and exited 0. This
walks every installed screen, presses each key its bindings (the app's, the screen's and the
focused widget's) offer, and checks after each that the app still runs; a screen change is undone
before the next key. Quitting is pressed last, once, and must exit 0.
"""

from __future__ import annotations

import pytest

from hwtui.app.node_api.client import parse_agents
from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.app.tui.screens.help import HelpScreen
from hwtui.app.tui.screens.nodes import NodesScreen
from hwtui.probes.host import ReplayHost
from tests.agent.helpers import dead_port
from tests.app.tui.conftest import FixedSampler, RecordedEngine, wait_for

pytestmark = pytest.mark.timeout(240)

SCREENS = ("monitor", "detect", "drivers", "environment", "engine", "run", "nodes")
QUIT_KEYS = {"q", "ctrl+c", "ctrl+q"}


def _keys(app) -> list[str]:
    """The keys the current screen answers: its active bindings (app, screen and focused widgets)."""
    keys = []
    for key, active in app.screen.active_bindings.items():
        if key in QUIT_KEYS or active.binding.action in ("quit", "app.quit"):
            continue
        keys.append(key)
    return sorted(set(keys))


async def _back_to(pilot, name: str) -> None:
    app = pilot.app
    while isinstance(app.screen, HelpScreen) or len(app.screen_stack) > 1 and app.screen.is_modal:
        await pilot.press("escape")  # press waits until the key was handled
    if app.screen is not app.get_screen(name):
        app.switch_screen(name)
        await wait_for(pilot, lambda: app.screen is app.get_screen(name) and app.screen.is_mounted)
        await pilot.pause()


async def test_every_key_on_every_screen(snapshots, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `w` writes the export file, ctrl+o the launch files: here
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    nodes = NodesScreen(parse_agents(f"127.0.0.1:{dead_port()}"))  # a node that never answers
    nodes.poller.interval = 0.2
    app = HwtuiApp(ReplayHost.load(snapshots["h100_x8"]), TuiConfig.load(), config_file=config_path(),
                   engine_stages=RecordedEngine("replicate_ok.jsonl"), sampler_factory=FixedSampler,
                   nodes_screen=nodes, workdir=tmp_path)
    pressed: list[tuple[str, str]] = []
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.screen is nodes)
        await pilot.press("w")
        await wait_for(pilot, lambda: app.devices)
        for name in SCREENS:
            await _back_to(pilot, name)
            if name == "engine":
                app.screen.query_one("#in-plan").value = str(plan)
                app.screen.query_one("#in-device").value = "cpu"
            for key in _keys(app):
                await _back_to(pilot, name)
                await pilot.press(key)  # returns once the app has handled it
                pressed.append((name, key))
                assert app.is_running and app.return_code is None, f"{key!r} on {name} ended the app"
                if app.screen.is_modal:
                    await pilot.press("escape")
        run = app.run_screen
        await wait_for(pilot, lambda: not run.engine_running)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)
    assert app.return_code == 0
    screens_pressed = {n for n, _ in pressed}
    assert screens_pressed == set(SCREENS), screens_pressed
    assert ("run", "s") in pressed and ("monitor", "g") in pressed and ("nodes", "m") in pressed
    assert all((name, "question_mark") in pressed for name in SCREENS), "`?` on every screen"
