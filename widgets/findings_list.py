"""Findings as a table: verdict, id, title. Worst first, so a fail is the first thing you see."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from hwtui.core.finding import Finding, Status
from hwtui.core.terminal_text import clean

# A word per verdict, not just a colour: readable with NO_COLOR and in a screen reader.
VERDICT = {
    "pass": ("✓ pass", "green"),
    "skip": ("- skip", "dim"),
    "warn": ("! warn", "yellow"),
    "error": ("E error", "magenta"),
    "fail": ("✗ FAIL", "bold red"),
}


def verdict_text(status: Status | str) -> Text:
    value = getattr(status, "value", status)
    word, style = VERDICT.get(str(value), (str(value), ""))
    return Text(word, style=style)


class FindingsList(DataTable):
    DEFAULT_CSS = "FindingsList { height: 1fr; min-height: 4; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", **kwargs)
        self.findings: list[Finding] = []

    def on_mount(self) -> None:
        self.add_columns("VERDICT", "ID", "TITLE")

    def show(self, findings: list[Finding]) -> None:
        self.findings = sorted(findings, key=lambda f: (-f.status.rank, f.id))
        self.clear()
        for i, f in enumerate(self.findings):
            # A cluster test's findings come from its ranks, on other machines: clean lines.
            self.add_row(verdict_text(f.status), Text(clean(f.id, 80)), Text(clean(f.title, 300)), key=str(i))
        if self.findings:
            self.move_cursor(row=0)

    def current(self) -> Finding | None:
        if not self.findings or self.cursor_row is None or not 0 <= self.cursor_row < len(self.findings):
            return None
        return self.findings[self.cursor_row]
