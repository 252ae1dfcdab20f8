"""Replication benchmark: hwtui vs the transport's ceiling and what PyTorch users do today.

One run per world size (``--ranks 2,3``), gloo over 127.0.0.1, ~1 GB in 400 fp32 tensors of
log-uniform sizes (plus 8 x 16 MB), rounds interleaved so background load hits every method alike:

- hwtui: ``hwtui replicate --plan P --nproc N`` as a user runs it (a fresh CLI interpreter); all ranks
  are on one host, so receivers copy each bucket from the source file's page cache and verify their
  own copy (same-host path). ``hwtui`` GB/s is total bytes / the slowest rank's transfer phase (from
  ``--report``); ``hwtui_cli_wall`` is the CLI's wall time, start to exit. ``--commit`` (``hwtui_commit``
  rows) adds the durable commit: every receiver's copy fsynced to disk, the vote and the switch,
  and prints its cost against the plain run of the same round: the transfer phase with and
  without ``--commit --out`` (issue 23: <= 1.5x), ``prepare`` and ``commit`` (the slowest
  receiver's), and transfer + prepare + commit (the slowest rank's sum, from the start barrier to
  its switch; issue 23: <= 2.5x the plain transfer), medians and per-round ratios, beside the disk
  alone writing the same bytes durably in the same rounds, every way (``disk_ceiling.py``);
  ``--network`` adds ``hwtui_network``: the same run with ``--no-same-host`` (the windowed, chunked
  gloo pipeline other hosts get);
- flat: one ``dist.broadcast`` of one preallocated, already-touched buffer holding the model's bytes,
  in a world that stays up between rounds (the transport's ceiling: no allocation, no page faults,
  no verification on the receivers);
- flat_end_to_end: what the simplest script pays, start to exit: N fresh interpreters, ``import
  torch``, ``init_process_group``, the source maps the model file, each receiver allocates a buffer,
  one broadcast of the file's bytes, exit (no verification);
- ``--methods all`` adds DDP's ``_broadcast_coalesced`` at 25 MB and 250 MB buffers and one broadcast
  per tensor, in the persistent world.

Every method is checked bit-exact. Then, optionally, the planner on a million tensors.

- cross-host: ``--netns`` runs ``bench_replication_netns.py`` (root, ``ip netns``: 2 namespace
  hosts x 2 ranks, hierarchical against a flat broadcast) after the rest and repeats its ratio line.

    .venv/bin/python benchmarks/bench_replication.py [--rounds 3] [--mb 1000] [--tensors 400] [--ranks 2,3]
        [--methods flat|all] [--commit] [--network] [--netns] [--planner-tensors 0]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MB = 1 << 20


def xxh(arr: Any) -> int:
    """xxh3-64 of a numpy array's bytes (typed once here: numpy's stubs are no Buffer to mypy)."""
    import xxhash

    return int(xxhash.xxh3_64_intdigest(arr))


def make_model(path: Path, total_mb: int, n: int, seed: int = 0) -> None:
    import numpy as np
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(seed)
    big = [4 * MB] * 8 if total_mb >= 256 else []  # 8 x 16 MB fp32
    small_bytes = total_mb * 1_000_000 - sum(big) * 4
    sizes = np.exp(rng.uniform(np.log(64), np.log(600_000), n - len(big)))
    sizes = np.maximum(1, (sizes * small_bytes / 4 / sizes.sum()).astype(int))
    g = torch.Generator().manual_seed(seed)
    tensors = {f"t{i:05d}": torch.randn(int(k), generator=g) for i, k in enumerate([*sizes.tolist(), *big])}
    save_file(tensors, str(path))


# ----------------------------------------------------------------------------- baseline world


def baseline_worker(rank: int, port: int, model: str, world: int, methods: str) -> None:
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    src = load_file(model)
    names = sorted(src)
    if rank == 0:
        tensors = [src[n].contiguous() for n in names]
    else:
        tensors = [torch.zeros_like(src[n]) for n in names]
    total = sum(t.numel() * 4 for t in tensors)
    flat = torch.cat([t.view(-1) for t in tensors]).view(torch.uint8) if rank == 0 else torch.zeros(total, dtype=torch.uint8)
    want = xxh(torch.cat([src[n].view(-1) for n in names]).view(torch.uint8).numpy())
    pg = dist.group.WORLD
    assert pg is not None

    def timed(fn: Any) -> float:
        for t in tensors if rank else []:
            t.zero_()
        if rank:
            flat.zero_()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        return float(dt.item())

    def exact_tensors() -> bool:
        return bool(xxh(torch.cat([t.view(-1) for t in tensors]).view(torch.uint8).numpy()) == want)

    table = {
        "flat": (lambda: dist.broadcast(flat, 0), lambda: xxh(flat.numpy()) == want),
        "ddp_coalesced_25mb": (lambda: dist._broadcast_coalesced(pg, tensors, 25 * MB, 0), exact_tensors),
        "ddp_coalesced_250mb": (lambda: dist._broadcast_coalesced(pg, tensors, 250 * MB, 0), exact_tensors),
        "tensor_by_tensor": (lambda: [dist.broadcast(t, 0) for t in tensors], exact_tensors),
    }
    if methods != "all":
        table = {"flat": table["flat"]}
    for line in sys.stdin:
        if line.strip() != "go":
            break
        out = {}
        for name, (fn, check) in table.items():
            secs = timed(fn)
            ok = torch.tensor([int(bool(check())) if rank else 1], dtype=torch.int32)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)  # bit-exact on every receiver
            out[name] = {"seconds": secs, "exact": bool(ok.item())}
        if rank == 1:
            print(json.dumps({"bytes": total, **out}), flush=True)
    dist.destroy_process_group()


def start_baselines(model: str, world: int, methods: str) -> list[subprocess.Popen[str]]:
    from hwtui.core.net import free_loopback_port as free_port

    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return [subprocess.Popen([sys.executable, __file__, "--baseline-worker", str(r), str(port), model, str(world), methods],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for r in range(world)]


def flat_once_worker(rank: int, port: int, model: str, world: int) -> None:
    """One fresh rank of the simplest script: import torch, join, map or allocate, one broadcast, exit."""
    import mmap

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    with open(model, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if rank == 0:
            mm = mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ)
            buf = torch.frombuffer(mm, dtype=torch.uint8)  # read-only: the source only sends
        else:
            buf = torch.empty(size, dtype=torch.uint8)
    dist.broadcast(buf, 0)
    if rank == 1:
        import xxhash

        with open(model, "rb") as fh:
            print(json.dumps({"exact": xxh(buf.numpy()) == xxhash.xxh3_64_intdigest(fh.read())}),
                  flush=True)
    dist.destroy_process_group()


def flat_end_to_end(model: str, world: int) -> tuple[float, bool]:
    """Wall seconds from starting N fresh interpreters to the last one's exit, and whether rank 1 got every byte."""
    import warnings

    from hwtui.core.net import free_loopback_port as free_port

    warnings.filterwarnings("ignore", message="The given buffer is not writable")
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--flat-once", str(r), str(port), model, str(world)],
                              stdout=subprocess.PIPE, text=True, env=env) for r in range(world)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    wall = time.perf_counter() - t0
    if any(p.returncode for p in procs):
        raise SystemExit("the flat end-to-end run failed")
    return wall, bool(json.loads(outs[1])["exact"])


# ----------------------------------------------------------------------------- hwtui


def run_hwtui(plan: str, world: int, work: Path, *, commit: bool, same_host: bool = True) -> dict:
    """``hwtui replicate`` as a user runs it; the report plus the CLI's wall time."""
    report, out = work / "report.json", work / "out"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "hwtui", "replicate", "--plan", plan, "--nproc", str(world), "--report", str(report)]
    if commit:
        cmd += ["--commit", "--out", str(out)]
    if not same_host:
        cmd.append("--no-same-host")
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"hwtui replicate failed ({r.returncode}): {r.stderr[-2000:]}")
    rep: dict = json.loads(report.read_text())
    rep["cli_wall"] = wall
    return rep


def check_committed(model: str, out: Path, world: int) -> bool:
    """Every receiver serves the source file, byte for byte."""
    want = Path(model).read_bytes()
    for rank in range(1, world):
        cur = json.loads((out / f"rank{rank}" / "CURRENT").read_text())
        if (out / f"rank{rank}" / cur["file"]).read_bytes() != want:
            return False
    return True


def commit_phases(rep: dict) -> dict[str, float]:
    """A ``--commit`` run's cost from its report: the transfer phase (slowest rank), the slowest
    receiver's prepare (its fsync, manifest, pending CURRENT) and commit (vote, decision, switch),
    and the slowest rank's transfer + prepare + commit (every rank starts them at the start barrier)."""
    recv = [r for r in rep["ranks"] if r["rank"] != 0]
    return {"transfer": rep["seconds"],
            "prepare": max(r["phases"].get("prepare", 0.0) for r in recv),
            "commit": max(r["phases"].get("commit", 0.0) for r in recv),
            "total": max(sum(r["phases"].get(p, 0.0) for p in ("transfer", "prepare", "commit")) for r in rep["ranks"])}


def disk_durable_write(directory: Path, nbytes: int, ceiling: dict[str, list[float]]) -> float:
    """Seconds the disk itself takes to make ``nbytes`` durable in a new file beside ``--out``.

    The floor under the commit path's cost, measured in the same round (benchmarks/disk_ceiling.py
    says how: buffered, write-behind, O_DIRECT with 1-8 writes in flight, preallocated or sparse).
    The first round runs every way; later rounds run the best so far and the old line (O_DIRECT,
    one 32 MiB write at a time, which 2-8 writes in flight beat). Returns this round's best;
    ``ceiling`` collects every way's seconds. Whatever ``--commit`` costs above ``plain transfer
    + this`` is hwtui's.
    """
    from disk_ceiling import source_buffer, ways

    buf = source_buffer()
    try:
        every = ways(directory, nbytes, buf)
        if ceiling:
            best = min(ceiling, key=lambda k: statistics.median(ceiling[k]))
            every = {k: v for k, v in every.items() if k in (best, OLD_DISK_LINE)}
        got = {name: fn() for name, fn in every.items()}
    finally:
        buf.close()
    for name, secs in got.items():
        ceiling.setdefault(name, []).append(secs)
    return min(got.values())


OLD_DISK_LINE = "O_DIRECT 32 MiB x1 + fsync"


def load_line() -> str:
    """``uptime``'s load averages (1, 5, 15 min), printed beside every must-show figure."""
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def verdict(ratio: float, target: float, at_most: bool) -> str:
    ok = ratio <= target if at_most else ratio >= target
    return "PASS" if ok else "FAIL"


def print_commit_cost(plain: list[float], costs: dict[str, list[float]]) -> None:
    """--commit --out against the plain run of the same round (they ran back to back)."""
    m = {k: statistics.median(v) for k, v in costs.items()}
    p = statistics.median(plain)

    def spread(v: list[float]) -> str:
        return f"[{min(v):.3f}-{max(v):.3f}]"

    print(f"commit path (medians, s): plain transfer {p:.3f} {spread(plain)}; --commit transfer {m['transfer']:.3f} "
          f"{spread(costs['transfer'])}, prepare {m['prepare']:.3f} {spread(costs['prepare'])}, "
          f"commit {m['commit']:.3f} {spread(costs['commit'])}, transfer+prepare+commit {m['total']:.3f} {spread(costs['total'])}")
    for key, what, target in (("transfer", "--commit transfer / plain transfer", 1.5),
                              ("total", "--commit transfer+prepare+commit / plain transfer", 2.5)):
        per_round = sorted(c / x for x, c in zip(plain, costs[key], strict=True))
        print(f"{what} = {m[key] / p:.2f}x (issue 23 target <= {target}x); per round (sorted): "
              + " ".join(f"{r:.2f}" for r in per_round))
    if "disk" in costs:
        d = statistics.median(costs["disk"])
        print("the disk itself, the same bytes into a new file beside --out, made durable (benchmarks/disk_ceiling.py; "
              "medians; the first round runs every way, later ones the best and the old line):")
        for name, v in sorted(CEILING.items(), key=lambda kv: statistics.median(kv[1])):
            print(f"  {name:58} {statistics.median(v):.3f} s {spread(v)} n={len(v)} = "
                  f"{statistics.median(v) / p:.2f}x the plain transfer")
        above = sorted(c - x - k for x, c, k in zip(plain, costs["total"], costs["disk"], strict=True))
        print(f"the disk alone (each round's best way): {d:.3f} s {spread(costs['disk'])} = {d / p:.2f}x the plain "
              f"transfer; 2.5x needs {2.5 * p:.3f} s for t+p+c, the disk alone takes {d:.3f} s of it"
              f"{' (2.5x is out of reach on this disk)' if d > 2.5 * p else ''}; t+p+c above plain+disk per "
              "round (sorted, s): " + " ".join(f"{a:+.3f}" for a in above))
        print(f"  t+p+c / the disk alone = {m['total'] / d:.2f}x (1.00x: the commit costs what the disk costs)")


def run_netns(rounds: int) -> None:
    """The cross-host ratio, from its own bench (it needs root and network namespaces)."""
    bench = Path(__file__).with_name("bench_replication_netns.py")
    r = subprocess.run([sys.executable, str(bench), "--rounds", str(rounds)], capture_output=True, text=True, timeout=1800)
    print("\ncross-host (" + bench.name + "):")
    print((r.stdout + r.stderr).strip() or f"exit {r.returncode}, no output")


# ----------------------------------------------------------------------------- planner


def bench_planner(n: int) -> dict:
    from hwtui.engine.replication.plan import PlanInputs, SourceTensor, build_plan, load_plan, write_json_atomic
    from hwtui.engine.replication.weights import TensorInfo

    data = memoryview(os.urandom(4096))
    tensors = [SourceTensor(0, TensorInfo(f"layer.{(i * 7919) % n:07d}.w", "F32", (4,), 16, 8 + 16 * ((i * 7919) % n)))
               for i in range(n)]  # shuffled on purpose: the planner sorts
    inputs = PlanInputs([{"path": "/synthetic", "format": "safetensors", "size": 8 + 16 * n}], tensors,
                        lambda s: data[s.info.file_offset % 4000:s.info.file_offset % 4000 + 16])
    t = time.perf_counter()
    plan = build_plan(inputs, model="synthetic", version="v1", bucket_bytes=32 * MB)
    t_plan = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        t = time.perf_counter()
        write_json_atomic(path, plan)
        t_write = time.perf_counter() - t
        del plan
        t = time.perf_counter()
        load_plan(path)  # parse + every invariant + digest
        t_validate = time.perf_counter() - t
        size = path.stat().st_size
    return {"tensors": n, "plan_s": round(t_plan, 2), "write_s": round(t_write, 2), "load_validate_s": round(t_validate, 2),
            "plan_json_mb": round(size / 1e6, 1)}


def bench_world(model: str, plan: str, work: Path, world: int, args: argparse.Namespace) -> dict[str, float]:
    procs = start_baselines(model, world, args.methods)
    CEILING.clear()
    rows: dict[str, list[float]] = {}
    costs: dict[str, list[float]] = {}  # the --commit run's phases (commit_phases), one per round
    exact: dict[str, bool] = {}
    total = 0
    try:
        for rnd in range(args.rounds):
            last = rnd == args.rounds - 1
            load = os.getloadavg()[0]
            if args.network:
                rep = run_hwtui(plan, world, work, commit=last, same_host=False)
                rows.setdefault("hwtui_network", []).append(rep["seconds"])
                if last:
                    exact["hwtui_network"] = check_committed(model, work / "out", world)
            # The default: every receiver is on the source's host, so it copies from the page cache.
            rep = run_hwtui(plan, world, work, commit=False)
            rows.setdefault("hwtui", []).append(rep["seconds"])
            rows.setdefault("hwtui_cli_wall", []).append(rep["cli_wall"])
            total = rep["bytes"]
            if args.commit or last:
                rep = run_hwtui(plan, world, work, commit=True)
                exact["hwtui"] = exact.get("hwtui", True) and check_committed(model, work / "out", world)
                if args.commit:
                    rows.setdefault("hwtui_commit", []).append(rep["seconds"])
                    rows.setdefault("hwtui_commit_cli_wall", []).append(rep["cli_wall"])
                    exact["hwtui_commit"] = exact["hwtui_commit_cli_wall"] = exact["hwtui"]
                    for k, v in commit_phases(rep).items():
                        costs.setdefault(k, []).append(v)
                    costs.setdefault("disk", []).append(disk_durable_write(work, rep["bytes"], CEILING))
            wall, ok = flat_end_to_end(model, world)
            rows.setdefault("flat_end_to_end", []).append(wall)
            exact["flat_end_to_end"] = exact.get("flat_end_to_end", True) and ok
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            assert procs[1].stdout is not None
            res = json.loads(procs[1].stdout.readline())
            for name, r in res.items():
                if isinstance(r, dict):
                    rows.setdefault(name, []).append(r["seconds"])
                    exact[name] = exact.get(name, True) and r["exact"]
            print(f"  {world} ranks, round {rnd + 1}: load {load:.1f}; "
                  + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in rows.items()), flush=True)
    finally:
        for p in procs:
            if p.stdin:
                p.stdin.close()
        for p in procs:
            p.wait(timeout=60)
    exact["hwtui_cli_wall"] = exact["hwtui"]
    med = {k: statistics.median(v) for k, v in rows.items()}
    gbps = {k: total / s / 1e9 for k, s in med.items()}
    print(f"\n{world} ranks: {'method':22} {'median GB/s':>11} {'best GB/s':>10} {'bit-exact':>9}")
    for k in rows:
        print(f"{k:22} {gbps[k]:11.2f} {total / min(rows[k]) / 1e9:10.2f} {str(exact[k]):>9}")
    # Paired by round: hwtui and flat ran back to back, so background load hits both alike.
    paired = sorted(f / h for h, f in zip(rows["hwtui"], rows["flat"], strict=True))
    print(f"  hwtui/flat per round (sorted): {' '.join(f'{r:.2f}' for r in paired)}")
    e2e = sorted(f / h for h, f in zip(rows["hwtui_cli_wall"], rows["flat_end_to_end"], strict=True))
    print(f"  flat end-to-end / hwtui CLI wall per round (sorted): {' '.join(f'{r:.2f}' for r in e2e)}")
    print(f"hwtui / flat             = {med['flat'] / med['hwtui']:.2f}x (issue 13 target >= 2.0x; transfer phase)")
    print(f"hwtui CLI wall vs flat end to end = {med['flat_end_to_end'] / med['hwtui_cli_wall']:.2f}x (target >= 0.5x)")
    if args.commit:
        print(f"hwtui --commit CLI wall vs flat end to end = {med['flat_end_to_end'] / med['hwtui_commit_cli_wall']:.2f}x "
              "(durable: every copy fsynced, voted, switched)")
    if args.commit:
        print_commit_cost(rows["hwtui"], costs)
    if args.network:
        print(f"hwtui network / flat     = {med['flat'] / med['hwtui_network']:.2f}x (target >= 0.85x)")
    for k in ("ddp_coalesced_25mb", "ddp_coalesced_250mb", "tensor_by_tensor"):
        if k in med:
            print(f"hwtui / {k:16} = {med[k] / med['hwtui']:.2f}x")
    if not all(exact.values()):
        print(f"NOT bit-exact: {sorted(k for k, v in exact.items() if not v)}")
    summary = must_show(world, rows, costs, exact)
    print("\n".join(summary))
    SUMMARY.extend(summary)
    return {"ok": float(all(exact.values()))}


CEILING: dict[str, list[float]] = {}  # the disk's seconds, by way (disk_durable_write), this world's rounds
SUMMARY: list[str] = []  # every world's must-show lines, repeated together at the end of the run


def must_show(world: int, rows: dict[str, list[float]], costs: dict[str, list[float]],
              exact: dict[str, bool]) -> list[str]:
    """Issue 23's CPU must-shows of this run, one line each with PASS/FAIL and the load beside it.

    The targets are stated at 2 ranks; other world sizes print the same lines marked "(info)".
    A method that was not bit-exact fails its line whatever its ratio.
    """
    tag = "MUST-SHOW" if world == 2 else "(info)"
    med = {k: statistics.median(v) for k, v in rows.items()}
    lines = [("same-host / flat gloo broadcast (transfer phase)", med["flat"] / med["hwtui"], 2.0, False,
              exact["hwtui"] and exact["flat"])]
    if costs:
        p = med["hwtui"]
        ok = exact.get("hwtui_commit", True)
        lines += [("--commit --out transfer / plain transfer", statistics.median(costs["transfer"]) / p, 1.5, True, ok),
                  ("--commit --out transfer+prepare+commit / plain transfer",
                   statistics.median(costs["total"]) / p, 2.5, True, ok)]
    out = []
    for what, ratio, target, at_most, exact_ok in lines:
        v = verdict(ratio, target, at_most) if exact_ok else "FAIL (not bit-exact)"
        out.append(f"{tag} {world} ranks: {what} = {ratio:.2f}x (target {'<=' if at_most else '>='} {target}x) "
                   f"{v}; {load_line()}")
    if "disk" in costs:
        d, p = statistics.median(costs["disk"]), med["hwtui"]
        out.append(f"(disk) {world} ranks: the disk alone (best way, same rounds) {d:.3f} s = {d / p:.2f}x the plain "
                   f"transfer ({p:.3f} s); --commit t+p+c {statistics.median(costs['total']):.3f} s = "
                   f"{statistics.median(costs['total']) / d:.2f}x the disk alone; {load_line()}")
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--baseline-worker":
        baseline_worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--flat-once":
        flat_once_worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--tensors", type=int, default=400)
    ap.add_argument("--ranks", default="2,3", help="world sizes, comma-separated (default 2,3)")
    ap.add_argument("--bucket-mb", type=float, default=32)
    ap.add_argument("--methods", choices=("flat", "all"), default="all")
    ap.add_argument("--commit", action="store_true", help="also time --commit --out (durable) every round")
    ap.add_argument("--network", action="store_true", help="also time --no-same-host (the network path)")
    ap.add_argument("--netns", action="store_true",
                    help="also run bench_replication_netns.py (cross-host: hierarchical vs flat; root)")
    ap.add_argument("--planner-tensors", type=int, default=1_000_000)
    args = ap.parse_args()

    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

    work = Path(tempfile.mkdtemp(prefix="hwtui-bench-"))
    ok = True
    try:
        model, plan = str(work / "model.safetensors"), str(work / "plan.json")
        make_model(Path(model), args.mb, args.tensors)
        write_json_atomic(plan, build_plan_from_files([model], model="bench", version="b1", bucket_bytes=int(args.bucket_mb * MB)))
        print(f"model: {os.path.getsize(model) / 1e6:.0f} MB in {args.tensors} tensors; bucket {args.bucket_mb:g} MiB; "
              f"{os.cpu_count()} CPU(s); {args.rounds} interleaved rounds; load {os.getloadavg()[0]:.1f}", flush=True)
        for world in (int(w) for w in args.ranks.split(",")):
            ok = bool(bench_world(model, plan, work, world, args)["ok"]) and ok
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the model and every served copy
    if args.netns:
        run_netns(args.rounds)
    else:
        print("\ncross-host: benchmarks/bench_replication_netns.py (or --netns) prints hierarchical / flat on "
              "2 namespace hosts x 2 ranks")
    if SUMMARY:
        print("\nissue 23 must-shows of this run (medians of interleaved rounds):\n" + "\n".join(SUMMARY))
    if args.planner_tensors:
        print(f"\nplanner: {json.dumps(bench_planner(args.planner_tensors))}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
