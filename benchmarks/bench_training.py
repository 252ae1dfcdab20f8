"""Balancing efficiency of ``hwtui train`` with workers of unequal speed.

    efficiency = achieved samples/s of the run / sum of each worker's solo samples/s

Solo figures come from runs of one worker alone, with the same model, batch and merge cadence
(so merge overhead is in both). The unequal pair is two CPU workers, rank 1 made FACTOR times
slower by the documented test-only knob ``HWTUI_TEST_SLOWDOWN=1:FACTOR`` (engine/training/knobs.py:
it sleeps (FACTOR-1) x its measured compute time after each batch). Dynamic balancing (chunks
claimed as workers free up) should reach >= 0.95; an equal split is bounded by the slow worker
(efficiency 2 / (1 + FACTOR), i.e. 0.5 for FACTOR 3) and is printed beside it.

With ``--mixed`` and a CUDA device visible, it also runs ``cuda:0`` with two CPU workers: a real
mixed-backend run (weights merged through host memory over gloo).

    .venv/bin/python benchmarks/bench_training.py [--steps 200] [--factor 3] [--repeats 3] [--mixed] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(gpu_ids: str, balance: str, steps: int, batch: int, merge_every: int, slowdown: str = "") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = dict(os.environ)
        env.pop("HWTUI_TEST_SLOWDOWN", None)
        if slowdown:
            env["HWTUI_TEST_SLOWDOWN"] = slowdown
        cmd = [sys.executable, "-m", "hwtui.app", "train", "--gpu-ids", gpu_ids, "--balance", balance, "--steps", str(steps),
               "--batch-size", str(batch), "--merge-every", str(merge_every), "--report", str(report)]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        return json.loads(report.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="merged-model steps per pair run (solo runs do the same chunk count)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--merge-every", type=int, default=20)
    ap.add_argument("--factor", type=float, default=3.0, help="how much slower worker 1 is (default 3)")
    ap.add_argument("--mixed", action="store_true", help="also run cuda:0 + cpu:0 + cpu:1 when CUDA is visible")
    ap.add_argument("--repeats", type=int, default=3, help="measurement repeats; medians reported (default 3)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args()
    s, b, m, f = args.steps, args.batch_size, args.merge_every, args.factor
    figures: dict = {"factor": f, "steps": s, "batch_size": b, "merge_every": m}

    # One worker alone does one chunk per step: 2*s steps gives it as many chunks as the pair's run.
    # Each repeat measures its own solos right before its pair runs, so a shared machine's load drift
    # hits numerator and denominator alike; medians over repeats are reported.
    per: dict[str, list[float]] = {"fast": [], "slow": [], "dynamic": [], "equal": [], "static": []}
    # In-run efficiency: achieved samples/s / sum of each worker's own rate while busy in the same run.
    # Same definition with the solo rates measured under the run's own load, so it survives a machine
    # shared with other jobs (where solo runs minutes earlier saw a different load).
    inrun: dict[str, list[float]] = {"dynamic": [], "equal": [], "static": []}
    shares: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        fast = run("cpu:0", "dynamic", 2 * s, b, m)["samples_per_s"]
        slow = run("cpu:0", "dynamic", 2 * s, b, m, slowdown=f"0:{f}")["samples_per_s"]
        per["fast"].append(fast)
        per["slow"].append(slow)
        for balance in ("dynamic", "equal", "static"):
            rep = run("cpu:0,cpu:1", balance, s, b, m, slowdown=f"1:{f}")
            per[balance].append(rep["samples_per_s"] / (fast + slow))
            inrun[balance].append(rep["samples_per_s"] / sum(w["busy_samples_per_s"] for w in rep["workers"]))
            shares[balance] = [round(w["samples"] / max(1, rep["samples"]), 3) for w in rep["workers"]]
    med = {k: statistics.median(v) for k, v in per.items()}
    figures["solo"] = {"fast": med["fast"], "slow": med["slow"], "runs": {"fast": per["fast"], "slow": per["slow"]}}
    print(f"solo (median of {args.repeats}): fast {med['fast']:.1f} samples/s, slow (x{f:g}) {med['slow']:.1f} samples/s")
    for balance in ("dynamic", "equal", "static"):
        ir = statistics.median(inrun[balance])
        figures[balance] = {"efficiency": round(med[balance], 4), "runs": [round(x, 4) for x in per[balance]],
                            "efficiency_in_run": round(ir, 4), "shares_last_run": shares[balance]}
        print(f"{balance:8s}: efficiency {med[balance]:.3f} (runs {', '.join(f'{x:.3f}' for x in per[balance])}); "
              f"in-run {ir:.3f}; shares in the last run " + " ".join(f"{x:.0%}" for x in shares[balance]))

    if args.mixed:
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                               capture_output=True, text=True)
        if probe.stdout.strip() != "True":
            print("mixed: no CUDA device visible to torch; skipped")
        else:
            solo = {d: run(d, "dynamic", 2 * s, b, m)["samples_per_s"] for d in ("cuda:0", "cpu:0")}
            ideal_mixed = solo["cuda:0"] + 2 * solo["cpu:0"]
            rep = run("cuda:0,cpu:0,cpu:1", "dynamic", s, b, m)
            rate = rep["samples_per_s"]
            shares = [w["samples"] / max(1, rep["samples"]) for w in rep["workers"]]
            figures["mixed"] = {"solo": solo, "samples_per_s": rate, "efficiency": round(rate / ideal_mixed, 4),
                                "shares": [round(x, 3) for x in shares], "final_loss": rep["final_loss"],
                                "precision": [w["precision"] for w in rep["workers"]]}
            print(f"mixed cuda:0+cpu:0+cpu:1: {rate:.1f} samples/s, efficiency {rate / ideal_mixed:.3f} "
                  f"(solo cuda {solo['cuda:0']:.1f}, cpu {solo['cpu:0']:.1f}), shares "
                  + " ".join(f"{x:.0%}" for x in shares))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
