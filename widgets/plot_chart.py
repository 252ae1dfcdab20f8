"""The base of hwtui's charts: textual-plotext with axes, a title that carries the figures, and a stable theme.

Every chart (throughput, loss, device history) clears the figure, sets its title and x label and
plots its series on each build; subclasses say only what to plot (:meth:`PlotChart.draw`) and
what the title reads (:meth:`PlotChart.summary`), so the figures are text too (NO_COLOR, tests,
screen readers).

Off the UI thread (``BUILD_IN_THREAD``): plotext builds a chart in pure Python, 5-30 ms for a
large one; a chart redrawn on every 1 Hz monitor tick would take most of the tick's budget. Such
a chart is built in a thread worker (one at a time, the newest data wins) and ``render`` returns
the last built lines (the plot's ANSI text parsed and cut into strips in the worker too: painting
a large styled Text costs the UI thread as much as building it), so a tick costs a cached paint. Builds are spaced so that they
take at most ``CPU_BUDGET`` of a core whatever the chart's size (a 40-row chart on a loaded box
is redrawn every few seconds, a small one every tick). ``pending`` says a build is under way or
scheduled (tests wait on it, never on time).

Theme: textual-plotext registers its "auto" theme in plotext's process-global theme dict under
the Textual theme's *name*, built from the colours of the first app that asked. A second app with
the same theme name but other colours (NO_COLOR, a test run after another) would draw with the
first one's colours, so snapshots would depend on test order. Here the registered name carries
the colours themselves, so each set of colours gets its own entry.
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import RenderResult
from textual.strip import Strip
from textual_plotext import PlotextPlot
from textual_plotext.plot import Plot

from hwtui.widgets._draw import nice_ticks, tick_label

# Share of one core a thread-built chart may use. 1 % left the Run screen at 200x60 at 2.3 % of a
# core at 1 Hz (the whole screen's target is 2 %); at 0.6 % a 200x60 history chart is redrawn every
# 2-3 s instead of every 1.5 s, the small ones still every tick.
CPU_BUDGET = 0.006
# Below this a chart cannot be read (at 80x24 the loss chart was one row with a point outside its
# frame): the chart gives way to its figures and a one-line note. Height: title, frame (2), tick
# labels and the x label take 5 rows; 3 rows of plot is the least that shows a trend.
MIN_WIDTH, MIN_HEIGHT = 24, 8
X_CELLS_PER_TICK, Y_ROWS_PER_TICK = 10, 3


class PlotChart(PlotextPlot):
    DEFAULT_CSS = "PlotChart { height: 9; width: 1fr; }"
    X_LABEL = ""
    BUILD_IN_THREAD: ClassVar[bool] = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._built: list[Strip] | None = None  # the last chart built in the worker, one strip per line
        self._built_key: tuple[Any, ...] | None = None  # (data version, width, height, theme) it was built for
        self._data_version = 0
        self._plot_lock = threading.Lock()  # the plotext figure is not thread-safe
        self.pending = False
        self._last_build = (0.0, 0.0)  # (monotonic start, CPU seconds) of the last build
        self._build_timer: Any = None
        self._building = False  # a worker is building; when it is done it checks for newer data
        self._plot_size = (0, 0)  # the size being built: set_ticks sizes the ticks to it

    def summary(self) -> str:
        """The chart's title: its figures as text."""
        return ""

    def draw(self, plt: Plot) -> None:
        """Plot the series (``plt`` is cleared, titled and labelled already)."""

    def x_label(self) -> str:
        """The x axis' label; subclasses add a key to their series' markers."""
        return self.X_LABEL

    def set_ticks(self, plt: Plot, axis: str, lo: float, hi: float, *, integer: bool = False,
                  mirrored: bool = False, yside: str | None = None, top: float | None = None) -> list[float]:
        """Round ticks over ``[lo, hi]`` on ``axis`` ("x" or "y"), as many as the chart's size reads
        well, and the axis' limits set to the outer ticks. ``mirrored``: the data runs over
        ``[-hi, -lo]`` (time before now) and the labels say how long ago, without the minus sign.
        ``top``: a fixed upper limit (a device's power limit): the axis ends there and only the
        round ticks below it are labelled."""
        width, height = self._plot_size
        count = max(2, (width // X_CELLS_PER_TICK) if axis == "x" else (height - 4) // Y_ROWS_PER_TICK + 1)
        ticks = nice_ticks(lo, top if top is not None else hi, count, integer=integer)
        if top is not None:
            ticks = [t for t in ticks if t <= top]
        if not ticks:
            return ticks
        labels = [tick_label(t) for t in ticks]
        positions = [-t for t in ticks] if mirrored else ticks
        low, high = min(positions), max(positions) if top is None else top
        # A hair of room past the outer tick: plotext drew a point lying exactly on the limit one
        # cell outside the frame.
        pad = (high - low) * 0.01
        if axis == "x":
            plt.xticks(positions, labels)
            plt.xlim(low - (pad if mirrored else 0), high + (0 if mirrored else pad))
        else:
            # plotext annotates yside as a number; it takes "left" / "right" (its own docs and code).
            plt.yticks(positions, labels, yside=yside)  # type: ignore[arg-type]
            plt.ylim(low, high + pad, yside=yside)  # type: ignore[arg-type]
        return ticks

    def data_changed(self) -> None:
        """Subclasses call this after storing new data: the next paint shows it."""
        self._data_version += 1
        if self.BUILD_IN_THREAD and self.is_mounted and self.size.area:
            self._schedule_build()
        else:
            self.refresh()

    def _schedule_build(self) -> None:
        """Build now, or when the CPU budget allows; a build under way or scheduled takes the newest data."""
        if self._build_timer is not None or self._building:
            return
        started, cost = self._last_build
        wait = started + cost / CPU_BUDGET - time.monotonic()
        if wait > 0:
            self.pending = True
            self._build_timer = self.set_timer(wait, self._timer_fired)
        else:
            self._request_build()

    def _timer_fired(self) -> None:
        self._build_timer = None
        self._request_build()

    def _build(self, width: int, height: int, theme: str) -> Text:
        if width < MIN_WIDTH or height < MIN_HEIGHT:
            short = [f"{n} {what} (has {have})" for n, what, have in
                     ((MIN_WIDTH, "columns", width), (MIN_HEIGHT, "rows", height)) if have < n]
            note = f"(chart hidden: it needs {' and '.join(short)}; a larger terminal shows it)"
            return Text(f"{self.summary()}\n{note}" if height >= 2 else note, no_wrap=True, overflow="ellipsis")
        with self._plot_lock:
            self._plot_size = (width, height)
            plt = self.plt
            plt.clear_data()
            plt.clear_figure()
            plt.plotsize(width, height)
            plt._set_size(width, height)  # as PlotextPlot.render does (textual-plotext issue 5)
            plt.title(self.summary())
            label = self.x_label()
            if label:
                plt.xlabel(label)
            self.draw(plt)
            plt.theme(theme)
            return Text.from_ansi(plt.build())

    def _key(self) -> tuple[Any, ...]:
        return (self._data_version, self.size.width, self.size.height, self._get_plotext_theme_name(self.app.theme))

    def _request_build(self) -> None:
        self.pending = self._building = True
        self._build_worker(self._key())

    @work(thread=True, exclusive=True, group="plot-build", exit_on_error=False)
    def _build_worker(self, key: tuple[Any, ...]) -> None:
        _version, width, height, theme = key
        started, cpu = time.monotonic(), time.thread_time()
        try:
            text = self._build(width, height, theme)
        except Exception as exc:  # noqa: BLE001 - a chart that cannot draw says so; it never freezes
            # Without this the worker died silently (exit_on_error=False) with _building still
            # set, and the chart never built again: frozen on old data for the rest of the run.
            text = Text(f"{self.summary()}\n(chart not drawn: {type(exc).__name__}: {exc})"[:2000],
                        no_wrap=True, overflow="ellipsis")
        console = self.app.console
        options = console.options.update(width=width, height=height, no_wrap=True, overflow="crop")
        strips = [Strip(line, width) for line in console.render_lines(text, options, pad=True)]
        self._last_build = (started, time.thread_time() - cpu)
        self.app.call_from_thread(self._built_done, key, strips)

    def _built_done(self, key: tuple[Any, ...], strips: list[Strip]) -> None:
        self._built, self._built_key = strips, key
        self._building = False
        self.pending = False
        if key != self._key():  # newer data or another size came meanwhile: build again (within the budget)
            self._schedule_build()
        self.refresh()

    def render(self) -> RenderResult:
        return self._build(self.size.width, self.size.height, self._get_plotext_theme_name(self.app.theme))

    def render_line(self, y: int) -> Strip:
        if not self.BUILD_IN_THREAD:
            return super().render_line(y)
        if self._built_key != self._key() and not self.pending:
            self._schedule_build()  # a resize or a theme change: the old picture until the new one is built
        built = self._built
        return built[y] if built is not None and 0 <= y < len(built) else Strip.blank(self.size.width, self.rich_style)

    def _get_plotext_theme_name(self, app_theme_name: str) -> str:
        if self.theme != "auto":
            return str(self.theme)
        colours = self.app.theme_variables
        return f"hwtui-{app_theme_name}-{colours.get('surface')}-{colours.get('foreground')}"
