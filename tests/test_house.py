"""House rules the reviewer checks by reading, checked here so they stay true.

No product function above cyclomatic complexity 30 (radon's count: one per branch, loop, boolean
operator and comprehension condition). Past that a function is a rule list written as an if-chain
or several concerns in one body; both read better as a table or as collaborators.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

radon_visitors = pytest.importorskip("radon.visitors")

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "core", "engine", "probes", "widgets")
MAX_COMPLEXITY = 30

def _blocks(path: Path) -> list[tuple[str, int]]:
    """(qualified name, complexity) of every function and method in ``path``: closures and the methods
    of nested classes too (radon scores a closure apart from the function around it)."""
    out: list[tuple[str, int]] = []

    def function(fn: Any, name: str) -> None:
        out.append((name, fn.complexity))
        for inner in fn.closures:
            function(inner, f"{name}.{inner.name}")

    def klass(cls: Any, name: str) -> None:
        for method in cls.methods:
            function(method, f"{name}.{method.name}")
        for inner in cls.inner_classes:
            klass(inner, f"{name}.{inner.name}")

    visitor = radon_visitors.ComplexityVisitor.from_code(path.read_text(encoding="utf-8"))
    for fn in visitor.functions:
        function(fn, fn.name)
    for cls in visitor.classes:
        klass(cls, cls.name)
    return out


def _over_limit() -> dict[str, int]:
    found: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name, score in _blocks(path):
                if score > MAX_COMPLEXITY:
                    found[f"{rel}::{name}"] = score
    return found


def test_no_product_function_above_the_complexity_limit() -> None:
    over = _over_limit()
    listing = "\n".join(f"  {name}: {score}" for name, score in sorted(over.items(), key=lambda kv: -kv[1]))
    assert not over, f"functions above cyclomatic {MAX_COMPLEXITY} (radon); split them or make the rules a table:\n{listing}"

