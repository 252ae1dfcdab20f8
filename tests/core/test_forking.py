"""core.forking: children forked from a preloaded launcher get what an exec'd child gets.

Each case runs tests/core/fork_driver.py as its own process: pytest's own process may have
threads (xdist), and a process with threads is never forked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procfs import alive, wait_gone


def drive(case: str, **env: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.core.fork_driver", case], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env}, check=False)
    assert proc.returncode == 0, proc.stderr
    out: dict = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_a_forked_child_has_its_own_session_env_and_only_its_own_fds() -> None:
    out = drive("exit3")
    assert out["forked"] is True and out["refusal"] is None
    r = out["report"]
    assert r["pid"] == r["pgid"] == r["sid"] != out["driver_pgid"]  # its own session and group
    assert r["ppid"] == out["driver_pid"]  # the launcher's own child: waitpid works
    assert r["rank"] == "7"
    assert r["fds"] == sorted({0, 1, 2, r["answer_fd"]})  # the launcher's own fd (leak_fd) is not there
    assert r["threads"] == 1 and r["sigterm_default"] is True
    assert r["argv"][0].endswith("fork_probe.py")  # as `python -m` sets it
    # The preloaded heap is frozen in the child (its collections skip it, its pages stay shared)
    # and back in the launcher's own collections.
    assert r["frozen"] > 1000 and out["driver_frozen"] == 0
    assert (out["code"], out["text"]) == (3, "exited with status 3")


def test_the_launchers_garbage_never_closes_a_childs_fd() -> None:
    """Once in a full suite run, rank 0 of a replicate lost its own c10d store connection mid-run
    ("Broken pipe"): forked from a test shard, its copy of the shard's heap held a TCPStore left in
    a garbage cycle by the training run before, and the rank's gc freed it, closing that store's fd
    numbers, which the child had given to its own sockets. Here the launcher (its heap frozen before,
    as the shards do) leaves a socket in a cycle; the child opens fds until one has the socket's
    number, collects, and every fd of its own must still be open. (A fork server's children go
    through the same set-up, forking.run_in_child; its own heap is its preload.)"""
    out = drive("owned_garbage")
    assert out["forked"] is True
    reuse = out["report"]["reuse"]
    assert reuse["mine"] and reuse["alive"] == reuse["mine"], reuse
    assert reuse["target"] not in reuse["mine"]  # the launcher's number stays taken (by /dev/null)
    assert out["report"]["placeholders"] >= 1
    assert out["report"]["fds"] == sorted({0, 1, 2, out["report"]["answer_fd"], *reuse["mine"]})


def test_a_forked_child_prints_and_reads_on_its_own_fds_whatever_the_launcher_did_to_its_streams() -> None:
    out = drive("stdio")
    assert out["forked"] is True, out
    assert (out["code"], out["stdout"], out["stderr"]) == (0, "out-line\necho:hello\n", "err-line\nlog-line\n"), out
    assert out["ours"] == {"stdout": "", "stderr": ""}  # nothing landed in the launcher's replaced streams


def test_terminate_reaches_a_forked_child_and_says_it_was_killed_by_sigterm() -> None:
    out = drive("hang")
    assert out["forked"] is True
    assert out["terminate"] == -15 and out["text"] == "was killed by SIGTERM"


def test_an_uncaught_exception_exits_1_as_python_does() -> None:
    out = drive("raise")
    assert out["forked"] is True and (out["code"], out["text"]) == (1, "exited with status 1")


def test_a_launcher_with_a_thread_execs_instead_and_says_why() -> None:
    out = drive("thread")
    assert out["forked"] is False and "threads" in out["refusal"]
    assert out["report"]["rank"] == "7" and out["code"] == 0  # exec'd, and it still ran


def test_a_thread_that_has_ended_no_longer_stops_the_fork() -> None:
    # The first preload met a passing thread (a library's, ending a moment later) and was refused;
    # that refusal stuck, and every later launch in the process exec'd its ranks.
    out = drive("passing_thread")
    assert "threads" in out["first_refusal"]
    assert out["forked"] is True and out["refusal"] is None and out["code"] == 0


def test_an_import_time_variable_that_differs_makes_the_child_exec() -> None:
    out = drive("env_mismatch")
    assert out["forked"] is False and "ZYG_IMPORT_TIME" in out["refusal"]
    assert out["code"] == 0


@pytest.mark.parametrize("value", ["0", "off"])
def test_the_switch_restores_exec_for_everyone(value: str) -> None:
    out = drive("exit3", HWTUI_FORK_RANKS=value)
    assert out["forked"] is False and "HWTUI_FORK_RANKS" in out["refusal"]
    assert out["code"] == 3


def test_an_interpreter_that_links_to_ours_is_still_another_python_and_execs(tmp_path: Path) -> None:
    # A venv's bin/python (HWTUI_PYTHON_CPU, `hwtui setup`) is a link to the base interpreter: its
    # resolved path can be ours while its site-packages (its torch) are not.
    other = tmp_path / "venv" / "bin" / "python"
    other.parent.mkdir(parents=True)
    other.symlink_to(os.path.realpath(sys.executable))
    out = drive("other_python", ZYG_OTHER_PYTHON=str(other))
    assert out["forked"] is False and "this interpreter" in out["refusal"]
    assert out["code"] == 0


@pytest.mark.parametrize("fork", ["1", "0"])
def test_a_child_commanded_on_stdin_gets_every_message_then_eof_as_with_exec(fork: str) -> None:
    out = drive("stdin", HWTUI_FORK_RANKS=fork)
    assert out["forked"] is (fork == "1"), out["refusal"]
    report, *rest = out["messages"]
    assert report["fds"] == sorted({0, 1, 2, report["answer_fd"]})
    assert rest == [{"echo": {"kind": "config", "n": 1}}, {"echo": {"kind": "stop"}}, {"eof": True}]
    assert out["code"] == 0


@pytest.mark.parametrize("fork", ["1", "0"])
def test_the_launchers_death_is_eof_on_a_forked_childs_stdin(fork: str) -> None:
    # The second child is forked while the launcher holds the first one's stdin: it must not keep
    # a copy, or the first would never see EOF.
    proc = subprocess.run([sys.executable, "-m", "tests.core.fork_driver", "stdin_orphan"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HWTUI_FORK_RANKS": fork}, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["forked"] == [fork == "1"] * 2, out["refusal"]
    first, second = out["pids"]
    try:
        wait_gone([first], "the first child never saw EOF on its stdin", limit=60)
        assert alive(second)  # it was only told nothing: it is still there (we clear it below)
    finally:
        for pid in (first, second):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- through the fork server (core.forkserver): a process with threads, as the node agent -------

def test_a_threaded_process_forks_through_its_server_and_the_child_gets_what_an_exec_gets() -> None:
    out = drive("server_exit3")
    assert out["forked"] is True and out["refusal"] is None, out
    r = out["report"]
    assert r["ppid"] == out["server_pid"] != out["driver_pid"]  # the server's child, not ours
    assert r["pid"] == r["pgid"] == r["sid"] != out["driver_pgid"]  # its own session: signal_group works
    assert r["fds"] == sorted({0, 1, 2, r["answer_fd"]}) and r["rank"] == "7"
    assert r["threads"] == 1 and r["sigterm_default"] is True and r["frozen"] > 1000
    assert (out["code"], out["text"]) == (3, "exited with status 3")  # relayed by the server


def test_through_the_server_stdio_terminate_and_exceptions_are_as_with_exec() -> None:
    out = drive("server_stdio")
    assert out["forked"] is True and (out["code"], out["stdout"], out["stderr"]) == (0, "out-line\necho:hello\n", "err-line\nlog-line\n")
    out = drive("server_hang")
    assert out["forked"] is True and out["terminate"] == -15 and out["text"] == "was killed by SIGTERM"
    out = drive("server_raise")
    assert out["forked"] is True and (out["code"], out["text"]) == (1, "exited with status 1")
    out = drive("server_stdin")
    assert out["forked"] is True and out["code"] == 0
    assert out["messages"][1:] == [{"echo": {"kind": "config", "n": 1}}, {"echo": {"kind": "stop"}}, {"eof": True}]


def test_a_killed_agent_takes_its_fork_server_and_every_child_with_it() -> None:
    proc = subprocess.run([sys.executable, "-m", "tests.core.fork_driver", "server_orphans"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["forked"] is True and out["server"]
    wait_gone([out["server"], out["child"]], "the server or its child outlived the agent")


def test_the_fork_server_outlives_a_stop_signal_sent_to_its_whole_group() -> None:
    out = drive("server_signals")
    # Both children forked by the same server, the second after SIGTERM, SIGINT and SIGHUP reached it.
    assert out == {"forked": [True, True], "code": 4, "first_alive": True, "server_alive": True}, out




SETTLE = """
import _thread, argparse, json, threading, time
from hwtui.app.host_args import host_from_args
from hwtui.core import forking
from hwtui.probes.inventory import detect_devices
host = host_from_args(argparse.Namespace(sysroot=None, replay=None, record=None))
out = {"lingered": 0, "settled": []}
for _ in range(100):  # what `hwtui train` does right before it preloads
    detect_devices(host)
    out["lingered"] += forking.thread_count() > 1
for _ in range(100):
    detect_devices(host)
    out["settled"].append(forking.settled_thread_count(bound_s=60))
ending = threading.Event()
live = threading.Thread(target=ending.wait)  # a Python thread, alive for now
live.start()
out["python_default"] = forking.settled_thread_count(bound_s=60)  # not waited for: a launcher's by design
threading.Timer(0.05, ending.set).start()
out["python_waited"] = forking.settled_thread_count(bound_s=60, python_threads=True)
release = threading.Event()
_thread.start_new_thread(release.wait, ())  # a thread threading does not count, as a native one
out["native_first"] = forking.settled_thread_count(bound_s=0.05)
started = time.monotonic()
out["native_again"] = forking.settled_thread_count(bound_s=60)
out["again_s"] = time.monotonic() - started
release.set()
print(json.dumps(out))
"""


def test_a_finished_thread_is_waited_out_and_a_lasting_one_counted_at_once() -> None:
    """A finished thread lingers in /proc/self/task while it exits (the device check's probe threads:
    10 to 52 of 200 checks left one, and `hwtui train` preloads right after it: its workers were
    exec'd), so the count a launcher forks by waits it out, by state. A thread that stays (an
    OpenMP pool's) is waited for once, up to the bound, then remembered; a live Python thread only
    when asked (python_threads). Its own process: pytest's may hold threads a test left."""
    proc = subprocess.run([sys.executable, "-c", SETTLE], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["settled"] == [1] * 100, out
    # A live Python thread: counted at once by default; waited out with python_threads (the suite's
    # wait between tests; its Timer's own thread ends too).
    assert (out["python_default"], out["python_waited"]) == (2, 1), out
    assert (out["native_first"], out["native_again"]) == (2, 2), out
    assert out["again_s"] < 30, out  # not the 60 s bound: it was remembered
    print(f"{out['lingered']} of 100 finished threads were still in /proc/self/task")
