"""``hwtui`` command line.

Imports stay lazy: this module pulls in only argparse, and each subcommand module imports its
heavy dependencies inside ``run``; ``hwtui --help`` and ``--version`` must answer in well under
0.2 s on a machine where importing torch takes seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from hwtui.core.errors import EXIT_INTERNAL, EXIT_USAGE, HwtuiError

# Modules that only the engine extra brings: a base install (`pip install hwtui`) meets them as a
# ModuleNotFoundError, which must read as "install the extra", not as an internal error.
ENGINE_EXTRA_MODULES = {"torch": "engine", "xxhash": "engine", "safetensors": "engine", "numpy": "engine",
                        "httpx": "agent"}


class OneLineParser(argparse.ArgumentParser):
    """Usage errors are one line (what is wrong and where to look) with exit 2, not argparse's five."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


# The areas `--check --only` takes, spelled out so --help stays fast (no probe import); a test
# keeps this equal to hwtui.probes.catalog.areas().
CHECK_AREAS = ("hardware", "gpu", "env")

# Subcommand name -> module with HELP, add_arguments(parser) and run(args) -> int.
SUBCOMMANDS: dict[str, str] = {
    "list-gpus": "hwtui.app.commands.list_gpus",
    "snapshot": "hwtui.app.commands.snapshot",
    "env": "hwtui.app.commands.env",
    "plan": "hwtui.app.commands.plan",
    "replicate": "hwtui.app.commands.replicate",
    "train": "hwtui.app.commands.train",
    "eval": "hwtui.app.commands.eval",
    "sample": "hwtui.app.commands.sample",
    "cluster": "hwtui.app.commands.cluster",
    "setup": "hwtui.app.commands.setup",
    "agent": "hwtui.app.commands.agent",
    "agents": "hwtui.app.commands.agents",
    "push": "hwtui.app.commands.push",
}


def _add_host_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("machine")
    group.add_argument("--sysroot", metavar="DIR", default=default,
                       help="read /sys, /dev, /proc and /etc under DIR (a recorded tree) instead of /")
    group.add_argument("--replay", metavar="FILE", default=default,
                       help="reproduce the machine recorded by `hwtui snapshot` in FILE")


def _add_output_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """-v / -q, before or after the command (`hwtui -q plan ...`, `hwtui plan -q ...`): one ``verbosity``."""
    group = parser.add_argument_group("output")
    group.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1,
                       default=argparse.SUPPRESS if suppress else 0,
                       help="more detail (replicate: every bucket of every rank; train: every worker's figures; "
                            "--check: every finding's detail)")
    group.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1,
                       default=argparse.SUPPRESS,
                       help="only results and errors: no progress, no start-up lines")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only``, every other subcommand is a stub that takes anything
    (``only=""``: every one, for a run that names no command: `hwtui --check`, the TUI).

    Building a subcommand imports its module (and what that imports at the top): all thirteen cost
    50-60 ms of every run, a sixth of a warm `hwtui push` beyond its transfer; built, they still
    cost ~9 ms of argparse per run. ``parse_argv`` builds only the command it finds in argv (none
    when there is none), and everything where that parse cannot be the whole parser's."""
    parser = OneLineParser(
        prog="hwtui",
        description="Detect and verify GPUs of every vendor, then replicate weights and train on them. "
                    "With no command, starts the terminal UI.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    _add_output_options(parser, suppress=False)
    check = parser.add_argument_group("headless check")
    check.add_argument("--check", action="store_true", help="run every check headless and print findings")
    check.add_argument("--json", action="store_true", help="with --check: print one JSON document (schema hwtui.check/1)")
    check.add_argument("--junit", metavar="FILE", help="with --check: also write JUnit XML, one testcase per finding")
    check.add_argument("--strict", action="store_true", help="with --check: warnings fail the check too")
    check.add_argument("--only", metavar="AREAS",
                       help=f"with --check: comma list of areas to run, from: {', '.join(CHECK_AREAS)}")
    check.add_argument("--timeout-scale", type=float, default=None, metavar="X",
                       help="multiply every probe timeout by X (default: HWTUI_PROBE_TIMEOUT_SCALE or 1)")
    check.add_argument("--agents", metavar="LIST", help="with --check: compare the nodes whose agents are listed "
                       "(HOST[:PORT],...); without --check: the TUI's live view of those nodes")
    check.add_argument("--token-file", metavar="FILE", help="with --agents: the agents' bearer token file")
    check.add_argument("--cacert", metavar="PEM", help="with --agents: CA bundle of the agents' https certificates")
    _add_host_options(parser, suppress=False)
    tui = parser.add_argument_group("terminal UI")
    tui.add_argument("--interval", type=float, default=None, metavar="S",
                     help="dashboard sampling interval in seconds (default: remembered choice, else 1)")

    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        if only is not None and name != only:
            stub = subs.add_parser(name, add_help=False)
            stub.add_argument("_rest", nargs=argparse.REMAINDER)
            stub.set_defaults(_stub=True)
            continue
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        sub = subs.add_parser(name, help=module.HELP, description=module.HELP)
        _add_host_options(sub, suppress=True)
        _add_output_options(sub, suppress=True)
        module.add_arguments(sub)
        sub.set_defaults(_module=module_name)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    if args.version:
        from hwtui.app import version

        print(f"hwtui {version()}")
        return 0
    if getattr(args, "_module", None):
        code: int = importlib.import_module(args._module).run(args)
        return code
    if args.check and args.agents:
        from hwtui.app.commands.agents import run_check as run_agents_check

        return run_agents_check(args)
    if args.check:
        from hwtui.app.commands.check import run as run_check

        return run_check(args)
    if args.json or args.junit or args.strict or args.only is not None:
        raise HwtuiError("--json, --junit, --strict and --only go with --check (or a command that takes them)")
    from hwtui.app.tui.launch import run_tui

    return run_tui(args)


def _command_words(args: argparse.Namespace) -> str:
    """How the user asked for what needs an extra, when it was no subcommand: `hwtui --agents ...`."""
    if getattr(args, "agents", None):
        return "--check --agents" if args.check else "--agents"
    return "--check" if args.check else "(the terminal UI)"


def _tolerant_streams() -> None:
    """Text that cannot be encoded (a lone surrogate from a hostile file) prints escaped, never raises."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass


def _standard_fds() -> None:
    """Descriptors 0-2 closed at start (`hwtui replicate ... >&-`, a service manager's closed fds):
    /dev/null goes onto each, and Python's stream for it (None then) is made again.

    Why: print() to a None stdout was an internal error (exit 3) after the work was done; and worse,
    the next file hwtui opened (a plan, a report, a staging copy) would take the lowest free
    descriptor, 1, where every child started with "inherit" writes its output."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:  # the lowest free number is fd itself unless a lower one is closed too
                os.dup2(null, fd)
                os.close(null)
    if sys.stdin is None:
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own stream
    if sys.stdout is None:
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115


def parse_argv(argv: list[str]) -> argparse.Namespace:
    """What the whole parser makes of ``argv`` (its SystemExit on help and usage errors included),
    building only the command argv names (build_parser).

    The first word that names a command is very likely the command; no such word: no command is
    built. argparse is asked again with everything built when it picked a stub (argv held a
    command's name as an option's value), met an argument it does not know, or exited: help (the
    top level's lists every command with its description, however the flag was spelt: -h, --he,
    -vh) and usage errors are the whole parser's words. The first parse's own words are dropped."""
    at = next((i for i, a in enumerate(argv) if a in SUBCOMMANDS), None)
    words = io.StringIO()
    try:
        with contextlib.redirect_stdout(words), contextlib.redirect_stderr(words):
            args, unknown = build_parser(argv[at] if at is not None else "").parse_known_args(argv)
    except SystemExit:
        return build_parser().parse_args(argv)
    if getattr(args, "_stub", False) or unknown:
        args = build_parser().parse_args(argv)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    _standard_fds()
    _tolerant_streams()
    args = parse_argv(list(sys.argv[1:] if argv is None else argv))
    try:
        return _dispatch(args)
    except HwtuiError as exc:
        # One place redacts every error line: a message may quote a URL, an env value or a command
        # line the user typed with a token in it, and stderr ends up in CI logs and bug reports.
        from hwtui.core.redact import redact_text

        print(f"hwtui: error: {redact_text(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        extra = ENGINE_EXTRA_MODULES.get((exc.name or "").split(".")[0])
        if extra is None:
            if os.environ.get("HWTUI_DEBUG"):
                raise
            print(f"hwtui: internal error: {type(exc).__name__}: {exc} (HWTUI_DEBUG=1 shows the traceback)", file=sys.stderr)
            return EXIT_INTERNAL
        from hwtui.core.install_hint import install_command

        what = args.command or _command_words(args)
        print(f"hwtui: error: `hwtui {what}` needs the {extra} extra ({exc.name} is not installed): "
              f"{install_command(extra)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("hwtui: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `hwtui --check | head` closes the pipe early; that is not an error worth a trace.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - no traceback ever reaches the user
        if os.environ.get("HWTUI_DEBUG"):
            raise
        print(f"hwtui: internal error: {type(exc).__name__}: {exc} (HWTUI_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["main", "build_parser", "SUBCOMMANDS", "EXIT_USAGE"]
