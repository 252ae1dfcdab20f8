"""The node-API client's command-line options (``--token-file``, ``--cacert``) and what they resolve to.

Shared by every command that talks to agents (``agents``, ``push``, ``train --push-to``) and by the
TUI's cluster screen (``app.tui`` never imports ``app.commands``)."""

from __future__ import annotations

import argparse
from typing import Any

from hwtui.core.errors import HwtuiError


def add_client_options(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--token-file", metavar="FILE", help="the agents' bearer token (default: $HWTUI_AGENT_TOKEN, "
                   "else $XDG_CONFIG_HOME/hwtui/agent.token)")
    p.add_argument("--cacert", metavar="PEM", help="CA bundle that signed the agents' certificates (https)")


def client_settings(args: argparse.Namespace) -> tuple[str | None, Any]:
    """(token, httpx ``verify``: True for the system CAs, or an SSL context trusting --cacert)."""
    return resolve_client(getattr(args, "token_file", None), getattr(args, "cacert", None))


def resolve_client(token_file: str | None, cacert: str | None) -> tuple[str | None, Any]:
    """The same, from the two values: (token, httpx ``verify``). A bad --cacert is one line (HwtuiError)."""
    from hwtui.app.node_api.token import client_token

    verify: Any = True
    if cacert:
        import ssl

        try:
            verify = ssl.create_default_context(cafile=cacert)
        except (OSError, ssl.SSLError) as exc:
            raise HwtuiError(f"--cacert {cacert}: {exc}") from None
    return client_token(token_file), verify
