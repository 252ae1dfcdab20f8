"""``python -m tests.with_umask MASK MODULE ARGS...``: ``python -m MODULE ARGS...`` under umask MASK (octal).

What ``subprocess.run(..., umask=MASK)`` gives an exec'd CLI, for one forked from the tests' CLI
zygote (tests/cli_proc.py), whose fork-server protocol carries no umask: an exec'd CLI paid a
fresh ``import torch`` per run.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 3:
        print("usage: python -m tests.with_umask MASK MODULE [ARGS...]", file=sys.stderr)
        sys.exit(2)
    os.umask(int(sys.argv[1], 8))
    module, args = sys.argv[2], sys.argv[3:]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
