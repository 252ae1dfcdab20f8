"""``python -m tests.cli_zygote FD PARENT``: the tests' CLI zygote (tests/cli_proc.py), a fresh interpreter.

Exec'd by a shard rather than forked from it, so that what each CLI is forked from is an
interpreter that only imported hwtui's CLI and what its launchers preload: none of pytest's
hooks (``threading.excepthook``, ``sys.unraisablehook``, the warnings it records, its logging
handlers, its capture files, its import hook), none of the test modules, the default gc settings.
Then it serves ``hwtui.core.forkserver``'s protocol on the socket at ``FD`` until the shard
(``PARENT``) closes it or dies.
"""

from __future__ import annotations

import gc
import importlib
import os
import socket
import sys

# What the CLI's commands and their launchers import, torch first of all. Not a module a test runs
# as ``__main__`` (hwtui.app.cli, hwtui.app.__main__): runpy warns on stderr when it finds one
# imported already ("found in sys.modules ... prior to execution"), which an exec'd CLI never does.
ZYGOTE_MODULES = ("hwtui.engine.rank_fork", "hwtui.app", "hwtui.app.host_args", "hwtui.engine.replication.launcher",
                  "hwtui.engine.resident.resident_child", "hwtui.engine.training.worker_fork", "torch.distributed")


def main() -> None:
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.socket(fileno=fd)
    from hwtui.core import forking, forkserver

    for name in ZYGOTE_MODULES:  # rank_fork first: numpy with a one-thread BLAS pool
        importlib.import_module(name)
    for main_module in ("hwtui.app.cli", "hwtui.app.__main__", "hwtui.__main__"):
        assert main_module not in sys.modules, f"{main_module} would be run as __main__ after an import of it"
    if (threads := forking.settled_thread_count()) > 1:  # an import started one: forking here is unsafe
        print(f"tests/cli_zygote.py: {threads} threads after the imports: every CLI is exec'd", file=sys.stderr)
        sys.exit(1)
    gc.freeze()  # as forkserver.start's server does: the children's collections never walk this heap
    forkserver.serve(sock, parent)
    os._exit(0)


if __name__ == "__main__":
    main()
