"""Text drawing shared by the widgets: sparklines, bars, column charts, byte sizes.

Pure functions over numbers, drawn with block characters so every chart reads the same with
NO_COLOR (shape carries the meaning; colour only reinforces it). Private: widgets import it,
screens do not.
"""

from __future__ import annotations

from collections.abc import Sequence

BLOCKS = " ▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int, lo: float | None = None, hi: float | None = None) -> str:
    """The last ``width`` values as one row of eighth-blocks; a missing value draws as a space."""
    if width <= 0:
        return ""
    vals = list(values)[-width:]
    known = [v for v in vals if v is not None]
    if not known:
        return " " * width
    lo = min(known) if lo is None else lo
    hi = max(known) if hi is None else hi
    span = hi - lo
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        else:
            level = 8 if span <= 0 else round((min(max(v, lo), hi) - lo) / span * 7) + 1
            out.append(BLOCKS[max(1, min(8, level))])
    return "".join(out).rjust(width)


def bar(fraction: float, width: int, full: str = "█", empty: str = "░") -> str:
    """A horizontal bar with eighth-block resolution at its end."""
    if width <= 0:
        return ""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    whole, part = divmod(eighths, 8)
    partial = "▏▎▍▌▋▊▉"[part - 1] if part else ""
    return (full * whole + partial + empty * width)[:width] if whole < width else full * width


def columns(values: Sequence[float], width: int, height: int, hi: float | None = None) -> list[str]:
    """A column chart of the last ``width`` values, ``height`` rows, top row first."""
    vals = list(values)[-width:]
    top = hi if hi is not None else max(vals, default=0.0)
    rows = []
    for row in range(height - 1, -1, -1):
        line = []
        for v in vals:
            level = 0.0 if top <= 0 else max(v, 0.0) / top * height * 8
            cell = min(max(level - row * 8, 0), 8)
            line.append(BLOCKS[int(round(cell))] if cell else " ")
        rows.append("".join(line).ljust(width))
    return rows


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024**3:.1f}G"
