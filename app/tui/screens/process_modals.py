"""The monitor's two questions: "send this signal?" (y / n, no by default) and "filter by what?".

Modal so nothing else takes the keys while they are open: a stray ``y`` typed elsewhere can never
signal a process, and escape, ``n`` or any click outside answers no.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class ConfirmSignal(ModalScreen[bool]):
    """``question`` with y / n; anything but ``y`` answers False."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes, send it"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "No", show=False),
    ]
    DEFAULT_CSS = """
    ConfirmSignal { align: center middle; }
    ConfirmSignal > Vertical { width: auto; max-width: 90%; height: auto; border: thick $error; padding: 0 1;
                               background: $surface; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question)
            yield Static("y: send it    n / escape: no (the default)")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def on_click(self) -> None:
        self.dismiss(False)


class FilterPrompt(ModalScreen[str | None]):
    """A one-line filter; Enter applies it (empty: show all), escape leaves it as it was."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    FilterPrompt { align: center middle; }
    FilterPrompt > Vertical { width: 60; max-width: 90%; height: auto; border: round $primary; padding: 0 1;
                              background: $surface; }
    """

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Show processes whose command, user or pid contain:")
            yield Input(self.current, placeholder="text (empty: all)", id="filter-text")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
