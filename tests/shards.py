"""Run the suite in N single-threaded pytest processes that take whole modules from a shared queue.

``python -m tests.shards -n 4 [pytest args]`` is what ``make test`` runs.

Why not pytest-xdist: its workers carry execnet's I/O thread, and hwtui never forks a process
that has a second thread (hwtui.core.forking), so every engine launcher a test runs in-process
exec'd each rank and paid ``import torch`` (1.2 CPU-s here) per rank. These shards are plain
pytest processes with no thread of their own: the launchers fork their ranks from the shard's
preloaded torch exactly as a user's ``hwtui replicate`` does, and the suite is CPU-bound on the
machines it runs on (2 cores), so that CPU is the suite's time.

How the work is shared (what ``--dist loadscope`` did): every shard collects everything, in the
order tests/conftest.py sorts it (slowest modules first); a shard runs a module only after
claiming it, by creating ``<claims>/<module hash>`` with O_EXCL in a private directory the runner
made. A module's tests therefore run in one process (its module-scoped fixtures start once) and a
shard that finishes early takes the next unclaimed module: the queue balances itself, with no
schedule to keep up to date.

The plugin is active only when the runner passes ``--shard-claims``; plain ``pytest`` and
``pytest -n 3`` are unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hwtui.core.forking import thread_count

PROGRESS_FD_ENV = "HWTUI_SHARD_PROGRESS_FD"
# A shard that runs this long is hung (each test has pytest-timeout's 300 s): stop them all.
SUITE_DEADLINE_S = 3600.0


# -- the plugin, inside each shard --------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shards", "hwtui's module-claiming shards (tests/shards.py)")
    group.addoption("--shard-claims", default=None, help="claim directory shared by the shards")
    group.addoption("--shard-name", default="s0", help="this shard's name in progress lines")


def pytest_configure(config: pytest.Config) -> None:
    # The progress pipe is the shard's alone: no process a test starts may hold it open.
    if not config.getoption("--shard-claims"):
        return
    # A shard runs some modules only: the snapshots of the others are not "unused" (syrupy would
    # fail the shard for them).
    if hasattr(config.option, "warn_unused_snapshots"):
        config.option.warn_unused_snapshots = True
    fd = os.environ.get(PROGRESS_FD_ENV, "")
    if fd.isdigit():
        try:
            os.set_inheritable(int(fd), False)
        except OSError:
            pass


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _claim(claims: Path, module: str) -> bool:
    name = hashlib.sha256(module.encode()).hexdigest()[:32]
    try:
        fd = os.open(claims / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _modules(items: list[pytest.Item]) -> list[list[pytest.Item]]:
    """Items grouped by module, in the collected order (a module's items are contiguous)."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(_module_of(item), []).append(item)
    return list(groups.values())


def _claimed(items: list[pytest.Item], claims: Path) -> Iterator[list[pytest.Item]]:
    for group in _modules(items):
        if _claim(claims, _module_of(group[0])):
            yield group


def _progress(line: str) -> None:
    fd = os.environ.get(PROGRESS_FD_ENV)
    if fd and fd.isdigit():
        try:
            os.write(int(fd), (line.rstrip("\n") + "\n").encode())
        except OSError:
            pass  # the runner went away; the shard's own log still has everything


def _thread_names() -> str:
    """Python's names for its threads, the kernel's for native ones (a C library's pool)."""
    import threading

    python = {t.native_id: t.name for t in threading.enumerate()}
    names = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        names.append(python.get(int(tid), f"native:{comm}"))
    return ", ".join(names)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    claims_opt = session.config.getoption("--shard-claims")
    if not claims_opt:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''} during collection")
    if session.config.option.collectonly:
        return True
    claims, name = Path(claims_opt), session.config.getoption("--shard-name")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    groups = _claimed(session.items, claims)
    group = next(groups, None)
    while group is not None:
        module, started = _module_of(group[0]), time.monotonic()
        cpu0, failed0, threads = _cpu(), session.testsfailed, thread_count()
        following = None
        for i, item in enumerate(group):
            if i == len(group) - 1:
                # Claim the next module before the last item runs: nextitem decides which
                # module-scoped fixtures are torn down after it.
                following = next(groups, None)
            nextitem = group[i + 1] if i + 1 < len(group) else (following[0] if following else None)
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        failed = session.testsfailed - failed0
        # Threads left behind by an earlier module make the launchers exec their ranks (slow,
        # still correct); the line names the module that started with them.
        extra = f", started with {threads} threads" if threads > 1 else ""
        if (left := thread_count()) > threads:
            extra += f", left {left} threads ({_thread_names()})"
        _progress(f"[{name}] {module}: {len(group)} tests, {failed} failed, {time.monotonic() - started:.1f} s, "
                  f"{_cpu() - cpu0:.1f} CPU-s{extra}")
        if reporter is not None:
            reporter.write_line(f"[shard {name}] {module} done")
        group = following
    return True


def _cpu() -> float:
    """CPU seconds of this shard and of every child it has reaped (ranks, CLIs, agents)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


# -- the runner ---------------------------------------------------------------------------------

# pytest's last line, with or without -q: "=== 1 failed, 13 passed in 1.20s ===" or "13 passed in 1.20s".
_SUMMARY = re.compile(r"^(?:=+ )?(?P<body>\d+ \w+(?:, \d+ \w+)*) in [\d.]+s(?: \([\d:]+\))?(?: =+)?$")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)")


def _summary_counts(log: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in reversed(log.splitlines()):
        if (m := _SUMMARY.match(line.strip())) is not None:
            for n, kind in _COUNT.findall(m.group("body")):
                kind = {"error": "errors", "warning": "warnings"}.get(kind, kind)
                counts[kind] = counts.get(kind, 0) + int(n)
            break
    return counts


def _failure_report(log: str) -> str:
    """The shard's failures and errors sections and its short summary, for the terminal."""
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"^=+ (FAILURES|ERRORS) =+$", line)), None)
    return "\n".join(lines[start:]) if start is not None else "\n".join(lines[-40:])


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m tests.shards", description=__doc__.split("\n", 1)[0])
    parser.add_argument("-n", "--shards", type=int, default=3, help="pytest processes (default 3)")
    parser.add_argument("--also", action="append", default=[], metavar="CMD",
                        help="a check run beside the shards, e.g. 'PYTHONPATH=. mypy' (split as a shell would, never run "
                             "through one; leading NAME=value words set its environment); its failure fails the run")
    args, rest = parser.parse_known_args(argv)
    if not 1 <= args.shards <= 64:
        parser.error("-n must be between 1 and 64")
    return args, rest


def main(argv: list[str] | None = None) -> int:
    args, pytest_args = _parse(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hwtui-shards-") as tmp:
        claims = Path(tmp) / "claims"
        claims.mkdir(mode=0o700)
        procs, logs, readers = [], [], []
        sel = selectors.DefaultSelector()
        # The checks (the linters) start first and run beside the shards: they are single-threaded
        # and would otherwise leave one of the two cores idle for their whole run.
        checks = [_Check(cmd, Path(tmp) / f"check{i}.log") for i, cmd in enumerate(args.also)]
        for i in range(args.shards):
            read_end, write_end = os.pipe()
            log = open(Path(tmp) / f"s{i}.log", "w+b")
            env = dict(os.environ, **{PROGRESS_FD_ENV: str(write_end)})
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "tests.shards", f"--shard-claims={claims}",
                 f"--shard-name=s{i}", *pytest_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, pass_fds=(write_end,)))
            os.close(write_end)
            logs.append(log)
            readers.append(read_end)
            sel.register(read_end, selectors.EVENT_READ)
        print(f"tests.shards: {args.shards} pytest processes taking modules from one queue (logs in {tmp})", flush=True)
        try:
            _pump(sel, procs, checks, readers, started)
            for p in procs:
                p.wait(timeout=max(1.0, SUITE_DEADLINE_S - (time.monotonic() - started)))
        except (KeyboardInterrupt, subprocess.TimeoutExpired) as exc:
            for p in [*procs, *(c.proc for c in checks)]:
                if p.poll() is None:
                    p.send_signal(signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGKILL)
            for p in [*procs, *(c.proc for c in checks)]:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            if isinstance(exc, subprocess.TimeoutExpired):
                print(f"tests.shards: the suite ran past {SUITE_DEADLINE_S:.0f} s; every shard was stopped", flush=True)
        return _report(procs, logs, checks, started)


class _Check:
    """A command run beside the shards, its output kept in a log and shown when it fails."""

    def __init__(self, cmd: str, log_path: Path):
        words = shlex.split(cmd)
        env = dict(os.environ)
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if not words:
            raise SystemExit(f"tests.shards: --also {cmd!r} names no command")
        self.cmd, self.started = cmd, time.monotonic()
        self.log = open(log_path, "w+b")
        try:
            self.proc = subprocess.Popen(words, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        except OSError as exc:
            raise SystemExit(f"tests.shards: --also {cmd!r}: {exc.strerror or exc}") from None
        self.reported = False

    def verdict(self) -> str:
        code = self.proc.returncode
        took = time.monotonic() - self.started
        if code == 0:
            return f"tests.shards: `{self.cmd}` passed ({took:.0f} s)"
        self.log.seek(0)
        return f"tests.shards: `{self.cmd}` FAILED (exit {code}, {took:.0f} s):\n{self.log.read().decode(errors='replace').rstrip()}"


def _pump(sel: selectors.BaseSelector, procs: list[subprocess.Popen[bytes]], checks: list[_Check], readers: list[int],
          started: float) -> None:
    """Print each shard's progress lines and each check's verdict as they come, until all have exited.

    The processes' exits are watched (pidfds), not their pipes' ends: a process a test leaked could
    hold a write end open long after its shard is gone.
    """
    pending = {fd: b"" for fd in readers}
    exits: dict[int, subprocess.Popen[bytes] | _Check] = {}
    watched: list[subprocess.Popen[bytes] | _Check] = [*procs, *checks]
    for p in watched:
        pidfd = os.pidfd_open(p.proc.pid if isinstance(p, _Check) else p.pid)
        exits[pidfd] = p
        sel.register(pidfd, selectors.EVENT_READ)
    try:
        while exits:
            left = SUITE_DEADLINE_S - (time.monotonic() - started)
            if left <= 0:
                raise subprocess.TimeoutExpired("tests.shards", SUITE_DEADLINE_S)
            for key, _ in sel.select(timeout=min(left, 60.0)):
                fd = int(key.fd)
                if fd in pending:
                    _read_lines(sel, fd, pending, started)
                elif fd in exits:
                    _exited(sel, fd, exits.pop(fd))
        for fd in list(pending):  # what the shards wrote just before they exited
            os.set_blocking(fd, False)
            try:
                while fd in pending:
                    _read_lines(sel, fd, pending, started)
            except BlockingIOError:
                pass
    finally:
        for pidfd in exits:
            sel.unregister(pidfd)
            os.close(pidfd)
        for fd in pending:
            sel.unregister(fd)
            os.close(fd)


def _exited(sel: selectors.BaseSelector, pidfd: int, what: subprocess.Popen[bytes] | _Check) -> None:
    # Unregistered at once: an exited process's pidfd stays readable and would spin the loop.
    sel.unregister(pidfd)
    os.close(pidfd)
    if isinstance(what, _Check):
        what.proc.wait()
        what.reported = True
        print(what.verdict(), flush=True)
    else:
        what.wait()


def _read_lines(sel: selectors.BaseSelector, fd: int, pending: dict[int, bytes], started: float) -> None:
    chunk = os.read(fd, 65536)
    if not chunk:
        sel.unregister(fd)
        os.close(fd)
        del pending[fd]
        return
    *lines, pending[fd] = (pending[fd] + chunk).split(b"\n")
    for line in lines:
        print(f"{time.monotonic() - started:6.0f} s {line.decode(errors='replace')}", flush=True)


def _report(procs: list[subprocess.Popen[bytes]], logs: list, checks: list[_Check], started: float) -> int:
    for check in checks:
        if check.proc.poll() is None:
            check.proc.kill()
            check.proc.wait()
        if not check.reported:
            print(check.verdict(), flush=True)
        check.log.close()
    totals: dict[str, int] = {}
    codes = [p.returncode if p.returncode is not None else -9 for p in procs]
    for i, (code, log) in enumerate(zip(codes, logs, strict=True)):
        log.seek(0)
        text = log.read().decode(errors="replace")
        log.close()
        for kind, n in _summary_counts(text).items():
            totals[kind] = totals.get(kind, 0) + n
        if code != 0:
            print(f"\n----- shard s{i} exited {code}: its report -----\n{_failure_report(text)}", flush=True)
    order = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "errors", "warnings")
    body = ", ".join(f"{totals[k]} {k}" for k in order if totals.get(k))
    print(f"tests.shards: {body or 'no tests ran'} in {time.monotonic() - started:.1f} s "
          f"({len(procs)} shards, exit codes {codes})", flush=True)
    # pytest's own codes: 1 tests failed, 2 interrupted, 3 internal error, 4 usage error; a shard
    # killed by a signal counts as interrupted.
    worst = [c for c in codes if c not in (0, 1)]
    if worst:
        return worst[0] if worst[0] > 0 else 2
    return 1 if 1 in codes or any(c.proc.returncode != 0 for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
