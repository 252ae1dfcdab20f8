"""The one process supervisor: sessions, answer pipes, bounded line reading, exit text, grace."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time

import pytest

from hwtui.core.supervisor import (
    Child,
    Group,
    LineReader,
    decode_message,
    encode_message,
    exit_text,
    hwtui_root,
    python_module,
    run_for_answer,
)
from tests.procfs import alive

pytestmark = pytest.mark.timeout(60)


def _script(body: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(body)]


def _wait_until(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_line_reader_splits_across_chunks_and_caps_long_lines():
    r = LineReader(limit=10)
    assert r.feed(b'{"a":') == []
    assert r.feed(b'1}\n{"b"') == [b'{"a":1}']
    # An over-long line is dropped whole (to its newline), counted, and the next line still arrives.
    assert r.feed(b":" + b"x" * 50) == []
    assert r.feed(b"yyy\nok\n") == [b"ok"]
    assert r.dropped == 1
    assert r.feed(b"tail") == [] and r.close() == b"tail"


def test_line_reader_never_holds_more_than_its_limit():
    r = LineReader(limit=1000)
    for _ in range(1000):
        r.feed(b"z" * 4096)  # 4 MB with no newline at all
    assert len(r._buf) <= 1000
    assert r.feed(b"\nnext\n") == [b"next"]


@pytest.mark.parametrize("line", [b"", b"not json", b"[1, 2]", b"{" * 100_000, b'"x"'])
def test_decode_message_takes_objects_only(line):
    assert decode_message(line) is None


def test_encode_refuses_nan_and_round_trips():
    assert decode_message(encode_message({"kind": "x", "v": 1.5})) == {"kind": "x", "v": 1.5}
    with pytest.raises(ValueError):
        encode_message({"kind": "x", "v": float("nan")})


@pytest.mark.parametrize(("code", "text"), [
    (0, "exited with status 0"), (3, "exited with status 3"), (-9, "was killed by SIGKILL"),
    (-15, "was killed by SIGTERM"), (143, "exited with status 143 (SIGTERM)"), (None, "is still running"),
])
def test_exit_text(code, text):
    assert exit_text(code) == text


def test_answer_pipe_ignores_what_the_child_prints():
    argv = _script("""
        import json, os, sys
        print("noise {not json", flush=True)
        print("more noise", file=sys.stderr, flush=True)
        with os.fdopen(int(sys.argv[1]), "w") as fh:
            fh.write(json.dumps({"kind": "answer", "v": 42}) + "\\n")
    """) + ["{answer_fd}"]
    code, last, tail, timed_out = run_for_answer(argv, timeout=20)
    assert (code, last, timed_out) == (0, {"kind": "answer", "v": 42}, False)
    assert "more noise" in tail


def test_timeout_kills_the_whole_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    argv = _script(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        open({str(pidfile)!r}, "w").write(str(p.pid))
        time.sleep(3600)
    """)
    code, last, _, timed_out = run_for_answer(argv, timeout=3)
    assert timed_out and last is None
    grandchild = int(pidfile.read_text())
    assert _wait_until(lambda: not alive(grandchild)), "the grandchild outlived its group"


def test_group_reads_several_children_and_reports_closed_pipes():
    body = """
        import json, os, sys
        with os.fdopen(int(sys.argv[1]), "w") as fh:
            for i in range(3):
                fh.write(json.dumps({"kind": "tick", "who": sys.argv[2], "i": i}) + "\\n")
                fh.flush()
    """
    with Group() as group:
        for name in ("a", "b"):
            group.add(Child(_script(body) + ["{answer_fd}", name], name=name, answer_pipe=True))
        seen: dict[str, list[int]] = {"a": [], "b": []}
        closed: set[str] = set()
        deadline = time.monotonic() + 20
        while len(closed) < 2 and time.monotonic() < deadline:
            for m in group.poll(0.1):
                if m.msg is None:
                    closed.add(m.child.name)
                else:
                    seen[m.msg["who"]].append(m.msg["i"])
        assert seen == {"a": [0, 1, 2], "b": [0, 1, 2]} and closed == {"a", "b"}
        assert _wait_until(lambda: all(c is not None for c in group.exit_codes().values()))
        assert set(group.exit_codes().values()) == {0}


def test_terminate_gives_grace_then_kills(tmp_path):
    # One child exits on SIGTERM (after writing a marker); the other ignores it and must be killed.
    marker = tmp_path / "graceful"
    polite = _script(f"""
        import signal, sys, time
        def bye(*_):
            open({str(marker)!r}, "w").write("bye")
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        time.sleep(3600)
    """)
    stubborn = _script("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(3600)
    """)
    a = Child(polite, stdout="pipe", text=True).start()
    b = Child(stubborn, stdout="pipe", text=True).start()
    for c in (a, b):
        assert c.proc is not None and c.proc.stdout is not None
        assert c.proc.stdout.readline().strip() == "ready"  # handlers installed: a state, not a sleep
    assert a.terminate(grace_s=10) == 0 and marker.read_text() == "bye"
    t0 = time.monotonic()
    assert b.terminate(grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - t0 < 10


def test_children_import_the_parents_tree(tmp_path):
    code, last, tail, _ = run_for_answer(_script("""
        import json, os, sys
        import hwtui.core.supervisor as s
        with os.fdopen(int(sys.argv[1]), "w") as fh:
            fh.write(json.dumps({"kind": "root", "root": s.hwtui_root()}) + "\\n")
    """) + ["{answer_fd}"], timeout=30, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, cwd=str(tmp_path))
    assert code == 0, tail
    assert last == {"kind": "root", "root": hwtui_root()}


def test_python_module_uses_this_interpreter():
    assert python_module("hwtui.app", "--version") == [sys.executable, "-m", "hwtui.app", "--version"]
    assert json.loads(json.dumps(python_module("x")))[0] == sys.executable


def test_run_capture_caps_output_and_kills_the_group_on_timeout(tmp_path):
    from hwtui.core.supervisor import run_capture

    loud = run_capture(_script("import sys\nfor _ in range(200):\n    sys.stdout.write('x' * 65536)\nprint('err', file=sys.stderr)"),
                       timeout=30, limit=1000)
    assert loud.code == 0 and len(loud.stdout) == 1000 and loud.stderr.strip() == "err" and not loud.timed_out
    pidfile = tmp_path / "grandchild.pid"
    slow = run_capture(_script(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        open({str(pidfile)!r}, "w").write(str(p.pid))
        print("started", flush=True)
        time.sleep(3600)
    """), timeout=3)
    assert slow.timed_out and slow.code is None and slow.stdout.strip() == "started"
    grandchild = int(pidfile.read_text())
    assert _wait_until(lambda: not alive(grandchild)), "the grandchild outlived its group"
    with pytest.raises(OSError):
        run_capture([str(tmp_path / "no-such-program")], timeout=5)
