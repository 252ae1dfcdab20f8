"""A thread-built chart whose drawing raises says so in the chart and builds again on new data: it
never freezes (the build worker runs with exit_on_error=False, and a raise used to leave the chart
marked "building" for ever, on its old picture, with nothing said)."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.app import App, ComposeResult

from hwtui.widgets.plot_chart import PlotChart
from tests.app.tui.conftest import wait_for


class _Flaky(PlotChart):
    BUILD_IN_THREAD: ClassVar[bool] = True
    DEFAULT_CSS = "_Flaky { height: 12; width: 60; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail = True
        self.points = [1.0, 2.0, 3.0]

    def summary(self) -> str:
        return f"flaky {len(self.points)} points"

    def draw(self, plt: Any) -> None:
        if self.fail:
            raise ValueError("no such axis")
        plt.plot(list(range(len(self.points))), self.points)


class _App(App[None]):
    def compose(self) -> ComposeResult:
        yield _Flaky()


def _text(chart: PlotChart) -> str:
    return "\n".join(chart.render_line(y).text for y in range(chart.size.height))


async def test_a_chart_that_fails_to_draw_says_why_and_draws_again_on_new_data() -> None:
    app = _App()
    async with app.run_test(size=(80, 20)) as pilot:
        chart = app.query_one(_Flaky)
        chart.data_changed()
        await wait_for(pilot, lambda: not chart.pending and chart._built_key == chart._key(), timeout=60)
        assert "chart not drawn: ValueError: no such axis" in _text(chart)
        assert not chart._building
        chart.fail = False
        chart.points.append(4.0)
        chart._last_build = (0.0, 0.0)  # the next build is not held back by the CPU budget
        chart.data_changed()
        await wait_for(pilot, lambda: not chart.pending and chart._built_key == chart._key(), timeout=60)
        text = _text(chart)
        assert "flaky 4 points" in text and "not drawn" not in text, text


async def test_builds_are_spaced_by_their_cost_over_the_cpu_budget(monkeypatch) -> None:
    """The budget the snapshot tests lift (conftest.unbudgeted_charts): a build that cost C CPU-s
    holds the next one until C / CPU_BUDGET after it started, with the newest data, then builds."""
    import time

    from hwtui.widgets import plot_chart

    monkeypatch.setattr(plot_chart, "CPU_BUDGET", 0.01)
    app = _App()
    async with app.run_test(size=(80, 20)) as pilot:
        chart = app.query_one(_Flaky)
        chart.fail = False
        await wait_for(pilot, lambda: not chart.pending and chart._built_key == chart._key(), timeout=60)  # its first
        chart._last_build = (time.monotonic(), 0.005)  # a build of 5 ms just started: the next waits ~0.5 s
        chart.data_changed()
        assert chart.pending and chart._build_timer is not None and not chart._building
        chart.points.append(4.0)
        chart.data_changed()  # newer data while held: still one timer, and it takes the newest
        await wait_for(pilot, lambda: not chart.pending and chart._built_key == chart._key(), timeout=60)
        assert "flaky 4 points" in _text(chart)  # the held build took the newest data
        chart._last_build = (time.monotonic() - 10.0, 0.005)  # its spacing has passed: builds at once
        chart.data_changed()
        assert chart._building and chart._build_timer is None
        await wait_for(pilot, lambda: not chart.pending and chart._built_key == chart._key(), timeout=60)
