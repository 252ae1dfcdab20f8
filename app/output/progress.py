"""Progress for long commands (plan, replicate, train, setup): a bar with % and ETA on a terminal, plain lines elsewhere.

Every figure comes from the engine's own events: what is done and the total, and the time the
engine measured (``elapsed_s``, or the events' timestamps). Nothing here reads a clock, so what is
shown for a stream of events is the same whenever and however fast it is replayed, and a test can
compare the text with the events.

Modes (:func:`mode_for`):
  ``live``   a terminal: one line redrawn in place (``\\r`` and erase-line), at most ten times per
             second of the engine's time; permanent lines (a merge round, the summary) print above it.
  ``plain``  not a terminal, ``TERM=dumb`` or ``NO_COLOR``: whole lines, at most one per ``every``
             seconds of engine time (a CI log stays readable), and always the last one.
  ``off``    ``-q``: no progress at all, only results and errors.
"""

from __future__ import annotations

import os
import shutil
from typing import IO

from hwtui.core.units import duration_text

LIVE, PLAIN, OFF = "live", "plain", "off"

# Verbosity, from the global -q / -v (app/cli.py): -1 quiet, 0 normal, 1 verbose.
QUIET, NORMAL, VERBOSE = -1, 0, 1


def mode_for(stream: IO[str], verbosity: int = NORMAL) -> str:
    """``off`` when quiet; ``live`` on a terminal that takes control sequences; else ``plain``."""
    if verbosity <= QUIET:
        return OFF
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return PLAIN
    isatty = getattr(stream, "isatty", None)
    try:
        return LIVE if isatty is not None and isatty() else PLAIN
    except (ValueError, OSError):  # a closed stream
        return PLAIN


def fraction(done: float, total: float) -> float:
    """done/total in [0, 1]; an empty job (total 0) is complete."""
    if total <= 0:
        return 1.0
    return min(1.0, max(0.0, done / total))


def eta_seconds(done: float, total: float, elapsed_s: float) -> float | None:
    """Time left at the average rate so far; None before anything is done (no rate yet)."""
    if done <= 0 or elapsed_s <= 0 or total <= 0:
        return None
    return max(0.0, elapsed_s * (total - done) / done)


def format_duration(seconds: float | None) -> str:
    """``7s``, ``2m05s``, ``1h02m``; ``?`` when unknown (core.units.duration_text, as the TUI writes it)."""
    return duration_text(seconds)


def format_bytes(n: float) -> str:
    """Decimal units, as the rest of hwtui's output (MB, GB)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def bar(frac: float, width: int = 24) -> str:
    """``[#########...............]``: ASCII, legible on a serial console and in any font."""
    filled = int(frac * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def status(done: float, total: float, elapsed_s: float, amount: str, eta: bool = True) -> str:
    """``42%  1.7 GB/4.1 GB  ETA 3s``: the figures every progress line carries (``amount`` says done/total).
    ``eta=False`` where the rate so far says nothing of the rest (setup's steps): no ETA is shown."""
    frac = fraction(done, total)
    if frac >= 1.0:
        left = "  done"
    else:
        left = f"  ETA {format_duration(eta_seconds(done, total, elapsed_s))}" if eta else ""
    # Rounded down: 100% means complete, never 99.6% of the way.
    return f"{int(frac * 100):3d}%  {amount}{left}"


class ProgressLine:
    """One progress display on ``stream`` in one of the modes above."""

    def __init__(self, stream: IO[str], mode: str, every: float = 1.0, live_every: float = 0.1):
        self.stream, self.mode = stream, mode
        self.every, self.live_every = every, live_every
        self._last_at: float | None = None
        self._completed = False  # the complete state was shown: once is enough
        self._shown = ""  # the live line on screen now ("" = none)

    def update(self, elapsed_s: float, label: str, done: float, total: float, amount: str, detail: str = "",
               force: bool = False, eta: bool = True) -> None:
        """Show progress ``elapsed_s`` seconds into the job (the engine's measure); throttled unless
        ``force`` or complete."""
        if self.mode == OFF:
            return
        complete = fraction(done, total) >= 1.0
        if complete and self._completed and not force:
            return
        step = self.live_every if self.mode == LIVE else self.every
        if not (force or complete or self._last_at is None or elapsed_s - self._last_at >= step):
            return
        self._last_at, self._completed = elapsed_s, complete
        text = f"{label} {status(done, total, elapsed_s, amount, eta)}" + (f"  {detail}" if detail else "")
        if self.mode == LIVE:
            self._draw(f"{label} {bar(fraction(done, total))} {text[len(label) + 1:]}")
        else:
            self._write(text + "\n")

    def line(self, text: str, stream: IO[str] | None = None) -> None:
        """A permanent line (a result, a round, a warning): above the live bar, which is redrawn after.
        ``stream``: another stream on the same terminal (stderr): the bar is erased before it is written."""
        shown = self._shown
        if shown:
            self._write("\r\x1b[K")
        if stream is None or stream is self.stream:
            self._write(text + "\n")
        else:
            stream.write(text + "\n")
            stream.flush()
        if shown:
            self._write(shown)

    def close(self) -> None:
        """End the live line (the cursor moves to a fresh line); plain and off have nothing to end."""
        if self._shown:
            self._write("\n")
            self._shown = ""

    def clear(self) -> None:
        """Erase the live line without leaving it behind (before an error message, for instance)."""
        if self._shown:
            self._write("\r\x1b[K")
            self._shown = ""

    def _draw(self, text: str) -> None:
        # A line longer than the terminal wraps, and "\r" then redraws only its last row.
        width = shutil.get_terminal_size((100, 24)).columns - 1
        text = text[:max(20, width)]
        self._shown = text
        self._write("\r\x1b[K" + text)

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


__all__ = ["LIVE", "PLAIN", "OFF", "QUIET", "NORMAL", "VERBOSE", "mode_for", "fraction", "eta_seconds",
           "format_duration", "format_bytes", "bar", "status", "ProgressLine"]
