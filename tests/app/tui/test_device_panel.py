"""The device panel: every device drawn by one widget, and the drawing functions it uses.

The panel replaced a row of four widgets per device (issue 7: a 1 Hz refresh of 8 GPUs spent its
whole UI-thread budget re-rendering ~47 widgets), so these tests pin what must not be lost with
them: used/total next to the memory bar, the util / temp / power history as sparklines with the
latest figure as a number, columns that line up, and a layout that still reads in 50 columns.
"""

from __future__ import annotations

import pytest
from rich.style import Style
from textual.app import App, ComposeResult

from hwtui.app.tui.device_sampler import DeviceHistory
from hwtui.probes.sampling import DeviceSample
from hwtui.widgets._draw import BLOCKS
from hwtui.widgets.device_panel import DevicePanel
from hwtui.widgets.memory_bar import memory_level, memory_segments
from hwtui.widgets.sparkline_panel import METRICS, metric_segments

pytestmark = pytest.mark.timeout(60)
GIB = 2**30
SPARK_CHARS = set(BLOCKS.strip())


def _text(segments) -> str:
    return "".join(s.text for s in segments)


def test_memory_segments_show_the_bar_and_used_over_total():
    text = _text(memory_segments(20 * GIB, 80 * GIB, 8, 12, Style()))
    bar, label = text[:8], text[8:]
    assert bar == "██░░░░░░", "a quarter of 8 cells"
    assert label == "  20.0G/80.0G", "a space, then the label right-aligned in 12 cells"
    unknown = _text(memory_segments(None, None, 6, 5, Style()))
    assert unknown == "······ mem ?"


@pytest.mark.parametrize(("used", "level"), [(60, "ok"), (61, "high"), (73, "full"), (None, "none")])
def test_memory_level_thresholds(used, level):
    assert memory_level(None if used is None else used * GIB, 80 * GIB) == level


def test_metric_segments_show_history_and_latest_value():
    util = METRICS[0]
    text = _text(metric_segments(util, [0.0, 50.0, 100.0], 5, 4, Style()))
    assert text == "  util   ▁▅█ 100%", "history right-aligned, fixed 0-100 scale, latest value as a number"
    power = METRICS[2]
    text = _text(metric_segments(power, [350.0, 700.0], 2, 4, Style(), hi=700.0))
    assert text == "  pwr ▅█ 700W", "power scales to the device's limit"
    missing = _text(metric_segments(METRICS[1], [None, None], 3, 3, Style()))
    assert missing == " " * len("  temp      -C"), "a device without the sensor: an empty column, no '-C' placeholder"


def test_a_wide_sparkline_shows_its_extent_before_the_history_fills_it():
    """At 200 columns three readings once drew as a 3-cell line after 20+ blank cells (issue 25): the
    monitor's lines show where the history has not reached yet as a dim dotted baseline."""
    util = METRICS[0]
    segments = metric_segments(util, [0.0, 50.0, 100.0], 30, 4, Style(), dots=True)
    text = _text(segments)
    assert text == "  util " + "·" * 27 + "▁▅█ 100%", text
    assert segments[1].style.dim and segments[2].text == "▁▅█", "the baseline is dim, the readings are the line"
    assert _text(metric_segments(util, [1.0] * 40, 30, 4, Style(), dots=True)) == "  util " + "▁" * 30 + "   1%", \
        "a full history leaves no dots"


def _history(polls: int, gpus: int = 8) -> DeviceHistory:
    history = DeviceHistory()
    for p in range(polls):
        samples = [DeviceSample(f"cuda:{i}", "NVIDIA H100 80GB HBM3", (10 + 5 * i) * GIB, 80 * GIB, float((p * 10 + i) % 100),
                                40.0 + i, 100.0 + 50 * i, 700.0) for i in range(gpus)]
        samples.append(DeviceSample("cpu", "CPU", 16 * GIB, 64 * GIB, float(p % 100), None, None, None))
        history.add(samples)
    return history


class PanelApp(App):
    def compose(self) -> ComposeResult:
        yield DevicePanel()


async def test_one_line_per_device_columns_aligned_at_80_columns():
    app = PanelApp()
    async with app.run_test(size=(80, 24)) as pilot:
        panel = app.query_one(DevicePanel)
        panel.update_from(_history(polls=30))
        await pilot.pause()
        assert panel.keys == (*(f"cuda:{i}" for i in range(8)), "cpu")
        assert not panel.children, "one widget draws every device: nothing is mounted per device"
        lines = panel.lines()
        assert len(lines) == 9 and panel.virtual_size.height == 9
        for i, line in enumerate(lines[:8]):
            assert len(line) == panel.scrollable_content_region.width
            assert line.startswith(f"cuda:{i}") and f"{10 + 5 * i:.1f}G/80.0G" in line
            assert f" {100 + 50 * i}W" in line and f" {40 + i}C" in line
        for word in ("util", "temp", "pwr"):
            assert len({line.index(word) for line in lines if word in line}) == 1, f"the {word} column lines up"
        util_spark = lines[0][lines[0].index("util") + 5:].split(" ")[0]
        assert len(util_spark) >= 4 and set(util_spark) <= SPARK_CHARS and len(set(util_spark)) > 1, "history, not one cell"
        assert "temp" not in lines[8] and "-C" not in lines[8] and "-W" not in lines[8], \
            "the CPU has no temperature or power sensor: those columns stay empty, no placeholder figures"


async def test_two_lines_per_device_when_narrow():
    app = PanelApp()
    async with app.run_test(size=(50, 30)) as pilot:
        panel = app.query_one(DevicePanel)
        panel.styles.max_height = 30
        panel.update_from(_history(polls=5, gpus=2))
        await pilot.pause()
        lines = panel.lines()
        assert panel.virtual_size.height == 6 and len(lines) == 6
        assert lines[0].startswith("cuda:0") and "10.0G/80.0G" in lines[0] and "util" not in lines[0]
        assert all(word in lines[1] for word in ("util", "temp", "pwr", "%", "C", "W"))
        assert all(len(line) <= 50 for line in lines)


async def test_scrolls_to_the_devices_below_when_short():
    app = PanelApp()
    async with app.run_test(size=(100, 24)) as pilot:
        panel = app.query_one(DevicePanel)
        panel.styles.max_height = 4
        panel.update_from(_history(polls=3))
        await pilot.pause()
        assert panel.size.height == 4 and panel.max_scroll_y == 5
        assert panel.render_line(0).text.startswith("cuda:0")
        panel.scroll_end(animate=False)
        await pilot.pause()
        assert panel.render_line(3).text.startswith("cpu")


async def test_refresh_redraws_with_new_figures():
    app = PanelApp()
    async with app.run_test(size=(100, 24)) as pilot:
        panel = app.query_one(DevicePanel)
        history = _history(polls=2)
        panel.update_from(history)
        await pilot.pause()
        assert "10.0G/80.0G" in panel.render_line(0).text
        history.add([DeviceSample("cuda:0", "NVIDIA H100 80GB HBM3", 75 * GIB, 80 * GIB, 99.0, 88.0, 650.0, 700.0)])
        panel.update_from(history)
        await pilot.pause()
        first = panel.render_line(0).text
        assert "75.0G/80.0G" in first and "99%" in first and "88C" in first and "650W" in first



async def test_the_log_never_hides_text_at_80_columns():
    from textual.app import App

    from hwtui.widgets.error_log import ErrorLog

    class LogApp(App):
        CSS = "ErrorLog { padding: 0 1; }"  # as on the Run screen: 80 columns leave 76 cells for text

        def compose(self):
            yield ErrorLog()

    line = "".join(f"word{i:02d}" for i in range(40))
    app = LogApp()
    async with app.run_test(size=(80, 12)) as pilot:
        log = app.query_one(ErrorLog)
        log.catch_up([("info", line)] * 20, 20)  # more than fits: the scrollbar shows
        await pilot.pause()
        visible = log.scrollable_content_region.width
        assert log.max_scroll_y > 0 and visible < 78
        assert all(strip.cell_length <= visible for strip in log.lines), "every line fits left of the scrollbar"
        assert line in "".join(strip.text for strip in log.lines[: -(-len(line) // visible)]), "nothing cut"


async def test_two_columns_fit_eight_gpus_and_the_cpu_in_five_lines_at_80_columns():
    app = PanelApp()
    async with app.run_test(size=(76, 24)) as pilot:
        panel = app.query_one(DevicePanel)
        panel.set_columns(2)
        panel.update_from(_history(polls=5))
        await pilot.pause()
        lines = panel.lines()
        assert len(lines) == 5 and panel.virtual_size.height == 5
        for i in range(5):  # the left column holds cuda:0-4
            assert lines[i].startswith(f"cuda:{i}") and f"{10 + 5 * i:.1f}G/80.0G" in lines[i]
        for i in range(3):  # the right one cuda:5-7, then the CPU
            right = lines[i][lines[i].index(f"cuda:{i + 5}"):]
            assert f" {100 + 50 * (i + 5)}W" in right and f" {40 + i + 5}C" in right and f"{10 + 5 * (i + 5):.1f}G/80.0G" in right
        cpu = lines[3][lines[3].index("cpu"):]
        assert "16.0G/64.0G" in cpu and cpu.rstrip().endswith("4%"), cpu
        assert "C " not in cpu and "W" not in cpu, "the CPU's absent sensors stay blank (no '-C', '-W')"
        assert "cpu" not in lines[4]


async def test_the_selected_device_moves_with_the_keys_and_a_click():
    app = PanelApp()
    seen: list[str] = []

    async with app.run_test(size=(80, 24)) as pilot:
        panel = app.query_one(DevicePanel)
        app.on_device_panel_selected = lambda msg: seen.append(msg.key)  # type: ignore[attr-defined]
        panel.update_from(_history(polls=3))
        assert panel.selected == "cuda:0", "the first device is selected until one is picked"
        panel.focus()
        await pilot.press("down", "down")
        assert panel.selected == "cuda:2"
        await pilot.click(DevicePanel, offset=(2, 5))
        assert panel.selected == "cuda:5"
        await pilot.press("up")
        assert panel.selected == "cuda:4"
