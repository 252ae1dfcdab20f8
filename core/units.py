"""How hwtui writes a quantity for people, one way everywhere (the CLI's progress, the TUI's ages and
process times): a duration is ``7s``, ``2m05s``, ``1h02m``, ``3d02h``."""

from __future__ import annotations

import math


def duration_text(seconds: float | None, unknown: str = "?") -> str:
    """``seconds`` rounded to whole seconds, in the two largest units; ``unknown`` for None or NaN."""
    if seconds is None or not math.isfinite(seconds):
        return unknown
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
