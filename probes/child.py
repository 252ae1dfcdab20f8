"""Run vendor-runtime code (torch, amdsmi, habana_frameworks, torch_xla...) in a child process.

Why a child: importing torch costs seconds and can crash (a bad driver segfaults in cuInit),
amdsmi prints to stdout and raises KeyError without ROCm, and libtpu takes an exclusive lock.
None of that may touch hwtui's own process. The child is started by the one supervisor
(hwtui.core.supervisor): its own session, so a timeout kills everything it started, and a dedicated
answer pipe, so whatever a library prints to stdout or stderr cannot corrupt the answer.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from hwtui.core.supervisor import exit_text, python_module, run_for_answer, signal_name


class ChildError(Exception):
    """The child did not produce an answer: timeout, crash, bad exit or a raised exception."""

    def __init__(self, kind: str, message: str, stderr_tail: str = ""):
        super().__init__(message)
        self.kind = kind  # "timeout" | "crash" | "exit" | "raised" | "protocol"
        self.stderr_tail = stderr_tail


def run_in_child(target: str, args: Mapping[str, Any] | None = None, *, timeout: float = 30.0,
                 env: Mapping[str, str] | None = None) -> Any:
    """Call ``module:function(**args)`` in a fresh interpreter and return its JSON answer."""
    child_env = dict(os.environ if env is None else env)
    # Whatever this process can import, the child can too (test fakes on sys.path, a sysroot's modules).
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, child_env.get("PYTHONPATH", "")] if p)
    argv = python_module("hwtui.probes._child_entry", target, "{answer_fd}", json.dumps(dict(args or {})))
    code, answer, tail, timed_out = run_for_answer(argv, timeout=timeout, env=child_env, name=target)
    if timed_out:
        raise ChildError("timeout", f"{target} did not answer within {timeout:.1f} s (killed)")
    if code < 0:
        raise ChildError("crash", f"{target} crashed with {signal_name(-code)}", tail)
    if answer is None:
        raise ChildError("exit", f"{target} {exit_text(code)} without answering", tail)
    if answer.get("kind") != "answer":
        raise ChildError("protocol", f"{target} sent a malformed answer", tail)
    if not answer.get("ok"):
        raise ChildError("raised", f"{target} raised {answer.get('error', 'an unknown error')}", tail)
    return answer.get("value")
