"""Processes on each device: device, PID, user, device memory and command; sortable by any column.

A click on a column header (or ``o``) changes the sort; memory sorts largest first, the rest in
ascending order. Rows are keyed by (device, pid) so a refresh updates them in place.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

COLUMNS = (("DEVICE", "device"), ("PID", "pid"), ("USER", "user"), ("MEM", "mem"), ("COMMAND", "command"))


def _mem(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


class ProcessTable(DataTable):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("o", "next_sort", "Sort", show=True)]
    DEFAULT_CSS = "ProcessTable { height: 1fr; min-height: 3; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.sort_key = "mem"
        self.rows_shown: list[Any] = []
        self.note = ""

    def on_mount(self) -> None:
        for label, key in COLUMNS:
            self.add_column(label, key=key)

    def _sorted(self, rows: list[Any]) -> list[Any]:
        if self.sort_key == "mem":
            return sorted(rows, key=lambda p: (-(p.mem_bytes or 0), p.device, p.pid))
        return sorted(rows, key=lambda p: (getattr(p, self.sort_key), p.pid))

    def show(self, processes: list[Any] | None) -> None:
        """``None``: this host has no processes to show (a replay)."""
        note = "not recorded in a replay" if processes is None else ("none" if not processes else "")
        rows = self._sorted(list(processes or []))
        subtitle = f"sorted by {self.sort_key}" + (f" - {note}" if note else "")
        if rows == self.rows_shown and self.row_count == len(rows) and subtitle == self.border_subtitle:
            return  # nothing changed: no layout, no repaint (the common case at 1 Hz)
        keys = [f"{p.device}/{p.pid}" for p in rows]
        self.note = note
        before = {f"{p.device}/{p.pid}": p for p in self.rows_shown}
        if self.row_count == len(rows) and set(keys) == set(before):
            # Same processes: update the cells that moved and reorder the rows in place; a rebuild
            # (clear + add_row) costs ~20 ms a tick with 40 rows, this a few.
            for key, new in zip(keys, rows, strict=True):
                old = before[key]
                if old.mem_bytes != new.mem_bytes:
                    self.update_cell(key, "mem", Text(_mem(new.mem_bytes), justify="right"), update_width=True)
                if old.command != new.command:
                    self.update_cell(key, "command", new.command, update_width=True)
            if keys != list(before):
                order = {(p.device, str(p.pid)): i for i, p in enumerate(rows)}
                self.sort("device", "pid", key=lambda cells: order[(str(cells[0]), str(cells[1]))])
        else:
            self.clear()
            for key, p in zip(keys, rows, strict=True):
                self.add_row(p.device, str(p.pid), p.user, Text(_mem(p.mem_bytes), justify="right"), p.command, key=key)
        self.rows_shown = rows
        self.border_subtitle = subtitle

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        self.sort_key = str(event.column_key.value)
        self.show(self.rows_shown if self.note != "not recorded in a replay" else None)

    def action_next_sort(self) -> None:
        keys = [k for _, k in COLUMNS]
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.show(self.rows_shown if self.note != "not recorded in a replay" else None)
