"""Hierarchical replication across two "hosts" (network namespaces joined by veth/bridge), 2 ranks each.

Side by side in one run, rounds interleaved, medians:

- flat: one ``dist.broadcast`` of the whole model from rank 0 to ranks 1-3 (gloo, world of 4,
  ranks 0-1 in namespace A, 2-3 in B): every byte crosses the veth once per remote rank;
- hwtui: ``hwtui replicate`` joined by the same 4 ranks: rank 1 copies from the source's page
  cache, rank 2 (B's leader) receives over the veth, rank 3 copies rank 2's verified copy.

GB/s = model bytes / the slowest rank's transfer (flat: the broadcast; hwtui: the transfer phase).
Needs root and ``ip netns``.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_replication_netns.py [--mb 256] [--rounds 3]
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

FLAT = r"""
import os, sys, time, datetime, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=4, timeout=datetime.timedelta(seconds=60))
n = os.path.getsize(sys.argv[1])
if rank == 0:
    buf = torch.frombuffer(bytearray(open(sys.argv[1], "rb").read()), dtype=torch.uint8)
else:
    buf = torch.zeros(n, dtype=torch.uint8)
dist.barrier()
t = time.perf_counter()
dist.broadcast(buf, 0)
dt = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
dist.all_reduce(dt, op=dist.ReduceOp.MAX)
if rank == 0:
    print(dt.item(), flush=True)
dist.destroy_process_group()
"""


def env_for(rank: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "HOTWEIGHTS_"))}
    env.update(RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", MASTER_ADDR="10.77.0.1",
               MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from benchmarks.bench_replication import make_model
    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic
    from tests.engine.cluster.netns import NetnsCluster, finish, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="hwtui-netns-bench-"))
    model = work / "model.safetensors"
    make_model(model, args.mb, 400)
    write_json_atomic(work / "plan.json", build_plan_from_files([str(model)], model="bench", version="n1",
                                                                bucket_bytes=32 << 20))
    total = os.path.getsize(model)
    net = NetnsCluster(2).up()
    rows: dict[str, list[float]] = {"flat": [], "hwtui": []}
    try:
        for rnd in range(args.rounds):
            port = 29600 + rnd
            procs = [net.popen(r // 2, [sys.executable, "-c", FLAT, str(model)], env=env_for(r, port)) for r in range(4)]
            res = finish(procs, timeout=300)
            assert all(rc == 0 for rc, _, _ in res), [e[-500:] for _, _, e in res]
            rows["flat"].append(float(res[0][1].strip().splitlines()[-1]))
            procs = [net.popen(r // 2, [sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(work / "plan.json"),
                                        "--report", str(work / f"rep{r}.json")], env=env_for(r, port + 50))
                     for r in range(4)]
            res = finish(procs, timeout=300)
            assert all(rc == 0 for rc, _, _ in res), [e[-500:] for _, _, e in res]
            reps = [json.loads((work / f"rep{r}.json").read_text()) for r in range(4)]
            rows["hwtui"].append(max(rep["seconds"] for rep in reps))
            paths = {rep["ranks"][0]["rank"]: rep["ranks"][0].get("path") for rep in reps}
            time.sleep(0.5)
    finally:
        net.down()
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"model {total / 1e6:.0f} MB, 2 hosts x 2 ranks, {args.rounds} rounds; paths {paths}")
    for k, v in rows.items():
        print(f"  {k:6} median {total / med[k] / 1e9:6.3f} GB/s  rounds: {' '.join(f'{total / x / 1e9:.3f}' for x in v)}")
    print(f"hwtui hierarchical / flat broadcast = {med['flat'] / med['hwtui']:.2f}x (issue 13 target >= 1.0x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
