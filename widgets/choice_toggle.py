"""A one-line choice between a few options: ``(•) replicate  ( ) train``.

Radio buttons mark the chosen option with colour alone; this one uses ``(•)`` against ``( )``,
so the choice reads the same with NO_COLOR. Left / right / space change it, and so does a click
on an option.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget


class ChoiceToggle(Widget, can_focus=True):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "move(-1)", "Previous", show=False),
        Binding("right", "move(1)", "Next choice", show=False),
        Binding("space", "move(1)", "Change", show=False),
    ]
    DEFAULT_CSS = """
    ChoiceToggle { height: 1; width: auto; padding: 0 1; }
    ChoiceToggle:focus { text-style: bold; background: $boost; }
    """
    value: reactive[str] = reactive("")

    class Changed(Message):
        def __init__(self, toggle: ChoiceToggle, value: str) -> None:
            super().__init__()
            self.toggle = toggle
            self.value = value

        @property
        def control(self) -> ChoiceToggle:
            return self.toggle

    def __init__(self, options: list[tuple[str, str]], value: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.options = options  # (value, label)
        self.set_reactive(ChoiceToggle.value, value if value in dict(options) else options[0][0])

    def render(self) -> Text:
        text = Text()
        for i, (value, label) in enumerate(self.options):
            chosen = value == self.value
            text.append(("  " if i else "") + ("(•) " if chosen else "( ) "))
            text.append(label, style="bold underline" if chosen else "dim")
        return text

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return sum(len(label) + 4 for _, label in self.options) + 2 * (len(self.options) - 1)

    def option_at(self, x: int) -> str | None:
        """The option drawn at content column ``x`` (the layout of :meth:`render`)."""
        pos = 0
        for i, (value, label) in enumerate(self.options):
            width = (2 if i else 0) + 4 + len(label)
            if pos <= x < pos + width:
                return value
            pos += width
        return None

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        chosen = self.option_at(offset.x) if offset is not None else None
        if chosen is not None:
            self.focus()
            self.value = chosen

    def action_move(self, step: int) -> None:
        values = [v for v, _ in self.options]
        self.value = values[(values.index(self.value) + step) % len(values)]

    def watch_value(self, value: str) -> None:
        self.post_message(self.Changed(self, value))
