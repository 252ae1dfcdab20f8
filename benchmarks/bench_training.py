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

**The plain-loop baseline** (``--baseline plain``): ``hwtui train`` on one device (``--gpu-ids``,
default cpu:0) against a plain PyTorch loop of the same model (``--model``, ``--d-model`` ...),
batch, batches (the same ``chunk_batch`` windows) and thread count, in its own process: AdamW,
no per-step host synchronisation, the loss read once at the end. Rounds are interleaved (hwtui,
plain, hwtui, plain ...) so load drifting on a shared machine hits both alike; samples/s and
tokens/s are medians over ``--repeats``, hwtui's from its report (its timed training: every
round, merges and evaluations included, start-up excluded), the plain loop's over its timed
steps after 3 warm-up steps. Device utilisation is NVML's median while each ran (n/a on CPU)::

    benchmarks/bench_training.py --baseline plain --repeats 5 [--model DIR --data FILE]
        [--d-model 16 --layers 1 --heads 1 --batch-size 2 --steps 600]
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
          merge: str = "average", slowdown: str = "", eval_every: int | None = None, checkpoint: bool = False,
          seed: int = 0, outer: tuple[float, float] | None = None, checkpoint_every: int = 10 ** 6) -> dict:
    """One ``hwtui train`` run to completion; its report (plus wall seconds and checkpoint dir)."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    env = dict(os.environ)
    env.pop("HWTUI_TEST_SLOWDOWN", None)
    if slowdown:
        env["HWTUI_TEST_SLOWDOWN"] = slowdown
    cmd = [sys.executable, "-m", "hwtui.app", "train", "--gpu-ids", gpu_ids, "--balance", balance, "--merge", merge,
           "--steps", str(steps), "--batch-size", str(batch), "--merge-every", str(merge_every),
           "--report", str(out / "report.json"), "--seed", str(seed)]
    if outer is not None:
        cmd += ["--outer-lr", str(outer[0]), "--outer-momentum", str(outer[1])]
    if eval_every is not None:
        cmd += ["--eval-every", str(eval_every)]
    if checkpoint:
        # the last round only by default; every round kept when a time-to-loss needs them all
        cmd += ["--checkpoint-dir", str(out / "ckpt"), "--checkpoint-every", str(checkpoint_every),
                "--keep-checkpoints", str(10 ** 6)]
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


def round_idles(rep: dict) -> list[float]:
    """Each round's largest idle share of any worker, every round but the first (start-up warms kernels)."""
    rounds = rep["rounds"][1:] or rep["rounds"]
    return [max(r.get("idle", {}).values(), default=0.0) for r in rounds]


def max_idle(rep: dict) -> float:
    return max(round_idles(rep), default=0.0)


def worst_round(rep: dict) -> str:
    """Where the worst round's idle went, per worker: seconds before its first chunk / between
    chunks / after its last (waiting at the merge), of the round's seconds."""
    rounds = rep["rounds"][1:] or rep["rounds"]
    r = max(rounds, key=lambda x: max(x.get("idle", {}).values(), default=0.0))
    parts = r.get("idle_parts", {})
    return (f"round {r['round']} ({r['seconds']:.2f}s, chunks {r['done_by']}): "
            + "; ".join(f"worker {k} idle {r['idle'][k]:.1%} = {p['before']:.3f}s before + {p['between']:.3f}s between "
                        f"+ {p['after']:.3f}s after" for k, p in sorted(parts.items())))


def efficiency_section(tmp: str, args: argparse.Namespace, figures: dict) -> None:
    s, b, m, f = args.steps, args.batch_size, args.merge_every, args.factor
    slow_steps = max(m, math.ceil(s / f / m) * m)  # whole rounds, about as long in time as the fast solo
    balances = [x for x in args.balances.split(",") if x]
    per: dict[str, dict[str, list[float]]] = {x: {"eff": [], "in_run": [], "idle": [], "idle_rounds": [], "knob": [],
                                                  "rate": []}
                                              for x in balances}
    knob_solo: list[float] = []
    solos: dict[str, list[float]] = {"fast": [], "slow": []}
    for i in range(args.repeats):
        # Odd repeats run the pairs first, then the solos: a load that rises (or falls) through the
        # invocation then favours the pair in one repeat and the solos in the next, not always the same.
        pairs = {balance: train(tmp, "cpu:0,cpu:1", s, b, m, balance=balance, slowdown=f"1:{f}", eval_every=10 ** 6)
                 for balance in (balances if i % 2 else [])}
        fast = train(tmp, "cpu:0", s, b, m, eval_every=10 ** 6)
        slow = train(tmp, "cpu:0", slow_steps, b, m, slowdown=f"0:{f}", eval_every=10 ** 6)
        solos["fast"].append(fast["samples_per_s"])
        solos["slow"].append(slow["samples_per_s"])
        knob_solo.append(seconds_per_batch(slow, 0) / seconds_per_batch(fast, 0))
        ideal = fast["samples_per_s"] + slow["samples_per_s"]
        line = [f"repeat {i + 1} (load {os.getloadavg()[0]:.1f}): solo fast {fast['samples_per_s']:.1f}/s, solo slow "
                f"{slow['samples_per_s']:.1f}/s (one after the other, {'after' if i % 2 else 'before'} the pair)"]
        for balance in balances:
            rep = pairs.get(balance) or train(tmp, "cpu:0,cpu:1", s, b, m, balance=balance, slowdown=f"1:{f}",
                                              eval_every=10 ** 6)
            rate = rep["samples_per_s"]
            per[balance]["eff"].append(rate / ideal)
            # Immune to load drift between runs: the pair against its own workers' training rates.
            per[balance]["in_run"].append(rate / sum(w["busy_samples_per_s"] for w in rep["workers"]))
            per[balance]["idle"].append(max_idle(rep))
            per[balance]["idle_rounds"].extend(round_idles(rep))
            per[balance]["knob"].append(seconds_per_batch(rep, 1) / seconds_per_batch(rep, 0))
            per[balance]["rate"].append(rate)
            line.append(f"{balance} {rate:.1f}/s = {rate / ideal:.3f}, max idle {max_idle(rep):.1%} in "
                        f"{worst_round(rep)}")
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
                                          "max_idle_share": round(med(e["idle"]), 4),
                                          "max_idle_share_runs": [round(x, 4) for x in e["idle"]],
                                          "round_max_idle_median": round(med(e["idle_rounds"]), 4),
                                          "rounds_over_10pct": sum(x > 0.10 for x in e["idle_rounds"]),
                                          "rounds": len(e["idle_rounds"]), "knob_ratio": round(med(e["knob"]), 3),
                                          "samples_per_s": e["rate"]}
        print(f"{balance:8s}: efficiency (solo) {med(e['eff']):.3f} [runs {', '.join(f'{x:.3f}' for x in e['eff'])}]; "
              f"in-run {med(e['in_run']):.3f}; max idle share of a round {med(e['idle']):.1%} "
              f"[runs {', '.join(f'{x:.1%}' for x in e['idle'])}] (target <= 10%); a round's largest idle: median "
              f"{med(e['idle_rounds']):.1%}, {sum(x > 0.10 for x in e['idle_rounds'])} of {len(e['idle_rounds'])} rounds "
              f"over 10% (uptime {os.getloadavg()[0]:.1f})")


def parse_outer(text: str) -> list[tuple[float, float]]:
    """``0.7:0.9,1.0:0.5`` -> [(0.7, 0.9), (1.0, 0.5)] (outer lr : outer momentum)."""
    out = []
    for part in filter(None, text.split(",")):
        lr, _, mom = part.partition(":")
        out.append((float(lr), float(mom)))
    return out


def loss_section(tmp: str, args: argparse.Namespace, figures: dict) -> None:
    """Held-out loss at equal samples, paired by seed: every variant trains the same chunks.

    Two workers of equal speed with ``--balance equal`` (chunks dealt round-robin from the seed),
    so two runs of one seed differ only in the merge rule, and the comparison of the merge rules
    is paired per seed (its median difference is what decides a default), not blurred by which
    worker happened to train which chunk."""
    s, b, m = args.steps, args.batch_size, args.merge_every
    ev = 10 ** 6  # no evaluation inside training: the held-out loss comes from hwtui eval on the checkpoint
    seeds = [int(x) for x in args.seeds.split(",") if x]
    variants: dict[str, dict] = {"sync": {"gpu_ids": "cpu:0", "batch": 2 * b},
                                 "average": {"gpu_ids": "cpu:0,cpu:1", "batch": b, "merge": "average"}}
    for lr, mom in parse_outer(args.outer):
        variants[f"outer {lr:g}/{mom:g}"] = {"gpu_ids": "cpu:0,cpu:1", "batch": b, "merge": "outer-nesterov",
                                             "outer": (lr, mom)}
    losses: dict[str, list[float]] = {k: [] for k in variants}
    seconds: dict[str, list[float]] = {k: [] for k in variants}
    samples = 0
    for seed in seeds:
        for name, v in variants.items():
            rep = train(tmp, v["gpu_ids"], s, v["batch"], m, balance="equal", merge=v.get("merge", "average"),
                        eval_every=ev, checkpoint=True, seed=seed, outer=v.get("outer"))
            losses[name].append(heldout(rep["checkpoint_dir"]))
            seconds[name].append(rep["train_seconds"])
            samples = rep["samples"]
        print(f"seed {seed}: " + ", ".join(f"{k} {losses[k][-1]:.4f}" for k in variants), flush=True)
    med = statistics.median
    figures["loss"] = {"seeds": seeds, "samples": samples,
                       "variants": {k: {"heldout_loss": [round(x, 4) for x in losses[k]], "median": round(med(losses[k]), 4),
                                        "train_seconds": seconds[k]} for k in variants}}
    print(f"held-out loss (whole held-out set) at N = {samples:,} samples, median of {len(seeds)} seed(s) "
          f"(uptime {os.getloadavg()[0]:.1f}):")
    for k in variants:
        gaps = [a / b - 1 for a, b in zip(losses[k], losses["sync"], strict=True)]  # paired by seed too
        figures["loss"]["variants"][k]["gap_vs_sync_median"] = round(med(gaps), 5)
        line = (f"  {k:18s} {med(losses[k]):.4f}  vs sync, paired by seed: median {med(gaps):+.2%} "
                f"[{', '.join(f'{g:+.2%}' for g in gaps)}] (target within 2%)")
        if k not in ("sync", "average"):
            diffs = [a - b for a, b in zip(losses[k], losses["average"], strict=True)]
            wins = sum(d < 0 for d in diffs)
            line += f"; vs average, paired by seed: median {med(diffs):+.4f}, better in {wins}/{len(diffs)}"
        print(line)
    if args.time_to_loss:
        time_to_loss(tmp, args, seeds[0], figures)
    if args.two_n:
        one = train(tmp, "cpu:0", 2 * s, b, m, eval_every=ev, checkpoint=True, seed=seeds[0])
        two = train(tmp, "cpu:0,cpu:1", s, b, m, eval_every=ev, checkpoint=True, seed=seeds[0])
        l_one, l_two = heldout(one["checkpoint_dir"]), heldout(two["checkpoint_dir"])
        figures["loss"]["one_worker_2n"] = {"heldout_loss": round(l_one, 4), "train_seconds": one["train_seconds"],
                                            "two_workers_loss": round(l_two, 4), "two_workers_seconds": two["train_seconds"]}
        # "2N": each of the two workers trains N = S x B samples, 2N in all; one worker reaches 2N alone
        # in 2S steps of batch B. The target: two workers reach its loss in <= 0.6x its wall time.
        print(f"one worker alone to 2N = {one['samples']:,} samples (2S steps of batch B): {l_one:.4f} in "
              f"{one['train_seconds']:.1f}s; two workers (dynamic, default merge): {l_two:.4f} ({l_two - l_one:+.4f}) in "
              f"{two['train_seconds'] / one['train_seconds']:.2f}x its time (target: its loss in <= 0.6x its time)")


def first_reaching(rounds: list[dict], path_of: dict[int, str], target: float) -> tuple[int | None, dict[int, float]]:
    """The index of the first round whose checkpoint's held-out loss is at or below ``target`` (None
    if even the last is above), by bisection (the loss falls round by round; each probe is one
    ``hwtui eval`` of the whole held-out set), and every loss probed (step -> loss)."""
    probed: dict[int, float] = {}

    def loss(i: int) -> float:
        step = rounds[i]["step"]
        if step not in probed:
            probed[step] = heldout(path_of[step])
        return probed[step]

    lo, hi = 0, len(rounds) - 1
    if loss(hi) > target:
        return None, probed
    while lo < hi:
        mid = (lo + hi) // 2
        if loss(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    return hi, probed


def time_to_loss(tmp: str, args: argparse.Namespace, seed: int, figures: dict) -> None:
    """The issue's "2 workers reach one worker's loss at 2N samples in <= 0.6x its wall time".

    One worker trains 2N samples (2S steps of batch B; its held-out loss is the target, its
    training seconds the reference). Two workers of equal speed (default balance and merge, batch
    B each) then train up to ``--two-n-max`` x S steps each with a checkpoint every round, and the
    first round whose checkpoint reaches the target gives their time. Both times are the runs' own
    ``train_seconds`` clock (training start to the commit of that round: no start-up, no
    evaluation); the two-worker run also writes a checkpoint every round inside it, which only
    counts against it.

    The bound no data-parallel pair can beat: the synchronous baseline (one worker, batch 2B,
    every step the exact mean gradient of both devices' batches) trained the same way; the first
    step at which it reaches the target, times one worker's seconds per step of batch B, is what
    two ideal devices would take."""
    s, b, m = args.steps, args.batch_size, args.merge_every
    ev = 10 ** 6
    one = train(tmp, "cpu:0", 2 * s, b, m, eval_every=ev, checkpoint=True, seed=seed)
    target, t_one = heldout(one["checkpoint_dir"]), one["train_seconds"]
    out: dict = {"seed": seed, "one_worker": {"steps": 2 * s, "samples": one["samples"], "heldout_loss": round(target, 4),
                                               "train_seconds": t_one}}
    print(f"time to loss (seed {seed}): one worker, 2N = {one['samples']:,} samples ({2 * s} steps of batch {b}): "
          f"held-out {target:.4f} in {t_one:.1f}s (uptime {os.getloadavg()[0]:.1f})", flush=True)
    for name, gpu_ids, batch in (("two_workers", "cpu:0,cpu:1", b), ("sync_bound", "cpu:0", 2 * b)):
        rep = train(tmp, gpu_ids, args.two_n_max * s, batch, m, eval_every=ev, checkpoint=True, seed=seed,
                    checkpoint_every=1)
        rounds = rep["rounds"]
        hit, probed = first_reaching(rounds, {c["step"]: c["path"] for c in rep["checkpoints"]}, target)
        r = rounds[hit if hit is not None else -1]
        seconds = r["train_t"] if name == "two_workers" else r["step"] / (2 * s) * t_one  # ideal: B-batch steps, 2 devices
        out[name] = {"reached": hit is not None, "step": r["step"], "train_seconds": round(seconds, 3),
                     "time_ratio": round(seconds / t_one, 3), "probed": {str(k): round(v, 4) for k, v in sorted(probed.items())}}
        what = ("two workers (default merge and balance)" if name == "two_workers" else
                "bound: one worker at batch 2B (synchronous), timed as two ideal devices")
        reach = f"reach it at step {r['step']}" if hit is not None else f"do not reach it in {r['step']} steps"
        print(f"  {what}: {reach} = {seconds:.1f}s = {seconds / t_one:.2f}x its time (target <= 0.6x); probed "
              + ", ".join(f"step {k}: {v:.4f}" for k, v in sorted(probed.items())) + f" (uptime {os.getloadavg()[0]:.1f})",
              flush=True)
    figures["time_to_loss"] = out


# -- --baseline plain: hwtui train against a plain PyTorch loop of the same model ---------------------

MODEL_FLAGS = ("model", "data", "context", "d_model", "layers", "heads")


def plain_loop(spec: dict) -> dict:
    """The plain loop (run in its own process): the model hwtui builds, AdamW, the same batches
    (``chunk_batch`` of the same corpus), ``steps`` optimizer steps; the loss read once at the end."""
    import torch

    from hwtui.engine.training import data, models, textdata
    from hwtui.engine.training.config import ModelConfig
    from hwtui.engine.training.modelspec import parse

    torch.set_num_threads(spec["threads"])
    mspec = parse(spec["model"])
    mcfg = ModelConfig(context=spec["context"], d_model=spec["d_model"], layers=spec["layers"], heads=spec["heads"])
    net = models.build(mspec, mcfg, seed=0)
    tokenizer = models.load_tokenizer(mspec) if mspec.kind == "hf" else None
    corpus = (textdata.tokenize(textdata.read_documents(spec["data"]), tokenizer, mcfg.context, net.vocab())
              if spec["data"] else data.load_corpus())
    opt = torch.optim.AdamW(net.module.parameters(), lr=3e-3, weight_decay=0.0)
    net.module.train()
    batch = spec["batch_size"]
    total = torch.zeros(())
    t0 = 0.0
    for i in range(spec["steps"] + spec["warmup"]):
        if i == spec["warmup"]:
            t0 = time.perf_counter()
        x, y = data.chunk_batch(corpus, i, batch, mcfg.context, 0)
        loss = net.loss(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total += loss.detach()
    final = float(total)
    seconds = time.perf_counter() - t0
    return {"samples_per_s": spec["steps"] * batch / seconds, "tokens_per_s": spec["steps"] * batch * mcfg.context / seconds,
            "seconds": seconds, "loss_sum": final}


class Utilisation:
    """Device utilisation sampled through NVML while a run goes on (None where NVML reports nothing)."""

    def __init__(self) -> None:
        import threading

        self.samples: list[float] = []
        self.handle = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self.handle, self.nvml = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml
        except Exception:
            return
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            self.samples.append(float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))

    def done(self) -> float | None:
        if self.handle is None:
            return None
        self.stop.set()
        self.thread.join(1)
        return statistics.median(self.samples) if self.samples else None


def _model_args(args: argparse.Namespace) -> list[str]:
    out = ["--model", args.model, "--context", str(args.context), "--d-model", str(args.d_model),
           "--layers", str(args.layers), "--heads", str(args.heads)]
    return out + (["--data", args.data] if args.data else [])


def baseline_section(tmp: str, args: argparse.Namespace, figures: dict) -> None:
    """Interleaved rounds (hwtui, plain, hwtui, plain, ...) on one worker, medians and their ratio."""
    gpu = args.gpu_ids
    rows: dict[str, list[dict]] = {"hwtui": [], "plain": []}
    spec = {"model": args.model, "data": args.data, "context": args.context, "d_model": args.d_model,
            "layers": args.layers, "heads": args.heads, "batch_size": args.batch_size, "steps": args.steps,
            "warmup": 3, "threads": args.threads}
    for rep in range(args.repeats):
        util = Utilisation()
        out = Path(tempfile.mkdtemp(dir=tmp))
        cmd = [sys.executable, "-m", "hwtui.app", "train", "--gpu-ids", gpu, "--steps", str(args.steps),
               "--batch-size", str(args.batch_size), "--merge-every", str(args.merge_every),
               "--report", str(out / "report.json"), *_model_args(args)]
        p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
        rep_doc = json.loads((out / "report.json").read_text())
        context = args.context
        rows["hwtui"].append({"samples_per_s": rep_doc["samples_per_s"], "tokens_per_s": rep_doc["samples_per_s"] * context,
                              "utilisation": util.done()})
        util = Utilisation()
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--plain-child", json.dumps(spec)], cwd=REPO,
                           capture_output=True, text=True, timeout=3600,
                           env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        if p.returncode != 0:
            raise SystemExit(f"the plain loop failed ({p.returncode}): {p.stderr.strip()[-500:]}")
        rows["plain"].append({**json.loads(p.stdout.strip().splitlines()[-1]), "utilisation": util.done()})
        h, b = rows["hwtui"][-1], rows["plain"][-1]
        print(f"  repeat {rep + 1}: hwtui {h['samples_per_s']:.1f} samples/s, plain {b['samples_per_s']:.1f} "
              f"samples/s, ratio {h['samples_per_s'] / b['samples_per_s']:.3f}", flush=True)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("samples_per_s", "tokens_per_s")} for k, v in rows.items()}
    ratio = med["hwtui"]["samples_per_s"] / med["plain"]["samples_per_s"]
    utils = {k: [r["utilisation"] for r in v if r["utilisation"] is not None] for k, v in rows.items()}
    print(f"{'':8}{'samples/s':>12}{'tokens/s':>12}{'utilisation':>14}")
    for k in ("hwtui", "plain"):
        u = f"{statistics.median(utils[k]):.0f} %" if utils[k] else "n/a (no NVML)"
        print(f"{k:8}{med[k]['samples_per_s']:>12.1f}{med[k]['tokens_per_s']:>12.0f}{u:>14}")
    paired = statistics.median(h["samples_per_s"] / b["samples_per_s"] for h, b in zip(rows["hwtui"], rows["plain"], strict=True))
    print(f"ratio hwtui / plain (medians of {args.repeats}): {ratio:.3f}; median of the paired rounds' ratios "
          f"{paired:.3f} (the load drifting between rounds moves this one less)", flush=True)
    figures["baseline"] = {"rows": rows, "medians": med, "ratio": ratio, "paired_ratio": paired,
                           "settings": spec | {"gpu_ids": gpu}}


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--plain-child":
        sys.path.insert(0, str(REPO))
        print(json.dumps(plain_loop(json.loads(sys.argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="merged-model steps per run (default 300)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--merge-every", type=int, default=20)
    ap.add_argument("--factor", type=float, default=3.0, help="how much slower worker 1 is (default 3)")
    ap.add_argument("--balances", default="dynamic", help="pair runs to measure (default dynamic; add equal,static)")
    ap.add_argument("--repeats", type=int, default=1, help="efficiency repeats; medians reported (default 1)")
    ap.add_argument("--loss", action="store_true", help="also measure held-out loss at equal samples (sync/average/outer)")
    ap.add_argument("--seeds", default="0", help="with --loss: seeds to run every variant with (default 0; medians)")
    ap.add_argument("--outer", default="0.7:0.9", metavar="LR:MOM[,...]",
                    help="with --loss: outer-nesterov settings to compare with average (default 0.7:0.9)")
    ap.add_argument("--two-n", action="store_true", help="with --loss: also one worker at 2N samples and its wall time")
    ap.add_argument("--time-to-loss", action="store_true",
                    help="with --loss: the time two workers take to reach one worker's loss at 2N samples, over its time")
    ap.add_argument("--two-n-max", type=int, default=3, metavar="K",
                    help="with --time-to-loss: two workers train at most K x --steps steps each (default 3)")
    ap.add_argument("--no-efficiency", action="store_true", help="skip the efficiency section")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    ap.add_argument("--baseline", choices=("plain",),
                    help="plain: hwtui train on one device against a plain PyTorch loop of the same model, batch and "
                         "threads, interleaved --repeats times (only this section runs)")
    ap.add_argument("--gpu-ids", default="cpu:0", help="with --baseline: the device (default cpu:0)")
    ap.add_argument("--threads", type=int, default=1, help="with --baseline: CPU threads of both (hwtui's default 1)")
    ap.add_argument("--model", default="char", help="with --baseline: hwtui train --model (default char)")
    ap.add_argument("--data", help="with --baseline: hwtui train --data")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    args = ap.parse_args()
    if args.baseline:
        figures = {}
        with tempfile.TemporaryDirectory() as tmp:
            baseline_section(tmp, args, figures)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
        return 0
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
