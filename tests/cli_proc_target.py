"""``python -m tests.cli_proc_target MODE ...``: a child that shows what it was given (tests/test_cli_proc.py)."""

from __future__ import annotations

import json
import os
import signal
import sys


def main() -> None:
    mode = sys.argv[1]
    if mode == "show":  # what it got: argv, env, cwd, stdin; a CRLF on stderr; exit with argv[2]
        got = sys.stdin.read()
        print(json.dumps({"argv": sys.argv[1:], "env": os.environ.get("CLI_PROC_PROBE"), "cwd": os.getcwd(),
                          "stdin": got, "path0": os.environ.get("PATH", "").split(os.pathsep)[0]}))
        sys.stderr.write("err\r\nline\n")
        sys.exit(int(sys.argv[2]))
    if mode == "netif":  # the network it sees: /sys/class/net and the kernel's interface list
        import socket

        import psutil

        ipv4 = sorted(a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET)
        print(json.dumps({"sys": sorted(os.listdir("/sys/class/net")), "index": sorted(n for _, n in socket.if_nameindex()),
                          "ipv4": ipv4}))
        sys.exit(0)
    if mode == "hooks":  # what a fresh interpreter prints: a thread's exception, a __del__'s, a warning, a log line
        import logging
        import threading
        import warnings

        class Broken:
            def __del__(self) -> None:
                raise RuntimeError("in __del__")

        t = threading.Thread(target=lambda: 1 / 0)
        t.start()
        t.join()
        Broken()
        warnings.warn("a warning from the child", UserWarning, stacklevel=1)
        logging.getLogger("child").warning("a log line from the child")
        sys.exit(0)
    if mode == "path":  # where it runs and what it imports from first
        print(json.dumps({"cwd": os.getcwd(), "path0": sys.path[0]}))
        sys.exit(0)
    if mode == "nondaemon":  # the interpreter waits for a non-daemon thread before it exits
        import threading
        import time

        threading.Thread(target=lambda: (time.sleep(0.2), open(sys.argv[2], "w").write("done"))).start()
        sys.exit(0)
    if mode == "partial":  # reads 4 KiB, writes 1 MiB, then reads the rest
        got = len(sys.stdin.buffer.read(4096))
        sys.stdout.buffer.write(b"x" * (1 << 20))
        sys.stdout.buffer.flush()
        print(got + len(sys.stdin.buffer.read()), file=sys.stderr)
        sys.exit(0)
    if mode == "cut":  # half of a UTF-8 character, then waits to be killed
        sys.stdout.buffer.write(b"\xc3")
        sys.stdout.buffer.flush()
        signal.pause()
    if mode == "hang":  # says it is ready, then waits to be killed
        print("ready", flush=True)
        signal.pause()
    if mode == "big":  # 1 MiB out before reading any input: a parent that writes all input first deadlocks
        sys.stdout.buffer.write(b"x" * (1 << 20))
        sys.stdout.buffer.flush()
        print(len(sys.stdin.buffer.read()), file=sys.stderr)


if __name__ == "__main__":
    main()
