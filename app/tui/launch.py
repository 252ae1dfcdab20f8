"""``hwtui`` with no command: build the host, load remembered choices, run the app.

Imported only when the TUI starts, so Textual never slows down the CLI's subcommands.
"""

from __future__ import annotations

import argparse
import os

from hwtui.core.errors import HwtuiError


def host_args(args: argparse.Namespace) -> list[str]:
    """The options that make a subprocess (``hwtui env``) see the same machine as the app."""
    if getattr(args, "replay", None):
        return ["--replay", os.path.abspath(args.replay)]
    if getattr(args, "sysroot", None):
        return ["--sysroot", os.path.abspath(args.sysroot)]
    return []


def require_terminal() -> None:
    """The TUI needs a terminal on both ends: without one it would wait for keys that never come."""
    import sys

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise HwtuiError("the terminal UI needs a terminal (stdin and stdout are not one); "
                         "use `hwtui --check` for a report without one")


def run_tui(args: argparse.Namespace) -> int:
    from hwtui.app.host_args import host_from_args

    nodes_screen_args = None
    if getattr(args, "agents", None):
        from hwtui.app.node_api.client import import_httpx, parse_agents

        # Bad input and a missing extra before the terminal check and before Textual starts: inside
        # the app, a missing httpx was a Textual traceback and exit 0 (a base install: `pip install
        # hwtui` without the agent extra). Here it is cli.py's one line, exit 2.
        targets = parse_agents(args.agents)
        import_httpx()
        nodes_screen_args = targets

    interval = getattr(args, "interval", None)
    if interval is not None and not 0.05 <= interval <= 3600:
        raise HwtuiError(f"--interval {interval}: choose between 0.05 and 3600 seconds")
    # The input first: a bad --replay / --sysroot is named in one line whether or not a terminal is
    # there (it used to be the terminal complaint, or a TUI waiting on a sampler that kept failing).
    host = host_from_args(args)
    require_terminal()

    from hwtui.app.tui.app import HwtuiApp
    from hwtui.app.tui.config import TuiConfig, config_path

    config_file = config_path()
    config = TuiConfig.load(config_file)
    if interval is not None:
        config.interval = float(interval)
    nodes_screen = None
    if nodes_screen_args is not None:
        from hwtui.app.node_api.client_options import client_settings
        from hwtui.app.tui.screens.nodes import NodesScreen

        token, verify = client_settings(args)
        nodes_screen = NodesScreen(nodes_screen_args, token=token, verify=verify)
    # The monitor first: a live view of this machine, the wizard one key (w) away (--agents: every node).
    app = HwtuiApp(host, config, config_file=config_file, host_args=host_args(args), start_step="monitor",
                   nodes_screen=nodes_screen)
    result = app.run()
    return int(result or 0)
