"""Start hwtui's CLI from a test as a process forked from a preloaded zygote, not exec'd.

Why: every ``python -m hwtui.app ...`` a test started was a fresh interpreter whose first act is
``import torch`` (1.2 CPU-s on the 2-core boxes the suite runs on). Process accounting over one
full run put ~250 such starts at about half of the suite's 527 CPU-s, and CI's wall sat at the
six-minute limit. Here a test's CLI is forked from a *zygote*: a fresh interpreter the shard
execs once, after collection (tests/cli_zygote.py: it imports what the CLI imports, torch first,
and none of pytest's hooks, capture files or test modules are in it), which forks each CLI on
request with ``hwtui.core.forkserver``'s protocol, the one the node agent uses for its resident
ranks.

What the CLI process gets is what an exec'd one gets: its own process running ``python -m
<module>`` (runpy, as the interpreter does), the test's argv, environment, cwd and stdio (the
test's fds 0-2 where a stream is not redirected), fresh signal handlers, and nothing else of the
test process. Its launchers fork or exec their ranks from it as from an exec'd CLI. The handle is
the part of ``subprocess.Popen`` the tests use (pid, poll, wait, communicate, signals, pipes), and
its ``returncode`` is the child's wait status as Popen reports it (-9 for SIGKILL). Differences,
none of which a test here depends on: the child always has its own session (as with
``start_new_session=True``), its parent is the zygote, its ``/proc/<pid>/cmdline`` is pytest's.

The CLI is exec'd as before (``subprocess``) when a fork could differ from an exec:
* ``HWTUI_TEST_CLI_EXEC=1`` in the test process's environment (every CLI exec'd: the old way);
* the zygote is not running (it did not start, or it died);
* argv is not ``[sys.executable, "-m", <hwtui's CLI module>, ...]`` (a wrapper such as ``unshare
  -m``, interpreter flags, another Python). A CLI in a network namespace is forked too: :func:`in_netns`
  gives ``python -m tests.in_netns NETNS <module> ...``, which does what ``ip netns exec`` does,
  and one in a mount namespace of its own too: :func:`in_mountns` gives ``python -m
  tests.in_mountns SETUP AFTER ARG... -- <module> ...``, which does what ``unshare -m sh -c ...`` did;
* a variable that is read once, at import or interpreter start, differs between the child's
  environment and the zygote's (torch's and its libraries', Hugging Face's, ``PYTHON*``, the
  locale): the child would silently keep the zygote's value;
* an argument this module does not implement (``preexec_fn``, several ``pass_fds``, ...).

The zygote is a child of the test process with ``PR_SET_PDEATHSIG``, and so is each CLI of the
zygote: nothing outlives the shard. A CLI is started from the test's main thread only. No thread is ever started here (the shard stays forkable).
"""

from __future__ import annotations

import contextlib
import io
import json
import locale
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from hwtui.core import forkserver

EXEC_ENV = "HWTUI_TEST_CLI_EXEC"
CLI_MODULES = ("hwtui", "hwtui.app", "hwtui.app.cli")
NETNS_MODULE = "tests.in_netns"  # python -m tests.in_netns NETNS <a CLI module> ...: ip netns exec, forkable
UMASK_MODULE = "tests.with_umask"  # python -m tests.with_umask MASK <a CLI module> ...: Popen's umask=, forkable
MOUNTNS_MODULE = "tests.in_mountns"  # python -m tests.in_mountns SETUP AFTER ARG... -- <a CLI module> ...: unshare -m
# Read once at import or at interpreter start: a child whose value differs is exec'd.
_ALLOWED_TO_DIFFER = frozenset({"PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE"})
_SUPPORTED = frozenset({"stdin", "stdout", "stderr", "env", "cwd", "text", "universal_newlines", "encoding", "errors",
                        "start_new_session", "pass_fds", "bufsize", "close_fds"})
REPLY_TIMEOUT_S = 30.0


def _import_env_prefixes() -> tuple[str, ...]:
    from hwtui.engine.rank_fork import IMPORT_ENV_PREFIXES
    from hwtui.engine.training.worker_fork import HF_ENV_PREFIXES

    return (*IMPORT_ENV_PREFIXES, *HF_ENV_PREFIXES, "PYTHON", "LC_", "LANG")


class _Zygote:
    """The client of the zygote (forkserver's protocol), read in the caller's thread.

    Only the test's main thread may use it (one reader of the socket; :func:`why_exec` execs a CLI
    started from another thread). A child is ``(pid, generation)``: a pid the kernel reuses starts
    a new generation, so an old handle never reads (or signals by) its successor's status."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, env: Mapping[str, str]):
        self.proc = proc
        self.pid = proc.pid
        self.alive = True
        self._sock = sock
        self._gen: dict[int, int] = {}
        self._codes: dict[tuple[int, int], int] = {}
        self._pending: set[tuple[int, int]] = set()
        self._prefixes = _import_env_prefixes()
        self._env = self._import_env(env)

    def _import_env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in env.items() if k.startswith(self._prefixes) and k not in _ALLOWED_TO_DIFFER}

    def env_differs(self, env: Mapping[str, str]) -> list[str]:
        theirs = self._import_env(env)
        return sorted(k for k in set(theirs) | set(self._env) if theirs.get(k) != self._env.get(k))

    def _gone(self) -> None:
        # The zygote died, and with it (PR_SET_PDEATHSIG) every CLI it had.
        self.alive = False
        for child in self._pending:
            self._codes.setdefault(child, -signal.SIGKILL)
        self._pending.clear()
        with contextlib.suppress(OSError):
            self.proc.poll()  # reaped if it has gone already

    def _take(self, timeout: float | None) -> dict[str, Any] | None:
        """One message, None when none came within ``timeout``; files exit notices as they come."""
        if not self.alive:
            return None
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return None
        try:
            data = self._sock.recv(forkserver.MAX_MESSAGE)
        except OSError:
            data = b""
        if not data:
            self._gone()
            return None
        msg: dict[str, Any] = json.loads(data)
        if "exit" in msg:
            child = (int(msg["exit"]), self._gen.get(int(msg["exit"]), 0))
            self._codes[child] = int(msg["code"])
            self._pending.discard(child)
        return msg

    def fork(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, stdio: tuple[int, int, int],
             keep_fd: int | None) -> tuple[int, int]:
        _main_thread_only()
        req, fds = forkserver.encode_request(argv, env=env, cwd=cwd, stdio=stdio, keep_fd=keep_fd)
        try:
            socket.send_fds(self._sock, [req], fds)
        except OSError as exc:  # EPIPE: the zygote is gone
            self._gone()
            raise OSError(f"the CLI zygote is gone ({exc})") from exc
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            msg = self._take(max(left, 0.0))
            if msg is None:
                if not self.alive or left <= 0:
                    raise OSError("the CLI zygote did not answer")
                continue
            if "exit" in msg:
                continue
            if "pid" in msg:
                pid = int(msg["pid"])
                # Its exit notice comes after this reply (the zygote reaps before it forks again).
                self._gen[pid] = self._gen.get(pid, 0) + 1
                self._pending.add((pid, self._gen[pid]))
                return pid, self._gen[pid]
            raise OSError(str(msg.get("error", "the CLI zygote refused")))

    def code(self, child: tuple[int, int], timeout: float | None) -> int | None:
        """The child's ``Popen.returncode``; None if it has not exited within ``timeout``."""
        _main_thread_only()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while self._take(0) is not None:  # every notice already here, first
                pass
            if child in self._codes:
                return self._codes[child]
            if not self.alive:
                return self._codes.setdefault(child, -signal.SIGKILL)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._take(left)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _main_thread_only() -> None:
    if not _on_main_thread():
        raise RuntimeError("tests/cli_proc.py: the zygote is read by the test's main thread only")


class _Asker:
    """What forkserver.ServedProc asks its server (code_of, wait_for), for one child of the zygote."""

    def __init__(self, zygote: _Zygote, gen: int):
        self._zygote, self._gen = zygote, gen

    def code_of(self, pid: int) -> int | None:
        return self._zygote.code((pid, self._gen), 0)

    def wait_for(self, pid: int, timeout: float | None) -> int | None:
        return self._zygote.code((pid, self._gen), timeout)


_zygote: _Zygote | None = None


def start() -> str | None:
    """Start the zygote (tests/cli_zygote.py) for this test process; why not (None: running)."""
    global _zygote
    if os.environ.get(EXEC_ENV, "").strip() not in ("", "0"):
        return f"{EXEC_ENV} is set"
    if _zygote is not None and _zygote.alive:
        return None
    try:
        _zygote = spawn_zygote()
    except OSError as exc:
        return str(exc)
    return None


def in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` to run inside network namespace ``netns``: a hwtui CLI through tests.in_netns, which
    run and Popen fork from the zygote where they can and exec as ``ip netns exec`` where they
    cannot (_execable: the decision is theirs, made with the child's own environment); anything
    else under ``ip netns exec``."""
    argv = [str(a) for a in argv]
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] in CLI_MODULES:
        return [*argv[:2], NETNS_MODULE, netns, *argv[2:]]
    return ["ip", "netns", "exec", netns, *argv]


def in_mountns(setup: str, after: str, script_args: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` (``python -m <a CLI module> ...``) run in a mount namespace of its own, after ``sh -c
    setup sh *script_args`` and before ``sh -c after sh *script_args`` (``$RC``: the run's exit
    status), exiting with the run's status (tests/in_mountns.py): run and Popen fork it from the
    zygote where they can, else exec that file with the same arguments (_execable)."""
    argv, script_args = [str(a) for a in argv], [str(a) for a in script_args]
    if len(argv) < 3 or argv[1] != "-m":
        raise ValueError(f"in_mountns runs `python -m MODULE ...`, not {argv[:3]}")
    return [*argv[:2], MOUNTNS_MODULE, setup, after, *script_args, "--", *argv[2:]]


def _execable(argv: Sequence[str]) -> list[str]:
    """``argv`` to exec: ``-m tests.in_netns NETNS ...`` as ``ip netns exec NETNS python -m ...``;
    another test wrapper module (``-m tests.in_mountns``, ``-m tests.with_umask``) as its file,
    which needs no ``tests`` package on the exec'd interpreter's path."""
    argv = [str(a) for a in argv]
    if argv[1:2] == ["-m"] and argv[2:3] == [NETNS_MODULE] and len(argv) >= 5:
        return ["ip", "netns", "exec", argv[3], argv[0], "-m", *argv[4:]]
    if argv[1:2] == ["-m"] and argv[2:3] and argv[2] in (MOUNTNS_MODULE, UMASK_MODULE):
        here = os.path.dirname(os.path.abspath(__file__))
        return [argv[0], os.path.join(here, argv[2].rsplit(".", 1)[1] + ".py"), *argv[3:]]
    return argv


def why_exec(argv: Sequence[str], env: Mapping[str, str] | None = None, kwargs: Mapping[str, Any] | None = None) -> str | None:
    """Why this CLI would be exec'd rather than forked from the zygote (None: forked)."""
    if os.environ.get(EXEC_ENV, "").strip() not in ("", "0"):
        return f"{EXEC_ENV} is set"
    if _zygote is None or not _zygote.alive:
        return "the zygote is not running"
    argv = [str(a) for a in argv]
    if argv[2:3] == [NETNS_MODULE]:
        argv = [*argv[:2], *argv[4:]]  # what runs in the namespace
    elif argv[2:3] == [UMASK_MODULE]:
        argv = [*argv[:2], *argv[4:]]  # what runs under the umask
    elif argv[2:3] == [MOUNTNS_MODULE] and "--" in argv[3:]:
        argv = [*argv[:2], *argv[argv.index("--", 3) + 1:]]  # what runs in the namespace
    if len(argv) < 3 or argv[1] != "-m" or argv[2] not in CLI_MODULES or os.path.abspath(argv[0]) != os.path.abspath(sys.executable):
        return "not `python -m hwtui...` with this interpreter"
    unsupported = sorted(set(kwargs or {}) - _SUPPORTED)
    if unsupported:
        return f"{', '.join(unsupported)} is not implemented here"
    if len(tuple((kwargs or {}).get("pass_fds", ()))) > 1:
        return "more than one pass_fds"
    if (kwargs or {}).get("close_fds") is False:
        return "close_fds=False"
    if not _on_main_thread():
        return "not the test's main thread (the zygote has one reader)"
    if len(json.dumps(dict(os.environ if env is None else env))) > forkserver.MAX_MESSAGE // 2:
        return "an environment too large for one fork-server request"
    if diff := _zygote.env_differs(os.environ if env is None else env):
        return f"the child's {', '.join(diff)} differ from the zygote's"
    return None


class ForkedCli(forkserver.ServedProc):
    """A CLI forked by the zygote: the part of ``subprocess.Popen`` the tests use (poll and wait
    are forkserver.ServedProc's, asking the zygote)."""

    def __init__(self, zygote: _Zygote, child: tuple[int, int], args: Sequence[str], stdin: IO[Any] | None,
                 stdout: IO[Any] | None, stderr: IO[Any] | None, text: tuple[str, str] | None):
        # The two questions ServedProc asks (code_of, wait_for) go to the zygote, read without a thread.
        super().__init__(_Asker(zygote, child[1]), child[0], args)  # type: ignore[arg-type]
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self._text = text  # (encoding, errors) in text mode
        self._out_fd = None if stdout is None else stdout.fileno()
        self._err_fd = None if stderr is None else stderr.fileno()
        self._chunks: dict[int, list[bytes]] = {}
        self._input = b""
        self._communication_started = False

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> ForkedCli:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr, self.stdin):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()
        self.wait()

    def communicate(self, input: str | bytes | None = None, timeout: float | None = None) -> tuple[Any, Any]:  # noqa: A002 - Popen's name
        """As ``Popen.communicate``: feed ``input`` while reading both pipes to EOF, then wait.
        TimeoutExpired carries what was read so far, and a later call goes on from there."""
        if self._communication_started and input:
            raise ValueError("Cannot send input after starting communication")
        deadline = None if timeout is None else time.monotonic() + timeout
        writer: int | None = None
        if not self._communication_started:
            self._communication_started = True
            if self.stdin is not None:
                with contextlib.suppress(BrokenPipeError):
                    self.stdin.flush()
                if input:
                    self._input = input.encode(*(self._text or ("utf-8", "strict"))) if isinstance(input, str) else bytes(input)
                    writer = self.stdin.fileno()
                else:
                    self.stdin.close()
        elif self.stdin is not None and not self.stdin.closed:
            writer = self.stdin.fileno()
        readers = {s.fileno(): s for s in (self.stdout, self.stderr) if s is not None and not s.closed}
        for fd in readers:
            self._chunks.setdefault(fd, [])
        while readers or writer is not None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise self._timeout_expired(timeout)
            readable, writable, _ = select.select(list(readers), [] if writer is None else [writer], [], left)
            if writable:
                try:
                    # At most PIPE_BUF: what a pipe that select calls writable takes without blocking.
                    self._input = self._input[os.write(writer, self._input[:select.PIPE_BUF]):]  # type: ignore[arg-type]
                except BrokenPipeError:
                    self._input = b""
                if not self._input:
                    assert self.stdin is not None
                    with contextlib.suppress(BrokenPipeError):
                        self.stdin.close()
                    writer = None
            for fd in readable:
                data = os.read(fd, 1 << 16)
                if data:
                    self._chunks[fd].append(data)
                else:
                    readers.pop(fd).close()
        try:
            self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            raise self._timeout_expired(timeout) from None
        return self._output(self._out_fd), self._output(self._err_fd)

    def _output(self, fd: int | None) -> Any:
        if fd is None:
            return None
        data = b"".join(self._chunks.get(fd, []))
        if self._text is None:
            return data
        return data.decode(*self._text).replace("\r\n", "\n").replace("\r", "\n")

    def _timeout_expired(self, timeout: float | None) -> subprocess.TimeoutExpired:
        # As subprocess: what was read so far, undecoded (a character may be cut), None if nothing.
        def raw(fd: int | None) -> bytes | None:
            return b"".join(self._chunks.get(fd, [])) or None if fd is not None else None

        return subprocess.TimeoutExpired(self.args, timeout or 0, output=raw(self._out_fd), stderr=raw(self._err_fd))


def _stdio(spec: Any, default: int, reading_side: bool) -> tuple[int, int | None, int | None]:
    """(the child's fd, our end of a pipe or None, an fd of ours to close once the child has it)."""
    if spec is None:
        return default, None, None
    if spec == subprocess.PIPE:
        r, w = os.pipe2(os.O_CLOEXEC)
        return (r, w, r) if reading_side else (w, r, w)
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDONLY if reading_side else os.O_WRONLY)
        return fd, None, fd
    if isinstance(spec, int):
        return spec, None, None
    return spec.fileno(), None, None


def _wrap(fd: int | None, mode: str, text: tuple[str, str] | None) -> IO[Any] | None:
    if fd is None:
        return None
    if text is None:
        return open(fd, mode + "b")  # noqa: SIM115 - the handle owns it, as Popen's pipes
    if mode == "w":  # as Popen's text stdin: every write goes through
        return io.TextIOWrapper(open(fd, "wb"), encoding=text[0], errors=text[1], write_through=True)  # noqa: SIM115
    return open(fd, mode, encoding=text[0], errors=text[1])  # noqa: SIM115


def _with_umask(argv: Sequence[str], kwargs: dict[str, Any]) -> tuple[Sequence[str], dict[str, Any]]:
    """A CLI's ``umask=`` as tests.with_umask around it, where that can be forked (the fork-server
    protocol carries no umask); else as given, for subprocess."""
    mask = kwargs.get("umask", -1)
    argv = [str(a) for a in argv]
    if mask == -1 or len(argv) < 3 or argv[1] != "-m" or argv[2] not in CLI_MODULES:
        return argv, kwargs
    rest = {k: v for k, v in kwargs.items() if k != "umask"}
    wrapped = [*argv[:2], UMASK_MODULE, f"{int(mask):o}", *argv[2:]]
    return (wrapped, rest) if why_exec(wrapped, rest.get("env"), rest) is None else (argv, kwargs)


def Popen(argv: Sequence[str], **kwargs: Any) -> ForkedCli | subprocess.Popen[Any]:  # noqa: N802 - subprocess's name
    """``subprocess.Popen(argv, **kwargs)`` for a hwtui CLI: forked from the zygote where it can be."""
    argv, kwargs = _with_umask(argv, kwargs)
    if why_exec(argv, kwargs.get("env"), kwargs) is not None:
        return subprocess.Popen(_execable(argv), **kwargs)
    assert _zygote is not None
    try:
        return forked(_zygote, argv, **kwargs)
    except OSError:
        if _zygote.alive:
            raise
        return subprocess.Popen(_execable(argv), **kwargs)  # the zygote died (its CLIs with it): exec from now on


def forked(zygote: _Zygote, argv: Sequence[str], **kwargs: Any) -> ForkedCli:
    """Fork ``argv`` (``python -m module ...``) from ``zygote`` with Popen's ``kwargs``, unchecked
    (:func:`why_exec` is the caller's)."""
    text_mode = bool(kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding") or kwargs.get("errors"))
    text = (kwargs.get("encoding") or locale.getpreferredencoding(False), kwargs.get("errors") or "strict") if text_mode else None
    child_in, our_in, close_in = _stdio(kwargs.get("stdin"), 0, True)
    child_out, our_out, close_out = _stdio(kwargs.get("stdout"), 1, False)
    if kwargs.get("stderr") == subprocess.STDOUT:
        child_err, our_err, close_err = child_out, None, None
    else:
        child_err, our_err, close_err = _stdio(kwargs.get("stderr"), 2, False)
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    cwd = os.getcwd() if kwargs.get("cwd") is None else os.fspath(kwargs["cwd"])  # ours now, as an exec's
    pass_fds = tuple(kwargs.get("pass_fds", ()))
    for stream in (sys.stdout, sys.stderr):  # ours, written before the child's (as with exec)
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        child = zygote.fork([str(a) for a in argv], env, cwd, (child_in, child_out, child_err),
                            pass_fds[0] if pass_fds else None)
    except BaseException:
        for fd in (our_in, our_out, our_err):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        raise
    finally:
        for fd in {close_in, close_out, close_err} - {None}:
            with contextlib.suppress(OSError):
                os.close(fd)  # type: ignore[arg-type]
    return ForkedCli(zygote, child, argv, _wrap(our_in, "w", text), _wrap(our_out, "r", text), _wrap(our_err, "r", text),
                     text)


def spawn_zygote() -> _Zygote:
    """A zygote (tests/cli_zygote.py, exec'd with this process's environment and cwd): :func:`start`
    keeps one for the session. It may still be importing when this returns: the first fork waits
    for it (REPLY_TIMEOUT_S), and one that dies meanwhile is found gone (every CLI then exec'd)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tests.cli_zygote", str(theirs.fileno()), str(os.getpid())],
                                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=sys.__stderr__)
    finally:
        theirs.close()
    return _Zygote(proc, ours, os.environ)


def zygote() -> _Zygote | None:
    """The session's zygote, while it runs."""
    return _zygote if _zygote is not None and _zygote.alive else None


def run(argv: Sequence[str], *, input: str | bytes | None = None, capture_output: bool = False,  # noqa: A002 - subprocess's name
        timeout: float | None = None, check: bool = False, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` for a hwtui CLI: forked from the zygote where it can be."""
    argv, kwargs = _with_umask(argv, kwargs)
    if why_exec(argv, kwargs.get("env"), kwargs) is not None:
        return subprocess.run(_execable(argv), input=input, capture_output=capture_output, timeout=timeout, check=check, **kwargs)
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with Popen(argv, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()  # as subprocess.run on POSIX: not the pipes, which a grandchild may hold
            raise
        code = proc.poll()
        assert code is not None
    if check and code:
        raise subprocess.CalledProcessError(code, proc.args, out, err)
    return subprocess.CompletedProcess(proc.args, code, out, err)


