"""core.terminal_text: nothing that could drive a terminal survives ``clean``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hwtui.core.terminal_text import clean, is_clean


def test_escape_sequences_go_whole():
    assert clean("evil\x1b]0;PWNED\x07\x1b[2J") == "evil"
    assert clean("a\x1b]52;c;SGVsbG8=\x1b\\b") == "ab"  # OSC 52 (clipboard write), ST-terminated
    assert clean("a\x9b31mb\x9d0;t\x9cc") == "abc"  # the C1 one-byte forms of CSI, OSC and ST
    assert clean("a\x1bPq#0;2;0;0;0\x1b\\b") == "ab"  # DCS (sixel)
    assert clean("a\x1b7b\x1b(Bc") == "abc"  # two-byte and charset sequences
    assert clean("\x1b") == "" and clean("x\x1b[") == "x"  # cut short: still nothing left


def test_controls_bidi_and_separators_go_whitespace_becomes_a_space():
    assert clean("good\u202egnp.exe\u2066x\u2069") == "goodgnp.exex"
    assert clean("a\x00b\x7fc\x85d\u200be\u2028f\u2029g\ud800h\ue000i") == "abcdefghi"
    assert clean("a\tb\nc\rd") == "a b c d"
    assert clean("naïve 漢字 ✓") == "naïve 漢字 ✓"


def test_limit_cuts_with_an_ellipsis():
    assert clean("abcdef", 4) == "abc…" and clean("abc", 4) == "abc"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=200))
def test_clean_output_is_clean_and_stable(text):
    out = clean(text)
    assert is_clean(out)
    assert clean(out) == out
