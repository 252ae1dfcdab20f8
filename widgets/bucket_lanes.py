"""The replication window as lanes: one lane per in-flight slot, each showing its bucket's stage.

Below the lanes, every bucket of the plan as one glyph, so the whole run reads at a glance. A
glyph per state (not only a colour) keeps it legible with NO_COLOR.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

GLYPH = {"pending": ("·", "dim"), "staged": ("░", "blue"), "inflight": ("▒", "yellow"),
         "verifying": ("▓", "magenta"), "done": ("█", "green"), "failed": ("✗", "bold red")}
STAGES = ("staged", "inflight", "verifying", "done")
SHORT = {"pending": "pend", "staged": "staged", "inflight": "flight", "verifying": "verify", "done": "done", "failed": "fail"}


class BucketLanes(Widget):
    DEFAULT_CSS = "BucketLanes { height: auto; min-height: 4; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.repl: Any = None

    def show(self, repl: Any) -> None:
        self.repl = repl
        self.refresh(layout=True)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        if self.repl is None:
            return 1
        lanes = max(len(self.repl.lanes), 1)
        overview = -(-max(self.repl.n_buckets, 1) // max(width - 9, 1))
        return 2 + lanes + min(overview, 3)

    def render(self) -> Text:
        r = self.repl
        if r is None:
            return Text("waiting for repl.start", style="dim")
        text = Text()
        text.append(f"window {r.occupancy}/{r.window}", style="bold")
        text.append(f" {r.bytes_in_flight / 1e6:5.1f} MB  ")
        for state in ("pending", *STAGES, "failed"):
            glyph, style = GLYPH[state]
            text.append(glyph, style=style)
            text.append(f"{SHORT[state]} ")
        width = max(self.size.width, 20)
        bar_w = max(width - 34, 4)
        for i, bid in enumerate(r.lanes):
            over = " (over window)" if i >= max(r.window, 1) else ""
            text.append(f"\nlane {i:<2} ")
            if bid is None:
                text.append("idle", style="dim")
                continue
            state = r.states.get(bid, "pending")
            reached = STAGES.index(state) + 1 if state in STAGES else 0
            # The lane fills stage by stage: staged -> inflight -> verifying -> done.
            per = bar_w // len(STAGES)
            for j, stage in enumerate(STAGES):
                glyph, style = GLYPH[stage]
                text.append((glyph if j < reached else "·") * per, style=style if j < reached else "dim")
            text.append(f" #{bid:<4} {state}{over}")
        done, total = r.count("done"), r.n_buckets
        text.append(f"\nbuckets {done}/{total} ")
        cells = width - 9
        ids = sorted(r.states)
        shown = ids[: cells * 3]
        for n, bid in enumerate(shown):
            if n and n % cells == 0:
                text.append("\n" + " " * 9)
            glyph, style = GLYPH.get(r.states[bid], ("?", ""))
            text.append(glyph, style=style)
        if len(ids) > len(shown):
            text.append(f" +{len(ids) - len(shown)}")
        return text
