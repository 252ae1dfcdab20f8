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

from dataclasses import dataclass
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


@dataclass(frozen=True)
class LanesPicture:
    """Everything the lanes draw, copied out of the view when :meth:`BucketLanes.show` is called.

    Why a copy: the app calls ``show`` under its state's lock, but Textual renders later, while the
    engine's reader thread goes on folding events into the same state; reading the live view in
    ``render`` met "Set changed size during iteration" (and could draw a header and lanes from two
    different moments)."""

    occupancy: int
    window: int
    bytes_in_flight: int
    awaiting_receivers: int
    starting_up: bool
    world: int  # ranks the launcher reported (0 before its first report)
    phase_counts: tuple[tuple[str, int], ...]
    lanes: tuple[tuple[int, str] | None, ...]  # slot -> (bucket id, its state), None: idle
    grid: tuple[str, ...]  # every known bucket's state, in bucket-id order
    done: int
    total: int

    @classmethod
    def of(cls, repl: ReplicationView) -> LanesPicture:
        states = dict(repl.states)
        return cls(
            occupancy=repl.occupancy, window=repl.window, bytes_in_flight=repl.bytes_in_flight,
            awaiting_receivers=repl.awaiting_receivers, starting_up=repl.starting_up,
            world=repl.ranks.world_size if repl.ranks is not None else 0,
            phase_counts=tuple(repl.phase_counts()),
            lanes=tuple(None if b is None else (b, str(states.get(b, "pending"))) for b in repl.lanes),
            grid=tuple(str(states[b]) for b in sorted(states)),
            done=repl.count("done"), total=repl.n_buckets,
        )


class BucketLanes(Widget):
    DEFAULT_CSS = "BucketLanes { height: auto; min-height: 4; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.picture: LanesPicture | None = None

    def show(self, repl: ReplicationView) -> None:
        """Copy what the lanes draw out of ``repl`` now (the caller holds its lock); draw it later."""
        self.picture = LanesPicture.of(repl)
        self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        p = self.picture
        if p is None:
            return 1
        grid_rows = -(-max(p.total, 1) // max(width - GRID_INDENT, 1))
        return 2 + max(len(p.lanes), 1) + grid_rows + (1 if p.starting_up else 0)

    def render(self) -> Text:
        p = self.picture
        if p is None:
            return Text("waiting for repl.start", style="dim")
        width = max(self.size.width, 20)
        text = Text(no_wrap=True, overflow="ellipsis")
        # Busy lanes over the limit, then their bytes apart ("3/4" and "0.2 MB" once ran into "3/40.2 MB").
        text.append(f"source window {p.occupancy}/{p.window}", style="bold")
        text.append(f" ({p.bytes_in_flight / 1e6:.1f} MB in flight)", style="")
        text.append(f"  receivers verifying {p.awaiting_receivers}", style="magenta" if p.awaiting_receivers else "dim")
        legend = Text()
        for state in GLYPH:
            glyph, style = GLYPH[state]
            legend.append(glyph, style=style)
            legend.append(f"{SHORT[state]} ")
        if text.cell_len + 2 + legend.cell_len <= width:
            text.append("  ")
            text.append_text(legend)
        if p.starting_up:
            # Before the first byte: how far each start-up phase got, as the launcher counts it.
            text.append("\nranks  ", style="bold")
            for phase, n in p.phase_counts:
                text.append(f"{phase} ", style="dim")
                text.append(f"{n}/{p.world}  ", style="green" if n >= p.world else "yellow")
        label_w = len("lane 00 ") + len(" #0000 inflight")
        bar_w = max(width - label_w - 1, 2)
        for i, lane in enumerate(p.lanes):
            text.append(f"\nlane {i:<2} ")
            if lane is None:
                text.append("idle", style="dim")
                continue
            bid, state = lane
            stage = "inflight" if state not in SOURCE_STAGES else state
            # Half the bar per source stage: staged, then on the wire.
            half = bar_w // 2
            for j, name in enumerate(SOURCE_STAGES):
                glyph, style = GLYPH[name]
                reached = j <= SOURCE_STAGES.index(stage)
                text.append((glyph if reached else "·") * half, style=style if reached else "dim")
            text.append(f" #{bid:<4} {'sending' if stage == 'inflight' else 'staged'}")
        text.append(f"\nbuckets {p.done}/{p.total}", style="bold")
        cells = max(width - GRID_INDENT, 1)
        for n, state in enumerate(p.grid):
            if n % cells == 0:
                text.append("\n" + " " * GRID_INDENT)
            glyph, style = GLYPH.get(state, ("?", ""))
            text.append(glyph, style=style)
        return text
