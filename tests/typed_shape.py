"""A document against the TypedDict that declares it: the keys a producer writes are exactly the ones
the type promises its readers (the type checker trusts the declaration; this keeps it honest)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def assert_shape(doc: Mapping[str, Any], typed: Any) -> None:
    required, optional = set(typed.__required_keys__), set(typed.__optional_keys__)
    missing, extra = required - set(doc), set(doc) - required - optional
    assert not missing and not extra, f"{typed.__name__}: missing {sorted(missing)}, undeclared {sorted(extra)}"
