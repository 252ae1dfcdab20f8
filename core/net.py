"""Small network helpers shared by the engines."""

from __future__ import annotations

import errno
import socket
import time


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for a local world's rendezvous.

    The port is released before the caller binds it, so another process could take it in between;
    local worlds are short-lived and a clash fails fast at init with a clear error.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def probe_port(host: str, port: int, timeout: float) -> tuple[bool, str]:
    """Try a TCP connect until it succeeds or ``timeout`` passes; say why it failed."""
    deadline = time.monotonic() + timeout
    why = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False, why
        try:
            with socket.create_connection((host, port), timeout=min(2.0, max(left, 0.05))):
                return True, "open"
        except socket.gaierror as exc:
            return False, f"cannot resolve {host}: {exc.strerror}"
        except ConnectionRefusedError:
            why = "connection refused (nothing listening there yet, or a firewall rejects the port)"
        except TimeoutError:
            why = "no answer (packets dropped: a firewall blocks the port, or the address is wrong)"
        except OSError as exc:
            if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
                why = f"{exc.strerror} (no route: wrong address or interface)"
            else:
                why = exc.strerror or str(exc)
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))
