"""Charts read at a glance: round ticks, labelled axes, series told apart without colour (issue 25)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.text import Text

from hwtui.widgets._draw import nice_ticks, tick_label

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(finite, finite, st.integers(min_value=2, max_value=20), st.booleans())
def test_ticks_are_round_enclose_the_range_and_stay_few(a, b, max_ticks, integer):
    lo, hi = min(a, b), max(a, b)
    ticks = nice_ticks(lo, hi, max_ticks, integer=integer)
    assert ticks == sorted(ticks) and len(ticks) >= 2
    step = ticks[1] - ticks[0]
    assert ticks[0] <= lo + 1e-6 * step and ticks[-1] >= hi - 1e-6 * step, "the outer ticks enclose the data"
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5, 10)), step
    if integer:
        assert step >= 1 and float(step).is_integer()
    assert len(ticks) <= max_ticks + 1


def test_the_values_the_old_charts_printed_are_round_now():
    assert [tick_label(t) for t in nice_ticks(0, 100, 4)] == ["0", "25", "50", "75", "100"]
    assert [tick_label(t) for t in nice_ticks(0, 59, 4)] == ["0", "20", "40", "60"]
    assert [tick_label(t) for t in nice_ticks(1, 40, 4, integer=True)] == ["0", "10", "20", "30", "40"]


async def test_device_chart_series_differ_without_colour_and_the_axes_say_what_they_are():
    from textual.app import App

    from hwtui.widgets.device_chart import DeviceChart

    class History:
        series = {"cuda:0": {"util": [50.0, 60.0, 70.0], "temp_c": [40.0, 41.0, 42.0], "power_w": [300.0, 310.0, 320.0]}}
        latest = {"cuda:0": type("S", (), {"power_limit_w": 700.0})()}

    chart = DeviceChart()

    class One(App[None]):
        def compose(self):
            yield chart

    async with One().run_test(size=(80, 16)) as pilot:
        chart.show(History(), "cuda:0", 1.0)
        await pilot.pause()
        while chart.pending:
            await pilot.pause(0.05)
        drawn = "\n".join(Text.from_ansi(line.text).plain for line in chart._built or [])
        assert "seconds ago" in drawn and "• util" in drawn and "+ temp" in drawn and "x pwr" in drawn
        for label in ("-59.0", "16.7", "83.3", "66.7"):
            assert label not in drawn, (label, drawn)


async def test_a_chart_too_small_to_read_says_so_in_one_line():
    from textual.app import App

    from hwtui.widgets.loss_chart import LossChart

    chart = LossChart()

    class One(App[None]):
        CSS = "LossChart { height: 3; width: 40; }"

        def compose(self):
            yield chart

    async with One().run_test(size=(40, 5)) as pilot:
        chart.points = [(1, 2.0), (2, 1.5)]
        chart.data_changed()
        await pilot.pause()
        drawn = str(chart.render())
        assert "loss step 2" in drawn
        assert "(chart hidden: it needs 8 rows (has 3); a larger terminal shows it)" in drawn
