"""The engine log keeps its last lines in sight when it shrinks after its last write (a panel
appearing as a run fails): RichLog follows its end only on a write, and left the ERROR lines
below the view."""

from __future__ import annotations

from textual.app import App, ComposeResult

from hwtui.widgets.error_log import ErrorLog
from tests.app.tui.conftest import wait_for


class _LogApp(App[None]):
    def compose(self) -> ComposeResult:
        yield ErrorLog(id="log")


async def test_a_log_that_shrinks_after_its_last_line_still_shows_it() -> None:
    app = _LogApp()
    async with app.run_test(size=(60, 30)) as pilot:
        log = app.query_one(ErrorLog)
        log.catch_up([("info", f"line {i}") for i in range(60)] + [("error", "the last one")], 61)
        await wait_for(pilot, lambda: not log._deferred_renders and log.max_scroll_y > 0 and log.scroll_y >= log.max_scroll_y)
        before = log.max_scroll_y
        log.styles.height = 8  # the view shrinks; nothing new is written
        await wait_for(pilot, lambda: log.max_scroll_y > before)
        await wait_for(pilot, lambda: log.scroll_y >= log.max_scroll_y)
        assert log.scroll_y == log.max_scroll_y
