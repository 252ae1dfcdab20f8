"""The command line builds only the subcommand it runs (each costs an import), and still parses
exactly as the whole parser does, whatever word in argv looks like a command."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtui.app.cli import SUBCOMMANDS, build_parser, parse_argv


def _loaded_commands(only: str) -> list[str]:
    probe = ("import sys; from hwtui.app.cli import build_parser; build_parser(sys.argv[1]); "
             "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('hwtui.app.commands.')))")
    out = subprocess.run([sys.executable, "-c", probe, only], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.replace("'", '"'))


def test_building_one_command_imports_that_command_only():
    loaded = _loaded_commands("push")
    assert "push" in loaded
    # push takes the agents' client options from agents.py; nothing else is imported.
    assert set(loaded) <= {"push", "agents"}, loaded
    assert len(SUBCOMMANDS) > 10


@pytest.mark.parametrize("argv", [
    ["push", "--plan", "p.json", "--agents", "a,b", "--inflight", "2"],
    ["list-gpus", "--json", "--unknown"],
    ["--only", "push", "list-gpus", "--json"],  # "push" is an option's value here; the command is list-gpus
])
def test_one_command_parses_like_the_whole_parser(argv):
    whole, whole_extra = build_parser().parse_known_args(argv)
    only = next(a for a in argv if a in SUBCOMMANDS)
    lazy, lazy_extra = build_parser(only).parse_known_args(argv)
    if getattr(lazy, "_stub", False):  # what main() does: argparse picked a stub, so build everything
        lazy, lazy_extra = build_parser().parse_known_args(argv)
    assert (vars(lazy), lazy_extra) == (vars(whole), whole_extra)


def _hwtui(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hwtui.app", *args], capture_output=True, text=True, timeout=120)


def test_a_command_named_as_an_option_value_still_runs_the_real_command(tmp_path):
    # `--only push` puts "push" first in argv; the command is list-gpus, on an empty machine tree.
    r = _hwtui("--only", "push", "list-gpus", "--json", "--sysroot", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"schema": "hwtui.gpus/1", "devices": []}


def test_an_unknown_option_is_still_one_line_and_exit_2():
    r = _hwtui("push", "--plan", "x", "--agents", "a,b", "--bogus")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["hwtui: error: unrecognized arguments: --bogus (see `hwtui --help`)"]


def test_top_level_help_before_a_command_lists_every_command():
    r = _hwtui("--help", "list-gpus")
    assert r.returncode == 0
    listed = [name for name in SUBCOMMANDS if f"    {name} " in r.stdout]
    assert listed == list(SUBCOMMANDS), r.stdout


def test_a_run_that_names_no_command_builds_none():
    # `hwtui --check`, `--version`, the TUI: every command a stub (~2 ms of argparse, not ~9 ms
    # for all of them), and no command's module imported.
    assert _loaded_commands("") == []


@pytest.mark.parametrize("argv", [
    ["--check", "--json", "--replay", "snap.json"],
    ["--check", "--replay", "plan"],  # a command's name as an option's value: still no command
    ["-q", "--version"],
    ["--check", "--only", "gpu", "--strict", "--unknown"],
])
def test_no_command_parses_like_the_whole_parser(argv):
    whole, whole_extra = build_parser().parse_known_args(argv)
    at = next((i for i, a in enumerate(argv) if a in SUBCOMMANDS), None)
    lazy, lazy_extra = build_parser("" if at is None else argv[at]).parse_known_args(argv)
    if getattr(lazy, "_stub", False):
        lazy, lazy_extra = build_parser().parse_known_args(argv)
    assert (vars(lazy), lazy_extra) == (vars(whole), whole_extra)


@pytest.mark.parametrize("args", [("--help",), ("-q", "-h")])
def test_top_level_help_with_no_command_lists_every_command(args):
    r = _hwtui(*args)
    assert r.returncode == 0
    assert [name for name in SUBCOMMANDS if f"    {name} " in r.stdout] == list(SUBCOMMANDS), r.stdout


def test_a_word_that_is_no_command_is_refused_naming_every_command():
    r = _hwtui("--check", "bogus-word")
    assert r.returncode == 2
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "bogus-word" in err
    assert all(name in err for name in SUBCOMMANDS), err


_WORDS = [*SUBCOMMANDS, "--check", "--json", "--strict", "--replay", "--only", "--plan", "--agents", "--mb", "-q", "-v",
          "-h", "--help", "--he", "--hel", "-vh", "-qh", "-hv", "--version", "--sysroot", "--bogus", "x", "1", "gpu", "--", "-", "push,plan", "--json=1"]


def _outcome(parse: Any, argv: list[str]) -> tuple[Any, ...]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            ns = parse(argv)
        except SystemExit as exc:
            return ("exit", exc.code, out.getvalue(), err.getvalue())
    return ("args", {k: v for k, v in vars(ns).items()}, out.getvalue(), err.getvalue())


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from(_WORDS), max_size=7))
def test_any_argv_parses_as_the_whole_parser_parses_it(argv: list[str]) -> None:
    """main's parse (cli.parse_argv: one command built, or none) against the whole parser, for any
    argv of commands, options, values and help flags (spelt as argparse takes them: --he, -vh):
    the same arguments, or the same exit with the same words (help text, usage errors)."""
    assert _outcome(parse_argv, argv) == _outcome(_whole().parse_args, argv), argv


@functools.cache
def _whole() -> Any:
    return build_parser()  # one for every example: a parser is not changed by parsing
