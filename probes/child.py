"""Run vendor-runtime code (torch, amdsmi, habana_frameworks, torch_xla...) in a child process.

Why a child: importing torch costs seconds and can crash (a bad driver segfaults in cuInit),
amdsmi prints to stdout and raises KeyError without ROCm, and libtpu takes an exclusive lock.
None of that may touch hwtui's own process. The child gets its own session (process group) so a
timeout kills everything it started, and it answers over a dedicated pipe, so whatever a library
prints to stdout or stderr cannot corrupt the answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any


class ChildError(Exception):
    """The child did not produce an answer: timeout, crash, bad exit or a raised exception."""

    def __init__(self, kind: str, message: str, stderr_tail: str = ""):
        super().__init__(message)
        self.kind = kind  # "timeout" | "crash" | "exit" | "raised" | "protocol"
        self.stderr_tail = stderr_tail


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def run_in_child(target: str, args: Mapping[str, Any] | None = None, *, timeout: float = 30.0,
                 env: Mapping[str, str] | None = None) -> Any:
    """Call ``module:function(**args)`` in a fresh interpreter and return its JSON answer."""
    read_fd, write_fd = os.pipe()
    child_env = dict(os.environ if env is None else env)
    # hwtui must be importable in the child exactly as it is here (editable installs, tests).
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, child_env.get("PYTHONPATH", "")] if p)
    cmd = [sys.executable, "-m", "hwtui.probes._child_entry", target, str(write_fd), json.dumps(dict(args or {}))]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                pass_fds=(write_fd,), start_new_session=True, env=child_env)
    finally:
        os.close(write_fd)

    chunks: list[bytes] = []

    def drain() -> None:
        with os.fdopen(read_fd, "rb") as fh:
            while block := fh.read(65536):
                chunks.append(block)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise ChildError("timeout", f"{target} did not answer within {timeout:.1f} s (killed)") from None
    reader.join(timeout=5)
    tail = err.decode(errors="replace")[-2000:]
    if proc.returncode < 0:
        raise ChildError("crash", f"{target} crashed with {_signal_name(-proc.returncode)}", tail)
    raw = b"".join(chunks)
    if not raw:
        raise ChildError("exit", f"{target} exited with status {proc.returncode} without answering", tail)
    try:
        answer = json.loads(raw)
    except ValueError:
        raise ChildError("protocol", f"{target} sent a malformed answer", tail) from None
    if not answer.get("ok"):
        raise ChildError("raised", f"{target} raised {answer.get('error', 'an unknown error')}", tail)
    return answer.get("value")
