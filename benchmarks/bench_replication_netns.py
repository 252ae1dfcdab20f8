"""Hierarchical replication across two "hosts" (network namespaces joined by veth/bridge), 2 ranks each.

Side by side in one run, rounds interleaved, medians:

- flat: one ``dist.broadcast`` of the whole model from rank 0 to ranks 1-3 (gloo, world of 4,
  ranks 0-1 in namespace A, 2-3 in B): every byte crosses the veth once per remote rank;
- hwtui: ``hwtui replicate`` joined by the same 4 ranks: rank 1 copies from the source's page
  cache, rank 2 (B's leader) receives over the veth, rank 3 copies rank 2's verified copy.

- ``--one-stream``: also hwtui with ``HWTUI_NET_STREAMS=1`` (the network group on one TCP stream per
  peer instead of the default two: engine.replication.net_streams), interleaved the same way;
- ``--compare-tree DIR``: also hwtui from another checkout (e.g. ``git archive f914956 | tar -x -C DIR``),
  so a change is measured against its base in the same run.

GB/s = model bytes / the slowest rank's transfer (flat: the broadcast; hwtui: the transfer phase).
The CPU budget line (the median hwtui round) sets what the ranks spent in their transfers (user +
system, which holds the network softirqs that ran in their context: CONFIG_IRQ_TIME_ACCOUNTING off)
plus the ksoftirqd threads' CPU during the run against what the cores give in the wall the 1.8x
target allows (flat / 1.8): whether the target fits this box's CPU at all.
The order alternates per round (flat first, then hwtui first), and each round prints the load
(``/proc/loadavg``) beside it: this box's 2 cores are shared. ``--timeline`` prints, for the
median hwtui round, where its time went per rank and per bucket (engine.replication.timeline, read
from the ranks' ``--events``) and the CPU each rank and the host spent during the transfer.
Needs root and ``ip netns``.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_replication_netns.py [--mb 1000] [--rounds 5] [--timeline]
        [--one-stream] [--compare-tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engine.cluster.netns import NetnsCluster, finish, unavailable_reason  # noqa: E402

FLAT = r"""
import os, sys, time, datetime, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=4, timeout=datetime.timedelta(seconds=60))
n = os.path.getsize(sys.argv[1])
if rank == 0:  # the model's bytes, read into memory (touched) before the clock starts
    buf = torch.frombuffer(bytearray(open(sys.argv[1], "rb").read()), dtype=torch.uint8)
else:  # torch.zeros writes every page: receivers' buffers are touched too (as bench_replication.py's)
    buf = torch.zeros(n, dtype=torch.uint8)
from hwtui.engine.replication.timeline import cpu_between, cpu_sample
dist.barrier()
c0 = cpu_sample()
t = time.perf_counter()
dist.broadcast(buf, 0)
dt = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
c = cpu_between(c0, cpu_sample())
dist.all_reduce(dt, op=dist.ReduceOp.MAX)
cpu = torch.tensor([c["process_s"], c["host_busy_s"]], dtype=torch.float64)
dist.all_reduce(cpu, op=dist.ReduceOp.SUM)  # the ranks' CPU summed; the host's busy time summed 4 times
if rank == 0:
    print(dt.item(), cpu[0].item(), cpu[1].item() / 4, flush=True)
dist.destroy_process_group()
"""


def env_for(rank: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "HOTWEIGHTS_"))}
    env.update(RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", MASTER_ADDR="10.77.0.1",
               MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return env


def load() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "?"


def run_flat(net: NetnsCluster, model: Path, port: int) -> tuple[float, float, float]:
    """(seconds, the ranks' CPU seconds, the host's busy core-seconds) of one flat broadcast."""
    procs = [net.popen(r // 2, [sys.executable, "-c", FLAT, str(model)], env=env_for(r, port)) for r in range(4)]
    res = finish(procs, timeout=300)
    assert all(rc == 0 for rc, _, _ in res), [e[-500:] for _, _, e in res]
    seconds, cpu, host = (float(x) for x in res[0][1].strip().splitlines()[-1].split())
    return seconds, cpu, host


def cpu_of(reps: list[dict]) -> tuple[float, float]:
    """(hwtui's ranks' CPU seconds in their transfers, the host's busy core-seconds in the longest one)."""
    cpus = [rep["ranks"][0].get("transfer_cpu") or {} for rep in reps]
    longest = max(cpus, key=lambda c: c.get("wall_s") or 0.0)
    return sum(c.get("process_s") or 0.0 for c in cpus), longest.get("host_busy_s") or 0.0


def ksoftirqd_s() -> float:
    """CPU seconds the ksoftirqd threads have spent since boot: softirq work no rank's time holds."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "(ksoftirqd/" in text:
            f = text.rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return total


def run_hwtui(net: NetnsCluster, work: Path, port: int, rnd: int, name: str = "hwtui", env: dict[str, str] | None = None,
              tree: Path = ROOT) -> tuple[float, list[dict]]:
    def rank_env(r: int) -> dict[str, str]:
        e = {**env_for(r, port), **(env or {})}
        e["PYTHONPATH"] = os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])
        return e

    # cwd: `python -m` puts the current directory first on sys.path, so the tree's hwtui is the one run.
    procs = [net.popen(r // 2, [sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(work / "plan.json"),
                                "--report", str(work / f"rep{rnd}-{name}-{r}.json"),
                                "--events", str(work / f"ev{rnd}-{name}-{r}.jsonl")],
                       env=rank_env(r), cwd=str(tree)) for r in range(4)]
    res = finish(procs, timeout=300)
    assert all(rc == 0 for rc, _, _ in res), [e[-500:] for _, _, e in res]
    reps = [json.loads((work / f"rep{rnd}-{name}-{r}.json").read_text()) for r in range(4)]
    return max(rep["seconds"] for rep in reps), reps


def budget(reps: list[dict], ksoft: float, total: int, flat_s: float) -> str:
    """The CPU the hierarchical transfer needed per GB against what the cores give at the 1.8x target."""
    rows = {rep["ranks"][0]["rank"]: rep["ranks"][0] for rep in reps}
    cpu = {r: row.get("transfer_cpu") or {} for r, row in rows.items()}
    ranks = sum(c.get("process_s") or 0.0 for c in cpu.values())
    sys_s = sum(c.get("process_sys_s") or 0.0 for c in cpu.values())
    gb = total / 1e9
    need = (ranks + ksoft) / gb
    cores = os.cpu_count() or 1
    target = flat_s / 1.8
    have = cores * target / gb
    per = ", ".join(f"{rows[r].get('path')} {cpu[r].get('process_s', 0):.2f}" for r in sorted(rows))
    return (f"CPU budget per GB: hwtui needs {need:.2f} CPU-s (its ranks' transfers {ranks / gb:.2f}: {per}; of them "
            f"{sys_s / gb:.2f} in the kernel; ksoftirqd {ksoft / gb:.2f}, whole run) against {have:.2f} core-s that "
            f"{cores} cores give in {target:.3f} s (flat {flat_s:.3f} s / 1.8): {100 * need / have:.0f}% of them, "
            f"every core busy all the time")


def timeline_of(work: Path, rnd: int, reps: list[dict], total: int) -> str:
    from hwtui.engine.replication.timeline import follower_lag, render, steps_from_events

    rows = {rep["ranks"][0]["rank"]: rep["ranks"][0] for rep in reps}
    paths = {r: str(row.get("path")) for r, row in rows.items()}
    events = [json.loads(line) for r in range(4)
              for line in (work / f"ev{rnd}-hwtui-{r}.jsonl").read_text().splitlines() if line]
    steps = steps_from_events(events, paths)
    out = render(steps, paths=paths, total_bytes=total, cpu={r: row.get("transfer_cpu") or {} for r, row in rows.items()})
    lag = follower_lag(steps, leader=2, follower=3)
    if lag:
        out += (f"\n  follower rank 3 behind its leader rank 2, median per bucket: starts copying "
                f"{lag['to_copy_start'] * 1000:.1f} ms and has verified {lag['to_verified'] * 1000:.1f} ms after the leader verified it")
    return out


def variants(args: argparse.Namespace) -> dict[str, tuple[dict[str, str], Path]]:
    """hwtui's runs besides the flat: name -> (extra environment, the checkout it runs from)."""
    out: dict[str, tuple[dict[str, str], Path]] = {"hwtui": ({}, ROOT)}
    if args.one_stream:
        out["1-stream"] = ({"HWTUI_NET_STREAMS": "1"}, ROOT)
    if args.compare_tree:
        out["tree"] = ({}, Path(args.compare_tree).resolve())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bucket-mb", type=int, default=32)
    ap.add_argument("--timeline", action="store_true", help="print where the median hwtui round's time went")
    ap.add_argument("--one-stream", action="store_true", help="also hwtui with HWTUI_NET_STREAMS=1")
    ap.add_argument("--compare-tree", metavar="DIR", help="also hwtui run from this checkout (its base, say)")
    args = ap.parse_args()

    from benchmarks.bench_replication import make_model
    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

    reason = unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    if args.compare_tree and not (Path(args.compare_tree) / "hwtui").is_dir():
        print(f"--compare-tree {args.compare_tree}: no hwtui package there", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hwtui-netns-bench-"))
    model = work / "model.safetensors"
    make_model(model, args.mb, 400)
    write_json_atomic(work / "plan.json", build_plan_from_files([str(model)], model="bench", version="n1",
                                                                bucket_bytes=args.bucket_mb << 20))
    total = os.path.getsize(model)
    hw = variants(args)
    names = ["flat", *hw]
    net = NetnsCluster(2).up()
    rows: dict[str, list[float]] = {k: [] for k in names}
    reps_of: dict[str, dict[int, list[dict]]] = {k: {} for k in hw}
    ksoft_of: dict[str, dict[int, float]] = {k: {} for k in hw}
    cpus: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    loads: list[str] = []
    try:
        for rnd in range(args.rounds):
            port = 29600 + 10 * rnd
            before = load()
            order = names if rnd % 2 == 0 else names[::-1]
            for what in order:
                port += 1
                if what == "flat":
                    seconds, cpu, host = run_flat(net, model, port)
                else:
                    k0 = ksoftirqd_s()
                    seconds, reps = run_hwtui(net, work, port, rnd, what, *hw[what])
                    reps_of[what][rnd], ksoft_of[what][rnd] = reps, ksoftirqd_s() - k0
                    cpu, host = cpu_of(reps)
                rows[what].append(seconds)
                cpus[what].append((cpu, host))
                time.sleep(0.5)
            loads.append(f"{before} -> {load()}")
            print(f"round {rnd + 1}: " + ", ".join(f"{k} {total / rows[k][-1] / 1e9:.3f} GB/s" for k in names)
                  + f"; flat/hwtui {rows['flat'][-1] / rows['hwtui'][-1]:.2f}x (load {loads[-1]})", flush=True)
    finally:
        net.down()
    paths = {rep["ranks"][0]["rank"]: rep["ranks"][0].get("path") for rep in reps_of["hwtui"][0]}
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"model {total / 1e6:.0f} MB in {args.bucket_mb} MiB buckets, 2 hosts x 2 ranks, {args.rounds} interleaved rounds; "
          f"paths {paths}; hwtui's network group: {reps_of['hwtui'][0][2]['ranks'][0].get('net_streams', 1)} TCP stream(s) per peer"
          + (f"; tree = {args.compare_tree}" if args.compare_tree else ""))
    for k, v in rows.items():
        print(f"  {k:8} median {total / med[k] / 1e9:6.3f} GB/s ({med[k]:.3f} s)  rounds: {' '.join(f'{total / x / 1e9:.3f}' for x in v)}")
    for k, pairs in cpus.items():
        print(f"  {k:8} CPU per run, median: its ranks {statistics.median(c for c, _ in pairs):.2f} s, the host busy "
              f"{statistics.median(h for _, h in pairs):.2f} core-s of {os.cpu_count()} x {med[k]:.2f} s")
    for k in hw:
        ratios = [f / h for f, h in zip(rows["flat"], rows[k], strict=True)]
        print(f"{'hwtui hierarchical' if k == 'hwtui' else k} / flat broadcast = {med['flat'] / med[k]:.2f}x (per round "
              f"{' '.join(f'{x:.2f}' for x in ratios)}" + ("; issue 23 target >= 1.8x)" if k == "hwtui" else ")"))
    print(f"load per round: {'; '.join(loads)}")
    for k in hw:
        m = sorted(range(args.rounds), key=lambda i: rows[k][i])[args.rounds // 2]
        print(f"{k}: " + budget(reps_of[k][m], ksoft_of[k][m], total, med["flat"]) + f" (its median round, {m + 1})")
    if args.timeline:
        rnd = sorted(range(args.rounds), key=lambda i: rows["hwtui"][i])[args.rounds // 2]
        print(f"timeline of the median hwtui round ({rnd + 1}, {rows['hwtui'][rnd]:.3f} s):")
        print(timeline_of(work, rnd, reps_of["hwtui"][rnd], total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
