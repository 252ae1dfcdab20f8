"""`hwtui --check --agents` against agents that are starting (issue 26) or hostile (issue 22, F6)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from hwtui.app.commands import agents as agents_cmd
from hwtui.app.commands.agents import compare_agents
from hwtui.app.node_api.client import parse_agents
from hwtui.core.terminal_text import is_clean
from tests import cli_proc
from tests.agent.helpers import TOKEN, start_agent, stop_agent
from tests.agent.hostile import HostileAgent, answer
from tests.agent.test_cluster_view import _facts

pytestmark = pytest.mark.timeout(120)


def _check(capsys, monkeypatch, *ports, extra=()):
    from hwtui.app.cli import main

    monkeypatch.setenv("HWTUI_AGENT_TOKEN", TOKEN)
    rc = main(["--check", "--json", *extra, "--agents", ",".join(f"127.0.0.1:{p}" for p in ports)])
    captured = capsys.readouterr()
    return rc, json.loads(captured.out), captured.err


def _blocking_facts(release: threading.Event):
    def facts():
        release.wait(60)  # the first collection (torch importing) until the test says so
        return {k: v for k, v in _facts("2.5.1").items() if k not in ("platform", "drivers", "check")}
    return facts


def test_an_agent_still_collecting_its_facts_is_starting_not_failed(capsys, monkeypatch):
    """Right after an agent starts its facts are not collected: before the fix, `[FAIL] facts are
    not ready yet` with a systemctl remedy. Now a bounded wait, then WARN "starting", exit 0."""
    release = threading.Event()
    a = start_agent("a", 0, facts=_blocking_facts(release))
    b = start_agent("b", 1, facts=lambda: {k: v for k, v in _facts("2.5.1").items()
                                           if k not in ("platform", "drivers", "check")})
    monkeypatch.setattr(agents_cmd, "STARTING_WAIT_S", 0.5, raising=False)
    try:
        deadline = time.monotonic() + 10
        while b.state.facts.view()["value"] is None and time.monotonic() < deadline:
            time.sleep(0.02)
        rc, doc, err = _check(capsys, monkeypatch, a.port, b.port)
        found = {f["id"]: f for f in doc["findings"]}
        starting = found[f"cluster.agent[127.0.0.1:{a.port}]"]
        assert starting["status"] == "warn" and "starting" in starting["title"], starting
        assert "systemctl" not in starting["remedy"]
        assert not any(f["status"] in ("fail", "error") for f in doc["findings"]), doc["findings"]
        assert rc == 0 and "waiting up to" in err
    finally:
        release.set()
        stop_agent(a)
        stop_agent(b)


def test_the_check_waits_for_a_starting_agent_and_then_compares_it(capsys, monkeypatch):
    """Its facts arrive while the check waits (released once the check has asked at least once):
    the node is compared like any other, with no warning."""
    release = threading.Event()
    a = start_agent("a", 0, facts=_blocking_facts(release))
    real = a.get_json
    asked = threading.Event()

    def get_json(path):
        if path == "/v1/facts":
            asked.set()
        return real(path)

    a.get_json = get_json
    threading.Thread(target=lambda: asked.wait(60) and release.set(), daemon=True).start()
    try:
        rc, doc, err = _check(capsys, monkeypatch, a.port)
        ids = {f["id"]: f["status"] for f in doc["findings"]}
        assert f"cluster.agent[127.0.0.1:{a.port}]" not in ids, ids
        assert ids["cluster.torch"] == "pass" and rc == 0
    finally:
        release.set()
        stop_agent(a)


def test_hostile_facts_are_cleaned_and_never_crash_the_comparison(capsys, monkeypatch):
    """An agent whose facts have the wrong shapes and whose strings carry escape sequences: the
    check names it, compares the rest, and prints nothing that drives a terminal."""
    from hwtui.app.cli import main

    evil = {"node": "evil\x1b]0;PWNED\x07\x1b[2J",
            "facts": {**_facts("2.5.1\x1b[2J\u202e"), "env": ["NCCL_SOCKET_IFNAME"], "interfaces": "eth0",
                      "torch": {"version": ["x"], "cuda": {"a": 1}}, "python": {"x": float("inf")},
                      "plugin": "x", "check": 7}}
    good = start_agent("good", 0, facts=lambda: {k: v for k, v in _facts("2.5.1").items()
                                                 if k not in ("platform", "drivers", "check")})
    hostile = HostileAgent(lambda path: answer(json.dumps(evil).encode()))
    try:
        deadline = time.monotonic() + 10
        while good.state.facts.view()["value"] is None and time.monotonic() < deadline:
            time.sleep(0.02)
        monkeypatch.setenv("HWTUI_AGENT_TOKEN", TOKEN)
        monkeypatch.setenv("NO_COLOR", "1")
        rc = main(["--check", "--agents", f"127.0.0.1:{good.port},127.0.0.1:{hostile.port}"])
        out = capsys.readouterr()
        assert rc in (0, 1)
        for line in (out.out + out.err).splitlines():
            assert is_clean(line), repr(line)
        assert "PWNED" not in out.out and "malformed facts" in out.out
    finally:
        hostile.close()
        stop_agent(good)


def test_compare_agents_takes_any_document():
    t = parse_agents("a:1,b:1")
    for doc in (None, [], "x", {"facts": 1}, {"facts": []}, {"facts": {"env": 1}, "node": 7},
                {"facts": {"torch": "x", "interfaces": [1]}, "node": "\x1b[2J"}, {"error": 5}):
        findings = compare_agents([(t[0], doc, None), (t[1], {"node": "b", "facts": _facts("2.5.1")}, None)])
        for f in findings:
            assert all(is_clean(s) for s in (f.title, f.detail, f.remedy)), f


def test_only_an_agent_answering_as_a_starting_agent_is_waited_for():
    from hwtui.app.commands.agents import _starting

    assert _starting({"schema": "hwtui.agent/1", "node": "a", "facts": None, "age_s": None, "error": None}, None)
    for doc in ({}, {"node": "a"}, {"facts": None}, {"facts": None, "age_s": 3.0, "error": None},
                {"facts": None, "age_s": None, "error": "ImportError: torch"}, {"facts": {}, "age_s": None}):
        assert not _starting(doc, None), doc
    assert not _starting({"facts": None, "age_s": None}, "no answer in time")


def test_a_drip_feeding_agent_cannot_hold_the_check(tmp_path):
    """`--check --agents` has one deadline per agent too (10 s): an agent that answers a byte at a
    time (200 s for its answer) is named unreachable and the check ends. The bounded subprocess wait
    is the proof, no timing assertion."""
    import os
    import sys

    drip = HostileAgent(answer(json.dumps({"node": "d", "facts": _facts("2.5.1"), "pad": "x" * 4000}).encode()),
                        drip_s=0.05, drip_from=90)
    try:
        out = cli_proc.run([sys.executable, "-m", "hwtui", "--check", "--json", "--agents", f"127.0.0.1:{drip.port}"],
                           capture_output=True, text=True, timeout=90, cwd=tmp_path,
                           env={**os.environ, "HWTUI_AGENT_TOKEN": TOKEN})
        doc = json.loads(out.stdout)
        found = {f["id"]: f for f in doc["findings"]}
        assert out.returncode == 1
        assert "no answer in time" in found[f"cluster.agent[127.0.0.1:{drip.port}]"]["title"]
    finally:
        drip.close()
