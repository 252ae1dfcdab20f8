"""``hwtui train --push-to AGENTS [--push-every ROUNDS]``: checked before anything is trained or
written (issue 24 item 5). Bad input is one line on stderr and exit 2, nothing written: a bad agent
list, --push-every without --push-to or out of range, a model --save-hf cannot write, the agent
extra (httpx) missing, a bad --cacert, and an agent that refuses (a wrong token, no --out) or does
not answer. The agents here are real AgentServers on loopback (tests/agent/helpers.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwtui.app.cli import main
from tests.agent.helpers import TOKEN, dead_port, start_agent, stop_agent

GPT2 = {"model_type": "gpt2", "vocab_size": 256, "n_embd": 16, "n_layer": 1, "n_head": 1, "n_positions": 64,
        "architectures": ["GPT2LMHeadModel"]}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "gpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(GPT2))
    return d


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    f = tmp_path / "agent.token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


def _train(tmp_path: Path, *argv: str) -> tuple[int, list[Path]]:
    """``hwtui train`` in-process with the outputs it would write; (exit code, outputs)."""
    outs = [tmp_path / "ck", tmp_path / "r.json", tmp_path / "hf"]
    code = main(["train", "--gpu-ids", "cpu:0", "--steps", "5", "--checkpoint-dir", str(outs[0]),
                 "--report", str(outs[1]), "--save-hf", str(outs[2]), *argv])
    return code, outs


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _nothing_written(tmp_path: Path, outs: list[Path]) -> None:
    assert not any(p.exists() for p in outs), [p for p in outs if p.exists()]
    assert not list(tmp_path.glob(".hwtui-push-*")) and not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize(("argv", "needle"), [
    (["--push-every", "2"], "--push-every goes with --push-to"),
    (["--push-to", "127.0.0.1:1,127.0.0.1:2", "--push-every", "0"], "--push-every must be between 1"),
    (["--push-to", "127.0.0.1:1"], "a source and at least one receiver"),
    (["--push-to", "not a host!,b"], "not a host!"),
    (["--push-to", ""], "--agents"),
    (["--push-to", "127.0.0.1:1,127.0.0.1:2", "--cacert", "/nonexistent/ca.pem"], "--cacert"),
])
def test_bad_push_options_are_one_line_exit_2_nothing_written(tmp_path, model, capsys, argv, needle):
    code, outs = _train(tmp_path, "--model", str(model), *argv)
    err = _one_line(capsys)
    assert code == 2 and needle in err, err
    _nothing_written(tmp_path, outs)


def test_push_to_needs_a_model_directory(tmp_path, capsys):
    code = main(["train", "--gpu-ids", "cpu:0", "--steps", "5", "--report", str(tmp_path / "r.json"),
                 "--push-to", "127.0.0.1:1,127.0.0.1:2"])
    err = _one_line(capsys)
    assert code == 2 and "--push-to" in err and "--model DIR" in err, err
    assert not (tmp_path / "r.json").exists()


def test_an_agent_that_refuses_the_token_stops_the_run_before_training(tmp_path, model, capsys):
    a, b = start_agent("a", 0), start_agent("b", 1)
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token\n")
    wrong.chmod(0o600)
    try:
        code, outs = _train(tmp_path, "--model", str(model), "--push-to", f"127.0.0.1:{a.port},127.0.0.1:{b.port}",
                            "--token-file", str(wrong))
    finally:
        stop_agent(a)
        stop_agent(b)
    err = _one_line(capsys)
    assert code == 2 and "refused the token" in err, err
    _nothing_written(tmp_path, outs)


def test_an_agent_that_takes_no_pushes_or_does_not_answer_is_refused_up_front(tmp_path, model, token_file, capsys):
    a = start_agent("a", 0)  # no push routes: an agent started without --out
    try:
        code, outs = _train(tmp_path, "--model", str(model), "--push-to",
                            f"127.0.0.1:{a.port},127.0.0.1:{dead_port()}", "--token-file", str(token_file))
        err = _one_line(capsys)
        assert code == 2 and "is unreachable" in err, err  # the unreachable one is named first
        _nothing_written(tmp_path, outs)
        b = start_agent("b", 1)
        try:
            code, outs = _train(tmp_path, "--model", str(model), "--push-to",
                                f"127.0.0.1:{a.port},127.0.0.1:{b.port}", "--token-file", str(token_file))
        finally:
            stop_agent(b)
        err = _one_line(capsys)
        assert code == 2 and "takes no pushes" in err and "--out" in err, err
        _nothing_written(tmp_path, outs)
    finally:
        stop_agent(a)


def test_push_to_without_the_agent_extra_names_it(tmp_path, model):
    """A base install (no httpx), simulated as tests/app/test_agent_extra.py does: the import raises."""
    code = ("import sys\nsys.modules['httpx'] = None\nfrom hwtui.app.cli import main\n"
            f"sys.exit(main(['train', '--gpu-ids', 'cpu:0', '--model', {str(model)!r}, '--push-to', 'a,b', "
            f"'--report', {str(tmp_path / 'r.json')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "httpx" in lines[0] and "hwtui[agent]" in lines[0], done.stderr
    assert not (tmp_path / "r.json").exists()
