"""hwtui --check --json against torch's collect_env on the same machine.

Medians of N runs each (default 5), run interleaved so machine noise hits both sides alike:
  cold  hwtui with an empty torch-facts cache (its child process imports torch once)
  warm  hwtui with the cache filled (keyed on the installed torch; no torch import at all)
  collect_env  `python -m torch.utils.collect_env`
plus `hwtui --version` and `hwtui --help` (lazy imports: target < 0.2 s).
Targets: cold <= 0.8x collect_env, warm <= 0.2x.

    .venv/bin/python benchmarks/bench_check.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def hwtui_cmd() -> list[str]:
    script = Path(sys.executable).with_name("hwtui")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hwtui.app"]


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=600)
    elapsed = time.perf_counter() - t
    if r.returncode not in (0, 1):  # 1 = the check found a failure, still a full run
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.decode()[-500:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    hw = hwtui_cmd()
    base_env = dict(os.environ)
    warm_cache = tempfile.mkdtemp(prefix="hwtui-warm-")
    warm_env = dict(base_env, XDG_CACHE_HOME=warm_cache)
    timed([*hw, "--check", "--json"], warm_env)  # fill the warm cache once

    samples: dict[str, list[float]] = {"cold": [], "warm": [], "collect_env": [], "version": [], "help": []}
    for _ in range(args.runs):
        cold_cache = tempfile.mkdtemp(prefix="hwtui-cold-")
        samples["cold"].append(timed([*hw, "--check", "--json"], dict(base_env, XDG_CACHE_HOME=cold_cache)))
        shutil.rmtree(cold_cache, ignore_errors=True)
        samples["warm"].append(timed([*hw, "--check", "--json"], warm_env))
        samples["collect_env"].append(timed([sys.executable, "-m", "torch.utils.collect_env"], base_env))
        samples["version"].append(timed([*hw, "--version"], base_env))
        samples["help"].append(timed([*hw, "--help"], base_env))
    shutil.rmtree(warm_cache, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"runs: {args.runs} each, medians (interleaved), python {sys.version.split()[0]}")
    for k in ("collect_env", "cold", "warm", "version", "help"):
        print(f"  {k:12s} {med[k]:7.3f} s   (min {min(samples[k]):.3f}, max {max(samples[k]):.3f})")
    cold_ratio = med["cold"] / med["collect_env"]
    warm_ratio = med["warm"] / med["collect_env"]
    print(f"ratio cold/collect_env = {cold_ratio:.2f}x (target <= 0.80) {'OK' if cold_ratio <= 0.8 else 'MISSED'}")
    print(f"ratio warm/collect_env = {warm_ratio:.2f}x (target <= 0.20) {'OK' if warm_ratio <= 0.2 else 'MISSED'}")
    for k in ("version", "help"):
        print(f"hwtui --{k}: {med[k]:.3f} s (target < 0.200) {'OK' if med[k] < 0.2 else 'MISSED'}")


if __name__ == "__main__":
    main()
