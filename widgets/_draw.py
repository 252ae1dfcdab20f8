"""Text drawing shared by the widgets: sparklines, bars, column charts, byte sizes.

Pure functions over numbers, drawn with block characters so every chart reads the same with
NO_COLOR (shape carries the meaning; colour only reinforces it). Private: widgets import it,
screens do not.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

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


def nice_ticks(lo: float, hi: float, max_ticks: int, integer: bool = False) -> list[float]:
    """Round tick values covering ``[lo, hi]``: steps of 1, 2, 2.5 or 5 times a power of ten.

    Why: plotext spaces its ticks evenly over the data's own range, which printed ``16.7``,
    ``83.3`` and ``-59.0/-44.2/-29.5`` on hwtui's charts. The smallest round step that needs at
    most ``max_ticks + 1`` ticks wins; the outer ticks enclose ``[lo, hi]`` so the axis ends on
    round values. ``integer``: steps of at least 1 (training steps).
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or max_ticks < 1:
        return []
    lo, hi = min(lo, hi), max(lo, hi)
    if (hi - lo) / max_ticks < 1e-300:  # one value (or two a denormal apart): an axis of one unit around it
        hi = lo + (abs(lo) if abs(lo) > 1e-290 else 1.0)
    # A range narrower than a billionth of its size (1e9 and 1e9 + 1e-7) has no round ticks a float
    # can tell apart: it gets an axis that wide (the property test found ticks collapsing to one value).
    hi = max(hi, lo + 1e-9 * max(abs(lo), abs(hi)))
    mag = 10 ** math.floor(math.log10((hi - lo) / max_ticks))
    if integer:
        mag = max(mag, 1)  # whole steps only, however short the range
    for step in (m * mag * scale for scale in (1, 10, 100) for m in (1, 2, 2.5, 5)):
        if integer and (step < 1 or step != int(step)):
            continue
        first, last = _whole(lo / step, math.floor), _whole(hi / step, math.ceil)
        last = max(last, first + 1)  # an axis has two ends, even for a range within a step's hair
        if last - first + 1 <= max_ticks + 1:
            return [float(f"{k * step:.12g}") for k in range(first, last + 1)]  # 0.30000000000000004 -> 0.3
    return [lo, hi]


def _whole(quotient: float, towards: Any) -> int:
    """``floor``/``ceil`` of a quotient that float error left a hair off a whole number (2.0000000001).

    The hair is absolute, a few units in the last place of the quotient: a tolerance relative to
    its size (1e-9) let -399999997.6 pass for -399999998 (0.4 off at 4e8), and the axis of
    [-999999999, -999999994] ended below its data (found by the property test)."""
    nearest = round(quotient)
    hair = max(1e-9, 8 * sys.float_info.epsilon * abs(quotient))
    return int(nearest) if abs(quotient - nearest) <= hair else int(towards(quotient))


def tick_label(value: float) -> str:
    """``25``, ``2.5``, ``0.25``, ``1.5k``: at most four significant digits, no trailing zeros."""
    if abs(value) >= 10_000:
        return f"{value / 1000:.4g}k"
    return f"{value:.4g}"
