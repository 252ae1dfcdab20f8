"""How a replication rank is stopped and how it dies: the signal gate and the exit codes.

SIGTERM/SIGINT interrupt a rank at once, except over the vote and the switch (a commit must never
be cut in half): there the gate defers them. The exit codes let the launcher tell a clean "voted
and aborted" from a rank that fell over.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

# Worker exit codes: the launcher tells a clean "voted and aborted" from a rank that fell over.
EXIT_OK, EXIT_ABORTED, EXIT_BAD_INPUT, EXIT_BROKEN, EXIT_INTERRUPTED = 0, 1, 2, 3, 4


class Interrupted(Exception):
    pass


class TransportFailure(Exception):
    pass


class SignalGate:
    """Defers SIGTERM/SIGINT over a section that must not be cut in half (the vote and the switch).

    pthread_sigmask cannot do this: it blocks the signal for one thread only, and the kernel
    hands a process-directed signal to any of gloo's threads instead. Python runs handlers in the
    main thread, so the handler asks the gate: inside a held section it records the signal, and
    the section raises :class:`Interrupted` when it ends.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None

    def deliver(self, signum: int) -> None:
        if self.depth:
            self.pending = self.pending or signum
            return
        raise Interrupted(f"stopped by {signal.Signals(signum).name}")

    @contextlib.contextmanager
    def held(self, hold: bool = True) -> Iterator[None]:
        if not hold:
            yield
            return
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if self.depth == 0 and self.pending is not None:
            signum, self.pending = self.pending, None
            raise Interrupted(f"stopped by {signal.Signals(signum).name} (after this rank's commit step)")


GATE = SignalGate()


def install_signal_gate() -> list[int]:
    """SIGTERM/SIGINT go through :data:`GATE` (deferred over the vote and the switch); returns the
    list the handler appends the first signal to, so a loop between runs can see it came.

    Only the first signal interrupts; a second one while the rank cleans up and reports must not
    cut that short (nor print a traceback): it is ignored.
    """
    stopping: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if stopping:
            return
        stopping.append(signum)
        GATE.deliver(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stopping
