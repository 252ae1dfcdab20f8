"""engine.resident.summary: every field of an agent's summary, replaced by every kind of JSON value,
parses without raising; what is kept is typed, finite, in range and clean, and the CLI line and the
TUI rows drawn from it never raise and hold no control character."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from hwtui.core.terminal_text import is_clean
from hwtui.engine.resident.summary import MAX_BYTES, NodeStatus, parse_summary

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
GOOD_DEVICE = {"device": "cuda:0", "name": "H100", "util": 50.0, "mem_used": 1 << 30, "mem_total": 80 << 30,
               "temp_c": 40, "power_w": 300.0, "power_limit_w": 700.0}
GOOD = {"node": "n1", "devices": [dict(GOOD_DEVICE), {"device": "cpu", "util": 3.0}], "devices_age_s": 0.2,
        "worst": "pass", "replication": {"serving": "v1", "in_flight": {"version": "v2", "progress": 0.5}}}
# Every field a view reads, as a path into GOOD.
FIELDS = [("node",), ("devices",), ("devices_age_s",), ("worst",), ("replication",),
          ("replication", "serving"), ("replication", "in_flight"), ("replication", "in_flight", "version"),
          ("replication", "in_flight", "progress"), ("devices", 0), *[("devices", 0, k) for k in GOOD_DEVICE]]
RANGES = {"util": (0, 100), "mem_used": (0, MAX_BYTES), "mem_total": (0, MAX_BYTES), "temp_c": (0, 200),
          "power_w": (0, 1e5), "power_limit_w": (0, 1e5)}


def _replace(path, value):
    doc = json.loads(json.dumps(GOOD))
    at = doc
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return doc


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _check(doc) -> None:
    from hwtui.app.commands.agents import _line
    from hwtui.widgets.cluster_nodes import node_rows

    s = parse_summary(doc)
    for d in s.devices:
        for key, (lo, hi) in RANGES.items():
            v = getattr(d, key)
            assert v is None or (isinstance(v, float) and math.isfinite(v) and lo <= v <= hi), (key, v)
    p = s.replication.in_flight.progress if s.replication.in_flight else None
    assert p is None or 0 <= p <= 1
    for stale in (False, True):
        status = NodeStatus(agent="a:1", url="http://a:1", stale=stale, age_s=1.0, summary=s)
        out = status.to_dict()
        json.dumps(out, allow_nan=False)  # strictly valid JSON: no NaN or infinity kept
        assert all(is_clean(t) for t in _strings(out))
        assert is_clean(_line(status))
        for row in node_rows(status):
            assert all(is_clean(str(cell)) for cell in row.values())


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(FIELDS), JSON)
def test_any_json_value_in_any_field_parses_to_checked_values(path, value):
    _check(_replace(path, value))


@settings(max_examples=100, deadline=None)
@given(JSON)
def test_any_json_document_parses(value):
    _check(value)


def test_a_good_summary_keeps_every_value():
    s = parse_summary(GOOD)
    assert s.unknown == () and s.node == "n1" and s.devices[0].mem_total == 80 << 30
    assert s.replication.serving == "v1" and s.replication.in_flight.progress == 0.5


def test_bad_values_are_unknown_and_named():
    s = parse_summary(_replace(("devices", 0, "temp_c"), "hot"))
    assert s.devices[0].temp_c is None and s.devices[0].unknown == ("temp_c",) and s.unknown == ("devices[0].temp_c",)
    for bad in (float("nan"), float("inf"), -1, 10**400, True, "40", [40], 1e6):
        s = parse_summary(_replace(("devices", 0, "temp_c"), bad))
        assert s.devices[0].temp_c is None and "temp_c" in s.devices[0].unknown, bad
    assert parse_summary(_replace(("node",), "x" * 254)).unknown == ("node",)
    assert parse_summary(_replace(("devices",), [{}] * 257)).unknown == ("devices",)
    assert parse_summary(_replace(("node",), "\x1b[2J")).unknown == ("node",)  # nothing printable left
