"""What every wizard step shares: the step bar, Back / Next / Re-run keys, the footer.

Private to the screens package. A step starts its work the first time it is shown (not when
installed), so the app opens instantly and only probes what the user walks to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from hwtui.app.tui.messages import ChecksFinished
from hwtui.widgets.finding_detail import FindingDetail
from hwtui.widgets.findings_list import FindingsList
from hwtui.widgets.step_bar import StepBar

if TYPE_CHECKING:
    from hwtui.app.tui.context import AppContext


class WizardStep(Screen):
    STEP: ClassVar[str] = ""
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("b", "back", "Back"),
        Binding("n", "next", "Next"),
        Binding("r", "rerun", "Re-run"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.started = False

    @property
    def hw(self) -> AppContext:
        """The app, typed: what the steps share (host, devices, config) lives there."""
        return cast("AppContext", self.app)

    def compose(self) -> ComposeResult:
        yield StepBar(self.STEP)
        with Vertical(classes="step-body"):
            yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        yield from ()

    def on_screen_resume(self) -> None:
        if not self.started:
            self.started = True
            self.action_rerun()

    def action_back(self) -> None:
        prev = self.hw.step_offset(self.STEP, -1)
        if prev:
            self.hw.goto(prev)

    def action_next(self) -> None:
        nxt = self.hw.step_offset(self.STEP, +1)
        if nxt:
            self.hw.goto(nxt)

    def action_rerun(self) -> None:
        """Run (again) what this step does. Subclasses override."""

    def set_status(self, text: str) -> None:
        self.query_one("#status", Static).update(text)


class ChecksStep(WizardStep):
    """A step that runs ``run_checks`` for some areas and lists the findings with remedies."""

    AREAS: ClassVar[frozenset[str]] = frozenset()
    BINDINGS: ClassVar[list[BindingType]] = [Binding("c", "copy_remedy", "Copy remedy")]
    INTRO: ClassVar[str] = ""

    def compose_body(self) -> ComposeResult:
        yield Static(self.INTRO, classes="hint")
        yield Static("", id="status", classes="summary")
        yield FindingsList(id="findings", classes="panel")
        yield FindingDetail(id="detail", classes="panel")

    def on_mount(self) -> None:
        self.query_one(FindingsList).border_title = "findings"
        self.query_one(FindingDetail).border_title = "finding and remedy"

    def action_rerun(self) -> None:
        self.set_status(f"checking {', '.join(sorted(self.AREAS))}...")
        self._run_checks()

    @work(thread=True, exclusive=True, group="checks", exit_on_error=False)
    def _run_checks(self) -> None:
        # Off the UI thread: a vendor probe may import torch in a child process for seconds.
        from hwtui.probes.catalog import catalog
        from hwtui.probes.framework import run_checks

        try:
            collectors, rules = catalog()
            result = run_checks(self.hw.host, collectors, rules, only=set(self.AREAS))
            msg = ChecksFinished(self.AREAS, result.findings, result.duration_s)
        except Exception as exc:  # noqa: BLE001 - shown on screen, never a crash
            msg = ChecksFinished(self.AREAS, [], 0.0, f"{type(exc).__name__}: {exc}")
        self.post_message(msg)

    def on_checks_finished(self, msg: ChecksFinished) -> None:
        if msg.error:
            self.set_status(f"checks failed to run: {msg.error}")
            return
        counts: dict[str, int] = {}
        for f in msg.findings:
            counts[f.status.value] = counts.get(f.status.value, 0) + 1
        order = ("fail", "error", "warn", "skip", "pass")
        summary = ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))
        self.set_status(f"{len(msg.findings)} findings ({summary or 'none'}) in {msg.duration_s:.1f} s")
        table = self.query_one(FindingsList)
        table.show(msg.findings)
        self.query_one(FindingDetail).show(table.current())

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        table = self.query_one(FindingsList)
        if event.data_table is table:
            self.query_one(FindingDetail).show(table.current())

    def action_copy_remedy(self) -> None:
        remedy = self.query_one(FindingDetail).remedy
        if not remedy:
            self.notify("this finding has no remedy to copy")
            return
        self.app.copy_to_clipboard(remedy)
        self.notify(f"copied: {remedy}", title="remedy")
