"""GPU benchmark (issue 17.2): hwtui's file -> GPU path and GPU -> GPU replication, against plain torch.

One run, rounds interleaved so background load hits every method alike, medians reported:

- file -> GPU memory: hwtui's source path (``SourceReader.stage``: the weight file memory-mapped,
  one host-to-device copy per planned bucket into pooled device buffers) against the plain way of
  moving the same bytes, ``torch.empty(n, pin_memory=True)`` + ``readinto`` + ``cuda_tensor.copy_``.
  Both end with every byte in GPU memory and are checked bit-exact against the file. The page
  cache is warm after the first round for both.
- GPU -> GPU (two GPUs or more): ``hwtui replicate --device cuda --nproc 2`` (NCCL, verified)
  against NCCL's own ``dist.broadcast`` of one preallocated buffer of the same bytes, two ranks;
  hwtui's figure is bytes / its slowest rank's transfer phase, the baseline's the slowest rank's
  broadcast.

``--device cpu`` runs the same code paths without a GPU (pageable buffers, no pinning): the smoke
test uses it so this file cannot rot on CPU-only CI; its figures say nothing about a GPU.

    .venv/bin/python benchmarks/bench_gpu.py [--mb 1024] [--rounds 5] [--device cuda]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 1 << 20


def make_model(path: Path, total_mb: int, n: int = 8) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    per = total_mb * MB // n
    save_file({f"w{i:02d}": torch.randint(0, 256, (per,), dtype=torch.uint8, generator=g) for i in range(n)}, str(path))


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def hwtui_to_device(plan_path: str, device: str) -> tuple[float, list]:
    """hwtui's source path: every planned bucket staged into a pooled device buffer."""
    from hwtui.engine.replication.plan import load_plan
    from hwtui.engine.replication.pool import BufferPool
    from hwtui.engine.replication.source_reader import SourceReader

    plan = load_plan(plan_path)
    largest = max(b["size"] for b in plan.buckets)
    pool = BufferPool(len(plan.buckets), largest, device)  # all buckets kept: the bytes end in device memory
    sync(device)
    t0 = time.perf_counter()
    reader = SourceReader(plan)
    bufs = []
    for b in range(len(plan.buckets)):
        buf, _pooled = reader.stage(plan, b, pool)
        if buf.device.type != device:  # a CPU run stages zero-copy views; copy them like the GPU path does
            buf = buf.clone()
        bufs.append((b, buf))
    sync(device)
    return time.perf_counter() - t0, [(plan, bufs)]


def plain_to_device(model: Path, device: str) -> tuple[float, object]:
    """The plain way: one pinned host buffer, readinto, one copy_ to the device."""
    import torch

    n = model.stat().st_size
    sync(device)
    t0 = time.perf_counter()
    host = torch.empty(n, dtype=torch.uint8, pin_memory=device == "cuda")
    with open(model, "rb", buffering=0) as fh:
        view = memoryview(host.numpy())
        pos = 0
        while pos < n:
            got = fh.readinto(view[pos:])
            if not got:
                raise SystemExit(f"{model}: short read at {pos}")
            pos += got
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=device == "cuda")
    sync(device)
    return time.perf_counter() - t0, dev


def exact_plain(dev, model: Path) -> bool:
    import torch

    want = torch.frombuffer(bytearray(model.read_bytes()), dtype=torch.uint8)
    return bool(torch.equal(dev.cpu(), want))


def exact_hwtui(staged, model: Path) -> bool:
    import torch

    data = model.read_bytes()
    (plan, bufs), = staged
    for b, buf in bufs:
        for it in plan.bucket_items[b]:
            got = buf[it["offset"]:it["offset"] + it["nbytes"]].cpu()
            want = torch.frombuffer(bytearray(data[it["file_offset"]:it["file_offset"] + it["nbytes"]]), dtype=torch.uint8)
            if not torch.equal(got, want):
                return False
    return True


# -- GPU -> GPU ---------------------------------------------------------------------------------------

def nccl_worker(rank: int, port: int, nbytes: int, rounds: int) -> None:
    """One rank of the baseline: NCCL's own broadcast of one preallocated buffer."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    buf = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda") if rank == 0 else \
        torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    want = buf.sum().item() if rank == 0 else None
    times = []
    for _ in range(rounds):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.broadcast(buf, 0)
        torch.cuda.synchronize()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device="cuda")
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(float(dt.item()))
    total = torch.tensor([buf.sum().item() if rank else want], dtype=torch.float64, device="cuda")
    dist.broadcast(total, 0)
    if rank == 1:
        print(json.dumps({"times": times, "exact": buf.sum().item() == total.item()}), flush=True)
    dist.destroy_process_group()


def nccl_baseline(nbytes: int, rounds: int) -> dict:
    from hwtui.core.net import free_loopback_port

    port = free_loopback_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--nccl-worker", str(r), str(port), str(nbytes), str(rounds)],
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("the NCCL baseline failed: " + " ".join(str(p.returncode) for p in procs))
    return json.loads(outs[1].strip().splitlines()[-1])


def hwtui_gpu_to_gpu(plan: str) -> dict:
    from hwtui.engine.replication.launcher import ReplicationOptions, run_replication

    res = run_replication(ReplicationOptions(plan=plan, device="cuda", nproc=2))
    if not res.ok:
        raise SystemExit(f"hwtui replication failed: {res.error}")
    return res.report


# -- main ---------------------------------------------------------------------------------------------

def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--nccl-worker":
        nccl_worker(*(int(x) for x in sys.argv[2:6]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="model size in MiB (default 1024)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here (torch.cuda.is_available() is False); run it where `make gpu-check` runs, "
              "or with --device cpu to exercise the code paths; nothing measured", file=sys.stderr)
        return 0  # `make bench` runs every benchmark: a CPU-only machine skips this one, it does not fail
    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

    results: dict = {"device": args.device, "mb": args.mb, "rounds": args.rounds,
                     "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="hwtui-bench-gpu-") as tmp:
        model = Path(tmp) / "model.safetensors"
        make_model(model, args.mb)
        plan_path = str(Path(tmp) / "plan.json")
        nbytes = model.stat().st_size
        # 64 MiB buckets (the engine's default order of magnitude); at toy sizes, still several buckets.
        bucket = max(MB, min(64 * MB, nbytes // 8))
        write_json_atomic(plan_path, build_plan_from_files([str(model)], model="bench", version="v1", bucket_bytes=bucket))
        hw, plain = [], []
        exact = True
        for r in range(args.rounds):
            t, staged = hwtui_to_device(plan_path, args.device)
            hw.append(t)
            exact &= r > 0 or exact_hwtui(staged, model)
            del staged
            t, dev = plain_to_device(model, args.device)
            plain.append(t)
            exact &= r > 0 or exact_plain(dev, model)
            del dev
        h, p = statistics.median(hw), statistics.median(plain)
        results["file_to_device"] = {"bytes": nbytes, "hwtui_gbps": round(nbytes / h / 1e9, 3),
                                     "pinned_copy_gbps": round(nbytes / p / 1e9, 3), "ratio": round(p / h, 3), "exact": exact}
        print(f"file -> {args.device}: {nbytes / 1e9:.2f} GB, hwtui {nbytes / h / 1e9:.2f} GB/s, torch.empty(pinned)+copy_ "
              f"{nbytes / p / 1e9:.2f} GB/s, ratio {p / h:.2f} (hwtui / baseline speed), bit-exact: {exact}")
        if args.device == "cuda" and torch.cuda.device_count() >= 2:
            reports = [hwtui_gpu_to_gpu(plan_path) for _ in range(args.rounds)]
            base = nccl_baseline(nbytes, args.rounds)
            hg = statistics.median(r["gbps"] for r in reports)
            bg = nbytes / statistics.median(base["times"]) / 1e9
            results["gpu_to_gpu"] = {"hwtui_gbps": hg, "nccl_broadcast_gbps": round(bg, 3), "ratio": round(hg / bg, 3),
                                     "transport": reports[0].get("transport"), "exact": base["exact"]}
            print(f"GPU -> GPU: hwtui {hg:.2f} GB/s via {reports[0].get('transport')}, NCCL broadcast {bg:.2f} GB/s, "
                  f"ratio {hg / bg:.2f}")
        elif args.device == "cuda":
            print("GPU -> GPU: skipped, one GPU here (needs two)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if results["file_to_device"]["exact"] else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
