"""``python -m tests.in_netns NETNS MODULE ARGS...``: run ``python -m MODULE ARGS...`` inside a network namespace.

What ``ip netns exec NETNS python -m MODULE ...`` does for a test, without an exec: join the
namespace, unshare the mount namespace and mount a sysfs of it on /sys (hwtui reads the interfaces
from /sys/class/net), then run the module as ``__main__``. Its point is that it can be forked
from the tests' CLI zygote (tests/cli_proc.py) like any hwtui CLI, where ``ip netns exec`` is an
exec and a fresh ``import torch`` (1.2 CPU-s) per process. Linux, root, single-threaded (a fork
of the zygote is). ``/etc/netns/NETNS`` is not bind-mounted: no test makes one.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
MNT_DETACH = 2


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter(netns: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
    finally:
        os.close(fd)
    _check(libc.unshare(CLONE_NEWNS), "unshare the mount namespace")
    # As ip-netns: our mounts stay ours (slave), and /sys is the namespace's.
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "make / a slave mount")
    libc.umount2(b"/sys", MNT_DETACH)  # as ip-netns: no sysfs mounted there is fine
    _check(libc.mount(netns.encode(), b"/sys", b"sysfs", 0, None), "mount a sysfs on /sys")


def main() -> None:
    if len(sys.argv) < 3:
        print("usage: python -m tests.in_netns NETNS MODULE [ARGS...]", file=sys.stderr)
        sys.exit(2)
    netns, module, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    enter(netns)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
