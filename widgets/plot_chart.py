"""The base of hwtui's charts: textual-plotext with axes, a title that carries the figures, and a stable theme.

Every chart (throughput, loss, device history) clears the figure, sets its title and x label and
plots its series on each render; subclasses say only what to plot (:meth:`PlotChart.draw`) and
what the title reads (:meth:`PlotChart.summary`), so the figures are text too (NO_COLOR, tests,
screen readers).

Theme: textual-plotext registers its "auto" theme in plotext's process-global theme dict under
the Textual theme's *name*, built from the colours of the first app that asked. A second app with
the same theme name but other colours (NO_COLOR, a test run after another) would draw with the
first one's colours, so snapshots would depend on test order. Here the registered name carries
the colours themselves, so each set of colours gets its own entry.
"""

from __future__ import annotations

from typing import Any

from textual.app import RenderResult
from textual_plotext import PlotextPlot


class PlotChart(PlotextPlot):
    DEFAULT_CSS = "PlotChart { height: 9; width: 1fr; }"
    X_LABEL = ""

    def summary(self) -> str:
        """The chart's title: its figures as text."""
        return ""

    def draw(self, plt: Any) -> None:
        """Plot the series (``plt`` is cleared, titled and labelled already)."""

    def render(self) -> RenderResult:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.summary())
        if self.X_LABEL:
            plt.xlabel(self.X_LABEL)
        self.draw(plt)
        return super().render()

    def _get_plotext_theme_name(self, app_theme_name: str) -> str:
        if self.theme != "auto":
            return str(self.theme)
        colours = self.app.theme_variables
        return f"hwtui-{app_theme_name}-{colours.get('surface')}-{colours.get('foreground')}"
