"""Entry point of a probe child process: ``python -m hwtui.probes._child_entry MOD:FUNC FD ARGS``.

Runs one function and writes ``{"kind": "answer", "ok": true, "value": ...}`` (or the error) as one
JSON line to the inherited pipe (the supervisor's envelope: an object with a ``kind``).
Standard output is not the channel, because vendor libraries print on import.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def main() -> None:
    target, fd, raw_args = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    try:
        module_name, func_name = target.split(":", 1)
        func = getattr(importlib.import_module(module_name), func_name)
        answer = {"kind": "answer", "ok": True, "value": func(**json.loads(raw_args))}
    except BaseException as exc:  # noqa: BLE001 - amdsmi raises KeyError on import, others SystemExit
        answer = {"kind": "answer", "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    payload = (json.dumps(answer, default=str) + "\n").encode()
    with os.fdopen(fd, "wb") as out:
        out.write(payload)


if __name__ == "__main__":
    main()
