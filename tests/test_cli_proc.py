"""tests/cli_proc.py, the tests' CLI zygote: a forked CLI gets what an exec'd one gets, and says
the same; whatever a fork could get wrong is exec'd; nothing it starts outlives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli_proc
from tests.procfs import wait_gone

ROOT = Path(__file__).resolve().parent.parent
TARGET = [sys.executable, "-m", "tests.cli_proc_target"]


@pytest.fixture
def zygote() -> cli_proc._Zygote:
    z = cli_proc.zygote()
    if z is None:
        pytest.skip(f"no CLI zygote in this test process: {cli_proc.why_exec([sys.executable, '-m', 'hwtui'])}")
    return z


def test_the_zygote_runs_for_the_suite_unless_exec_is_asked_for() -> None:
    """A shard forks it after collection: the suite's CLI processes are forked, not exec'd."""
    if os.environ.get(cli_proc.EXEC_ENV, "").strip() not in ("", "0"):
        assert cli_proc.zygote() is None
    else:
        assert cli_proc.zygote() is not None, "the zygote did not start (tests/conftest.py)"


def test_a_forked_child_gets_argv_env_cwd_and_stdin_and_answers_as_an_execd_one(zygote, tmp_path: Path) -> None:
    env = {**os.environ, "CLI_PROC_PROBE": "ünïcode 'q' $x", "PATH": f"/nowhere{os.pathsep}{os.environ['PATH']}"}
    kw = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True, "timeout": 60, "input": "one\r\ntwo\n"}
    argv = [*TARGET, "show", "3", "--flag=a b"]
    execd = subprocess.run(argv, **kw)  # type: ignore[call-overload]
    child = cli_proc.forked(zygote, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env=env)
    out, err = child.communicate("one\r\ntwo\n", timeout=60)
    assert (child.returncode, out, err) == (execd.returncode, execd.stdout, execd.stderr)
    shown = json.loads(out)
    assert child.returncode == 3 and err == "err\nline\n"  # text mode translates newlines, as Popen
    assert shown == {"argv": ["show", "3", "--flag=a b"], "env": "ünïcode 'q' $x", "cwd": str(tmp_path),
                     "stdin": "one\r\ntwo\n", "path0": "/nowhere"}  # stdin translates nothing, as CPython


def test_a_killed_child_reports_minus_9_and_a_timeout_keeps_what_was_read(zygote) -> None:
    child = cli_proc.forked(zygote, [*TARGET, "hang"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)  # it hangs for good: any bound expires
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        child.communicate(timeout=0.2)
    assert timed_out.value.stdout == b"" and timed_out.value.stderr == b""
    child.kill()
    assert child.communicate(timeout=60) == (b"", b"") and child.returncode == -signal.SIGKILL
    wait_gone([child.pid], "the killed child")


def test_input_and_output_larger_than_a_pipe_flow_both_ways(zygote) -> None:
    """The child writes 1 MiB before it reads its 1 MiB of input: written first, the input would deadlock."""
    child = cli_proc.forked(zygote, [*TARGET, "big"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err = child.communicate(b"y" * (1 << 20), timeout=120)
    assert (child.returncode, len(out), err) == (0, 1 << 20, b"1048576\n")


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["replicate", "--plan", "/nonexistent/plan.json"],
                                  ["train", "--steps", "many"]])
def test_the_real_cli_forked_says_exactly_what_the_execd_one_says(zygote, args: list[str]) -> None:
    argv = [sys.executable, "-m", "hwtui.app", *args]
    assert cli_proc.why_exec(argv) is None
    forked = cli_proc.run(argv, capture_output=True, text=True, timeout=120)
    execd = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (execd.returncode, execd.stdout, execd.stderr)
    assert "Traceback" not in forked.stderr


@pytest.mark.parametrize(("argv", "kwargs", "says"), [
    (["unshare", "-m", sys.executable, "-m", "hwtui.app"], {}, "not `python -m hwtui...`"),
    ([sys.executable, "-X", "dev", "-m", "hwtui.app"], {}, "not `python -m hwtui...`"),
    (["/usr/bin/python3", "-m", "hwtui.app"], {}, "not `python -m hwtui...`"),
    ([sys.executable, "-m", "hwtui.engine.replication.worker"], {}, "not `python -m hwtui...`"),
    ([sys.executable, "-m", "hwtui.app"], {"preexec_fn": os.getpid}, "preexec_fn is not implemented"),
    ([sys.executable, "-m", "hwtui.app"], {"pass_fds": (5, 6)}, "more than one pass_fds"),
    ([sys.executable, "-m", "hwtui.app"], {"env": {**os.environ, "TORCH_SHOW_CPP_STACKTRACES": "7"}},
     "TORCH_SHOW_CPP_STACKTRACES differ"),
    ([sys.executable, "-m", "hwtui.app"], {"env": {**os.environ, "PYTHONPATH": "/fake/torch"}}, "PYTHONPATH differ"),
    ([sys.executable, "-m", "hwtui.app"], {"env": {**os.environ, "HF_HUB_OFFLINE": "0"}}, "HF_HUB_OFFLINE differ"),
    ([sys.executable, "-m", "hwtui.app"], {"env": {**os.environ, "LC_ALL": "tr_TR.UTF-8"}}, "LC_ALL differ"),
])
def test_what_a_fork_could_get_wrong_is_execd(zygote, argv: list[str], kwargs: dict, says: str) -> None:
    why = cli_proc.why_exec(argv, kwargs.get("env"), kwargs)
    assert why is not None and says in why, why
    assert cli_proc.why_exec([sys.executable, "-m", "hwtui.app"], {**os.environ, "HWTUI_ANYTHING": "1"}) is None


DEATH = """
import json, os, signal, sys
from tests import cli_proc
assert cli_proc.start() is None
z = cli_proc.zygote()
child = cli_proc.Popen([sys.executable, "-m", "hwtui.app", "agent", "--listen", "127.0.0.1:0", "--token-file",
                        sys.argv[1], "--out", sys.argv[2]], stdout=-1, stderr=-1, text=True)
assert isinstance(child, cli_proc.ForkedCli)
line = child.stdout.readline()
os.kill(z.pid, signal.SIGKILL)
os.waitpid(z.pid, 0)
# Not noticed yet (nothing was read since): this one finds the zygote gone and is exec'd.
assert z.alive and cli_proc.why_exec([sys.executable, "-m", "hwtui.app"]) is None
version = cli_proc.run([sys.executable, "-m", "hwtui.app", "--version"], capture_output=True, text=True, timeout=60)
code = child.wait(60)
later = cli_proc.why_exec([sys.executable, "-m", "hwtui.app"])
print(json.dumps({"line": line, "pid": child.pid, "code": code, "later": later, "version": [version.returncode, version.stdout]}),
      flush=True)
"""


def test_a_dead_zygote_takes_its_children_and_later_clis_are_execd(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t" * 40 + "\n")
    token.chmod(0o600)
    proc = subprocess.run([sys.executable, "-c", DEATH, str(token), str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=180, cwd=ROOT, env={**os.environ, cli_proc.EXEC_ENV: ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "listening on" in got["line"], got
    assert got["code"] == -signal.SIGKILL and got["later"] == "the zygote is not running", got
    assert got["version"][0] == 0 and got["version"][1].startswith("hwtui "), got
    wait_gone([got["pid"]], "the agent outlived its zygote")


def test_a_cli_forked_into_a_network_namespace_sees_that_namespace_as_ip_netns_exec_shows_it(zygote) -> None:
    from tests.engine.cluster.netns import NetnsCluster, unavailable_reason

    if (why := unavailable_reason()) is not None:
        pytest.skip(why)
    net = NetnsCluster(nodes=1).up()
    try:
        ns = net.node_ns[0]
        argv = [*TARGET, "netif"]
        assert cli_proc.in_netns(ns, [sys.executable, "-m", "hwtui.app"])[:4] == [sys.executable, "-m", "tests.in_netns", ns]
        execd = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=60)
        child = cli_proc.forked(zygote, [sys.executable, "-m", "tests.in_netns", ns, *argv[2:]], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        out, err = child.communicate(timeout=60)
        assert (child.returncode, err) == (0, ""), err
        seen = {"sys": ["eth0", "lo"], "index": ["eth0", "lo"], "ipv4": ["10.77.0.1", "127.0.0.1"]}
        assert json.loads(out) == json.loads(execd.stdout) == seen
        here = json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout)
        assert "10.77.0.1" not in here["ipv4"], here  # the namespace's, not this one's
    finally:
        net.down()
