"""tests/cli_proc.py, the tests' CLI zygote: a forked CLI gets what an exec'd one gets, and says
the same; whatever a fork could get wrong is exec'd; nothing it starts outlives it."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    assert timed_out.value.stdout is None and timed_out.value.stderr is None  # as subprocess: nothing read
    child.kill()
    assert child.communicate(timeout=60) == (b"", b"") and child.returncode == -signal.SIGKILL
    wait_gone([child.pid], "the killed child")


def _both(zygote, argv: list[str], **kw: Any) -> tuple[tuple, tuple]:
    """(returncode, stdout, stderr) forked from the zygote, and exec'd."""
    child = cli_proc.forked(zygote, argv, stdin=kw.get("stdin"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=kw.get("cwd"))
    out, err = child.communicate(kw.get("input"), timeout=120)
    execd = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=kw.get("cwd"), input=kw.get("input"))
    def same(text: str) -> str:  # object addresses differ between any two runs
        return re.sub(r"0x[0-9a-f]+", "0x...", text)

    return (child.returncode, same(out), same(err)), (execd.returncode, same(execd.stdout), same(execd.stderr))


def test_a_forked_child_has_a_fresh_interpreters_hooks_not_pytests(zygote) -> None:
    """A thread's exception, a __del__'s, a warning and a log line with no logging set up: each
    printed on stderr as a fresh interpreter prints it (the zygote is an exec'd interpreter, not a
    fork of pytest's, whose hooks record these)."""
    forked, execd = _both(zygote, [*TARGET, "hooks"])
    assert forked == execd
    err = forked[2]
    assert "ZeroDivisionError" in err and "in __del__" in err and "UserWarning: a warning from the child" in err, err
    assert "a log line from the child" in err, err


def test_a_forked_child_runs_and_imports_from_the_cwd_an_execd_one_would(zygote, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no cwd= given: the test's working directory now, not the zygote's
    forked, execd = _both(zygote, [*TARGET, "path"])
    assert forked == execd and json.loads(forked[1]) == {"cwd": str(tmp_path), "path0": str(tmp_path)}


def test_the_child_waits_for_its_non_daemon_threads_as_an_interpreter_does(zygote, tmp_path: Path) -> None:
    child = cli_proc.forked(zygote, [*TARGET, "nondaemon", str(tmp_path / "f")])
    assert child.wait(60) == 0 and (tmp_path / "f").read_text() == "done"


def test_input_a_child_reads_in_parts_while_it_writes_cannot_deadlock(zygote) -> None:
    """It reads 4 KiB, writes 1 MiB, then reads the rest: a write larger than a pipe takes without
    blocking would hang with the child blocked on its output (the timeout was never reached)."""
    child = cli_proc.forked(zygote, [*TARGET, "partial"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err = child.communicate(b"y" * (1 << 20), timeout=120)
    assert (child.returncode, len(out), err) == (0, 1 << 20, b"1048576\n")


def test_a_timeout_in_text_mode_after_half_a_character_is_a_timeout(zygote) -> None:
    child = cli_proc.forked(zygote, [*TARGET, "cut"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not child._chunks.get(child._out_fd):  # until the half character has been read
            with pytest.raises(subprocess.TimeoutExpired) as timed_out:
                child.communicate(timeout=0.1)
        assert timed_out.value.stdout == b"\xc3"  # undecoded, as subprocess gives it
    finally:
        child.kill()
        child.wait(60)


def test_a_cli_started_from_another_thread_is_execd() -> None:
    import threading

    why: list[str | None] = []
    t = threading.Thread(target=lambda: why.append(cli_proc.why_exec([sys.executable, "-m", "hwtui.app"])))
    t.start()
    t.join()
    assert why[0] is not None and "main thread" in why[0], why


def test_input_and_output_larger_than_a_pipe_flow_both_ways(zygote) -> None:
    """The child writes 1 MiB before it reads its 1 MiB of input: written first, the input would deadlock."""
    child = cli_proc.forked(zygote, [*TARGET, "big"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err = child.communicate(b"y" * (1 << 20), timeout=120)
    assert (child.returncode, len(out), err) == (0, 1 << 20, b"1048576\n")


@pytest.mark.parametrize(("module", "args"), [
    ("hwtui.app", ["--help"]), ("hwtui.app", ["--version"]), ("hwtui.app", ["replicate", "--plan", "/nonexistent/plan.json"]),
    ("hwtui.app", ["train", "--steps", "many"]), ("hwtui.app.cli", ["--version"]), ("hwtui", ["--version"])])
def test_the_real_cli_forked_says_exactly_what_the_execd_one_says(zygote, module: str, args: list[str]) -> None:
    """Every module a test runs the CLI as: none may be imported in the zygote already (runpy would
    warn on stderr that it found it in sys.modules)."""
    argv = [sys.executable, "-m", module, *args]
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


def test_a_cli_forked_into_a_network_namespace_sees_that_namespace_as_ip_netns_exec_shows_it(zygote, monkeypatch) -> None:
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
        # Where a fork could differ, run execs the same argv as `ip netns exec` (cli_proc._execable).
        monkeypatch.setenv(cli_proc.EXEC_ENV, "1")
        again = cli_proc.run(cli_proc.in_netns(ns, argv), capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and json.loads(again.stdout) == seen, again.stderr
    finally:
        net.down()


@pytest.mark.parametrize("how", ["forked", "execd"])
def test_a_cli_in_a_mount_namespace_writes_into_that_namespace_only_and_exits_as_it_did(
        zygote, tmp_path: Path, monkeypatch, how: str) -> None:
    """cli_proc.in_mountns: the setup's tmpfs is where the CLI writes, the after script reads it
    and the CLI's status in the namespace, the host never sees it; forked from the zygote, or
    tests/in_mountns.py exec'd (the same steps) when a fork could differ."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -m needs CAP_SYS_ADMIN)")
    if how == "execd":
        monkeypatch.setenv(cli_proc.EXEC_ENV, "1")
    mnt, root = tmp_path / "mnt", tmp_path / "root"
    mnt.mkdir()
    root.mkdir()
    setup = 'set -e; mount --make-rprivate /; mount -t tmpfs -o mode=700 hwtui-test "$1"'
    after = 'ls "$1"; echo "RC=$RC"'
    for extra, code in (([], 0), (["--bogus"], 2)):
        argv = cli_proc.in_mountns(setup, after, [mnt], [sys.executable, "-m", "hwtui.app", "snapshot", "--sysroot",
                                                         str(root), "-o", str(mnt / "snap.json"), *extra])
        assert argv[2] == "tests.in_mountns" and (cli_proc.why_exec(argv) is None) == (how == "forked")
        proc = cli_proc.run(argv, capture_output=True, text=True, timeout=120)
        assert proc.returncode == code, proc.stderr[-2000:]
        assert proc.stdout.splitlines()[-2:] == (["snap.json", "RC=0"] if code == 0 else ["RC=2"]), proc.stdout
        assert not (mnt / "snap.json").exists()  # the tmpfs went with the namespace


@pytest.mark.parametrize("mask,mode", [(0o000, 0o666), (0o077, 0o600)])
def test_a_forked_cli_runs_under_the_umask_asked_for_as_an_execd_one_does(zygote, tmp_path: Path, mask: int,
                                                                         mode: int) -> None:
    """``umask=`` (which the fork-server protocol does not carry) is tests.with_umask around a forked
    CLI: the snapshot it writes (honouring the umask, as an exec'd one) gets the same mode."""
    root = tmp_path / "root"
    root.mkdir()
    modes = []
    for exec_it in (False, True):
        out = tmp_path / f"snap-{exec_it}.json"
        argv = [sys.executable, "-m", "hwtui.app", "snapshot", "--sysroot", str(root), "-o", str(out)]
        wrapped, rest = cli_proc._with_umask(argv, {"umask": mask, "env": dict(os.environ)})
        assert (wrapped[2] == cli_proc.UMASK_MODULE and "umask" not in rest), wrapped
        env = {**os.environ, cli_proc.EXEC_ENV: "1"} if exec_it else None
        if exec_it:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, umask=mask)
        else:
            proc = cli_proc.run(argv, capture_output=True, text=True, timeout=120, umask=mask)
        assert proc.returncode == 0, proc.stderr
        modes.append(stat.S_IMODE(out.stat().st_mode))
    assert modes == [mode, mode]


def test_a_run_in_a_mount_namespace_that_raises_still_runs_its_after_script_with_status_1(tmp_path: Path) -> None:
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -m needs CAP_SYS_ADMIN)")
    argv = cli_proc._execable(cli_proc.in_mountns("true", 'echo "RC=$RC"', [tmp_path],
                                                  [sys.executable, "-m", "hwtui_no_such_module"]))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout.splitlines() == ["RC=1"], proc
    assert "No module named hwtui_no_such_module" in proc.stderr
    with pytest.raises(ValueError):
        cli_proc.in_mountns("true", "", [], ["/usr/bin/hwtui", "snapshot"])
