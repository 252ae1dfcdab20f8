"""Redaction time per value size and shape: linear, a 1 MB value well under 0.1 s.

Medians of N runs per shape at 100 KB and 1 MB; the ratio 1 MB / 100 KB is ~10 for a linear scan
(a quadratic one gives ~100: the old scheme regex took 38 s on a 100 KB NCCL_SOCKET_IFNAME).

    .venv/bin/python benchmarks/bench_redact.py [--runs 5] [--mb 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

from hwtui.core.redact import redact_text

SHAPES = {
    "letters": "a", "iface list": "eth0,", "scheme-like": "http", "jwt-like": "eyJ", "openai-like": "sk-",
    "at signs": "@", "colon-at": ":@", "assignments": "a=b ", "words": "word ", "credentials": "a:b@c ",
    "query tokens": "token=x&",
}


def median_time(text: str, runs: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        redact_text(text)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mb", type=float, default=1.0)
    args = ap.parse_args()
    size = int(args.mb * 1_000_000)
    print(f"{'shape':14s} {'100KB s':>9s} {'1MB s':>9s} {'ratio':>6s}")
    for name, unit in SHAPES.items():
        big = (unit * (size // len(unit) + 1))[:size]
        small = big[: size // 10]
        t_small, t_big = median_time(small, args.runs), median_time(big, args.runs)
        print(f"{name:14s} {t_small:9.4f} {t_big:9.4f} {t_big / max(t_small, 1e-9):6.1f}")


if __name__ == "__main__":
    main()
