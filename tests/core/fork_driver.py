"""A launcher for tests/core/test_forking.py, run as its own (single-threaded) process.

``python -m tests.core.fork_driver CASE``: preloads, starts tests.core.fork_probe with fork=True
the way a rank launcher does, prints one JSON line with what the child reported and how it ended.
``server_CASE``: the same case as the node agent runs it: a fork server started after the preload
(core.forkserver), then a thread (the agent is threaded), then the child through the server.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import threading
import time

from hwtui.core import forking, forkserver
from hwtui.core.supervisor import Child, Group, exit_text, python_module


def stdin_case(case: str) -> None:
    """A child commanded on its stdin, as a training worker is: messages in, EOF when we close it
    (``stdin``) or when we die (``stdin_orphan``: a second child started after it must not hold
    its stdin open, nor may anything else of ours)."""
    preload(["json"])
    first = Child(python_module("tests.core.fork_probe", "{answer_fd}", "echo"), name="echo", answer_pipe=True,
                  stdin="pipe", stdout="null", stderr="null", fork=True).start()
    if case == "stdin_orphan":
        second = Child(python_module("tests.core.fork_probe", "{answer_fd}", "quiet"), name="quiet", answer_pipe=True,
                       stdin="pipe", stdout="null", stderr="null", fork=True).start()
        print(json.dumps({"forked": [first.forked, second.forked], "refusal": first.fork_refusal,
                          "pids": [first.pid, second.pid]}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    out: dict[str, object] = {"forked": first.forked, "refusal": first.fork_refusal}
    with Group() as group:
        group.add(first)
        first.send({"kind": "config", "n": 1})
        first.send({"kind": "stop"})
        assert first.proc is not None and first.proc.stdin is not None
        first.proc.stdin.close()
        got = []
        for _ in range(600):  # bounded: 60 s
            got += [m.msg for m in group.poll(0.1) if m.msg is not None]
            if not group.open_pipes:
                break
        out.update(messages=got, code=first.wait(timeout=60))
    print(json.dumps(out), flush=True)


def stdio_case() -> None:
    """A launcher whose Python streams are not its fds (pytest's capture, a redirect, an embedding
    app): the child's print(), input() and stderr must be its own fds 0-2, as in a fresh
    interpreter, not our replaced objects (which a fork would otherwise hand it)."""
    import io

    # The child's own module preloaded too, as the agent preloads its resident rank's module: the
    # child's stderr must still be only its own (runpy warned of "found in sys.modules" there).
    preload(["json", "tests.core.fork_probe"])
    real_stdout = sys.stdout
    sys.stdin, sys.stdout, sys.stderr = io.StringIO("not for the child\n"), io.StringIO(), io.StringIO()
    # A library's logger set up at import (transformers' is): its handler holds our sys.stderr.
    import logging

    lib = logging.getLogger("launcher-lib")
    lib.addHandler(logging.StreamHandler())
    lib.propagate = False
    child = Child(python_module("tests.core.fork_probe", "{answer_fd}", "stdio"), name="stdio", answer_pipe=True,
                  stdin="pipe", stdout="pipe", stderr="pipe", text=True, fork=True).start()
    assert child.proc is not None and child.proc.stdin and child.proc.stdout and child.proc.stderr
    child.proc.stdin.write("hello\n")
    child.proc.stdin.close()
    code = child.wait(timeout=60)
    ours = {"stdout": sys.stdout.getvalue(), "stderr": sys.stderr.getvalue()}  # type: ignore[attr-defined]
    out = {"forked": child.forked, "refusal": child.fork_refusal, "code": code, "stdout": child.proc.stdout.read(),
           "stderr": child.proc.stderr.read(), "ours": ours}
    print(json.dumps(out), file=real_stdout, flush=True)


VIA_SERVER = sys.argv[1].startswith("server_") if len(sys.argv) > 1 else False


def preload(modules: list[str], **kw: object) -> None:
    forking.preload(modules, **kw)  # type: ignore[arg-type]
    if VIA_SERVER:
        assert forkserver.start() is None
        # A thread for good, as the agent has: from now on only the server may fork.
        threading.Thread(target=threading.Event().wait, daemon=True).start()


class _Owner:
    me: object
    sock: socket.socket


def main() -> None:
    case = sys.argv[1].removeprefix("server_")
    if case == "orphans":
        orphans_case()
        return
    if case == "signals":
        signals_case()
        return
    if case.startswith("stdin"):
        stdin_case(case)
        return
    if case == "stdio":
        stdio_case()
        return
    how = {"exit3": "3", "hang": "hang", "raise": "raise", "owned_garbage": "reuse"}.get(case, "0")
    first_refusal = None
    if case == "passing_thread":  # a preload refused for a thread that then ends, and a second one
        gone = threading.Event()
        passing = threading.Thread(target=gone.wait)
        passing.start()
        first_refusal = forking.preload(["json"], import_env_prefixes=("ZYG_",))
        gone.set()
        passing.join()
        for _ in range(1000):  # bounded: 10 s; a joined thread's task leaves /proc a moment later
            if forking.thread_count() == 1:
                break
            time.sleep(0.01)
    preload(["json"], import_env_prefixes=("ZYG_",))
    leak = os.open(__file__, os.O_RDONLY)  # the launcher's own fd: must not reach the child
    os.set_inheritable(leak, True)
    env = {**os.environ, "RANK": "7"}
    if case == "owned_garbage":
        # As in a test shard after a training run: the heap frozen before, then a socket that only
        # a garbage cycle holds (its launcher's store, in the shard), not yet collected.
        gc.freeze()
        gc.disable()
        owner = _Owner()
        owner.me, owner.sock = owner, socket.socket()
        env["PROBE_OWNED_FD"] = str(owner.sock.fileno())
        del owner
    if case == "env_mismatch":
        env["ZYG_IMPORT_TIME"] = "child"
    stop = threading.Event()
    if case == "thread":
        threading.Thread(target=stop.wait, daemon=True).start()
    argv = python_module("tests.core.fork_probe", "{answer_fd}", how)
    if case == "other_python":  # another venv's python: a link to the same base interpreter as ours
        argv[0] = os.environ["ZYG_OTHER_PYTHON"]
    child = Child(argv, name="probe", env=env,
                  answer_pipe=True, stdout="null", stderr="null", fork=True)
    out: dict[str, object] = {"driver_pid": os.getpid(), "driver_pgid": os.getpgid(0), "leak_fd": leak,
                              "server_pid": server.pid if (server := forkserver.server()) else None}
    with Group() as group:
        group.add(child)
        report = None
        for _ in range(600):  # bounded: 60 s
            for m in group.poll(0.1):
                if m.msg is not None:
                    report = m.msg
            if not group.open_pipes:
                break
        if case == "hang":
            out["terminate"] = child.terminate(grace_s=10.0)
        code = child.wait(timeout=60)
    stop.set()
    out.update(forked=child.forked, refusal=child.fork_refusal, report=report, code=code, text=exit_text(code),
               driver_frozen=gc.get_freeze_count(), first_refusal=first_refusal)
    print(json.dumps(out), flush=True)


def signals_case() -> None:
    """A stop signal for the whole group reaches the server too: it must outlive it (and keep
    serving) until its agent goes, so the agent's own orderly stop decides when ranks end."""
    preload(["json"])
    server = forkserver.server()
    assert server is not None
    first = Child(python_module("tests.core.fork_probe", "{answer_fd}", "quiet"), name="quiet", answer_pipe=True,
                  stdout="null", stderr="null", fork=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        os.kill(server.pid, sig)
    second = Child(python_module("tests.core.fork_probe", "{answer_fd}", "4"), name="after", answer_pipe=True,
                   stdout="null", stderr="null", fork=True).start()
    code = second.wait(timeout=60)
    alive = first.poll() is None
    first.terminate(grace_s=10.0)
    print(json.dumps({"forked": [first.forked, second.forked], "code": code, "first_alive": alive,
                      "server_alive": forkserver.server() is not None}), flush=True)


def orphans_case() -> None:
    """The agent killed with its server and a child running: both must die with it."""
    preload(["json"])
    child = Child(python_module("tests.core.fork_probe", "{answer_fd}", "quiet"), name="quiet", answer_pipe=True,
                  stdout="null", stderr="null", fork=True).start()
    server = forkserver.server()
    print(json.dumps({"forked": child.forked, "server": server.pid if server else None, "child": child.pid}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
