"""GPU benchmark (issues 17.2, 23.6): hwtui's file -> device path and GPU -> GPU replication, against
the references, in one run: rounds interleaved so background load hits every method alike, medians.

file -> device memory (warm page cache after the first, untimed, read), every method ending with
the file's bytes in device memory, hwtui's checked bit-exact against the file:

- ``hwtui reader T=N``: engine.replication.reader, N threads ``preadv``-ing 64 MiB slices into a
  pinned ring and copying each on the thread's own stream (on CPU: ``preadv`` straight into the
  destination), into a preallocated destination (a source reads into its pooled buffers);
- ``hwtui source path``: the replication source's own staging of every planned bucket
  (``SourceReader.stage``) into pooled device buffers, with the next bucket's read queued behind
  each (as replicate's source does) and bucket by bucket (the reader drains between buckets);
- ``safetensors load_file(device=...)`` and ``safetensors load_file`` to CPU then ``.to(device)``;
- ``plain pinned copy``: one thread ``readinto`` a pinned buffer, one ``copy_`` to the device;
- ``read-only T=N``: the reader into host memory only (the ceiling the disk / page cache allows);
- ``host->device``: one copy of an already filled pinned buffer (the PCIe ceiling); on CPU a memcpy.

GPU -> GPU (two GPUs or more): ``hwtui replicate --device cuda --nproc 2`` (NCCL, verified) against
NCCL's own ``dist.broadcast`` of one preallocated buffer of the same bytes, two ranks; hwtui's
figure is bytes / its slowest rank's transfer phase, the baseline's the slowest rank's broadcast.

``--device cpu`` runs it without a GPU: the reader into host memory with 1 and 2 threads (or
``--readers``) and the source path reading every bucket into host buffers (as a source packing its
buckets does), against a plain single read and a memcpy, on this machine's page cache.

    .venv/bin/python benchmarks/bench_gpu.py [--mb 1024] [--rounds 5] [--device cuda] [--readers 1,2,8]
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
from typing import Any

MB = 1 << 20


def make_model(path: Path, total_mb: int, n: int = 8) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    per = total_mb * MB // n
    # One random 64 MiB block, each 64 MiB chunk of the file xor-ed with its own index: every chunk
    # differs (a slice landing in the wrong place is caught) and 4 GiB is made in seconds, not minutes.
    block = torch.randint(0, 256, (min(per, 64 * MB),), dtype=torch.uint8, generator=g)
    tensors, k = {}, 0
    for i in range(n):
        t = torch.empty(per, dtype=torch.uint8)
        for pos in range(0, per, block.numel()):
            m = min(block.numel(), per - pos)
            torch.bitwise_xor(block[:m], k % 251 + 1, out=t[pos:pos + m])
            k += 1
        tensors[f"w{i:02d}"] = t
    save_file(tensors, str(path))


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def hwtui_to_device(plan_path: str, device: str, ahead: int = 1) -> tuple[float, list]:
    """hwtui's source path: every planned bucket staged into a pooled device buffer, the next
    bucket's read queued behind each (``ahead``, as replicate's source does) or bucket by bucket
    (0). The pool and the reader's pinned ring are made before the clock, as a source's set-up does."""
    from hwtui.engine.replication.plan import load_plan
    from hwtui.engine.replication.pool import BufferPool
    from hwtui.engine.replication.source_reader import SourceReader

    plan = load_plan(plan_path)
    largest = max(b["size"] for b in plan.buckets)
    # All buckets kept: the bytes end in device memory. On a CPU run the pool is named "cpu:0": host
    # memory, but not the "cpu" pool whose contiguous buckets a source sends zero-copy from its
    # mapping, so every bucket is read, as a source packing its buckets reads them.
    pool = BufferPool(len(plan.buckets), largest, device if device != "cpu" else "cpu:0")
    pool.warm(len(plan.buckets))
    reader = SourceReader(plan)
    reader.warm(device)
    sync(device)
    t0 = time.perf_counter()
    bufs = []
    for b in range(len(plan.buckets)):
        buf, _pooled = reader.stage(plan, b, pool, ahead=ahead)
        bufs.append((b, buf))
    sync(device)
    dt = time.perf_counter() - t0
    reader.close()  # the staged buckets are pool buffers, not views of the mapping: it can go now
    return dt, [(plan, bufs)]


def plain_to_device(model: Path, device: str) -> tuple[float, object]:
    """The plain way: one pinned host buffer, readinto, one copy_ to the device."""
    import torch

    n = model.stat().st_size
    sync(device)
    t0 = time.perf_counter()
    host = torch.empty(n, dtype=torch.uint8, pin_memory=device == "cuda")
    _readinto(model, host)
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=device == "cuda")
    sync(device)
    return time.perf_counter() - t0, dev


def _readinto(model: Path, host: Any) -> None:
    n = host.numel()
    with open(model, "rb", buffering=0) as fh:
        view = memoryview(host.numpy())
        pos = 0
        while pos < n:
            got = fh.readinto(view[pos:])
            if not got:
                raise SystemExit(f"{model}: short read at {pos}")
            pos += got


def plain_read(model: Path, host: Any) -> float:
    """CPU reference: one thread, one read of the whole file into a preallocated host buffer."""
    t0 = time.perf_counter()
    _readinto(model, host)
    return time.perf_counter() - t0


def reader_to(model: Path, reader: Any, dst: Any, device: str) -> float:
    """hwtui's reader: the whole file into ``dst`` (device memory, or host memory for read-only/CPU)."""
    from hwtui.engine.replication.reader import Extent, WeightFile

    sync(device)
    t0 = time.perf_counter()
    with WeightFile(model) as wf:
        reader.read(wf, [Extent(0, wf.size, 0)], dst)
    sync(device)
    return time.perf_counter() - t0


def safetensors_direct(model: Path, device: str) -> float:
    from safetensors.torch import load_file

    sync(device)
    t0 = time.perf_counter()
    out = load_file(str(model), device=device)
    sync(device)
    dt = time.perf_counter() - t0
    del out
    return dt


def safetensors_via_cpu(model: Path, device: str) -> float:
    from safetensors.torch import load_file

    sync(device)
    t0 = time.perf_counter()
    out = {k: v.to(device) for k, v in load_file(str(model), device="cpu").items()}
    sync(device)
    dt = time.perf_counter() - t0
    del out
    return dt


def host_to_device(src: Any, dst: Any, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    dst.copy_(src, non_blocking=device == "cuda")
    sync(device)
    return time.perf_counter() - t0


def _source_label(ahead: int, bucket_mib: float | None = None) -> str:
    of = f"{bucket_mib:g} MiB buckets, " if bucket_mib else ""
    if ahead == 0:
        return f"hwtui source path ({of}bucket by bucket)"
    return f"hwtui source path ({of}{ahead} read ahead)"


def file_to_device(model: Path, plan_paths: dict[float, str], device: str, rounds: int, threads: list[int],
                   slices: list[int] | None = None, depths: list[int] | None = None,
                   aheads: tuple[int, ...] = (3, 0)) -> dict:
    """Every method, rounds interleaved, medians; -> the results (GB/s and ratios to safetensors)."""
    import torch

    from hwtui.engine.replication.reader import DEPTH, SLICE_BYTES, ParallelReader, seam_for

    n = model.stat().st_size
    pinned = device != "cpu"
    host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
    host.zero_()  # touched: page faults are not the reader's
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    dev.zero_()
    slice_mib = slices or [SLICE_BYTES // MB]
    depth_n = depths or [DEPTH]

    def label(t: int, s: int, d: int) -> str:
        return (f"hwtui reader T={t}" + (f" slice={s}MiB" if len(slice_mib) > 1 else "")
                + (f" depth={d}" if len(depth_n) > 1 else ""))

    readers = {label(t, s, d): ParallelReader(seam_for(device), threads=t, slice_bytes=s * MB, depth=d)
               for t in threads for s in slice_mib for d in depth_n}
    host_readers = {t: ParallelReader(seam_for("cpu"), threads=t) for t in threads}
    want = torch.frombuffer(bytearray(model.read_bytes()), dtype=torch.uint8)  # warms the page cache too
    want_dev = want.to(device) if device != "cpu" else want  # compared where the bytes are: seconds, not minutes
    exact = True
    for name, r in readers.items():  # untimed: allocates the pinned rings once, as a source does in set-up
        reader_to(model, r, dev, device)
        exact &= bool(torch.equal(dev, want_dev))
        dev.zero_()
        progress(f"{name}: warmed, exact so far {exact}")
    staged_exact = all(exact_hwtui(hwtui_to_device(path, device)[1], want_dev) for path in plan_paths.values())
    progress(f"source path: exact {staged_exact}")
    times: dict[str, list[float]] = {}

    def add(name: str, dt: float) -> None:
        times.setdefault(name, []).append(dt)

    for rnd in range(rounds):
        progress(f"round {rnd + 1} of {rounds}")
        for name, r in readers.items():
            add(name, reader_to(model, r, dev, device))
        for mib, path in plan_paths.items():
            for ahead in aheads:
                t_src, staged = hwtui_to_device(path, device, ahead)
                add(_source_label(ahead, mib if len(plan_paths) > 1 else None), t_src)
                del staged
        if device != "cpu":  # on CPU load_file maps the file lazily: it moves no bytes, so it is no reference
            add(f"safetensors load_file(device={device!r})", safetensors_direct(model, device))
            add("safetensors load_file cpu -> .to(device)", safetensors_via_cpu(model, device))
            add("plain pinned copy (1 thread readinto + copy_)", plain_to_device(model, device)[0])
        else:
            add("plain single read (readinto, 1 thread)", plain_read(model, host))
        for t, r in host_readers.items():
            if device != "cpu":
                add(f"read-only ceiling T={t} (into pinned host memory)", reader_to(model, r, host, "cpu"))
        _readinto(model, host)
        add("host->device ceiling (pinned copy_)" if device != "cpu" else "memcpy ceiling (host copy_)",
            host_to_device(host, dev, device))
    for r in [*readers.values(), *host_readers.values()]:
        r.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = next(k for k in med if k.startswith("safetensors load_file(device" if device != "cpu" else "plain single read"))
    rows = {k: {"gbps": round(n / v / 1e9, 3), "median_s": round(v, 5), "x_reference": round(med[ref] / v, 3)}
            for k, v in med.items()}
    best = max((k for k in rows if k.startswith("hwtui reader")), key=lambda k: rows[k]["gbps"])
    return {"bytes": n, "methods": rows, "hwtui_gbps": rows[best]["gbps"], "hwtui_best": best,
            "exact": bool(exact and staged_exact), "reference": ref}


def exact_hwtui(staged: Any, want: Any) -> bool:
    """Every planned item of every staged bucket equals the file's bytes (``want``, on the same device)."""
    import torch

    (plan, bufs), = staged
    for b, buf in bufs:
        for it in plan.bucket_items[b]:
            got = buf[it["offset"]:it["offset"] + it["nbytes"]]
            if not torch.equal(got, want[it["file_offset"]:it["file_offset"] + it["nbytes"]].to(got.device)):
                return False
    return True


_T0 = time.perf_counter()


def progress(what: str) -> None:
    """A line on stderr per stage: a run cut short by a time limit still says how far it got."""
    print(f"[bench_gpu +{time.perf_counter() - _T0:6.1f}s] {what}", file=sys.stderr, flush=True)


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
    result: dict = json.loads(outs[1].strip().splitlines()[-1])
    return result


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
    ap.add_argument("--aheads", default="3,0", metavar="LIST",
                    help="the source path's read-ahead in buckets, one row each (default 3,0: what replicate "
                         "does with its default window of 4, and none). On an H200 the source path staged 64 MiB "
                         "buckets at 11-13 GB/s where the reader took the whole file at 31-39 while a 64 MiB bucket "
                         "gave 16 threads 4 MiB each (reader.DEVICE_MIN_SLICE)")
    ap.add_argument("--bucket-mb", default="64", metavar="LIST",
                    help="the source path's bucket sizes in MiB, one plan each (default 64; replicate's default is 32)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--readers", metavar="LIST", help="reader threads to measure, e.g. 1,2,8 (default: 1 and 2 on cpu; "
                                                      "1 and hwtui's default on a GPU)")
    ap.add_argument("--depths", metavar="LIST", help="pinned buffers per reader thread to measure, e.g. 2,4 "
                                                     "(default: the reader's default)")
    ap.add_argument("--slices", metavar="LIST", help="reader slice sizes in MiB to measure, e.g. 16,64 (default: the "
                                                     "reader's default)")
    args = ap.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here (torch.cuda.is_available() is False); run it where `make gpu-check` runs, "
              "or with --device cpu to exercise the code paths; nothing measured", file=sys.stderr)
        return 0  # `make bench` runs every benchmark: a CPU-only machine skips this one, it does not fail
    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic
    from hwtui.engine.replication.reader import default_readers

    try:
        bucket_mibs = [int(x) for x in args.bucket_mb.split(",")]
    except ValueError:
        bucket_mibs = []
    if not bucket_mibs or min(bucket_mibs) < 1:
        print(f"bench_gpu.py: --bucket-mb {args.bucket_mb[:40]!r}: expected sizes in MiB like 64,32", file=sys.stderr)
        return 2
    results: dict = {"device": args.device, "mb": args.mb, "rounds": args.rounds,
                     "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="hwtui-bench-gpu-") as tmp:
        model = Path(tmp) / "model.safetensors"
        make_model(model, args.mb)
        progress(f"model written: {model.stat().st_size / 1e9:.2f} GB")
        nbytes = model.stat().st_size
        plan_paths: dict[float, str] = {}  # by the bucket size the plan really has, in MiB
        for mib in bucket_mibs:
            bucket = max(MB, min(mib * MB, nbytes // 8))  # at toy sizes, still several buckets
            if bucket / MB not in plan_paths:
                plan_paths[bucket / MB] = str(Path(tmp) / f"plan-{bucket}.json")
                write_json_atomic(plan_paths[bucket / MB], build_plan_from_files(
                    [str(model)], model="bench", version="v1", bucket_bytes=bucket))
        plan_path = next(iter(plan_paths.values()))
        threads = [int(x) for x in args.readers.split(",")] if args.readers else (
            [1, 2] if args.device == "cpu" else sorted({1, default_readers()}))
        slices = [int(x) for x in args.slices.split(",")] if args.slices else None
        depths = [int(x) for x in args.depths.split(",")] if args.depths else None
        try:
            aheads = tuple(int(x) for x in args.aheads.split(","))
        except ValueError:
            print(f"bench_gpu.py: --aheads {args.aheads!r}: expected a list of integers like 1,4,8", file=sys.stderr)
            return 2
        res = results["file_to_device"] = file_to_device(model, plan_paths, args.device, args.rounds, threads, slices,
                                                         depths, aheads)
        print(f"file -> {args.device}: {nbytes / 1e9:.2f} GB file, warm page cache, medians of {args.rounds} interleaved "
              f"rounds (x = speed / that of {res['reference']}); hwtui bit-exact: {res['exact']}")
        for name, row in res["methods"].items():
            print(f"  {name:<56} {row['gbps']:8.2f} GB/s  {row['median_s'] * 1e3:9.1f} ms  x{row['x_reference']:.2f}")
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
