"""The replication window as lanes: one lane per slot of the SOURCE's window, each showing its bucket.

A bucket holds a lane from the moment the source stages it until the source's send completes, so
there are never more lanes than the window the engine enforces. Buckets the source has sent that
the receivers are still receiving or verifying are a separate count on the header line. Below the
lanes, every bucket of the plan as one glyph, wrapped to the width so the grid is always whole.
While the ranks start (before the first bucket moves) a line counts the ranks in each start-up
phase, from the launcher's ``repl.ranks`` reports.
A glyph per state (not only a colour) keeps it legible with NO_COLOR.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from hwtui.engine.replication.views import ReplicationView

# Keyed by the state names (engine.replication.events.BucketState values).
GLYPH = {"pending": ("·", "dim"), "staged": ("░", "blue"), "inflight": ("▒", "yellow"),
         "verifying": ("▓", "magenta"), "done": ("█", "green"), "failed": ("✗", "bold red")}
SOURCE_STAGES = ("staged", "inflight")
SHORT = {"pending": "pend", "staged": "staged", "inflight": "flight", "verifying": "verify", "done": "done", "failed": "fail"}
GRID_INDENT = 9  # "buckets " column


class BucketLanes(Widget):
    DEFAULT_CSS = "BucketLanes { height: auto; min-height: 4; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.repl: ReplicationView | None = None

    def show(self, repl: ReplicationView) -> None:
        self.repl = repl
        self.refresh(layout=True)

    def _grid_rows(self, repl: ReplicationView, width: int) -> int:
        return -(-max(repl.n_buckets, 1) // max(width - GRID_INDENT, 1))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        r = self.repl
        if r is None:
            return 1
        return 2 + max(len(r.lanes), 1) + self._grid_rows(r, width) + (1 if r.starting_up else 0)

    def render(self) -> Text:
        r = self.repl
        if r is None:
            return Text("waiting for repl.start", style="dim")
        width = max(self.size.width, 20)
        text = Text(no_wrap=True, overflow="ellipsis")
        # Busy lanes over the limit, then their bytes apart ("3/4" and "0.2 MB" once ran into "3/40.2 MB").
        text.append(f"source window {r.occupancy}/{r.window}", style="bold")
        text.append(f" ({r.bytes_in_flight / 1e6:.1f} MB in flight)", style="")
        text.append(f"  receivers verifying {r.awaiting_receivers}", style="magenta" if r.awaiting_receivers else "dim")
        legend = Text()
        for state in GLYPH:
            glyph, style = GLYPH[state]
            legend.append(glyph, style=style)
            legend.append(f"{SHORT[state]} ")
        if text.cell_len + 2 + legend.cell_len <= width:
            text.append("  ")
            text.append_text(legend)
        if r.starting_up:
            # Before the first byte: how far each start-up phase got, as the launcher counts it.
            world = r.ranks.world_size if r.ranks is not None else 0  # starting_up: ranks were reported
            text.append("\nranks  ", style="bold")
            for phase, n in r.phase_counts():
                text.append(f"{phase} ", style="dim")
                text.append(f"{n}/{world}  ", style="green" if n >= world else "yellow")
        label_w = len("lane 00 ") + len(" #0000 inflight")
        bar_w = max(width - label_w - 1, 2)
        for i, bid in enumerate(r.lanes):
            text.append(f"\nlane {i:<2} ")
            if bid is None:
                text.append("idle", style="dim")
                continue
            state = str(r.states.get(bid, "pending"))
            stage = "inflight" if state not in SOURCE_STAGES else state
            # Half the bar per source stage: staged, then on the wire.
            half = bar_w // 2
            for j, name in enumerate(SOURCE_STAGES):
                glyph, style = GLYPH[name]
                reached = j <= SOURCE_STAGES.index(stage)
                text.append((glyph if reached else "·") * half, style=style if reached else "dim")
            text.append(f" #{bid:<4} {'sending' if stage == 'inflight' else 'staged'}")
        done, total = r.count("done"), r.n_buckets
        text.append(f"\nbuckets {done}/{total}", style="bold")
        cells = max(width - GRID_INDENT, 1)
        ids = sorted(r.states)
        for n, bid in enumerate(ids):
            if n % cells == 0:
                text.append("\n" + " " * GRID_INDENT)
            glyph, style = GLYPH.get(str(r.states[bid]), ("?", ""))
            text.append(glyph, style=style)
        return text
