"""Minimal terminal styling that honours NO_COLOR and never colours a pipe."""

from __future__ import annotations

import os
import re
import sys
from typing import TextIO

_CODES = {"green": "32", "yellow": "33", "red": "31", "magenta": "35", "dim": "2", "bold": "1", "cyan": "36"}


def use_color(stream: TextIO = sys.stdout) -> bool:
    if "NO_COLOR" in os.environ and os.environ["NO_COLOR"] != "":
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"


# C0 and C1 control characters and DEL: in a title from a replayed snapshot or a hostile sysroot,
# an ESC sequence would drive the terminal (retitle it, hide text, fake a PASS). Newlines are
# handled by the callers, which split lines themselves.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters shown escaped (``\x1b``) rather than sent to the terminal."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class Painter:
    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, text: str, style: str) -> str:
        if not self.enabled or style not in _CODES:
            return text
        return f"\x1b[{_CODES[style]}m{text}\x1b[0m"
