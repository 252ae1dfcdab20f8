"""Functions the probe-child tests run inside a real child process."""

import os
import signal
import sys
import time


def answer(x: int) -> dict:
    # Vendor libraries print on import; the answer channel must not care.
    print("garbage on stdout {not json", flush=True)
    print("and on stderr", file=sys.stderr, flush=True)
    return {"double": 2 * x}


def segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def hang() -> None:
    time.sleep(3600)


def hang_with_grandchild() -> None:
    # A grandchild in the same process group must die with the child on timeout.
    import subprocess

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.environ["HWTUI_TEST_PIDFILE"], "w") as fh:
        fh.write(str(p.pid))
    time.sleep(3600)


def amdsmi_like() -> None:
    print("ERROR:root:Unable to find amdsmi library try installing amd-smi-lib from your package manager")
    raise KeyError("libamd_smi.so")


def exit_silently() -> None:
    os._exit(3)
