"""Errors the CLI turns into one line on stderr and an exit code (never a traceback)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the check found a failure / the run failed
EXIT_USAGE = 2  # bad arguments or bad input files
EXIT_INTERNAL = 3


class HwtuiError(Exception):
    """A problem the user can fix; the message is one line that says what and how."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code
