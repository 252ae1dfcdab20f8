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
        "worst": "pass", "replication": {"serving": "v1", "in_flight": {"version": "v2", "progress": 0.5},
                                         "device": {"device": "cuda:0", "slot": "A", "error": None,
                                                    "holds": [{"slot": "A", "version": "v1", "left_s": 280.5,
                                                               "holder": "uid 0"}]},
                                         "persist": {"state": "done", "version": "v1", "seconds": 1.5}}}
# Every field a view reads, as a path into GOOD.
FIELDS = [("node",), ("devices",), ("devices_age_s",), ("worst",), ("replication",),
          ("replication", "serving"), ("replication", "in_flight"), ("replication", "in_flight", "version"),
          ("replication", "in_flight", "progress"), ("replication", "device"), ("replication", "device", "device"),
          ("replication", "device", "slot"), ("replication", "device", "error"), ("replication", "device", "holds"),
          ("replication", "device", "holds", 0), ("replication", "device", "holds", 0, "left_s"),
          ("replication", "device", "holds", 0, "version"), ("replication", "persist"),
          ("replication", "persist", "state"), ("replication", "persist", "version"), ("replication", "persist", "error"),
          ("devices", 0), *[("devices", 0, k) for k in GOOD_DEVICE]]
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
    d = s.replication.device
    if d is not None:
        assert d.holds is None or (type(d.holds) is int and 0 <= d.holds <= 64), d.holds
        assert d.hold_left_s is None or (math.isfinite(d.hold_left_s) and 0 <= d.hold_left_s <= 3600)
        assert d.slot in (None, "A", "B")
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


def test_a_gpu_resident_nodes_slot_and_holds_are_kept_and_shown():
    from hwtui.app.commands.agents import _line
    from hwtui.widgets.cluster_nodes import node_rows

    d = parse_summary(GOOD).replication.device
    assert (d.device, d.slot, d.holds, d.held, d.hold_left_s, d.error) == ("cuda:0", "A", 1, ("v1",), 280.5, None)
    status = NodeStatus(agent="a:1", url="http://a:1", stale=False, age_s=0.1, summary=parse_summary(GOOD))
    assert str(node_rows(status)[0]["version"]) == "v1 [1 held: v1]"
    assert "serving v1 on cuda:0 slot A, 1 hold(s) on v1, the last ends in 280 s, pushing v2 50%" in _line(status)
    no_device = json.loads(json.dumps(GOOD))
    del no_device["replication"]["device"]
    plain = NodeStatus(agent="a:1", url="http://a:1", stale=False, age_s=0.1, summary=parse_summary(no_device))
    assert str(node_rows(plain)[0]["version"]) == "v1" and " on " not in _line(plain)
    broken = parse_summary(_replace(("replication", "device", "error"), "v3 could not be loaded onto cuda:0: OOM"))
    row = node_rows(NodeStatus(agent="a:1", url="http://a:1", stale=False, age_s=0.1, summary=broken))[0]
    assert str(row["note"]) == "device: v3 could not be loaded onto cuda:0: OOM"


def test_a_disk_copy_still_written_or_failed_is_shown_and_a_bad_state_is_unknown():
    from hwtui.app.commands.agents import _line
    from hwtui.widgets.cluster_nodes import node_rows

    def status(persist):  # type: ignore[no-untyped-def]
        doc = _replace(("replication", "persist"), persist)
        del doc["replication"]["in_flight"]
        return NodeStatus(agent="a:1", url="http://a:1", stale=False, age_s=0.1, summary=parse_summary(doc))

    done = status({"state": "done", "version": "v1", "seconds": 1.5})
    assert str(node_rows(done)[0]["version"]) == "v1 [1 held: v1]" and "disk" not in _line(done)
    writing = status({"state": "writing", "version": "v1", "since": 1.0})
    assert str(node_rows(writing)[0]["version"]) == "v1 [1 held: v1] [disk: writing]"
    assert _line(writing).endswith("the last ends in 280 s, writing v1 to disk  host cpu 3% mem -; cuda:0 50% 1.0/80G"), \
        _line(writing)
    failed = status({"state": "failed", "version": "v1", "error": "rank 1: no space left on device"})
    row = node_rows(failed)[0]
    assert str(row["version"]) == "v1 [1 held: v1] [disk: FAILED]" and str(row["note"]) == "disk: rank 1: no space left on device"
    assert "its disk copy FAILED: rank 1: no space left on device" in _line(failed)
    # its write stopped for a newer push that has not committed (yet): the disk is behind the device
    behind = status({"state": "superseded", "version": "v1", "by": "v2", "seconds": 0.2})
    assert str(node_rows(behind)[0]["version"]) == "v1 [1 held: v1] [disk: behind]"
    assert "its disk write stopped for a newer push (not on its disk)" in _line(behind)
    older = status({"state": "failed", "version": "v0", "error": "x"})  # about a version no longer served
    assert "disk" not in str(node_rows(older)[0]["version"]) and "disk" not in _line(older)
    bad = status({"state": "exploded", "version": "v1"})
    assert "replication.persist.state" in parse_summary(_replace(("replication", "persist", "state"), "exploded")).unknown
    assert "[disk: ?]" in str(node_rows(bad)[0]["version"])


def test_bad_device_served_values_are_unknown_and_named():
    from hwtui.widgets.cluster_nodes import node_rows

    for path, bad, name in (
            (("replication", "device", "slot"), "C", "replication.device.slot"),
            (("replication", "device", "holds"), "1", "replication.device.holds"),
            (("replication", "device", "holds"), [{"left_s": 1.0}] * 65, "replication.device.holds"),
            (("replication", "device", "holds", 0, "left_s"), -1, "replication.device.holds"),
            (("replication", "device", "holds", 0, "left_s"), float("nan"), "replication.device.holds"),
            (("replication", "device", "holds", 0, "left_s"), 3601, "replication.device.holds"),
            (("replication", "device", "holds", 0), "x", "replication.device.holds"),
            (("replication", "device", "holds", 0, "version"), "\x1b[2J", "replication.device.holds"),
            (("replication", "device"), [], "replication.device")):
        s = parse_summary(_replace(path, bad))
        assert name in s.unknown, (path, bad, s.unknown)
        status = NodeStatus(agent="a:1", url="http://a:1", stale=False, age_s=0.1, summary=s)
        if name == "replication.device.holds":
            assert s.replication.device.holds is None
            assert str(node_rows(status)[0]["version"]) == "v1 [? held]"


def test_bad_values_are_unknown_and_named():
    s = parse_summary(_replace(("devices", 0, "temp_c"), "hot"))
    assert s.devices[0].temp_c is None and s.devices[0].unknown == ("temp_c",) and s.unknown == ("devices[0].temp_c",)
    for bad in (float("nan"), float("inf"), -1, 10**400, True, "40", [40], 1e6):
        s = parse_summary(_replace(("devices", 0, "temp_c"), bad))
        assert s.devices[0].temp_c is None and "temp_c" in s.devices[0].unknown, bad
    assert parse_summary(_replace(("node",), "x" * 254)).unknown == ("node",)
    assert parse_summary(_replace(("devices",), [{}] * 257)).unknown == ("devices",)
    assert parse_summary(_replace(("node",), "\x1b[2J")).unknown == ("node",)  # nothing printable left
