"""`hwtui train` with forked CPU workers (the default) against exec'd ones (HWTUI_FORK_RANKS=0).

    python benchmarks/bench_train_fork.py [--rounds 5] [--steps 40] [--model DIR]

The built-in toy model (or --model DIR), 2 CPU workers. Each round runs both, interleaved (the
order alternates), under /usr/bin/time: wall and the CPU of the whole process tree (user+sys of
the launcher and every worker it waited for). Prints each run, the medians, their ratios, and the
load average before and after: figures from a shared box are comparable only side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(fork: str, steps: int, model: str | None) -> tuple[float, float]:
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        argv = ["/usr/bin/time", "-o", tf.name, "-f", "%e %U %S", sys.executable, "-m", "hwtui", "train",
                "--gpu-ids", "cpu:0,cpu:1", "--steps", str(steps), "--merge-every", str(max(1, steps // 2)), "-q"]
        if model:
            argv += ["--model", model]
        env = {**os.environ, "HWTUI_FORK_RANKS": fork,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"HWTUI_FORK_RANKS={fork}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
        wall, user, sys_ = (float(x) for x in Path(tf.name).read_text().split()[-3:])
    return wall, user + sys_


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--model", default=None, help="a Hugging Face model directory (default: the toy model)")
    args = ap.parse_args()
    print("load before:", os.getloadavg(), flush=True)
    got: dict[str, list[tuple[float, float]]] = {"1": [], "0": []}
    for i in range(args.rounds):
        for fork in (("1", "0") if i % 2 == 0 else ("0", "1")):
            wall, cpu = run(fork, args.steps, args.model)
            got[fork].append((wall, cpu))
            print(f"round {i + 1} {'forked' if fork == '1' else 'exec  '}: wall {wall:6.2f} s  cpu {cpu:6.2f} s", flush=True)
    med = {f: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for f, r in got.items()}
    print(f"median forked: wall {med['1'][0]:.2f} s, cpu {med['1'][1]:.2f} s")
    print(f"median exec:   wall {med['0'][0]:.2f} s, cpu {med['0'][1]:.2f} s")
    print(f"forked/exec: wall {med['1'][0] / med['0'][0]:.2f}, cpu {med['1'][1] / med['0'][1]:.2f}")
    print("load after:", os.getloadavg())


if __name__ == "__main__":
    main()
