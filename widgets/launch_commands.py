"""The commands that start the cluster smoke test, one row per node (or one for mpirun/SLURM).

A table rather than text so the highlighted row is the one copied: a person picks the node they
are about to log in to and copies exactly its line.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable


class LaunchCommands(DataTable):
    DEFAULT_CSS = "LaunchCommands { height: auto; max-height: 6; } LaunchCommands.-empty { display: none; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self.commands: list[tuple[str, str]] = []
        self.add_class("-empty")

    def on_mount(self) -> None:
        self.add_columns("RUN ON", "COMMAND")

    def show(self, commands: dict[str, str]) -> None:
        self.commands = list(commands.items())
        self.clear()
        for i, (where, command) in enumerate(self.commands):
            self.add_row(Text(where), Text(command), key=str(i))
        self.set_class(not self.commands, "-empty")
        if self.commands:
            self.move_cursor(row=0)

    def current(self) -> tuple[str, str] | None:
        if not self.commands:
            return None
        row = self.cursor_row if self.cursor_row is not None and 0 <= self.cursor_row < len(self.commands) else 0
        return self.commands[row]
