"""The runner keeps probes on a leash: raise, hang and crash become error findings in time."""

import os
import threading
import time

import pytest

from hwtui.core.finding import Status
from hwtui.probes.child import ChildError, run_in_child
from hwtui.probes.framework import Collector, Rule, run_checks
from hwtui.probes.host import FsHost


def _ok(host):
    return {"n": 1}


def _raises(host):
    raise RuntimeError("boom in probe")


# The hung probe hangs until its test lets it go: a thread left for good makes the shard a process
# with threads, and every later in-process launch there exec'd its ranks (39 CPU-s in one module).
_RELEASE_HUNG = threading.Event()


def _hangs(host):
    _RELEASE_HUNG.wait(60)


def _segfaulting_child(host):
    return run_in_child("tests.core.child_targets:segfault", timeout=20)


def _rule(facts):
    from hwtui.core.finding import passed

    yield passed("test.ok", f"n={facts['ok']['n']}")


def _needs_dead(facts):
    raise AssertionError("a rule whose collector failed must not run")


def test_raise_hang_and_crash_become_error_findings(tmp_path):
    collectors = [
        Collector("ok", _ok, "test", timeout=5),
        Collector("raises", _raises, "test", timeout=5),
        Collector("hangs", _hangs, "test", timeout=0.5),
        Collector("segv", _segfaulting_child, "test", timeout=25),
    ]
    rules = [Rule("ok", _rule, "test", needs=("ok",)), Rule("dead", _needs_dead, "test", needs=("hangs",))]
    _RELEASE_HUNG.clear()
    started = time.monotonic()
    try:
        result = run_checks(FsHost(tmp_path, {}), collectors, rules)
    finally:
        _RELEASE_HUNG.set()
    elapsed = time.monotonic() - started
    by_id = {f.id: f for f in result.findings}
    assert by_id["test.ok"].status is Status.PASS and by_id["test.ok"].title == "n=1"
    assert by_id["hwtui.probe.raises"].status is Status.ERROR
    assert "boom in probe" in by_id["hwtui.probe.raises"].title
    assert by_id["hwtui.probe.hangs"].status is Status.ERROR
    assert "did not finish within 0.5 s" in by_id["hwtui.probe.hangs"].title
    assert by_id["hwtui.probe.segv"].status is Status.ERROR
    assert "SIGSEGV" in by_id["hwtui.probe.segv"].title
    assert "hwtui.rule.dead" not in by_id
    assert elapsed < 20, "the hung probe must not hold the run past its timeout"


def test_rule_that_raises_is_an_error_finding(tmp_path):
    def bad_rule(facts):
        raise ValueError("rule bug")

    result = run_checks(FsHost(tmp_path, {}), [Collector("ok", _ok, "test")], [Rule("bad", bad_rule, "test", needs=("ok",))])
    (finding,) = [f for f in result.findings if f.id == "hwtui.rule.bad"]
    assert finding.status is Status.ERROR and "rule bug" in finding.title


def test_only_runs_selected_areas_and_their_collectors(tmp_path):
    calls = []

    def mk(name):
        def fn(host):
            calls.append(name)
            return {}
        return fn

    collectors = [Collector("a", mk("a"), "one"), Collector("b", mk("b"), "two")]
    rules = [Rule("ra", lambda f: [], "one", needs=("a",)), Rule("rb", lambda f: [], "two", needs=("b",))]
    run_checks(FsHost(tmp_path, {}), collectors, rules, only={"one"})
    assert calls == ["a"]


def test_child_answer_survives_stdout_garbage():
    assert run_in_child("tests.core.child_targets:answer", {"x": 21}, timeout=20) == {"double": 42}


def test_child_keyerror_on_import_is_contained():
    with pytest.raises(ChildError) as info:
        run_in_child("tests.core.child_targets:amdsmi_like", timeout=20)
    assert info.value.kind == "raised" and "libamd_smi.so" in str(info.value)


def test_child_exit_without_answer():
    with pytest.raises(ChildError) as info:
        run_in_child("tests.core.child_targets:exit_silently", timeout=20)
    assert info.value.kind == "exit" and "status 3" in str(info.value)


def test_child_timeout_kills_whole_process_group(tmp_path):
    pidfile = tmp_path / "pid"
    env = dict(os.environ, HWTUI_TEST_PIDFILE=str(pidfile))
    started = time.monotonic()
    with pytest.raises(ChildError) as info:
        run_in_child("tests.core.child_targets:hang_with_grandchild", timeout=3, env=env)
    assert info.value.kind == "timeout"
    assert time.monotonic() - started < 10
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        # A killed child not yet reaped by init shows as a zombie; that counts as dead.
        try:
            with open(f"/proc/{grandchild}/stat") as fh:
                if fh.read().split()[2] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("grandchild survived the timeout kill")


def test_host_survives_nul_bytes_in_paths(tmp_path):
    host = FsHost(tmp_path, {})
    bad = "/etc/x\0y"
    assert (host.read_text(bad), host.listdir(bad), host.exists(bad), host.readlink(bad), host.stat(bad)) == (
        None, [], False, None, None)
