"""A local user's moves in the tests: a forked child that drops to another uid (no torch needed)."""

from __future__ import annotations

import os
from typing import Any


def as_user(uid: int, cwd: str | os.PathLike[str], fn: Any) -> None:
    """Run ``fn`` in a forked child as ``uid``, in ``cwd`` (entered before privileges are dropped,
    so only ``cwd`` itself must let that user in): an unprivileged local user's moves."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.chdir(cwd)
            if uid != os.geteuid():
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            fn()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
