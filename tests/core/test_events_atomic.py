import json
import os
import stat
import subprocess
import sys

import pytest

from hwtui.core.atomic import atomic_open, atomic_write_text
from hwtui.core.events import ErrorEvent, LogEvent, UnknownEvent, parse_line


def test_roundtrip_and_unknown_kinds():
    ev = parse_line(ErrorEvent(message="rank 2 hung", rank=2, where="bucket 7").to_json())
    assert isinstance(ev, ErrorEvent) and ev.rank == 2 and ev.where == "bucket 7"
    unknown = parse_line(json.dumps({"kind": "future.thing", "x": 1}))
    assert isinstance(unknown, UnknownEvent) and unknown.payload["x"] == 1
    partial = parse_line(json.dumps({"kind": "error"}))  # required field missing: still no crash
    assert isinstance(partial, UnknownEvent) and partial.kind_name == "error"
    plain = parse_line("not json at all")
    assert isinstance(plain, LogEvent) and plain.message == "not json at all"


@pytest.mark.parametrize("kind", ["repl.start", "train.start", "cluster.done"])
def test_engine_events_resolve_without_importing_the_engine_first(kind):
    # A fresh interpreter that never imported an engine still decodes typed events, without torch.
    code = ("import sys; from hwtui.core.events import _lookup; "
            f"cls = _lookup({kind!r}); print(cls is not None and cls.kind == {kind!r}, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "report.json"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_open(target) as fh:
            fh.write("half of the new")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary left behind


def test_atomic_write_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "public.xml", "x")
        atomic_write_text(tmp_path / "secret.env", "x", perms=0o600)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "public.xml").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "secret.env").stat().st_mode) == 0o600


def test_events_are_strict_json_even_with_a_stray_nan():
    from hwtui.core.events import LogEvent, UnknownEvent

    line = UnknownEvent(kind_name="x", payload={"rate": float("inf"), "xs": [1.0, float("nan")]}).to_json()
    raw = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert raw["payload"] == {"rate": None, "xs": [1.0, None]}
    assert json.loads(LogEvent(message="ok").to_json())["message"] == "ok"
