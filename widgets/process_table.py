"""Processes on each device: GPU %, device memory, CPU %, host memory, age and command; sortable,
filtered, or drawn as a tree by parent process.

A click on a column header (or ``o``) changes the sort; figures sort largest first, names in
ascending order. ``up`` / ``down`` (or a click) move the cursor row. ``filter`` keeps the rows whose
command, user or pid contain a text; ``tree`` puts each process under its parent when the parent is
shown too (the sort orders siblings).

Why not a DataTable: with 40 processes whose memory moves every second, a DataTable re-rendered
every visible cell on each tick (update_cell, a re-sort, width recalculation): 20-30 ms of the UI
thread per tick, most of the monitor's cost. Here a tick stores the rows and marks one widget
dirty; the visible lines are drawn once, lazily, as plain segments (the device panel's pattern).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from hwtui.core.units import duration_text

if TYPE_CHECKING:  # the probes' types only; a widget module imports no probe code
    from hwtui.probes.processes import DeviceProcess

COLUMNS = (("DEVICE", "device"), ("PID", "pid"), ("USER", "user"), ("GPU%", "gpu"), ("MEM", "mem"),
           ("CPU%", "cpu"), ("RSS", "rss"), ("TIME", "time"), ("COMMAND", "command"))
RIGHT = {"pid", "gpu", "mem", "cpu", "rss", "time"}  # right-aligned columns (numbers)
# Sort keys: figures largest first (what a person looks for), names ascending; unknown figures last.
NUMERIC = {"gpu": "gpu_util", "mem": "mem_bytes", "cpu": "cpu_percent", "rss": "host_mem", "time": "elapsed_s"}
MAX_INDENT = 24  # cells of tree indentation at most (8 levels): the command stays readable
PAD = 1  # cells either side of a column's text (as a DataTable draws them)
REPLAY_NOTE = "not recorded in a replay"


def _mem(n: int | None) -> str:
    """In G like the device panel beside it (one unit family on screen); two decimals below 1 G so a
    small process is not "0.0G"."""
    if n is None:
        return "-"
    gib = n / 2**30
    return f"{gib:.1f}G" if gib >= 1 else f"{gib:.2f}G"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _elapsed(s: float | None) -> str:
    """How long the process has run, written as every duration on screen (core.units): ``12m05s``."""
    return duration_text(s, unknown="-")


def cells(p: DeviceProcess, prefix: str = "") -> dict[str, str]:
    """One process as the text of each column (``prefix``: its branch in the tree view)."""
    return {"device": str(p.device), "pid": str(p.pid), "user": str(p.user),
            "gpu": _pct(getattr(p, "gpu_util", None)), "mem": _mem(p.mem_bytes),
            "cpu": _pct(getattr(p, "cpu_percent", None)), "rss": _mem(getattr(p, "host_mem", None)),
            "time": _elapsed(getattr(p, "elapsed_s", None)), "command": prefix + str(p.command)}


def matches(p: DeviceProcess, text: str) -> bool:
    """The filter: ``text`` (case-insensitive) in the command or the user, or equal to the start of the pid."""
    text = text.strip().lower()
    return not text or text in str(p.command).lower() or text in str(p.user).lower() or str(p.pid).startswith(text)


def tree_order(rows: list[DeviceProcess]) -> list[tuple[DeviceProcess, str]]:
    """``rows`` (already sorted) with each process after its parent when the parent is shown; the
    branch prefix of each. A process on two devices is one node (its first row) with the others beside."""
    first: dict[int, DeviceProcess] = {}
    for p in rows:
        first.setdefault(p.pid, p)
    children: dict[int, list[DeviceProcess]] = {}
    roots = []
    for p in rows:
        parent = getattr(p, "ppid", None)
        if parent in first and parent != p.pid:
            children.setdefault(parent, []).append(p)
        else:
            roots.append(p)
    out: list[tuple[DeviceProcess, str]] = []
    seen: set[int] = set()

    def walk(root: DeviceProcess) -> None:
        # Iterative: a chain of a thousand nested processes must not hit the recursion limit.
        stack: list[tuple[DeviceProcess, str, str]] = [(root, "", "")]
        while stack:
            p, lead, branch = stack.pop()
            if id(p) in seen:  # a ppid cycle (pid reuse mid-read): never loop, never twice
                continue
            seen.add(id(p))
            out.append((p, lead + branch))
            kids = children.get(p.pid, []) if first[p.pid] is p else []
            inner = lead + ("" if not branch else ("   " if branch == "└─ " else "│  "))
            inner = inner if len(inner) <= MAX_INDENT else lead  # deeper than that: not indented further
            for i in range(len(kids) - 1, -1, -1):  # pushed last first: drawn in sorted order
                stack.append((kids[i], inner, "└─ " if i == len(kids) - 1 else "├─ "))

    for root in roots:
        walk(root)
    for p in rows:  # parents in a cycle (pids reused between two reads) have no root: draw them anyway
        if id(p) not in seen:
            walk(p)
    return out


@dataclass(frozen=True)
class _Column:
    key: str
    label: str
    x: int  # first cell, padding included
    width: int  # padding included


class ProcessTable(ScrollView, can_focus=True):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "next_sort", "Sort", show=True),
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {"process-table--header", "process-table--odd", "process-table--cursor"}
    DEFAULT_CSS = """
    ProcessTable { height: 1fr; min-height: 3; overflow-x: hidden; }
    ProcessTable > .process-table--header { text-style: bold; color: $primary; }
    ProcessTable > .process-table--odd { background: $boost; }
    ProcessTable > .process-table--cursor { background: $surface-lighten-2; }
    ProcessTable:focus > .process-table--cursor { background: $accent 40%; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sort_key = "mem"
        self.filter_text = ""
        self.as_tree = False
        self.rows_shown: list[DeviceProcess] = []  # after the filter, in the order drawn
        self._all: list[DeviceProcess] | None = []  # the last rows given to show() (None: a replay)
        self.note = ""
        self.cursor_row = 0
        self._cells: list[dict[str, str]] = []
        self._columns: list[_Column] = []
        self._strips: dict[int, Strip] = {}  # drawn lines of this tick, by row index (-1: the header)
        self._drawn_width = -1
        self._styles: dict[str, Style] = {}
        self._base = Style()

    # -- data ---------------------------------------------------------------------------------
    @property
    def row_count(self) -> int:
        return len(self.rows_shown)

    def _sorted(self, rows: list[DeviceProcess]) -> list[DeviceProcess]:
        attr = NUMERIC.get(self.sort_key)
        if attr is not None:
            return sorted(rows, key=lambda p: (getattr(p, attr, None) is None, -(getattr(p, attr, None) or 0),
                                               p.device, p.pid))
        return sorted(rows, key=lambda p: (getattr(p, self.sort_key), p.pid))

    def show(self, processes: list[DeviceProcess] | None) -> None:
        """``None``: this host has no processes to show (a replay)."""
        self._all = None if processes is None else list(processes)
        note = REPLAY_NOTE if processes is None else ("none" if not processes else "")
        rows = [p for p in self._sorted(list(processes or [])) if matches(p, self.filter_text)]
        if processes and not rows:
            note = "none match the filter"
        ordered = tree_order(rows) if self.as_tree else [(p, "") for p in rows]
        parts = [f"sorted by {self.sort_key}"]
        if self.filter_text:
            parts.append(f"filter '{self.filter_text}' ({len(rows)} of {len(processes or [])})")
        if self.as_tree:
            parts.append("tree")
        subtitle = ", ".join(parts) + (f" - {note}" if note else "")
        new_rows = [p for p, _ in ordered]
        if new_rows == self.rows_shown and subtitle == self.border_subtitle and self._cells:
            return  # nothing changed: no repaint (the common case at 1 Hz on an idle box)
        self.note = note
        self.rows_shown = new_rows
        self._cells = [cells(p, prefix) for p, prefix in ordered]
        self.cursor_row = min(self.cursor_row, max(len(new_rows) - 1, 0))
        self._strips.clear()
        self._columns = []
        height = len(new_rows) + 1  # the header is the first line
        if self.virtual_size.height != height:
            self.virtual_size = Size(0, height)
            self.refresh(layout=True)  # the table is as tall as its rows: the chart below gets the rest
        if subtitle != self.border_subtitle:
            self.border_subtitle = subtitle
        self.refresh()

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip()
        self.show(self._all)

    def toggle_tree(self) -> None:
        self.as_tree = not self.as_tree
        self.show(self._all)

    @property
    def selected_process(self) -> DeviceProcess | None:
        """The process under the cursor, or None."""
        return self.rows_shown[self.cursor_row] if 0 <= self.cursor_row < len(self.rows_shown) else None

    def lines(self, width: int | None = None) -> list[str]:
        """The table's text, header first (what tests and screen readers get)."""
        width = self.scrollable_content_region.width if width is None else width
        self._layout(width)
        return [self._draw(i, width, Style()).text for i in range(-1, len(self._cells))]

    # -- layout and drawing -------------------------------------------------------------------
    def _layout(self, width: int) -> list[_Column]:
        x, columns = 0, []
        for label, key in COLUMNS:
            text_w = max([len(label)] + [len(c[key]) for c in self._cells])
            w = text_w + 2 * PAD
            if key == "command":  # the last column takes what is left (cut with an ellipsis)
                w = max(width - x, len(label) + 2 * PAD)
            columns.append(_Column(key, label, x, w))
            x += w
        self._columns = columns
        return columns

    def _draw(self, index: int, width: int, base: Style) -> Strip:
        """Row ``index`` of the table (-1: the header) as one strip of ``width`` cells."""
        if not self._styles:  # looked up once per drawing pass: a lookup per line costs more than the line
            self._styles = {name: self.get_component_rich_style(f"process-table--{name}", partial=True)
                            for name in ("header", "odd", "cursor")}
        if index == -1:
            style = base + self._styles["header"]
            texts = {key: label for label, key in COLUMNS}
        else:
            style = base
            if index % 2:
                style += self._styles["odd"]
            if index == self.cursor_row:
                style += self._styles["cursor"]
            texts = self._cells[index]
        segments = []
        for col in self._columns:
            inner = col.width - 2 * PAD
            text = texts[col.key]
            if len(text) > inner:
                text = text[: max(inner - 1, 0)] + "…" if inner > 0 else ""
            text = text.rjust(inner) if col.key in RIGHT else text.ljust(inner)
            segments.append(Segment(" " * PAD + text + " " * PAD, style))
        return Strip(segments).adjust_cell_length(width, style)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if width != self._drawn_width or not self._columns:
            self._strips.clear()
            self._layout(width)
            self._drawn_width = width
        if not self._strips:  # a new drawing pass: the base style once (rich_style is costly per line)
            self._base = self.rich_style
        index = -1 if y == 0 else y - 1 + self.scroll_offset.y
        if index >= len(self._cells):
            return Strip.blank(width, self._base)
        strip = self._strips.get(index)
        if strip is None:
            strip = self._strips[index] = self._draw(index, width, self._base)
        return strip

    def notify_style_update(self) -> None:
        # Theme, NO_COLOR or focus change: the cached lines carry old styles.
        super().notify_style_update()
        self._strips.clear()
        self._styles.clear()

    def on_focus(self) -> None:
        self._styles.clear()  # the cursor's colour follows focus
        self._strips.clear()
        self.refresh()

    def on_blur(self) -> None:
        self.on_focus()

    # -- input --------------------------------------------------------------------------------
    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)  # inside the border and padding
        if offset is None:
            return
        if offset.y == 0:  # a header: sort by that column
            for col in self._columns:
                if col.x <= offset.x < col.x + col.width:
                    self._sort_by(col.key)
                    return
        else:
            self._move_cursor_to(offset.y - 1 + self.scroll_offset.y)

    def _sort_by(self, key: str) -> None:
        self.sort_key = key
        self.show(self._all)

    def action_next_sort(self) -> None:
        keys = [k for _, k in COLUMNS]
        self._sort_by(keys[(keys.index(self.sort_key) + 1) % len(keys)])

    def action_cursor(self, delta: int) -> None:
        self._move_cursor_to(self.cursor_row + delta)

    def _move_cursor_to(self, row: int) -> None:
        if not self._cells:
            return
        row = min(max(row, 0), len(self._cells) - 1)
        if row != self.cursor_row:
            self.cursor_row = row
            self._strips.clear()
            # Keep the cursor in view (the header takes the first line).
            visible = max(self.scrollable_content_region.height - 1, 1)
            if row < self.scroll_offset.y:
                self.scroll_to(y=row, animate=False)
            elif row >= self.scroll_offset.y + visible:
                self.scroll_to(y=row - visible + 1, animate=False)
            self.refresh()
