"""The monitor `hwtui` opens on: devices, host strip and processes; the wizard one key away."""

from __future__ import annotations

from types import SimpleNamespace

from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.probes.host import ReplayHost
from hwtui.widgets.device_panel import DevicePanel
from hwtui.widgets.process_table import ProcessTable
from tests.app.tui.conftest import FixedSampler, wait_for


def _proc(device: str, pid: int, user: str, mem: int | None, cmd: str):
    return SimpleNamespace(device=device, pid=pid, user=user, mem_bytes=mem, command=cmd)


def _h100x8_monitor(snapshots) -> HwtuiApp:
    """The 8-GPU replay opened on the monitor, with deterministic device figures."""
    return HwtuiApp(ReplayHost.load(snapshots["example:h100_x8"]), TuiConfig.load(), config_file=config_path(),
                    sampler_factory=FixedSampler, start_step="monitor")


async def test_monitor_first_then_the_wizard_and_back(snapshots):
    app = _h100x8_monitor(snapshots)
    async with app.run_test(size=(80, 24)) as pilot:
        monitor = app.screen
        await wait_for(pilot, lambda: monitor.ticks >= 1)
        panel = monitor.query_one(DevicePanel)
        await wait_for(pilot, lambda: len(panel.keys) == 9 and panel.size.height >= 9)  # laid out: all 9 rows shown
        assert panel.max_scroll_y == 0, "8 GPUs and the CPU fit at 80x24 without scrolling"
        table = monitor.query_one(ProcessTable)
        assert table.note == "not recorded in a replay", "a replay has no processes; it says so"
        await pilot.press("w")
        assert app.screen.STEP == "detect"
        await pilot.press("b")
        assert app.screen is monitor


async def test_process_table_sorts_by_memory_then_by_a_clicked_column(snapshots):
    app = _h100x8_monitor(snapshots)
    rows = [_proc("cuda:1", 30, "bob", 1 << 30, "python train.py"), _proc("cuda:0", 20, "alice", 8 << 30, "vllm serve"),
            _proc("cuda:0", 10, "carol", None, "nvtop")]
    async with app.run_test(size=(120, 30)) as pilot:
        table = app.screen.query_one(ProcessTable)
        await wait_for(pilot, lambda: app.screen.ticks >= 1)
        app.screen.on_screen_suspend()  # stop sampling: the rows below are the table's only input
        table.show(rows)
        assert [p.pid for p in table.rows_shown] == [20, 30, 10], "largest memory first"
        # Let the device panel take its rows first: the table moves down once they are laid out.
        panel = app.screen.query_one(DevicePanel)
        await wait_for(pilot, lambda: panel.size.height >= 9)
        await pilot.pause()
        assert await pilot.click(ProcessTable, offset=(12, 1))  # the PID header (inside the border and padding)
        await wait_for(pilot, lambda: table.sort_key == "pid")
        assert [p.pid for p in table.rows_shown] == [10, 20, 30]
        await pilot.press("o")
        assert table.sort_key == "user" and [p.user for p in table.rows_shown] == ["alice", "bob", "carol"]


async def test_the_device_chart_follows_the_selected_device(snapshots):
    """Wide: the chart sits beside the processes; narrow: g swaps it in. It plots the selected device."""
    from hwtui.widgets.device_chart import DeviceChart

    app = _h100x8_monitor(snapshots)
    async with app.run_test(size=(160, 50)) as pilot:
        monitor = app.screen
        await wait_for(pilot, lambda: monitor.ticks >= 1)
        chart = monitor.query_one(DeviceChart)
        assert chart.region.width > 0 and monitor.query_one(ProcessTable).region.width > 0, "side by side"
        assert chart.key == "cuda:0" and chart.summary().startswith("cuda:0  util ")
        panel = monitor.query_one(DevicePanel)
        panel.focus()
        await pilot.press("down")
        await wait_for(pilot, lambda: chart.key == "cuda:1")
        sample = monitor.history.latest["cuda:1"]
        assert f"util {sample.util:.0f}%" in chart.summary() and f"pwr {sample.power_w:.0f}W/700W" in chart.summary()
        assert len(chart.series["util"]) == monitor.ticks


async def test_g_swaps_the_process_table_for_the_chart_when_narrow(snapshots):
    from hwtui.widgets.device_chart import DeviceChart

    app = _h100x8_monitor(snapshots)
    async with app.run_test(size=(80, 30)) as pilot:
        monitor = app.screen
        await wait_for(pilot, lambda: monitor.ticks >= 1)
        assert not monitor.query_one("#chart-box").display and monitor.query_one(ProcessTable).display
        await pilot.press("g")
        await pilot.pause()
        assert monitor.query_one("#chart-box").display and not monitor.query_one(ProcessTable).display
        assert monitor.query_one(DeviceChart).key == "cuda:0"
