"""The monitor `hwtui` opens on: devices, host strip and processes; the wizard one key away."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.probes.host import ReplayHost
from hwtui.widgets.device_panel import DevicePanel
from hwtui.widgets.process_table import ProcessTable
from hwtui.widgets.process_table import cells as process_cells
from tests.app.tui.conftest import FixedSampler, wait_for
from tests.probes.fakenvml import FakeNVML

VENDOR = Path(__file__).resolve().parents[2] / "data" / "vendor"


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


async def test_process_table_sorts_by_memory_then_by_a_clicked_column():
    """The table as shown: largest memory first; a click on the PID header sorts by pid; `o` moves
    the sort to the next column (USER). Rows are read from the drawn text, header first."""
    from textual.app import App

    rows = [_proc("cuda:1", 30, "bob", 1 << 30, "python train.py"), _proc("cuda:0", 20, "alice", 8 << 30, "vllm serve"),
            _proc("cuda:0", 10, "carol", None, "nvtop")]

    class TableApp(App):
        def compose(self):
            yield ProcessTable()

    def column(table: ProcessTable, name: str) -> list[str]:
        header, *body = table.lines()
        at = header.index(name)
        return [line[at:at + len(name) + 6].split()[0] for line in body if line.strip()]

    app = TableApp()
    async with app.run_test(size=(120, 12)) as pilot:
        table = app.query_one(ProcessTable)
        table.show(rows)
        await wait_for(pilot, lambda: len(table.lines()) == 4)
        assert column(table, "PID") == ["20", "30", "10"], "largest memory first"
        table.focus()
        header = table.lines()[0]
        x = table.scrollable_content_region.x - table.region.x + header.index("PID") + 1
        assert await pilot.click(ProcessTable, offset=(x, table.scrollable_content_region.y - table.region.y))
        await wait_for(pilot, lambda: column(table, "PID") == ["10", "20", "30"])
        await pilot.press("o")
        await wait_for(pilot, lambda: column(table, "USER") == ["alice", "bob", "carol"])


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


async def test_the_chart_fills_the_room_the_table_leaves_and_g_gives_it_all(snapshots):
    """History on by default wherever the screen has room (issue 25): below a table sized to its
    rows; `g` gives the chart the whole bottom; too short a screen shows the table alone."""
    from hwtui.widgets.device_chart import DeviceChart

    app = _h100x8_monitor(snapshots)
    async with app.run_test(size=(80, 30)) as pilot:
        monitor = app.screen
        await wait_for(pilot, lambda: monitor.ticks >= 2)
        table, box = monitor.query_one(ProcessTable), monitor.query_one("#chart-box")
        await wait_for(pilot, lambda: box.display and table.display)
        assert table.outer_size.height == table.virtual_size.height + 2, "the table is as tall as its rows"
        bottom = monitor.query_one("#bottom")
        assert box.outer_size.height == bottom.size.height - table.outer_size.height, "the chart takes the rest"
        await pilot.press("g")
        await pilot.pause()
        assert box.display and not table.display
        assert monitor.query_one(DeviceChart).key == "cuda:0"
    app = _h100x8_monitor(snapshots)
    async with app.run_test(size=(80, 24)) as pilot:
        monitor = app.screen
        await wait_for(pilot, lambda: monitor.ticks >= 2)
        await pilot.pause()
        assert not monitor.query_one("#chart-box").display, "4 rows left: no chart squeezed in"


# -- a live host's processes: NVML at the library boundary, real processes for psutil -----------

IGNORES_TERM = ("import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                "sys.stdin.read()")
PARENT = ("import subprocess, sys; g = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdin=subprocess.PIPE, "
          "stdout=subprocess.PIPE); g.stdout.readline(); print(g.pid, flush=True); sys.stdin.read(); g.kill(); g.wait()")


class _LiveReplay(ReplayHost):
    """The 8x H100 example as if it were this machine: its processes are looked up live."""

    @property
    def is_live(self) -> bool:
        return True


class _NvmlSampler(FixedSampler):
    """Deterministic device figures, and NVML handles (a FakeNVML) the process list asks."""

    nvml: Any = None

    def __init__(self, host, devices):
        super().__init__(host, devices)
        self._nvml = self.nvml
        cuda = [d for d in devices if d.device and d.device.startswith("cuda:")]
        self._handles = {d.pci: i for i, d in enumerate(cuda)}


def _readline(stream, timeout: float = 30.0) -> str:
    import select

    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, "the child did not answer in time"
    return stream.readline().decode().strip()


@pytest.fixture
def family():
    """A parent on cuda:0 and its child (which ignores SIGTERM) on cuda:1: real processes."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, IGNORES_TERM], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    child = int(_readline(parent.stdout))
    yield parent, child
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)  # our own grandchild, by its pid
    if parent.poll() is None:
        parent.kill()
    parent.wait(timeout=30)


def _live_monitor(snapshots, parent: int, child: int) -> tuple[HwtuiApp, FakeNVML]:
    data = json.loads((VENDOR / "nvml_h100x8.json").read_text())
    for dev in data["devices"]:
        dev["processes"] = []
    data["devices"][0]["processes"] = [{"pid": parent, "used_memory": 3 * 2**30}]
    data["devices"][0]["process_utilization"] = [{"pid": parent, "timeStamp": 10, "smUtil": 93, "memUtil": 4}]
    data["devices"][1]["processes"] = [{"pid": child, "used_memory": 512 * 2**20}]
    nvml = FakeNVML(data)
    nvml.nvmlInit()
    _NvmlSampler.nvml = nvml
    app = HwtuiApp(_LiveReplay.load(snapshots["example:h100_x8"]), TuiConfig.load(), config_file=config_path(),
                   sampler_factory=_NvmlSampler, start_step="monitor")
    return app, nvml


async def test_each_process_figure_is_its_source(snapshots, family):
    """GPU % and device memory as NVML answered, CPU %, RSS, age and user as psutil reads them."""
    parent, child = family
    app, nvml = _live_monitor(snapshots, parent.pid, child)
    async with app.run_test(size=(160, 40)) as pilot:
        monitor = app.screen
        table = monitor.query_one(ProcessTable)
        await wait_for(pilot, lambda: len(table.rows_shown) == 2)
        top, second = table.rows_shown
        assert (top.pid, top.device, top.mem_bytes) == (parent.pid, "cuda:0", 3 * 2**30), "largest memory first"
        assert top.gpu_util == 93.0, "the recorded NVML sample"
        assert second.gpu_util is None, "cuda:1 has no sample buffer (NotSupported): unknown, not 0"
        header, first_line, second_line = table.lines()[:3]
        for word in ("GPU%", "MEM", "CPU%", "RSS", "TIME", "COMMAND"):
            assert word in header
        ps = psutil.Process(parent.pid)
        assert first_line.split()[:5] == ["cuda:0", str(parent.pid), ps.username(), "93", "3.0G"]
        assert top.host_mem is not None and abs(top.host_mem - ps.memory_info().rss) < 8 * 2**20
        assert top.elapsed_s == pytest.approx(time.time() - ps.create_time(), abs=10)
        assert second_line.split()[:5] == ["cuda:1", str(child), ps.username(), "-", "0.50G"]
        await wait_for(pilot, lambda: table.rows_shown[0].cpu_percent is not None)  # the second tick
        row = table.rows_shown[0]
        cells = process_cells(row)
        assert cells["cpu"] == f"{row.cpu_percent:.0f}" and cells["rss"] == f"{row.host_mem / 2**30:.2f}G"
        assert cells["gpu"] == "0", "no sample newer than the last tick: no kernel ran"


async def test_filter_tree_and_a_confirmed_term_then_kill(snapshots, family):
    from hwtui.app.tui.screens.process_modals import ConfirmSignal, FilterPrompt

    parent, child = family
    app, _ = _live_monitor(snapshots, parent.pid, child)
    async with app.run_test(size=(160, 40)) as pilot:
        monitor = app.screen
        table = monitor.query_one(ProcessTable)
        await wait_for(pilot, lambda: len(table.rows_shown) == 2)
        await pilot.press("t")
        await wait_for(pilot, lambda: table.as_tree)
        lines = table.lines()
        assert str(parent.pid) in lines[1] and "└─ " in lines[2] and str(child) in lines[2], lines
        await pilot.press("slash")
        await wait_for(pilot, lambda: isinstance(app.screen, FilterPrompt))
        await pilot.press(*str(child), "enter")
        await wait_for(pilot, lambda: [p.pid for p in table.rows_shown] == [child])
        assert "filter" in str(table.border_subtitle) and "1 of 2" in str(table.border_subtitle)
        table.focus()
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmSignal))
        assert "SIGTERM" in app.screen.question and str(child) in app.screen.question
        await pilot.press("n")  # no: nothing is sent
        await wait_for(pilot, lambda: app.screen is monitor)
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmSignal))
        await pilot.press("y")
        await wait_for(pilot, lambda: app.screen is monitor)
        assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE, "it ignores SIGTERM: still there"
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmSignal))
        assert "SIGKILL" in app.screen.question, "after SIGTERM the next k offers SIGKILL"
        await pilot.press("y")
        await wait_for(pilot, lambda: not psutil.pid_exists(child) or
                       psutil.Process(child).status() == psutil.STATUS_ZOMBIE)


async def test_the_detail_line_is_the_selected_devices_nvml_figures(tmp_path):
    """Clocks, PCIe link and traffic, NVLink, ECC and clocks-event reasons of the selected device,
    as NVML answered when the machine was recorded (tests/data/vendor/nvml_h100x8.json)."""
    from tests.probes.recorded import h100x8

    data = json.loads((VENDOR / "nvml_h100x8.json").read_text())["devices"]
    app = HwtuiApp(h100x8(tmp_path).host(), TuiConfig.load(), config_file=config_path(),
                   start_step="monitor")  # the real sampler, reading the recorded NVML answers
    async with app.run_test(size=(160, 40)) as pilot:
        monitor = app.screen
        detail = monitor.query_one("#device-detail")
        await wait_for(pilot, lambda: str(detail.render()).startswith("cuda:0"))
        for i in (0, 1):
            rec = data[i]
            text = str(detail.render())
            assert f"clocks sm {rec['clocks']['sm']}MHz mem {rec['clocks']['mem']}MHz" in text
            assert f"PCIe gen{rec['pcie']['cur_gen']} x{rec['pcie']['cur_width']}" in text
            assert f"rx {rec['pcie']['rx_kbps'] / 1e6:.1f} GB/s tx {rec['pcie']['tx_kbps'] / 1e6:.1f} GB/s" in text
            assert f"NVLink {sum(rec['nvlink'])} up" in text and "fan" not in text
            assert f"ECC {rec['ecc']['uncorrected']} uncorr {rec['ecc']['corrected']} corr" in text
            assert text.endswith("clocks held: " + ("idle" if rec["clocks_event_mask"] == 1 else "power-cap"))
            if i == 0:
                monitor.query_one(DevicePanel).focus()
                await pilot.press("down")
                await wait_for(pilot, lambda: str(detail.render()).startswith("cuda:1"))


async def test_at_200_columns_the_sparklines_use_the_width(snapshots):
    import re

    app = _h100x8_monitor(snapshots)
    async with app.run_test(size=(200, 60)) as pilot:
        monitor = app.screen
        await wait_for(pilot, lambda: monitor.ticks >= 2)
        panel = monitor.query_one(DevicePanel)
        line = panel.lines()[0]
        lines = re.findall(r"util (·*)([▁▂▃▄▅▆▇█ ]+?) +(\d+)%", line)
        assert lines, line
        dots, spark, value = lines[0]
        assert len(dots) + len(spark) >= 30, "a wide screen: a wide line, its unfilled part dotted"
        assert len(spark) == monitor.ticks and value == f"{monitor.history.latest['cuda:0'].util:.0f}"


async def test_a_hostile_replays_detail_is_shown_as_text(tmp_path):
    """Markup and escape sequences in a snapshot's strings: drawn as text, the app keeps running."""
    snap = json.loads((VENDOR.parent / "recordings" / "h200.snapshot.json").read_text())
    snap["facts"]["nvml"]["devices"][0]["clocks_event"] = {"mask": 4, "reasons": ["[bold]x[/", "\x1b[2Jcleared"]}
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(snap))
    app = HwtuiApp(ReplayHost.load(path), TuiConfig.load(), config_file=config_path(), start_step="monitor")
    async with app.run_test(size=(120, 36)) as pilot:
        detail = app.screen.query_one("#device-detail")
        await wait_for(pilot, lambda: "clocks held" in str(detail.render()))
        assert str(detail.render()).endswith("clocks held: [bold]x[/, cleared") and app.is_running
