"""A stand-in engine process for the TUI tests: writes a recorded JSONL event stream to stdout.

It goes through the same path as the real engine (a child process in its own session, stdout
read line by line, stderr captured, exit status reported), so the Run screen's reader, merging
and error handling are tested for real. Options:

  --delay S        pause between lines (so the dashboard is seen mid-run)
  --stderr TEXT    write TEXT to stderr before exiting
  --exit N         exit status (after the stream)
  --hang           after the stream, wait for a signal (to test stopping)
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("stream")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--stderr", default="")
    parser.add_argument("--exit", type=int, default=0)
    parser.add_argument("--hang", action="store_true")
    args = parser.parse_args()
    with open(args.stream, encoding="utf-8") as fh:
        for line in fh:
            sys.stdout.write(line)
            sys.stdout.flush()
            if args.delay:
                time.sleep(args.delay)
    if args.stderr:
        print(args.stderr, file=sys.stderr, flush=True)
    if args.hang:
        time.sleep(600)
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
