"""Balancing efficiency of ``hwtui train`` with workers of unequal speed.

    efficiency = achieved samples/s of the pair run / sum of each worker's solo samples/s

The unequal pair is two CPU workers, rank 1 made FACTOR times slower by the documented test-only
knob ``HWTUI_TEST_SLOWDOWN=1:FACTOR`` (engine/training/knobs.py: after every batch and every
held-out evaluation it sleeps (FACTOR-1) x the compute time it just measured, so all of that
worker's work takes FACTOR times as long and its core is left free, like a slower device).

How the solo rates are measured, so that they are comparable with the pair run:

* the same process setup: a real ``hwtui train`` run with one worker (coordinator + one spawned
  worker, one torch thread per CPU worker), the same model, batch, ``--merge-every`` and
  ``--eval-every``; the slow solo carries the same knob (``0:FACTOR``: it is rank 0 alone);
* the same kind of window: ``samples_per_s`` from the run report, i.e. samples / the training
  window (first claim to last commit, startup and shutdown excluded), merges included, with rounds
  as long in steps as the pair's; the slow solo trains fewer steps (whole rounds) so that both
  solos last about as long as the pair run;
* under the same contention: the machine has 2 cores shared with other jobs, and in the pair run
  both workers (and whatever else runs) compete for them; a worker alone on the machine does not
  see that. So the headline solo rates come from the two one-worker runs started *together*
  (two independent jobs, no merging between them: perfect balancing by construction, same CPU
  demand as the pair). The solos run one after the other (``alone``) are printed as well;
* interleaved: every repeat measures both solos right before its pair runs, so a shared machine's
  load drift hits numerator and denominator alike; each figure is the median over repeats of the
  per-repeat ratio.

Three figures per balance, labelled:

* ``solo``: the definition above with the concurrent solos (the target, >= 0.95 for dynamic);
* ``alone``: with the solos run one after the other (optimistic on a loaded machine: a worker
  alone there gets more CPU than either worker of the pair);
* ``vs compute``: against the solos' pure compute rates (samples / seconds spent inside batches):
  stricter, it also charges the merge rounds and evaluations themselves;
* ``in-run``: against each worker's own compute rate inside the same pair run (immune to load drift
  between runs; also charges merges).

The knob check prints the slow/fast ratio of seconds per batch in the solo runs and inside the
pair run: both should be close to FACTOR.

An equal split is bounded by the slow worker (2 / (1 + FACTOR) of the ideal, 0.5 for FACTOR 3).
With ``--mixed`` and a CUDA device visible it also runs ``cuda:0`` with two CPU workers.

    flock /tmp/hwtui-bench.lock .venv/bin/python benchmarks/bench_training.py \\
        [--steps 600] [--merge-every 150] [--factor 3] [--repeats 3] [--balances dynamic,equal] [--json OUT]
        [--no-prefetch]
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_PREFETCH = False  # --no-prefetch: one chunk at a time (a round trip per chunk), to compare


def start(tmp: str, gpu_ids: str, balance: str, steps: int, batch: int, merge_every: int, eval_every: int | None,
          slowdown: str = "") -> tuple[subprocess.Popen, list[str], Path]:
    report = Path(tempfile.mkdtemp(dir=tmp)) / "report.json"
    env = dict(os.environ)
    env.pop("HWTUI_TEST_SLOWDOWN", None)
    if NO_PREFETCH:
        env["HWTUI_TEST_PREFETCH"] = "0"
    if slowdown:
        env["HWTUI_TEST_SLOWDOWN"] = slowdown
    cmd = [sys.executable, "-m", "hwtui.app", "train", "--gpu-ids", gpu_ids, "--balance", balance, "--steps", str(steps),
           "--batch-size", str(batch), "--merge-every", str(merge_every), "--report", str(report)]
    if eval_every is not None:
        cmd += ["--eval-every", str(eval_every)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, cmd, report


def finish(proc: subprocess.Popen, cmd: list[str], report: Path) -> dict:
    try:
        _, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise SystemExit(f"{' '.join(cmd)} took over 900 s") from None
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.strip()[-500:]}")
    return json.loads(report.read_text())


def run(*args, **kw) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return finish(*start(tmp, *args, **kw))


def run_together(*jobs: tuple) -> list[dict]:
    """Independent one-worker runs at the same time: each solo under the pair's CPU contention."""
    with tempfile.TemporaryDirectory() as tmp:
        started = [start(tmp, *a, **kw) for a, kw in jobs]
        return [finish(*x) for x in started]


def seconds_per_batch(rep: dict, rank: int) -> float:
    w = rep["workers"][rank]
    return rep["config"]["batch_size"] / w["busy_samples_per_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600, help="merged-model steps per pair run (default 600)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--merge-every", type=int, default=150,
                    help="steps per merge round (default 150: rounds of several seconds, like a real job)")
    ap.add_argument("--eval-every", type=int, default=None, help="passed to hwtui train (default: its own default)")
    ap.add_argument("--factor", type=float, default=3.0, help="how much slower worker 1 is (default 3)")
    ap.add_argument("--balances", default="dynamic,equal", help="pair runs to measure (default dynamic,equal; add static)")
    ap.add_argument("--mixed", action="store_true", help="also run cuda:0 + cpu:0 + cpu:1 when CUDA is visible")
    ap.add_argument("--repeats", type=int, default=3, help="measurement repeats; medians reported (default 3)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="workers claim one chunk at a time (HWTUI_TEST_PREFETCH=0), for a before/after comparison")
    args = ap.parse_args()
    global NO_PREFETCH
    NO_PREFETCH = args.no_prefetch
    s, b, m, f, ev = args.steps, args.batch_size, args.merge_every, args.factor, args.eval_every
    balances = [x for x in args.balances.split(",") if x]
    # The slow solo trains 1/FACTOR of the steps: it lasts about as long as the fast solo (same window).
    slow_steps = max(1, math.ceil(s / f))
    figures: dict = {"factor": f, "steps": s, "batch_size": b, "merge_every": m, "eval_every": ev,
                     "solo_steps": {"fast": s, "slow": slow_steps}}
    print(f"settings: pair {s} steps, --merge-every {m} (rounds of {2 * m} chunks), --batch-size {b}, "
          f"--eval-every {ev if ev is not None else 'default'}, slowdown x{f:g}; solo fast {s} steps, solo slow {slow_steps} steps; "
          f"{args.repeats} interleaved repeats, medians", flush=True)

    solo: dict[str, list[dict]] = {"fast": [], "slow": []}
    pair: dict[str, list[dict]] = {x: [] for x in balances}
    eff: dict[str, dict[str, list[float]]] = {x: {"solo": [], "alone": [], "vs_compute": [], "in_run": []} for x in balances}
    together: dict[str, list[float]] = {"fast": [], "slow": []}
    knob: dict[str, list[float]] = {"solo": [], **{x: [] for x in balances}}
    for i in range(args.repeats):
        fast = run("cpu:0", "dynamic", s, b, m, ev)
        slow = run("cpu:0", "dynamic", slow_steps, b, m, ev, slowdown=f"0:{f}")
        solo["fast"].append(fast)
        solo["slow"].append(slow)
        knob["solo"].append(seconds_per_batch(slow, 0) / seconds_per_batch(fast, 0))
        fast_t, slow_t = run_together((("cpu:0", "dynamic", s, b, m, ev), {}),
                                      (("cpu:0", "dynamic", slow_steps, b, m, ev), {"slowdown": f"0:{f}"}))
        together["fast"].append(fast_t["samples_per_s"])
        together["slow"].append(slow_t["samples_per_s"])
        alone = fast["samples_per_s"] + slow["samples_per_s"]
        ideal = fast_t["samples_per_s"] + slow_t["samples_per_s"]
        ideal_compute = fast["workers"][0]["busy_samples_per_s"] + slow["workers"][0]["busy_samples_per_s"]
        line = [f"repeat {i + 1}: solo alone fast {fast['samples_per_s']:.1f}/s slow {slow['samples_per_s']:.1f}/s, "
                f"together fast {fast_t['samples_per_s']:.1f}/s slow {slow_t['samples_per_s']:.1f}/s"]
        for balance in balances:
            rep = run("cpu:0,cpu:1", balance, s, b, m, ev, slowdown=f"1:{f}")
            pair[balance].append(rep)
            rate = rep["samples_per_s"]
            eff[balance]["solo"].append(rate / ideal)
            eff[balance]["alone"].append(rate / alone)
            eff[balance]["vs_compute"].append(rate / ideal_compute)
            eff[balance]["in_run"].append(rate / sum(w["busy_samples_per_s"] for w in rep["workers"]))
            knob[balance].append(seconds_per_batch(rep, 1) / seconds_per_batch(rep, 0))
            line.append(f"{balance} {rate:.1f}/s = {rate / ideal:.3f}")
        print("; ".join(line), flush=True)

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    fast_rate = med([r["samples_per_s"] for r in solo["fast"]])
    slow_rate = med([r["samples_per_s"] for r in solo["slow"]])
    figures["solo"] = {
        "fast_samples_per_s": [r["samples_per_s"] for r in solo["fast"]],
        "slow_samples_per_s": [r["samples_per_s"] for r in solo["slow"]],
        "fast_compute_samples_per_s": [r["workers"][0]["busy_samples_per_s"] for r in solo["fast"]],
        "slow_compute_samples_per_s": [r["workers"][0]["busy_samples_per_s"] for r in solo["slow"]],
    }
    figures["knob_ratio"] = {k: [round(x, 3) for x in v] for k, v in knob.items()}
    figures["solo"] |= {"together_fast_samples_per_s": together["fast"], "together_slow_samples_per_s": together["slow"]}
    print(f"solo alone (median): fast {fast_rate:.1f} samples/s, slow (x{f:g}) {slow_rate:.1f} samples/s; together: "
          f"fast {med(together['fast']):.1f}, slow {med(together['slow']):.1f}")
    print("knob check, slow/fast seconds per batch (median): solo " + f"{med(knob['solo']):.2f}"
          + "".join(f", {x} pair {med(knob[x]):.2f}" for x in balances) + f" (target {f:g})")
    for balance in balances:
        e = {k: med(v) for k, v in eff[balance].items()}
        reps = pair[balance]
        shares = [round(statistics.median(r["workers"][k]["samples"] / max(1, r["samples"]) for r in reps), 3)
                  for k in range(2)]
        rounds = statistics.median(r["train_seconds"] / max(1, len(r["rounds"])) for r in reps)
        figures[balance] = {"efficiency": round(e["solo"], 4), "efficiency_alone": round(e["alone"], 4),
                            "efficiency_vs_compute": round(e["vs_compute"], 4),
                            "efficiency_in_run": round(e["in_run"], 4),
                            "runs": {k: [round(x, 4) for x in v] for k, v in eff[balance].items()},
                            "samples_per_s": [r["samples_per_s"] for r in reps], "shares_median": shares,
                            "round_seconds_median": round(rounds, 2), "final_loss": [r["final_loss"] for r in reps]}
        print(f"{balance:8s}: efficiency (solo) {e['solo']:.3f} [runs {', '.join(f'{x:.3f}' for x in eff[balance]['solo'])}]; "
              f"alone {e['alone']:.3f}; vs compute {e['vs_compute']:.3f}; in-run {e['in_run']:.3f}; shares {shares[0]:.0%}/{shares[1]:.0%}; "
              f"rounds {rounds:.1f}s")

    if args.mixed:
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                               capture_output=True, text=True)
        if probe.stdout.strip() != "True":
            print("mixed: no CUDA device visible to torch; skipped")
        else:
            solos = {d: run(d, "dynamic", s, b, m, ev)["samples_per_s"] for d in ("cuda:0", "cpu:0")}
            ideal_mixed = solos["cuda:0"] + 2 * solos["cpu:0"]
            rep = run("cuda:0,cpu:0,cpu:1", "dynamic", s, b, m, ev)
            rate = rep["samples_per_s"]
            shares_m = [w["samples"] / max(1, rep["samples"]) for w in rep["workers"]]
            figures["mixed"] = {"solo": solos, "samples_per_s": rate, "efficiency": round(rate / ideal_mixed, 4),
                                "shares": [round(x, 3) for x in shares_m], "final_loss": rep["final_loss"],
                                "precision": [w["precision"] for w in rep["workers"]]}
            print(f"mixed cuda:0+cpu:0+cpu:1: {rate:.1f} samples/s, efficiency {rate / ideal_mixed:.3f} "
                  f"(solo cuda {solos['cuda:0']:.1f}, cpu {solos['cpu:0']:.1f}), shares "
                  + " ".join(f"{x:.0%}" for x in shares_m))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
