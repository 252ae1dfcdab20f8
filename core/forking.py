"""Start ``python -m module`` children by forking a launcher that already imported the heavy modules.

Every rank is ``python -m hwtui.engine.<...>.worker``: a fresh interpreter whose first act is
``import torch`` (0.75-1 s of CPU here). N ranks paid N imports. Instead the launcher imports the
engine's preload list once (:func:`preload`) while it is still single-threaded, and
:class:`~hwtui.core.supervisor.Child` forks each rank from it and runs the module as ``__main__``
in the fork. The rank stays the launcher's own child (waitpid, exit status and signals are as with
exec), gets its own session, its answer pipe and stdio on the same fds an exec'd child gets, its
own environment, and nothing else of the launcher's: every other fd is closed, signal handlers,
the signal mask and atexit are reset, and it ends with ``os._exit``.

Why fork rather than a zygote process relaying exit statuses over a socket: the ranks stay plain
children, so every guarantee of :class:`Child` (group signals, exit_text, PDEATHSIG on the
launcher) holds unchanged, with no second protocol and no fd passing to get wrong. A process that
has threads by design (the node agent) cannot fork so; it starts a zygote once, before its first
thread (:mod:`hwtui.core.forkserver`), and ``Child(fork=True)`` goes through it.

A fork is refused (and the child exec'd as before, the reason kept in :func:`refusal`) when:
* ``HWTUI_FORK_RANKS=0`` in the environment;
* nothing was preloaded (no gain), or the preload failed;
* the process has another thread, Python's or native (``/proc/self/task``): a fork copies only
  the calling thread, and a lock another thread held would stay locked in the child forever;
* the child's interpreter is not ours, or an environment variable that the preloaded modules read
  at import time (the engine names their prefixes) differs between us and the child: those values
  were fixed by our import and the child would silently run with ours;
* the engine's ``fork_ok`` predicate says no (the engine checks that no device runtime is
  initialised: CUDA must never be touched before a fork).

core never imports torch: the engine passes module names and callables.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

ENV_SWITCH = "HWTUI_FORK_RANKS"

_preloaded: tuple[str, ...] = ()
_preload_error: str | None = None
_import_env_prefixes: tuple[str, ...] = ()
_import_env_except: frozenset[str] = frozenset()
_import_env: dict[str, str] = {}
_after_fork: Callable[[], None] | None = None
_fork_ok: Callable[[], str | None] | None = None


def enabled_by_env(env: Mapping[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(ENV_SWITCH, "1").strip().lower() not in ("0", "no", "false", "off")


def thread_count() -> int:
    """Threads of this process, native ones included (Python's ``threading`` sees only its own)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


# A Python thread that has finished (``threading`` no longer counts it) is still in /proc/self/task
# while it exits: microseconds, a few ms on a loaded box. A launcher that reached its fork right
# after one exec'd every rank: `hwtui train` checks the devices with the probes' threads just
# before it preloads, and 52 of 200 such checks left one there; a CLI whose modules were already
# imported (nothing in between) met it in a suite run. Waited for, by state and bounded; threads
# still there after the bound are native ones for good (an OpenMP pool) and never waited for again.
EXITING_THREAD_WAIT_S = 1.0
_lasting_tids: set[str] = set()


def settled_thread_count(bound_s: float = EXITING_THREAD_WAIT_S, *, python_threads: bool = False) -> int:
    """:func:`thread_count`, once threads on their way out have left.

    Only threads Python has finished with are waited for, and only when Python counts no other
    (a process with threads by design, the agent, is not held up). ``python_threads``: any thread
    is waited for, up to the bound (the test suite between tests: a test's library threads, an
    event loop's executor or a server's handler, end a moment after the test does)."""
    try:
        tasks = set(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()
    if len(tasks) <= 1 or (not python_threads and threading.active_count() > 1):
        return len(tasks)
    me = str(threading.get_native_id())
    deadline = time.monotonic() + bound_s
    while tasks - _lasting_tids - {me} and time.monotonic() < deadline:
        time.sleep(0.001)
        with contextlib.suppress(OSError):
            tasks = set(os.listdir("/proc/self/task"))
    _lasting_tids.update(tasks - {me})
    return len(tasks)


def preload(modules: Sequence[str], *, import_env_prefixes: Sequence[str] = (), import_env_except: Sequence[str] = (),
            quiet_env: Mapping[str, str] | None = None, after_fork: Callable[[], None] | None = None,
            fork_ok: Callable[[], str | None] | None = None) -> str | None:
    """Import ``modules`` once so forked children share them; returns why forking is off, or None.

    ``quiet_env`` is set in our environment for the import only where unset (e.g.
    ``OPENBLAS_NUM_THREADS=1``: numpy's BLAS otherwise starts a thread pool at import, and a
    process with threads is never forked). ``after_fork`` runs in each child once its environment
    is in place (re-applying what the import read, e.g. the intra-op thread count).
    """
    global _preloaded, _preload_error, _import_env_prefixes, _import_env, _after_fork, _fork_ok, _import_env_except
    if not enabled_by_env():
        return refusal()
    if _preloaded:
        return refusal()  # imported already: keep the environment of that import, not today's
    if (threads := settled_thread_count()) > 1:
        _preload_error = f"the launcher already has {threads} threads before the preload"
        return _preload_error
    set_here = [k for k in (quiet_env or {}) if k not in os.environ]
    try:
        for k in set_here:
            os.environ[k] = (quiet_env or {})[k]
        for name in modules:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - a broken install: ranks exec and report it themselves
        _preload_error = f"preloading failed ({type(exc).__name__}: {exc})"
        return _preload_error
    finally:
        for k in set_here:
            os.environ.pop(k, None)
    _preloaded = tuple(modules)
    # An earlier attempt refused for a thread that has ended since is history: forks work now (it
    # used to stick, and one launch that met a passing thread made every later one in the process exec).
    _preload_error = None
    _import_env_prefixes = tuple(import_env_prefixes)
    _import_env_except = frozenset(import_env_except)
    _import_env = _env_with_prefixes(os.environ)
    _after_fork, _fork_ok = after_fork, fork_ok
    return refusal()


def _env_with_prefixes(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_import_env_prefixes) and k not in _import_env_except}


def refusal(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, *,
            threads_ok: bool = False) -> str | None:
    """Why a child with this argv and env would be exec'd rather than forked (None: it is forked).

    ``threads_ok``: the fork happens in this process's fork server (core.forkserver), which was
    single-threaded when it was forked, so our threads do not matter."""
    if not enabled_by_env() or (env is not None and not enabled_by_env(env)):
        return f"{ENV_SWITCH}=0"
    if _preload_error is not None:
        return _preload_error
    if not _preloaded:
        return "nothing was preloaded"
    if not threads_ok and (n := settled_thread_count()) > 1:
        return f"the launcher has {n} threads (a fork copies only one)"
    # Paths as given, not resolved: another venv's bin/python links to the same base interpreter
    # as ours, but its site-packages (its torch) are its own.
    if argv is not None and (len(argv) < 3 or argv[1] != "-m" or os.path.abspath(argv[0]) != os.path.abspath(sys.executable)):
        return "the child is not `python -m` with this interpreter"
    if env is not None:
        theirs = _env_with_prefixes(env)
        diff = sorted(k for k in set(theirs) | set(_import_env) if theirs.get(k) != _import_env.get(k))
        if diff:
            return f"the child's {', '.join(diff)} differ from the preloaded import's"
    if _fork_ok is not None and (why := _fork_ok()) is not None:
        return why
    return None


def reset_for_tests() -> None:
    global _preloaded, _preload_error, _import_env_prefixes, _import_env, _after_fork, _fork_ok, _import_env_except
    _preloaded, _preload_error, _import_env_prefixes, _import_env, _after_fork, _fork_ok = (), None, (), {}, None, None
    _import_env_except = frozenset()


class ForkedProc:
    """The parent's handle on a forked child, with the part of ``subprocess.Popen`` hwtui uses."""

    def __init__(self, pid: int, args: Sequence[str]):
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        self._lock = threading.Lock()

    def _reap(self, flags: int) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:
                self.returncode = self.returncode if self.returncode is not None else 255
                return self.returncode
            if pid == 0:
                return None
            self.returncode = os.waitstatus_to_exitcode(status)  # -N when killed by signal N, as Popen
            return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            code = self._reap(0)
            assert code is not None
            return code
        deadline = time.monotonic() + timeout
        pidfd = -1
        with contextlib.suppress(OSError, AttributeError):
            pidfd = os.pidfd_open(self.pid)
        try:
            while (code := self.poll()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                if pidfd >= 0:
                    select.select([pidfd], [], [], left)
                else:
                    time.sleep(min(left, 0.01))
            return code
        finally:
            if pidfd >= 0:
                os.close(pidfd)


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent (the thread that forked it) dies, so no
    orphan ever holds a port, a GPU or a resident rank's staging copy. One place for every process
    hwtui starts: replication and training ranks, resident ranks, the fork server and its children."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _null_fd(flags: int) -> int:
    return os.open(os.devnull, flags)


def fork_module(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, stdio: tuple[int | None, int | None, int | None],
                keep_fd: int | None) -> ForkedProc:
    """Fork a child that runs ``argv`` (``python -m module args``) in this interpreter.

    ``stdio``: for fd 0, 1, 2 the fd to put there (``None``: inherit ours). ``keep_fd`` (the answer
    pipe's write end) stays open at its number; every other fd of ours is let go in the child (its
    number held by /dev/null: _become_child).
    """
    module, args = argv[2], list(argv[3:])
    # Buffered output of ours must not be written twice (once by us, once by the child's flush).
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    pid = os.fork()
    if pid:
        return ForkedProc(pid, argv)
    run_in_child(module, args, env=env, cwd=cwd, stdio=stdio, keep_fd=keep_fd)


def run_in_child(module: str, args: list[str], *, env: Mapping[str, str], cwd: str | None,
                 stdio: tuple[int | None, int | None, int | None], keep_fd: int | None) -> NoReturn:
    """In a freshly forked child: become the child (see :func:`fork_module`) and run ``module`` as
    ``__main__``. Nothing here may return into the forking process's stack: it ends in os._exit."""
    # First, the heap the child was forked with (the preload, torch: ~400k objects, and whatever
    # else the launcher holds) goes to the permanent generation, as the gc module's docs advise for
    # a fork. The child's collections never walk it (nor touch its pages, which stay shared): a
    # 2-worker `hwtui train` start cost 0.45 CPU-s less (3.3 -> 2.9), the workers' lazy imports
    # (torch._dynamo) no longer paying a full collection of torch each. And the launcher's garbage
    # is never collected here, where freeing it would close fd numbers the child has reused (see
    # _become_child). The launcher's own heap is untouched.
    gc.freeze()
    _lasting_tids.clear()  # the launcher's threads, not the child's
    code = 1
    try:
        _become_child(module, args, env, cwd, stdio, keep_fd)
        code = _run_main(module, args)
    except BaseException:  # noqa: BLE001 - set-up failed: say so on stderr, exit 1
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _become_child(module: str, args: list[str], env: Mapping[str, str], cwd: str | None,
                  stdio: tuple[int | None, int | None, int | None], keep_fd: int | None) -> None:
    os.setsid()
    # Signals as a fresh interpreter has them: our handlers (the launcher's Stop) must not run here.
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as CPython's start-up sets it
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    atexit._clear()  # the launcher's exit handlers are not the child's
    # ...but what a fresh interpreter has registered is: logging's flush of its handlers, and
    # weakref.finalize's exit hook (registered again by the next finalize the child makes).
    if (logging := sys.modules.get("logging")) is not None:
        atexit.register(logging.shutdown)
    import weakref

    weakref.finalize._registered_with_atexit = False  # type: ignore[attr-defined]
    # stdio: dup2 onto 0-2, after moving the kept fd out of the way if it sits there.
    if keep_fd is not None and keep_fd < 3:
        keep_fd = os.dup(keep_fd)  # pragma: no cover - only when the launcher runs with 0-2 closed
    for target, src in enumerate(stdio):
        if src is not None and src != target:
            os.dup2(src, target)
    if keep_fd is not None:
        os.set_inheritable(keep_fd, True)  # as Popen's pass_fds: a process the child execs keeps it
    keep = {0, 1, 2} | ({keep_fd} if keep_fd is not None else set())
    # Everything else of the launcher's (its pipes to other ranks, sockets, selectors) is let go,
    # but its numbers stay taken, by /dev/null, for the child's life. Why not close them: the
    # launcher's Python objects that own those numbers were copied with its heap, and one that is
    # freed here (a socket or a TCPStore in a garbage cycle of an earlier run, collected by the
    # child's gc) closes its number. Closed, that number went to the child's next socket: in a
    # test shard, rank 0's own c10d store connection was closed under it ("Broken pipe") by a
    # training launcher's store left from the test before. Now such a close hits a /dev/null copy
    # (and run_in_child froze that heap: a garbage cycle of the launcher's is never collected here).
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for fd in sorted(_open_fds() - keep - {null}):
        with contextlib.suppress(OSError):
            os.dup2(null, fd, inheritable=False)
    os.close(null)
    if cwd is not None:
        os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)  # putenv too: C code (gloo, torch.distributed) reads these
    if sys.path:  # `python -m` puts its working directory first: the child's, not the launcher's
        sys.path[0] = os.getcwd()
    _fresh_stdio(env)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [p for p in path if p not in sys.path]
    if _after_fork is not None:
        _after_fork()


def _fresh_stdio(env: Mapping[str, str]) -> None:
    """sys.stdin/stdout/stderr on fds 0-2, as a fresh interpreter has them.

    The fork copies the launcher's Python stream objects, and those need not be its fds: pytest's
    capture, an app that redirected its output, a StringIO. Left alone, the child's print() and
    tracebacks would go into its copy of those objects (lost), or to an fd closed above.
    faulthandler likewise held an fd of the launcher's, now closed or reused (the answer pipe).
    """
    import faulthandler
    import io
    import locale

    faulthandler.disable()
    encoding = "utf-8" if sys.flags.utf8_mode else (locale.getpreferredencoding(False) or "utf-8")
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    streams: list[io.TextIOWrapper | None] = []
    for fd in (0, 1, 2):
        try:
            raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
        except OSError:
            streams.append(None)  # as CPython: a closed standard fd gives a None stream
            continue
        buffered: io.BufferedReader | io.BufferedWriter = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
        # newline="\n": CPython's standard streams translate nothing (a "\r\n" read stays one).
        streams.append(io.TextIOWrapper(buffered, encoding=encoding, errors="backslashreplace" if fd == 2 else "strict",
                                        newline="\n", line_buffering=fd == 2 or raw.isatty(),
                                        write_through=unbuffered and fd != 0))
    # logging handlers made before the fork (a preloaded library's: transformers' logger binds the
    # sys.stderr of its import) write to the launcher's stream object; an exec'd child would have
    # bound its own. Seen when the launcher's stderr was pytest's capture: "--- Logging error ---".
    moved = {id(old): new for old, new in ((sys.stdout, streams[1]), (sys.__stdout__, streams[1]),
                                          (sys.stderr, streams[2]), (sys.__stderr__, streams[2])) if old is not None}
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]
    _rebind_log_handlers(moved)
    if env.get("PYTHONFAULTHANDLER") and sys.stderr is not None:
        faulthandler.enable(sys.stderr)


def _rebind_log_handlers(moved: Mapping[int, object]) -> None:
    """Point each logging.StreamHandler at the child's stream where it held one the fork replaced."""
    logging = sys.modules.get("logging")
    if logging is None:
        return
    for ref in list(getattr(logging, "_handlerList", [])):
        handler = ref()
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and id(stream) in moved:
            new = moved[id(stream)]
            if new is None:  # the child has no such stream: nothing, as a closed fd gives a fresh interpreter
                new = open(os.devnull, "w")  # noqa: SIM115 - the handler owns it for the child's life
            handler.stream = new  # not setStream: it flushes the old stream, the launcher's


def _open_fds() -> set[int]:
    try:
        return {int(n) for n in os.listdir("/proc/self/fd")}
    except OSError:  # pragma: no cover - no /proc: close a generous range
        return set(range(3, 4096))


def _run_main(module: str, args: list[str]) -> int:
    """Run ``module`` as ``__main__`` the way ``python -m`` does; its exit code."""
    sys.argv = [module, *args]
    # A preloaded ``module`` (the agent preloads its resident rank's module, for the imports it
    # makes) is forgotten first: ``python -m`` runs a module that no one imported, and runpy, finding
    # it imported, ran it a second time beside the first and warned so on every child's stderr
    # ("found in sys.modules ... unpredictable behaviour"). Its own imports stay preloaded.
    sys.modules.pop(module, None)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # As CPython: die of SIGINT so the parent sees how it ended.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130  # pragma: no cover
    except BaseException:  # noqa: BLE001 - an uncaught exception: sys.excepthook (a traceback), status 1
        sys.excepthook(*sys.exc_info())
        return 1
    finally:
        # As the interpreter ends: its non-daemon threads are waited for, then its exit handlers
        # run (the child's own, registered after the fork: the launcher's were cleared).
        with contextlib.suppress(Exception):
            threading._shutdown()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()
    return 0
