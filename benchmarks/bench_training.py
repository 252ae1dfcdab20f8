"""``hwtui train`` measured honestly: balancing efficiency, and what a second device is worth.

Every figure comes from real ``hwtui train`` runs (coordinator + spawned workers, one torch thread
per CPU worker) started by this script, one after another, never side by side.

**Efficiency** of a pair of unequal workers (two CPU workers, rank 1 made FACTOR times slower by
the documented test-only knob ``HWTUI_TEST_SLOWDOWN``, engine/training/knobs.py)::

    efficiency = achieved samples/s of the pair / (fast solo samples/s + slow solo samples/s)

with each solo a one-worker run of the same model, batch and rounds, run *one after the other*
in the same invocation (fast solo, slow solo, pair), so the denominator is what each device does
alone. The slowdown knob is measured, not assumed: the slow/fast ratio of seconds per batch in
the solo runs and inside the pair run is printed next to the target FACTOR. Each round's idle
share per worker (1 - its training seconds / the round's wall time) comes from the run report:
the largest is printed (target: no worker idles more than 10% of a round).

On a shared machine the load drifts between runs, and solo runs one after another then measure
another machine than the pair: a figure above 1 is that drift, not a gain. ``--repeats`` takes
the median, and the ``in-run`` figure (the pair's rate over the sum of its own workers' training
rates inside the same run, which also charges merges and idling) is printed beside it.

**Loss at equal samples** (``--loss``): the synchronous baseline in the same harness -- one
worker, batch 2B, S steps -- against two workers of batch B, S steps each (the same samples, the
same number of optimizer steps of the merged model) with ``--merge average`` and ``--merge
outer-nesterov``, and one worker at 2N samples (batch B, 2S steps) with its wall time. Held-out
loss is measured on each final checkpoint by ``hwtui eval`` over the whole held-out set (exact,
no sampling error).

    flock /tmp/hwtui-bench.lock .venv/bin/python benchmarks/bench_training.py \\
        [--steps 300] [--batch-size 16] [--merge-every 20] [--factor 3] [--repeats 1] [--loss] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def train(tmp: str, gpu_ids: str, steps: int, batch: int, merge_every: int, *, balance: str = "dynamic",
          merge: str = "average", slowdown: str = "", eval_every: int | None = None, checkpoint: bool = False) -> dict:
    """One ``hwtui train`` run to completion; its report (plus wall seconds and checkpoint dir)."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    env = dict(os.environ)
    env.pop("HWTUI_TEST_SLOWDOWN", None)
    if slowdown:
        env["HWTUI_TEST_SLOWDOWN"] = slowdown
    cmd = [sys.executable, "-m", "hwtui.app", "train", "--gpu-ids", gpu_ids, "--balance", balance, "--merge", merge,
           "--steps", str(steps), "--batch-size", str(batch), "--merge-every", str(merge_every),
           "--report", str(out / "report.json")]
    if eval_every is not None:
        cmd += ["--eval-every", str(eval_every)]
    if checkpoint:
        cmd += ["--checkpoint-dir", str(out / "ckpt"), "--checkpoint-every", str(10 ** 6)]  # the last round only
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=1800)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    rep = json.loads((out / "report.json").read_text())
    rep["wall_seconds"] = wall
    rep["checkpoint_dir"] = str(out / "ckpt") if checkpoint else None
    return rep


def heldout(ckpt: str) -> float:
    p = subprocess.run([sys.executable, "-m", "hwtui.app", "eval", "--checkpoint-dir", ckpt, "--json", "--threads", "1"], cwd=REPO,
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"hwtui eval {ckpt} failed: {p.stderr.strip()[-500:]}")
    return float(json.loads(p.stdout)["loss"])


def seconds_per_batch(rep: dict, rank: int) -> float:
    return rep["config"]["batch_size"] / rep["workers"][rank]["busy_samples_per_s"]


def max_idle(rep: dict) -> float:
    """The largest idle share of any worker in any round but the first (start-up warms kernels)."""
    rounds = rep["rounds"][1:] or rep["rounds"]
    return max((v for r in rounds for v in r.get("idle", {}).values()), default=0.0)


def efficiency_section(tmp: str, args: argparse.Namespace, figures: dict) -> None:
    s, b, m, f = args.steps, args.batch_size, args.merge_every, args.factor
    slow_steps = max(m, math.ceil(s / f / m) * m)  # whole rounds, about as long in time as the fast solo
    balances = [x for x in args.balances.split(",") if x]
    per: dict[str, dict[str, list[float]]] = {x: {"eff": [], "in_run": [], "idle": [], "knob": [], "rate": []}
                                              for x in balances}
    knob_solo: list[float] = []
    solos: dict[str, list[float]] = {"fast": [], "slow": []}
    for i in range(args.repeats):
        fast = train(tmp, "cpu:0", s, b, m, eval_every=10 ** 6)
        slow = train(tmp, "cpu:0", slow_steps, b, m, slowdown=f"0:{f}", eval_every=10 ** 6)
        solos["fast"].append(fast["samples_per_s"])
        solos["slow"].append(slow["samples_per_s"])
        knob_solo.append(seconds_per_batch(slow, 0) / seconds_per_batch(fast, 0))
        ideal = fast["samples_per_s"] + slow["samples_per_s"]
        line = [f"repeat {i + 1}: solo fast {fast['samples_per_s']:.1f}/s, solo slow {slow['samples_per_s']:.1f}/s "
                f"(one after the other)"]
        for balance in balances:
            rep = train(tmp, "cpu:0,cpu:1", s, b, m, balance=balance, slowdown=f"1:{f}", eval_every=10 ** 6)
            rate = rep["samples_per_s"]
            per[balance]["eff"].append(rate / ideal)
            # Immune to load drift between runs: the pair against its own workers' training rates.
            per[balance]["in_run"].append(rate / sum(w["busy_samples_per_s"] for w in rep["workers"]))
            per[balance]["idle"].append(max_idle(rep))
            per[balance]["knob"].append(seconds_per_batch(rep, 1) / seconds_per_batch(rep, 0))
            per[balance]["rate"].append(rate)
            line.append(f"{balance} {rate:.1f}/s = {rate / ideal:.3f}")
        print("; ".join(line), flush=True)
    med = statistics.median
    figures["efficiency"] = {"factor": f, "solo_fast_samples_per_s": solos["fast"], "solo_slow_samples_per_s": solos["slow"],
                             "knob_ratio_solo": [round(x, 3) for x in knob_solo]}
    print(f"knob check, slow/fast seconds per batch: solo {med(knob_solo):.2f}"
          + "".join(f", {x} pair {med(per[x]['knob']):.2f}" for x in balances) + f" (target {f:g})")
    for balance in balances:
        e = per[balance]
        figures["efficiency"][balance] = {"efficiency": round(med(e["eff"]), 4), "runs": [round(x, 4) for x in e["eff"]],
                                          "efficiency_in_run": round(med(e["in_run"]), 4),
                                          "max_idle_share": round(med(e["idle"]), 4), "knob_ratio": round(med(e["knob"]), 3),
                                          "samples_per_s": e["rate"]}
        print(f"{balance:8s}: efficiency (solo) {med(e['eff']):.3f} [runs {', '.join(f'{x:.3f}' for x in e['eff'])}]; "
              f"in-run {med(e['in_run']):.3f}; max idle share of a round {med(e['idle']):.1%} (target <= 10%)")


def loss_section(tmp: str, args: argparse.Namespace, figures: dict) -> None:
    s, b, m = args.steps, args.batch_size, args.merge_every
    ev = 10 ** 6  # no evaluation inside training: the held-out loss comes from hwtui eval on the checkpoint
    runs = {
        "sync": train(tmp, "cpu:0", s, 2 * b, m, eval_every=ev, checkpoint=True),
        "average": train(tmp, "cpu:0,cpu:1", s, b, m, merge="average", eval_every=ev, checkpoint=True),
        "outer-nesterov": train(tmp, "cpu:0,cpu:1", s, b, m, merge="outer-nesterov", eval_every=ev, checkpoint=True),
        "one worker, 2N": train(tmp, "cpu:0", 2 * s, b, m, eval_every=ev, checkpoint=True),
    }
    losses = {k: heldout(r["checkpoint_dir"]) for k, r in runs.items()}
    n = runs["sync"]["samples"]
    figures["loss"] = {k: {"heldout_loss": round(losses[k], 4), "samples": r["samples"], "train_seconds": r["train_seconds"]}
                       for k, r in runs.items()}
    print(f"held-out loss (whole held-out set) at N = {n:,} samples: "
          + ", ".join(f"{k} {losses[k]:.4f}" for k in ("sync", "average", "outer-nesterov")))
    for k in ("average", "outer-nesterov"):
        gap = losses[k] / losses["sync"] - 1
        print(f"  {k:15s}: {gap:+.2%} vs sync (target within 2%); {runs[k]['train_seconds']:.1f}s training")
    one = runs["one worker, 2N"]
    # "2N": each of the two workers trains N = S x B samples, 2N in all; one worker reaches 2N alone
    # in 2S steps of batch B. The target: two workers reach its loss in <= 0.6x its wall time.
    print(f"one worker alone to 2N = {one['samples']:,} samples (2S steps of batch B): {losses['one worker, 2N']:.4f} "
          f"in {one['train_seconds']:.1f}s; two workers at the same samples: "
          + ", ".join(f"{k} {losses[k]:.4f} ({losses[k] - losses['one worker, 2N']:+.4f}) in "
                      f"{runs[k]['train_seconds'] / one['train_seconds']:.2f}x its time" for k in ("average", "outer-nesterov"))
          + " (target: its loss in <= 0.6x its time)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="merged-model steps per run (default 300)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--merge-every", type=int, default=20)
    ap.add_argument("--factor", type=float, default=3.0, help="how much slower worker 1 is (default 3)")
    ap.add_argument("--balances", default="dynamic", help="pair runs to measure (default dynamic; add equal,static)")
    ap.add_argument("--repeats", type=int, default=1, help="efficiency repeats; medians reported (default 1)")
    ap.add_argument("--loss", action="store_true", help="also measure held-out loss at equal samples (sync/average/outer)")
    ap.add_argument("--no-efficiency", action="store_true", help="skip the efficiency section")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args()
    figures: dict = {"steps": args.steps, "batch_size": args.batch_size, "merge_every": args.merge_every}
    print(f"settings: {args.steps} steps, batch {args.batch_size}, merge every {args.merge_every}, slowdown x{args.factor:g}, "
          f"{args.repeats} repeat(s); runs one after another", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_efficiency:
            efficiency_section(tmp, args, figures)
        if args.loss:
            loss_section(tmp, args, figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
