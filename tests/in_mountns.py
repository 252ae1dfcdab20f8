"""``python -m tests.in_mountns SETUP AFTER ARG... -- MODULE ARGS...``: in a mount namespace of its own,
``sh -c SETUP sh ARG...``, then ``python -m MODULE ARGS...``, then ``sh -c AFTER sh ARG...`` (with
``$RC``, the module's exit status), exiting with the module's status.

What ``unshare -m -- sh -c 'SETUP; shift N; "$@"; AFTER' sh ARG... python -m MODULE ...`` does for
a test (a read-only mount, a full tmpfs or ext2 under one rank's directory, for that run only),
without an exec: it can be forked from the tests' CLI zygote (tests/cli_proc.py) like any hwtui
CLI, where the exec'd form paid a fresh ``import torch`` (2.5 CPU-s on the 2-core box) per run.
The shell steps run as children of this process, so they share its new mount namespace, and so do
the ranks the CLI starts. Linux, root (CAP_SYS_ADMIN), single-threaded (a fork of the zygote is).
"""

from __future__ import annotations

import ctypes
import os
import runpy
import subprocess
import sys
import traceback

CLONE_NEWNS = 0x00020000


def split(argv: list[str]) -> tuple[str, str, list[str], list[str]]:
    """(setup, after, the scripts' arguments, the module's argv) of this module's argv."""
    if "--" not in argv or argv.index("--") < 2 or argv.index("--") + 1 >= len(argv):
        raise ValueError("usage: python -m tests.in_mountns SETUP AFTER [ARG...] -- MODULE [ARGS...]")
    at = argv.index("--")
    return argv[0], argv[1], argv[2:at], argv[at + 1:]


def main() -> None:
    try:
        setup, after, script_args, module_argv = split(sys.argv[1:])
    except ValueError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        print(f"tests.in_mountns: unshare the mount namespace: {os.strerror(err)}", file=sys.stderr)
        sys.exit(1)
    if (rc := subprocess.run(["sh", "-c", setup, "sh", *script_args]).returncode) != 0:
        sys.exit(rc)
    sys.argv = list(module_argv)
    code = 0
    try:
        runpy.run_module(module_argv[0], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, status 1, then AFTER
        traceback.print_exc()
        code = 1
    # Unlike `sh -c '"$@"; AFTER'`, AFTER runs before this process's atexit handlers and while its
    # non-daemon threads may still run: no hwtui CLI leaves either behind.
    sys.stdout.flush()
    sys.stderr.flush()
    if after:
        subprocess.run(["sh", "-c", after, "sh", *script_args], env={**os.environ, "RC": str(code)})
    sys.exit(code)


if __name__ == "__main__":
    main()
