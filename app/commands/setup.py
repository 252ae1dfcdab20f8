"""``hwtui setup``: one Python environment per GPU vendor present, each with the torch its driver takes.

Plans from the detected hardware (so ``--sysroot`` / ``--replay`` plan for a recorded machine),
prints the exact commands with ``--dry-run``, otherwise runs them (uv when it is on PATH, venv +
pip otherwise; each step bounded by ``--step-timeout``), links this hwtui tree into each
environment with a ``.pth`` file, and records the environments in the config file, where
``hwtui train`` and the check find them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports probes lazily (startup time); the names are for mypy only
    from hwtui.probes.framework import Facts
    from hwtui.probes.host import Host
    from hwtui.probes.vendor_envs import EnvPlan, Step

from hwtui.core.errors import EXIT_FAILED, EXIT_OK, HwtuiError
from hwtui.core.redact import redact_text

HELP = "create one Python environment per GPU vendor with the matching torch wheel, and record it for `train`"

if TYPE_CHECKING:
    from hwtui.probes.framework import Facts
    from hwtui.probes.host import Host
    from hwtui.probes.vendor_envs import EnvPlan, Step



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="print the exact commands and the config change; run nothing")
    parser.add_argument("--vendor", action="append", choices=("NVIDIA", "AMD", "Intel"),
                        help="only this vendor (repeatable; default: every vendor with a usable GPU here)")
    parser.add_argument("--dir", metavar="DIR", help="where the environments go (default: $XDG_DATA_HOME/hwtui/envs)")
    parser.add_argument("--python", metavar="PYTHON", default=sys.executable,
                        help="base interpreter for the environments (default: the one running hwtui)")
    parser.add_argument("--tool", choices=("auto", "uv", "pip"), default="auto", help="installer (default: uv if on PATH)")
    parser.add_argument("--index-url", metavar="URL", default=None,
                        help="base of the per-build torch indexes (default https://download.pytorch.org/whl); "
                             "<URL>/<tag> is used, e.g. <URL>/cu128")
    parser.add_argument("--deps-index-url", metavar="URL", default=None,
                        help="index for the engine's other packages (default: pip's own)")
    parser.add_argument("--torch-version", metavar="X.Y.Z", default=None,
                        help="the torch release to pin (default 2.9.1; cu118: 2.7.1, cu129: 2.8.0); the build "
                             "installed is exactly torch==<X.Y.Z>+<tag> from <URL>/<tag>")
    parser.add_argument("--step-timeout", type=float, default=1800.0, metavar="S",
                        help="longest one install step may take (default 1800 s)")


def _facts(host: Host) -> Facts:
    from hwtui.probes.catalog import catalog
    from hwtui.probes.framework import collect

    collectors, _ = catalog()
    facts, _problems = collect(host, [c for c in collectors if c.name in ("pci", "nvml", "host")])
    return facts


def run(args: argparse.Namespace) -> int:
    from hwtui.app.host_args import host_from_args
    from hwtui.core.supervisor import hwtui_root
    from hwtui.probes import vendor_envs as ve
    from hwtui.probes.torchwheel import INDEX_URL

    if not 0 < args.step_timeout <= 86400:
        raise HwtuiError(f"--step-timeout {args.step_timeout}: give seconds in (0, 86400]")
    try:
        for option, url in (("--index-url", args.index_url), ("--deps-index-url", args.deps_index_url)):
            if url is not None:
                ve.check_index_url(option, url)
    except ValueError as exc:
        raise HwtuiError(str(exc)) from None
    if args.torch_version is not None and not re.fullmatch(r"\d+\.\d+(\.\d+)?", args.torch_version):
        raise HwtuiError(f"--torch-version {redact_text(args.torch_version)[:40]!r}: give a release such as 2.9.1 "
                         "(the build tag is added from the hardware)")
    host = host_from_args(args)
    verbosity = getattr(args, "verbosity", 0)
    if not host.is_live and not args.dry_run and verbosity >= 0:
        # Preparing environments for another machine's GPUs (an image built elsewhere) is allowed; say it.
        print(f"hwtui setup: planning for {host.description}; the environments are created on this machine",
              file=sys.stderr)
    base = os.path.abspath(args.dir) if args.dir else ve.envs_dir(os.environ)
    plans = ve.plan_environments(_facts(host), base, set(args.vendor or ()))
    if not plans:
        wanted = f" from {', '.join(args.vendor)}" if args.vendor else ""
        print(f"hwtui setup: no usable NVIDIA, AMD or Intel GPU{wanted} on {host.description}: nothing to set up",
              file=sys.stderr)
        return EXIT_OK
    tool = args.tool if args.tool != "auto" else ("uv" if shutil.which("uv") else "pip")
    if tool == "uv" and not shutil.which("uv") and not args.dry_run:
        raise HwtuiError("--tool uv: uv is not on PATH (install it, or use --tool pip)")
    root = hwtui_root()
    config = ve.config_path(os.environ)
    index_url = args.index_url or INDEX_URL
    work = [(plan, ve.torch_requirement(plan.tag, args.torch_version),
             ve.commands_for(plan, args.python, tool, root, index_url, args.deps_index_url, args.torch_version))
            for plan in plans]
    if args.dry_run:
        for plan, torch, steps in work:
            print(_plan_text(plan, torch, steps, root, config, quiet=False))
        print(f"hwtui setup: dry run, nothing was run; without --dry-run the environments are recorded in {config}",
              file=sys.stderr)
        return EXIT_OK
    # Every step of every environment, known before the first runs: the bar's total.
    printer = SetupPrinter(sys.stdout, sys.stderr, sum(len(steps) + 1 for _, _, steps in work), verbosity)
    try:
        for plan, torch, steps in work:
            text = _plan_text(plan, torch, steps, root, config, quiet=verbosity < 0)
            if text:
                printer.say(text)
            _set_up(plan, torch, steps, args, tool, root, index_url, printer)
            printer.say(f"hwtui setup: {plan.vendor} environment ready: {plan.python}", sys.stderr)
    except BaseException:
        printer.failed()  # the bar gives way to the error line; under -q the failed step's output comes first
        raise
    printer.finish()
    return EXIT_OK


def _plan_text(plan: EnvPlan, torch: str, steps: list[Step], root: str, config: str, quiet: bool) -> str:
    """What setup will do for ``plan``: the exact commands (printed as they are with --dry-run);
    under -q only a warning."""
    from hwtui.probes import vendor_envs as ve

    lines = [] if quiet else [f"# {plan.vendor}: {', '.join(plan.devices)} -> {torch} from {plan.tag}'s index only, "
                              f"in {plan.path}"]
    if plan.note:
        lines.append(f"# warning: {plan.note}")
    if not quiet:
        lines += [ve.shell_line(step) for step in steps]
        lines.append(f"# then: link {root} into the environment ({plan.backend}.pth) and record {plan.python} in {config}")
    return "\n".join(lines)


def _set_up(plan: EnvPlan, torch: str, steps: list[Step], args: argparse.Namespace, tool: str, root: str, index_url: str,
            printer: SetupPrinter) -> None:
    """Run one environment's steps, then check, link and record it; a failed step leaves nothing behind."""
    from hwtui.probes import vendor_envs as ve

    created = not os.path.exists(plan.path)
    try:
        for step in steps:
            printer.start(f"{plan.vendor}: {step.what}")
            _run_step(step.argv, args.step_timeout, ve.isolated_env(os.environ) if step.isolated else None, printer.relay)
        printer.start(f"{plan.vendor}: check {torch}, link hwtui and record")
        _check_torch(plan, torch)
        _link_hwtui(plan, root)
    except HwtuiError:
        if created:  # no half-built environment is left behind to be mistaken for a working one
            shutil.rmtree(plan.path, ignore_errors=True)
        raise
    try:
        ve.record_environments({plan.backend: ve.record_entry(plan, tool, torch.split("==", 1)[1], index_url)})
    except (OSError, ValueError) as exc:
        raise HwtuiError(f"environment {plan.path} is ready but could not be recorded: {exc}") from None


class SetupPrinter:
    """``hwtui setup``'s progress: % of the steps of every environment (create, torch, the engine's
    packages, check), the step running named; the installer's output relayed above the bar.

    No ETA: the steps' durations differ by orders of magnitude and by vendor (a venv in 0.3 s, a
    ROCm torch of 4 GB in minutes, a CUDA one of 2.5 GB), so a rate from the finished steps would
    promise seconds for a download of minutes; and nothing the installer prints while running says
    how far it is. The % counts steps finished, never a clock.

    Modes (:func:`hwtui.app.output.progress.mode_for`): a redrawn bar on a terminal; a plain line as
    each step starts elsewhere; with -q no progress and no installer output, except the failed
    step's (its last lines) before the error, which says "the output above says why".
    """

    TAIL = 200  # lines of a quiet step's output kept for its failure

    def __init__(self, out: IO[str], err: IO[str], total: int, verbosity: int = 0, mode: str | None = None):
        from hwtui.app.output.progress import QUIET, ProgressLine, mode_for

        self.out, self.err, self.total, self.done = out, err, total, 0
        self.quiet = verbosity <= QUIET
        self.progress = ProgressLine(out, mode or mode_for(out, verbosity))
        self._lock = threading.Lock()  # two relay threads (the step's stdout and stderr) and this one
        self._tail: deque[tuple[str, IO[str]]] = deque(maxlen=self.TAIL)
        self._running = False

    def start(self, what: str) -> None:
        """The next step begins: the previous one (if any) is done."""
        with self._lock:
            self.done += self._running
            self._running = True
            self._tail.clear()
            # Every step is shown (forced): there are a handful, and each start is news.
            self.progress.update(0.0, "setup", self.done, self.total, f"step {self.done + 1}/{self.total}",
                                 redact_text(what), force=True, eta=False)

    def finish(self) -> None:
        with self._lock:
            self.done += self._running
            self._running = False
            self.progress.update(0.0, "setup", self.done, self.total, f"{self.done}/{self.total} steps", force=True,
                                 eta=False)
            self.progress.close()

    def say(self, text: str, stream: IO[str] | None = None) -> None:
        """A result or a note, above the bar."""
        with self._lock:
            self.progress.line(text, stream or self.out)

    def relay(self, line: str, to_err: bool) -> None:
        """One line of the installer's output, already redacted (``_relay``)."""
        stream = self.err if to_err else self.out
        with self._lock:
            if self.quiet:
                self._tail.append((line, stream))
            else:
                self.progress.line(line.rstrip("\r\n"), stream)

    def failed(self) -> None:
        with self._lock:
            self.progress.clear()
            for line, stream in self._tail:
                stream.write(line.rstrip("\r\n") + "\n")
            self._tail.clear()
            for stream in (self.out, self.err):
                stream.flush()


def _relay(stream: IO[str], to_err: bool, show: Callable[[str, bool], None]) -> None:
    """Pass a step's output on line by line with credentials masked: pip and uv print the index URLs
    they use, and ``--index-url https://user:pw@host/`` must not reach a terminal or a log."""
    for line in iter(lambda: stream.readline(1 << 16), ""):
        show(redact_text(line), to_err)


def _run_step(argv: list[str], timeout: float, env: dict[str, str] | None, show: Callable[[str, bool], None]) -> None:
    from hwtui.core.supervisor import Child, exit_text

    shown = redact_text(" ".join(argv[:4]))
    child = Child(argv, name=os.path.basename(argv[0]), env=env, stdout="pipe", stderr="pipe", text=True)
    try:
        child.start()
    except OSError as exc:
        raise HwtuiError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    assert child.proc is not None
    relays = [threading.Thread(target=_relay, args=(stream, to_err, show), daemon=True)
              for stream, to_err in ((child.proc.stdout, False), (child.proc.stderr, True))]
    for t in relays:
        t.start()
    try:
        code = child.wait(timeout)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: stop the whole step's group
        child.terminate()
        raise HwtuiError(f"`{shown} ...` did not finish within {timeout:.0f} s (stopped); "
                         "re-run with a larger --step-timeout", EXIT_FAILED) from None
    finally:
        for t in relays:  # the pipes close when the step's group is gone; a grandchild holding one is not waited for
            t.join(5.0)
    if code != 0:
        raise HwtuiError(f"`{shown} ...` {exit_text(code)}; the output above says why (nothing was recorded "
                         "for this environment)", EXIT_FAILED)


def _check_torch(plan: EnvPlan, wanted: str) -> None:
    """The environment holds exactly the pinned build (``torch==2.9.1+rocm6.4``), or the step failed."""
    import glob

    from hwtui.core.bounded_read import SMALL_FILE_CAP, decode_text, read_capped
    from hwtui.probes.torchwheel import parse_version_py

    version = None
    for path in sorted(glob.glob(os.path.join(plan.path, "lib*", "python*", "site-packages", "torch", "version.py"))):
        try:
            version = parse_version_py(decode_text(read_capped(path, SMALL_FILE_CAP))).get("__version__")
        except OSError:
            continue
        break
    expected = wanted.split("==", 1)[1]
    if version != expected:
        raise HwtuiError(f"{plan.path} got torch {version or '(none)'}, not the pinned {expected}; nothing was recorded "
                         "for this environment", EXIT_FAILED)


def _link_hwtui(plan: EnvPlan, root: str) -> None:
    """A .pth in the environment's site-packages: its interpreter imports this very hwtui tree."""
    import glob

    from hwtui.core.atomic import atomic_write_text

    found = sorted(glob.glob(os.path.join(plan.path, "lib", "python*", "site-packages")))
    if not found:
        raise HwtuiError(f"{plan.path} has no lib/python*/site-packages: the environment was not created")
    atomic_write_text(os.path.join(found[0], "hwtui-tree.pth"), root + "\n")
