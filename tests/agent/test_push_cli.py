"""`hwtui push` refuses bad input with one line and exit 2, before any rank starts."""

from __future__ import annotations

import json

import pytest

from hwtui.app.cli import main
from tests.agent.helpers import TOKEN, dead_port, start_agent, stop_agent


def _one_line_exit_2(capsys, argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_bad_pushes_are_one_line_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HWTUI_AGENT_TOKEN", TOKEN)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "nope"}))
    _one_line_exit_2(capsys, ["push", "--plan", str(plan), "--agents", "a:1,b:1"], "plan")
    _one_line_exit_2(capsys, ["push", "--plan", str(plan), "--agents", "a:1"], "source and at least one receiver")
    _one_line_exit_2(capsys, ["push", "--plan", str(plan), "--agents", "a:1,b:1", "--timeout", "-1"], "--timeout")


def test_a_push_into_agents_that_take_none_or_refuse_the_token(capsys, tmp_path, monkeypatch):
    pytest.importorskip("xxhash")
    from tests.engine.replication.helpers import make_model, write_plan

    make_model(tmp_path / "m", seed=1, big=1000, n=2)
    write_plan(tmp_path / "m", tmp_path / "p.json", version="v1")
    a, b = start_agent("a"), start_agent("b")  # no --out: no resident rank, no push routes
    try:
        agents = f"127.0.0.1:{a.port},127.0.0.1:{b.port}"
        monkeypatch.setenv("HWTUI_AGENT_TOKEN", TOKEN)
        _one_line_exit_2(capsys, ["push", "--plan", str(tmp_path / "p.json"), "--agents", agents], "start it with --out")
        monkeypatch.setenv("HWTUI_AGENT_TOKEN", "wrong")
        _one_line_exit_2(capsys, ["push", "--plan", str(tmp_path / "p.json"), "--agents", agents], "refused the token")
        _one_line_exit_2(capsys, ["push", "--plan", str(tmp_path / "p.json"), "--agents", f"{agents},127.0.0.1:{dead_port()}"],
                         "unreachable")
    finally:
        stop_agent(a)
        stop_agent(b)


def test_a_plan_larger_than_an_agent_accepts_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
    """The plan travels as its file's bytes, bounded by what an agent takes as one plan; a larger
    one never leaves the pusher."""
    pytest.importorskip("xxhash")
    from hwtui.engine.resident import resident
    from tests.engine.replication.helpers import make_model, write_plan

    make_model(tmp_path / "m", seed=1, big=1000, n=2)
    write_plan(tmp_path / "m", tmp_path / "p.plan", version="v1")
    monkeypatch.setenv("HWTUI_AGENT_TOKEN", TOKEN)
    monkeypatch.setattr(resident, "MAX_PLAN_BYTES", (tmp_path / "p.plan").stat().st_size - 1)
    agents = "127.0.0.1:1,127.0.0.1:2"  # never contacted: refused before any request
    _one_line_exit_2(capsys, ["push", "--plan", str(tmp_path / "p.plan"), "--agents", agents],
                     "larger than an agent accepts")
