"""One device's memory drawn as a bar plus ``used/total``: pure functions, no widget.

The device panel draws every device in one widget (one Strip per line) so a 1 Hz refresh of
many devices repaints one widget instead of dozens; these functions give it the memory column.
The numbers are always printed next to the bar, so it reads the same with NO_COLOR (colour only
repeats what the length and the numbers already say).
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style

from hwtui.widgets._draw import bar, gib

LEVEL_STYLES = {"ok": Style(color="green"), "high": Style(color="yellow"), "full": Style(color="red"), "none": Style(dim=True)}


def memory_label(used: int | None, total: int | None) -> str:
    """``"12.0G/80.0G"``, or ``"mem ?"`` when the total is unknown (nothing to scale a bar to)."""
    return f"{gib(used)}/{gib(total)}" if total else "mem ?"


def memory_level(used: int | None, total: int | None) -> str:
    """``ok`` / ``high`` (> 75 %) / ``full`` (> 90 %), or ``none`` when it cannot be told."""
    if not total or used is None:
        return "none"
    frac = used / total
    return "full" if frac > 0.9 else "high" if frac > 0.75 else "ok"


def memory_bar_text(used: int | None, total: int | None, width: int) -> str:
    """The bar alone, ``width`` cells; dots when the figures are unknown."""
    if not total or used is None:
        return "·" * max(width, 0)
    return bar(used / total, width)


def memory_segments(used: int | None, total: int | None, bar_width: int, label_width: int, base: Style) -> list[Segment]:
    """Bar, a space, and the label right-aligned in ``label_width`` cells (so columns line up)."""
    return [Segment(memory_bar_text(used, total, bar_width), base + LEVEL_STYLES[memory_level(used, total)]),
            Segment(" " + memory_label(used, total).rjust(label_width), base)]
