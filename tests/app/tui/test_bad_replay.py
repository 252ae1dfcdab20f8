"""The TUI on a bad replay (issue 22 F8): one line, never "first sample..." forever.

A replay whose facts have the wrong type is refused before the TUI starts, in one line naming the
fact (it used to open, and the monitor's host strip waited for a first sample that never came).
A sampler that fails anyway (a replay built in code, a device library that raises) shows its
one-line error where the figures would be.
"""

from __future__ import annotations

import json

from hwtui.app.cli import main
from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.probes.host import ReplayHost
from hwtui.widgets.host_strip import HostStrip
from tests.app.tui.conftest import wait_for


def test_the_tui_refuses_a_replay_with_a_wrong_typed_fact_in_one_line(snapshots, tmp_path, capsys):
    snap = json.loads(snapshots["example:h100_x8"].read_text())
    snap["facts"]["nvml"] = 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(snap))
    code = main(["--replay", str(bad)])  # the TUI's own entry: no terminal is needed to refuse the input
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "facts.nvml must be an object, not 1" in err, err


async def test_a_failing_sampler_shows_its_error_instead_of_first_sample_forever(snapshots):
    host = ReplayHost.load(snapshots["example:h100_x8"])
    host.snap["facts"]["nvml"] = 1  # past the loader's check: what the sampler meets, it cannot use
    app = HwtuiApp(host, TuiConfig.load(), config_file=config_path(), start_step="monitor")
    async with app.run_test(size=(100, 30)) as pilot:
        monitor = app.screen
        await wait_for(pilot, lambda: monitor.ticks >= 1)
        strip = monitor.query_one(HostStrip)
        await wait_for(pilot, lambda: "first sample" not in str(strip.render()))
        shown = str(strip.render())
        assert "sampling failed" in shown and "AttributeError" in shown and "\n" not in shown, shown
