"""Text from someone else (a node agent, the network) made safe to show on a terminal, on one line.

A string that reaches a terminal can drive it: ESC sequences retitle or clear it, move the cursor
over a verdict, or (OSC 52) write the clipboard; C1 controls are the same sequences in one byte;
bidi overrides (U+202E) print text in an order other than the bytes'; line and paragraph
separators break one line into two. ``clean`` removes whole ESC sequences first (so no parameter
text such as ``]0;PWNED`` is left to read), then every remaining character of the Unicode
categories Cc (C0, DEL, C1), Cf (bidi overrides and isolates, zero-width characters), Cs (lone
surrogates, which JSON can carry), Co (private use) and Zl/Zp. Whitespace controls become a space.
Linear time: the sequence pattern has no nested repetition.
"""

from __future__ import annotations

import re
import unicodedata

# ESC (or its C1 single-byte form) and what follows it, for each sequence family of ECMA-48:
# CSI (ESC [ or 0x9b) parameters, intermediates, final byte; OSC/DCS/SOS/PM/APC strings (ESC ] P X ^ _
# or 0x9d 0x90 0x98 0x9e 0x9f) up to BEL or ST; any other ESC with its intermediates and final byte.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?"
)
_DROP = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
_SPACES = frozenset("\t\n\r\v\f")


def clean(text: str, limit: int | None = None) -> str:
    """``text`` with every terminal control sequence and control/format character removed; cut to
    ``limit`` characters (with ``…``) when given. Always one line."""
    text = _SEQUENCE.sub("", text)
    out = "".join(" " if c in _SPACES else c for c in text
                  if c in _SPACES or unicodedata.category(c) not in _DROP)
    if limit is not None and len(out) > limit:
        out = out[: max(limit - 1, 0)] + "…"
    return out


def clean_lines(text: str, limit: int | None = None) -> str:
    """``text`` cleaned line by line (``clean``), its line breaks kept: for what is shown over
    several lines (a finding's detail, a remedy), each line at most ``limit`` characters."""
    return "\n".join(clean(line, limit) for line in text.splitlines())


def is_clean(text: str) -> bool:
    """True when ``text`` holds nothing ``clean`` would remove (tests and assertions use it)."""
    return not any(c == "\x1b" or unicodedata.category(c) in _DROP for c in text)
