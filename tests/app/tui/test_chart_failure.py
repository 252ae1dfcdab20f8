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
