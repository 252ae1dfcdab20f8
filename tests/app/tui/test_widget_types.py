"""Widgets take typed inputs (issue 27): no public widget method or function takes or gives ``Any``.

The widgets sit below the app and may not import it, so they used to take ``show(x: Any)`` and
trust the app's objects to have the right fields; a renamed field then failed only when drawn.
They are now typed by Protocols beside the engine's events (``engine/*/views.py``) and by the
probes' and core's own types, and mypy checks every call site. This test keeps ``Any`` from
creeping back: it reads each public callable's annotations as written (the modules use
``from __future__ import annotations``, so they are the source text).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import hwtui.widgets
from hwtui.core.finding import Status
from hwtui.widgets.findings_list import verdict_text

ANY = re.compile(r"\bAny\b")


def _widget_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(hwtui.widgets.__path__, "hwtui.widgets."))


def _public_callables(module_name: str) -> list[tuple[str, object]]:
    """(qualified name, function) for the module's public functions and the public methods its own
    classes define (inherited Textual methods are Textual's business)."""
    module = importlib.import_module(module_name)
    found: list[tuple[str, object]] = []
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module_name:
            continue
        if inspect.isfunction(obj):
            found.append((name, obj))
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if inspect.isfunction(fn):
                    found.append((f"{name}.{attr}", fn))
    return found


def _any_annotations(fn: object) -> list[str]:
    """Parameters (and the return) annotated with Any; ``**kwargs: Any`` is Textual's pass-through
    of widget options (id, classes, ...) and stays."""
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    bad = [p.name for p in sig.parameters.values()
           if p.kind is not inspect.Parameter.VAR_KEYWORD and ANY.search(str(p.annotation))]
    if ANY.search(str(sig.return_annotation)):
        bad.append("return")
    return bad


def test_there_are_widgets_to_check() -> None:
    names = [q for m in _widget_modules() for q, _ in _public_callables(m)]
    assert len(_widget_modules()) >= 20 and sum(q.endswith(".show") for q in names) >= 15


@pytest.mark.parametrize("module_name", _widget_modules())
def test_no_public_widget_callable_takes_any(module_name: str) -> None:
    offenders = {q: bad for q, fn in _public_callables(module_name) if (bad := _any_annotations(fn))}
    assert offenders == {}, f"{module_name}: typed by a Protocol or a model below the widgets, not Any"


def test_verdict_text_takes_a_status_or_its_value() -> None:
    assert verdict_text(Status.FAIL).plain == verdict_text("fail").plain == "✗ FAIL"
