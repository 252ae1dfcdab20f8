"""A child for tests/core/test_forking.py: reports what it sees on its answer pipe, then ends as told."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading


def _reuse() -> dict[str, object]:
    """The launcher left garbage that owns fd PROBE_OWNED_FD: open our own fds until one gets that
    number (or 64 pipes), collect the garbage, and say which of ours are still open."""
    target = int(os.environ["PROBE_OWNED_FD"])
    mine: list[int] = []
    for _ in range(64):
        mine += os.pipe()
        if target in mine:
            break
    gc.collect()  # the launcher's socket, in its cycle, is freed here
    alive = []
    for fd in mine:
        try:
            os.fstat(fd)
            alive.append(fd)
        except OSError:
            pass
    return {"target": target, "mine": mine, "alive": alive}


def main() -> None:
    fd, how = int(sys.argv[1]), sys.argv[2]
    if how == "quiet":  # says nothing, holds whatever it was given, until killed
        signal.pause()
    if how == "stdio":  # Python's own streams: print, stderr, a line read with input()
        print("out-line")
        print("err-line", file=sys.stderr)
        import logging

        logging.getLogger("launcher-lib").warning("log-line")  # a handler the launcher made (fork_driver)
        print("echo:" + input())
        sys.exit(0)
    reuse = _reuse() if how == "reuse" else None
    fds, placeholders = [], 0
    for n in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{n}")  # listdir's own fd is gone by now
        except OSError:
            continue
        if int(n) > 2 and target == os.devnull:  # a launcher's number, held by /dev/null (forking)
            placeholders += 1
            continue
        fds.append(int(n))
    fds.sort()
    report = {"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "ppid": os.getppid(),
              "rank": os.environ.get("RANK"), "fds": fds, "answer_fd": fd, "argv": sys.argv,
              "threads": threading.active_count(), "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
              "frozen": gc.get_freeze_count(), "placeholders": placeholders, "reuse": reuse}
    os.write(fd, (json.dumps(report) + "\n").encode())
    if how == "echo":  # each stdin line back on the answer pipe, then "eof" when stdin closes
        buf = b""
        while chunk := os.read(0, 65536):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                os.write(fd, (json.dumps({"echo": json.loads(line)}) + "\n").encode())
        os.write(fd, b'{"eof": true}\n')
        sys.exit(0)
    if how == "reuse":
        sys.exit(0)
    if how == "hang":
        os.close(fd)  # the parent sees the pipe close, then stops us
        signal.pause()
    elif how == "raise":
        raise RuntimeError("boom")
    sys.exit(int(how))


if __name__ == "__main__":
    main()
