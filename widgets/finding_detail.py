"""The highlighted finding: its detail, and its remedy in a read-only text area.

The remedy sits in a TextArea so a person can select part of it with the mouse or keyboard even
where the terminal has no clipboard support; ``c`` copies the whole of it.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static, TextArea

from hwtui.core.finding import Finding
from hwtui.core.terminal_text import clean, clean_lines
from hwtui.widgets.findings_list import verdict_text


class FindingDetail(Vertical):
    DEFAULT_CSS = """
    FindingDetail { height: auto; max-height: 12; border-top: solid $primary; }
    FindingDetail > #detail { height: auto; max-height: 6; }
    FindingDetail > #remedy { height: 4; }
    FindingDetail > #remedy.-empty { display: none; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.remedy = ""

    def compose(self) -> ComposeResult:
        yield Static(id="detail")
        yield TextArea("", id="remedy", read_only=True, show_line_numbers=False, soft_wrap=True, classes="-empty")

    def show(self, finding: Finding | None) -> None:
        detail = self.query_one("#detail", Static)
        area = self.query_one("#remedy", TextArea)
        if finding is None:
            detail.update("No findings.")
            self.remedy = ""
        else:
            # A cluster test's findings come from its ranks, on other machines: clean lines (no ESC
            # sequence reaches the terminal, nor the clipboard through c), their line breaks kept.
            text = Text.assemble(verdict_text(finding.status), " ", (clean(finding.id, 80), "bold"), "\n",
                                 clean(finding.title, 300))
            if finding.detail:
                text.append("\n" + clean_lines(finding.detail.strip(), 1000))
            if finding.remedy:
                text.append("\nRemedy (c copies it):", style="bold")
            detail.update(text)
            self.remedy = clean_lines(finding.remedy or "", 1000)
        area.load_text(self.remedy)
        area.set_class(not self.remedy, "-empty")
