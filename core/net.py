"""Small network helpers shared by the engines."""

from __future__ import annotations

import socket


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for a local world's rendezvous.

    The port is released before the caller binds it, so another process could take it in between;
    local worlds are short-lived and a clash fails fast at init with a clear error.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
