"""The one process supervisor: every child hwtui starts goes through here.

Probe children (torch, amdsmi...), replication and training ranks and the TUI's engine all need
the same things, and each used to write them itself:

* **Its own session.** A child is started with ``start_new_session`` so one signal to its process
  group reaches everything it spawned (torch's own workers, a launcher's ranks), and a timeout or
  a stop never leaves orphans behind.
* **A dedicated answer pipe.** Structured messages travel as JSON lines on a pipe of their own
  (its fd is passed to the child), so whatever a vendor library prints on stdout or stderr can
  never corrupt them. The envelope is an event: a JSON object with a ``kind``.
* **A bounded line reader.** Lines are split incrementally and capped in length, so a child that
  writes garbage without a newline cannot make the parent's memory grow without bound.
* **Exit text.** ``exit_text(code)`` says "exited with status 3" or "was killed by SIGKILL" the same
  way everywhere.
* **Termination with grace.** SIGTERM to the group, a bounded wait, then SIGKILL to the group.
* **The same tree.** Children import hwtui from the tree the parent runs (a clone's tests, an
  editable install, site-packages): the parent's ``hwtui`` root is put first on their PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hwtui.core import forking, forkserver

# A message line longer than this is dropped (and counted): no JSON message hwtui sends comes near.
MAX_LINE_BYTES = 16 << 20
STOP_GRACE_S = 5.0


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def exit_text(code: int | None) -> str:
    """How a child ended, in words: "exited with status 1", "was killed by SIGKILL", "is running"."""
    if code is None:
        return "is still running"
    if code < 0:
        return f"was killed by {signal_name(-code)}"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        # A shell or a launcher reports a child killed by signal N as 128+N.
        return f"exited with status {code} ({signal_name(code - 128)})"
    return f"exited with status {code}"


def hwtui_root() -> str:
    """The directory that holds the ``hwtui`` package this process imported."""
    import hwtui

    return str(Path(next(iter(hwtui.__path__))).resolve().parent)


def child_env(env: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: ``env`` (default: ours) plus ``extra``, importing our hwtui tree."""
    out = dict(os.environ if env is None else env)
    out.update(extra or {})
    path = [hwtui_root(), *[p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


class LineReader:
    """Split a byte stream into lines incrementally, never holding more than ``limit`` bytes."""

    def __init__(self, limit: int = MAX_LINE_BYTES):
        self.limit = limit
        self._buf = bytearray()
        self._skipping = False  # inside an over-long line: drop until its newline
        self.dropped = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                break
            piece = chunk[start:nl]
            if self._skipping:
                self._skipping = False
            elif len(self._buf) + len(piece) > self.limit:
                self.dropped += 1
            else:
                self._buf += piece
                lines.append(bytes(self._buf))
            self._buf.clear()
            start = nl + 1
        rest = chunk[start:]
        if not self._skipping:
            if len(self._buf) + len(rest) > self.limit:
                self._buf.clear()
                self._skipping = True
                self.dropped += 1
            else:
                self._buf += rest
        return lines

    def close(self) -> bytes | None:
        """The unterminated last line, if any."""
        tail = None if self._skipping or not self._buf else bytes(self._buf)
        self._buf.clear()
        return tail


def decode_message(line: bytes | str) -> dict[str, Any] | None:
    """One JSON-lines message: a JSON object, else None (a stray print, half a line)."""
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return raw if isinstance(raw, dict) else None


def encode_message(msg: Mapping[str, Any]) -> bytes:
    # allow_nan=False: a NaN in a message is a bug upstream, and bare NaN is not JSON.
    return (json.dumps(msg, separators=(",", ":"), default=str, allow_nan=False) + "\n").encode()


class AnswerPipe:
    """The child's end of the answer pipe: one JSON-lines message per ``send``, thread-safe.

    A write to a pipe may be partial (a message larger than the pipe's buffer, a signal), so the
    rest is written until the whole line is out; the lock keeps two threads' lines from interleaving.
    """

    def __init__(self, fd: int):
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, msg: Mapping[str, Any]) -> None:
        view = memoryview(encode_message(msg))
        with self._lock:
            while view:
                view = view[os.write(self.fd, view):]

    __call__ = send


class Child:
    """One supervised child process in its own session.

    ``answer_pipe=True`` passes the write end of a pipe to the child; its fd number is available
    as ``answer_fd_arg`` before start (put it in argv with ``{answer_fd}``) and the parent reads
    messages from it. stdin/stdout/stderr are ``"pipe"``, ``"inherit"`` or ``"null"`` (stdin
    ``"pipe"``: a command channel the parent writes to, as the training coordinator does).
    """

    def __init__(self, argv: Sequence[str], *, name: str = "", env: Mapping[str, str] | None = None,
                 answer_pipe: bool = False, stdout: str = "null", stderr: str = "pipe",
                 cwd: str | None = None, text: bool = False, stdin: str = "null", fork: bool = False):
        self.name = name or Path(argv[0]).name
        self._argv = list(argv)
        self._env = env
        self._answer_pipe = answer_pipe
        self._stdout = stdout
        self._stdin = stdin
        self._stderr = stderr
        self._cwd = cwd
        self._text = text
        self.proc: subprocess.Popen[Any] | forking.ForkedProc | forkserver.ServedProc | None = None
        # fork=True: fork from this (preloaded) process instead of exec when core.forking allows;
        # why it did not is kept here (None: forked, or fork not asked).
        self._fork = fork
        self.fork_refusal: str | None = None
        self.forked = False
        self.answer_fd: int | None = None  # parent's read end
        self.reader = LineReader()
        self.stopped = False

    @staticmethod
    def _stream(how: str) -> Any:
        return {"pipe": subprocess.PIPE, "inherit": None, "null": subprocess.DEVNULL}[how]

    def start(self) -> Child:
        wfd = None
        argv = self._argv
        if self._answer_pipe:
            self.answer_fd, wfd = os.pipe()
            argv = [a.replace("{answer_fd}", str(wfd)) for a in argv]
        try:
            self.proc = self._spawn(argv, wfd)
        except BaseException:
            if self.answer_fd is not None:
                os.close(self.answer_fd)
                self.answer_fd = None
            raise
        finally:
            if wfd is not None:
                os.close(wfd)  # the child has its own copy
        return self

    def _spawn(self, argv: list[str], wfd: int | None) -> Any:
        """The child process: forked where that was asked for and is safe, else exec'd."""
        env = child_env(self._env)
        if self._fork:
            server = forkserver.server()  # a process with threads forks through its server, if it has one
            self.fork_refusal = forking.refusal(argv, env, threads_ok=server is not None)
            if self.fork_refusal is None:
                try:
                    proc = self._start_forked(argv, env, wfd, server)
                except OSError as exc:
                    if server is None:
                        raise
                    self.fork_refusal = f"the fork server failed ({exc})"  # exec'd below, as before
                else:
                    self.forked = True
                    return proc
        kwargs: dict[str, Any] = {"text": True, "encoding": "utf-8", "errors": "replace", "bufsize": 1} if self._text else {}
        return subprocess.Popen(  # noqa: S603 - an argv list, never a shell
            argv, stdin=self._stream(self._stdin), stdout=self._stream(self._stdout), stderr=self._stream(self._stderr),
            pass_fds=(wfd,) if wfd is not None else (), start_new_session=True, env=env, cwd=self._cwd, **kwargs,
        )

    def _start_forked(self, argv: list[str], env: dict[str, str], wfd: int | None,
                      server: forkserver.ForkServer | None = None) -> forking.ForkedProc | forkserver.ServedProc:
        """The fork path of start(): the same fds, session and environment an exec'd child gets."""
        child_fds: list[int | None] = []
        parent_ends: list[tuple[int, int]] = []  # (stdio index, our end of its pipe)
        to_close: list[int] = []
        try:
            for i, how in enumerate((self._stdin, self._stdout, self._stderr)):
                if how == "inherit":
                    child_fds.append(None)
                elif how == "null":
                    fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                    to_close.append(fd)
                    child_fds.append(fd)
                else:
                    r, w = os.pipe2(os.O_CLOEXEC)
                    theirs, ours = (r, w) if i == 0 else (w, r)
                    to_close.append(theirs)
                    parent_ends.append((i, ours))
                    child_fds.append(theirs)
            fork = server.fork_module if server is not None else forking.fork_module
            proc = fork(argv, env=env, cwd=self._cwd, stdio=(child_fds[0], child_fds[1], child_fds[2]), keep_fd=wfd)
        except BaseException:
            for _, ours in parent_ends:
                os.close(ours)
            raise
        finally:
            for fd in to_close:
                os.close(fd)
        for i, ours in parent_ends:
            raw: IO[Any] = os.fdopen(ours, "wb" if i == 0 else "rb")
            if self._text:
                raw = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", line_buffering=(i == 0))
            setattr(proc, ("stdin", "stdout", "stderr")[i], raw)
        return proc

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def terminate(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the group, wait ``grace_s``, SIGKILL it; then clear the group either way."""
        self.stopped = True
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(grace_s)
        # Processes the child spawned may outlive it; the group is ours, clear it.
        self.signal_group(signal.SIGKILL)
        return self.proc.poll()

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_GRACE_S)

    def close(self) -> None:
        if self.answer_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.answer_fd)
            self.answer_fd = None

    def send(self, msg: Mapping[str, Any]) -> None:
        """One message down the child's stdin (``stdin="pipe"``); raises OSError if it is gone."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(encode_message(msg) if not self._text else encode_message(msg).decode())
        self.proc.stdin.flush()

    def stdout_lines(self) -> Iterator[str]:
        """stdout lines (text mode) until the child closes it."""
        assert self.proc is not None and self.proc.stdout is not None
        yield from self.proc.stdout

    def stderr_stream(self) -> IO[Any] | None:
        return None if self.proc is None else self.proc.stderr


@dataclass
class Message:
    child: Child
    msg: dict[str, Any] | None  # None: the child's answer pipe closed


class Group:
    """Several children whose answer pipes are watched together with one selector (bounded waits)."""

    def __init__(self) -> None:
        self.children: list[Child] = []
        self._sel = selectors.DefaultSelector()

    def add(self, child: Child) -> Child:
        if child.proc is None:
            child.start()
        self.children.append(child)
        if child.answer_fd is not None:
            os.set_blocking(child.answer_fd, False)
            self._sel.register(child.answer_fd, selectors.EVENT_READ, child)
        return child

    @property
    def open_pipes(self) -> int:
        return len(self._sel.get_map())

    def poll(self, timeout: float) -> list[Message]:
        """Messages that arrived within ``timeout`` seconds (an empty list when none did)."""
        out: list[Message] = []
        if not self._sel.get_map():
            time.sleep(timeout)
            return out
        for key, _ in self._sel.select(timeout=timeout):
            child: Child = key.data
            try:
                chunk = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self._sel.unregister(key.fd)
                tail = child.reader.close()
                if tail is not None and (msg := decode_message(tail)) is not None:
                    out.append(Message(child, msg))
                child.close()
                out.append(Message(child, None))
                continue
            for line in child.reader.feed(chunk):
                if (msg := decode_message(line)) is not None:
                    out.append(Message(child, msg))
        return out

    def exit_codes(self) -> dict[Child, int | None]:
        return {c: c.poll() for c in self.children}

    def terminate(self, grace_s: float = 2.0) -> None:
        """SIGTERM every live group, one shared grace period, then SIGKILL what is left."""
        alive = [c for c in self.children if c.running]
        for c in alive:
            c.stopped = True
            c.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.wait(timeout=max(0.0, deadline - time.monotonic()))
        for c in self.children:
            c.signal_group(signal.SIGKILL)
            if c.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.wait(timeout=STOP_GRACE_S)

    def close(self) -> None:
        for key in list(self._sel.get_map().values()):
            self._sel.unregister(key.fd)
        for c in self.children:
            c.close()
        self._sel.close()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.terminate()
        self.close()


def run_for_answer(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                   name: str = "", cwd: str | None = None) -> tuple[int, dict[str, Any] | None, str, bool]:
    """Start a child with an answer pipe, wait at most ``timeout`` s for it to exit.

    Returns (exit code, the last message it sent or None, its stderr tail, timed_out). On a timeout
    the whole group is killed.
    """
    child = Child(argv, name=name, env=env, answer_pipe=True, stdout="null", stderr="pipe", cwd=cwd).start()
    group = Group()
    group.add(child)
    last: dict[str, Any] | None = None
    err = bytearray()
    stderr = child.stderr_stream()
    assert stderr is not None
    os.set_blocking(stderr.fileno(), False)
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while True:
            for m in group.poll(0.02):
                if m.msg is not None:
                    last = m.msg
            with contextlib.suppress(BlockingIOError, OSError):
                while block := stderr.read(65536):
                    err += block
                    del err[:-4000]
            if child.poll() is not None and not group.open_pipes:
                break
            if child.poll() is not None and time.monotonic() > deadline:
                break  # a grandchild holds the pipe open: the child itself has answered or not
            if time.monotonic() > deadline:
                timed_out = True
                child.kill()
                break
    finally:
        group.terminate(grace_s=0.0)
        group.close()
        with contextlib.suppress(OSError):
            stderr.close()
    code = child.poll()
    return (code if code is not None else -signal.SIGKILL), last, bytes(err).decode(errors="replace")[-2000:], timed_out


def python_module(module: str, *args: str) -> list[str]:
    """argv for ``python -m module args...`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


@dataclass
class Captured:
    """What ``run_capture`` saw: exit code (None on a timeout), bounded stdout and stderr."""

    code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False


def run_capture(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                cwd: str | None = None, limit: int = 1 << 20) -> Captured:
    """Run a short command to completion in its own session, its output captured and capped.

    For the tools hwtui asks a question (``timedatectl``, ``hl-smi``, ``hwtui cluster init`` from
    the TUI): unlike ``subprocess.run(timeout=...)``, a timeout kills the command's whole group,
    and a command that prints without end cannot grow our memory past ``limit`` bytes a stream.
    Raises OSError when the command cannot be started.
    """

    child = Child(argv, name=Path(argv[0]).name, env=env, cwd=cwd, stdout="pipe", stderr="pipe").start()
    assert child.proc is not None and child.proc.stdout is not None and child.proc.stderr is not None
    kept: dict[str, bytearray] = {"out": bytearray(), "err": bytearray()}

    def drain(name: str, stream: IO[bytes]) -> None:
        while block := stream.read(65536):
            room = limit - len(kept[name])
            if room > 0:
                kept[name] += block[:room]

    readers = [threading.Thread(target=drain, args=(n, s), daemon=True)
               for n, s in (("out", child.proc.stdout), ("err", child.proc.stderr))]
    for r in readers:
        r.start()
    timed_out = False
    try:
        code: int | None = child.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out, code = True, None
    child.kill()  # the group: whatever the command left behind, and the command itself on a timeout
    for r in readers:
        r.join(1.0)
    return Captured(code, kept["out"].decode(errors="replace"), kept["err"].decode(errors="replace"), timed_out)
