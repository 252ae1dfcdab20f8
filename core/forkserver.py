"""A fork server for a process with threads: children forked from a preloaded, single-threaded twin.

A launcher forks its ranks itself (:mod:`hwtui.core.forking`): it is single-threaded when it does.
The node agent is not (HTTP handlers, refreshers, readers), and a process with threads must never
fork a child that goes on running Python: a lock another thread held stays locked in the child. So
every resident rank the agent started was exec'd and imported torch again (1.2 CPU-s here; the
agent's tests started 58 of them). Instead the agent, while it is still single-threaded and right
after preloading, forks this server once: a twin with the heavy modules imported and no thread,
which forks each child on request and relays its exit status.

Protocol (an anonymous ``AF_UNIX`` ``SOCK_SEQPACKET`` pair, so nobody else can reach it): a request
is one JSON message (argv, env, cwd, which passed fd goes to stdin/stdout/stderr, and the fd number
the answer pipe must have in the child) with the fds passed alongside (SCM_RIGHTS). The server
answers ``{"pid": N}`` (or ``{"error": ...}``) and later ``{"exit": N, "code": C}`` when it reaps
the child (``C`` as ``Popen.returncode``: -9 for SIGKILL). Requests are serialised by a lock; one
reader thread in the client files the answers.

What a child gets is what :func:`hwtui.core.forking.fork_module` gives one: its own session (so
``Child.signal_group`` works from the client as for any child), its stdio and answer pipe at the
same numbers, a fresh environment and signal state, nothing else of the server's. It gets
``PR_SET_PDEATHSIG`` on the server, and the server has it on the client, so a killed agent takes
its server and every child with it. If the server dies, every child it had dies with it
(reported as SIGKILL), and later children are exec'd as before.

core never imports torch: the engine preloads (``forking.preload``) before :func:`start`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import IO, Any

from hwtui.core import forking

MAX_MESSAGE = 1 << 20  # argv + env of one child
REPLY_TIMEOUT_S = 30.0
_server: ForkServer | None = None


class ServedProc:
    """The client's handle on a child the server forked: the part of ``Popen`` hwtui uses."""

    def __init__(self, server: ForkServer, pid: int, args: Sequence[str]):
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        # Popen's pipes: the client keeps its ends itself (Child), so none here.
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.code_of(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._server.wait_for(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = code
        return self.returncode


class ForkServer:
    """The client side: started by :func:`start`, used by :class:`~hwtui.core.supervisor.Child`."""

    def __init__(self, pid: int, sock: socket.socket):
        self.pid = pid
        self._sock = sock
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._codes: dict[int, int] = {}
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._pending: set[int] = set()
        self.alive = True
        self._reader: threading.Thread | None = None

    def _ensure_reader(self) -> None:
        if self._reader is None:  # started on first use: the client forks the server before any thread
            self._reader = threading.Thread(target=self._read, name="hwtui-forkserver", daemon=True)
            self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                data = self._sock.recv(MAX_MESSAGE)
                if not data:
                    break
                msg = json.loads(data)
                if "exit" in msg:
                    with self._cond:
                        self._codes[int(msg["exit"])] = int(msg["code"])
                        self._pending.discard(int(msg["exit"]))
                        self._cond.notify_all()
                else:
                    if "pid" in msg:
                        with self._cond:  # a reused pid: the old child's status is not this one's
                            self._codes.pop(int(msg["pid"]), None)
                            self._pending.add(int(msg["pid"]))
                    self._replies.put(msg)
        except (OSError, ValueError):
            pass
        # The server is gone, and with it (PR_SET_PDEATHSIG) every child it had.
        with self._cond:
            self.alive = False
            for pid in self._pending:
                self._codes.setdefault(pid, -signal.SIGKILL)
            self._pending.clear()
            self._cond.notify_all()
        self._replies.put({"error": "the fork server is gone"})
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, 0)

    def code_of(self, pid: int) -> int | None:
        with self._cond:
            return self._codes.get(pid)

    def wait_for(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while pid not in self._codes:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            return self._codes[pid]

    def fork_module(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None,
                    stdio: tuple[int | None, int | None, int | None], keep_fd: int | None) -> ServedProc:
        """As :func:`forking.fork_module`, in the server; raises OSError when it cannot."""
        if not self.alive:
            raise OSError("the fork server is gone")
        self._ensure_reader()
        req, fds = encode_request(argv, env=env, cwd=cwd, stdio=stdio, keep_fd=keep_fd)
        with self._send_lock:
            socket.send_fds(self._sock, [req], fds)
            try:
                reply = self._replies.get(timeout=REPLY_TIMEOUT_S)
            except queue.Empty:
                raise OSError("the fork server did not answer") from None
        if "pid" not in reply:
            raise OSError(str(reply.get("error", "the fork server refused")))
        return ServedProc(self, int(reply["pid"]), argv)


def encode_request(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None,
                   stdio: tuple[int | None, int | None, int | None], keep_fd: int | None) -> tuple[bytes, list[int]]:
    """One request of the protocol (the module docstring): the message and the fds to pass with it."""
    fds = [fd for fd in stdio if fd is not None]
    where = [None if fd is None else fds.index(fd) for fd in stdio]
    keep = None
    if keep_fd is not None:
        keep = {"index": len(fds), "at": keep_fd}
        fds.append(keep_fd)
    req = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd, "stdio": where, "keep": keep}).encode()
    if len(req) > MAX_MESSAGE:
        raise OSError("the child's argv and environment are too large for the fork server")
    return req, fds


def server() -> ForkServer | None:
    """This process's fork server, while it runs."""
    return _server if _server is not None and _server.alive else None


def start() -> str | None:
    """Fork the server from this process (preloaded, single-threaded); returns why not (None: running)."""
    global _server
    if (why := forking.refusal()) is not None:
        return why
    if _server is not None:
        return None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the server: nothing here returns into the caller's stack
        code = 0
        try:
            ours.close()
            gc.freeze()  # as forking.run_in_child does in each child: the server's heap is its preload
            serve(theirs, parent)
        except BaseException:  # noqa: BLE001
            code = 1
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            os._exit(code)
    theirs.close()
    _server = ForkServer(pid, ours)
    return None


# --- the server process ------------------------------------------------------------------------

def serve(sock: socket.socket, parent: int) -> None:
    """Be the server on ``sock`` until the client closes its end or ``parent`` (the client) dies.

    :func:`start` runs it in a fork; a process exec'd for the purpose (its imports done, the
    socket passed to it) may run it itself (the tests' CLI zygote, tests/cli_zygote.py)."""
    with contextlib.suppress(OSError):  # the client closed its end (stop()) or died: we end quietly
        _serve_until_closed(sock, parent)


def _serve_until_closed(sock: socket.socket, parent: int) -> None:
    forking.die_with_parent()
    if os.getppid() != parent:  # the client died before the line above
        return
    # The server ends only when its agent does (EOF on the socket, or PR_SET_PDEATHSIG): a stop
    # signal sent to every process of the agent's group or cgroup (Ctrl-C in a terminal, systemd's
    # SIGTERM) must not kill it first, since its death would SIGKILL a resident rank in the middle
    # of the switch that rank's own SIGTERM gate lets finish. Its children reset these to default.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    keep = {0, 1, 2, sock.fileno(), wake_r, wake_w}
    for fd in forking._open_fds() - keep:  # the client's sockets, pipes, selectors: not ours
        with contextlib.suppress(OSError):
            os.close(fd)
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [], 1.0)
        if wake_r in ready:
            with contextlib.suppress(OSError):
                os.read(wake_r, 4096)
        _reap(sock, children)
        if sock.fileno() not in ready:
            continue
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 16)
        if not data:
            return  # the client closed its end or died: the children go with us
        try:
            pid = _fork_child(json.loads(data), fds, sock, (wake_r, wake_w))
            children.add(pid)
            reply: dict[str, Any] = {"pid": pid}
        except Exception as exc:  # noqa: BLE001 - a bad request: say so, keep serving
            reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        sock.send(json.dumps(reply).encode())


def _reap(sock: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _fork_child(req: dict[str, Any], fds: list[int], sock: socket.socket, wake: tuple[int, int]) -> int:
    argv, env, cwd = list(req["argv"]), dict(req["env"]), req.get("cwd")
    stdio = tuple(None if i is None else fds[int(i)] for i in req["stdio"])
    keep = req.get("keep")
    if len(argv) < 3 or argv[1] != "-m" or len(stdio) != 3:
        raise ValueError("a request is `python -m module args` with three stdio entries")
    server = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    keep_fd = None
    try:
        sock.close()
        signal.set_wakeup_fd(-1)
        for fd in wake:
            os.close(fd)
        forking.die_with_parent()
        if os.getppid() != server:  # the server died before the line above: nobody would kill us
            os._exit(1)
        if keep is not None:
            # Received fds sit at arbitrary numbers; copy every one above the wanted number first,
            # so the answer pipe can be put exactly where argv says without clobbering another
            # (the originals are closed with everything else as the child sets itself up).
            import fcntl

            at = int(keep["at"])
            moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, max(at + 1, 3)) for fd in fds]
            os.dup2(moved[int(keep["index"])], at, inheritable=True)
            stdio = tuple(None if i is None else moved[int(i)] for i in req["stdio"])
            keep_fd = at
    except BaseException:  # noqa: BLE001 - set-up failed: say so on stderr, exit 1
        with contextlib.suppress(Exception):
            traceback.print_exc()
        os._exit(1)
    forking.run_in_child(argv[2], argv[3:], env=env, cwd=cwd, stdio=(stdio[0], stdio[1], stdio[2]), keep_fd=keep_fd)

