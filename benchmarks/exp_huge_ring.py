"""Experiment (issue 23.1): does the reader's ring reach the last few GB/s file -> GPU when its pinned
slices are huge pages?

The reader (engine.replication.reader) is at the page cache's own ceiling on an H200 host (round
sixteen: 38.4 GB/s file -> GPU, the read into host memory alone ~40-47 GB/s with 16 threads). A
``preadv`` from the page cache is the kernel copying 4 KiB pages into the buffer; this asks
whether the destination's TLB misses are part of that cost: the same reader, the same threads and
slices, once with torch's pinned buffers and once with buffers that are anonymous mappings
advised MADV_HUGEPAGE, populated, then registered with ``cudaHostRegister`` (pinned too, so the
copies stay asynchronous). Also the read into host memory alone, into a plain and a huge-page
destination, and the file's filesystem and the kernel's transparent huge page setting.
Rounds interleaved, medians, every GPU result compared with the file once per way.

Measured on an H200 host (round seventeen, 4 GiB warm, 16 threads, an ext filesystem, THP "madvise"): the kernel
gave the 4 GiB MADV_HUGEPAGE buffer 62 MiB of huge pages; read-only 42.65 GB/s into plain memory and
39.03 into the huge buffer; file -> GPU 32.84 through torch's pinned ring and 31.44 through the huge,
registered one (bit-exact both). No gain: the reader keeps torch's pinned buffers.

    python3 benchmarks/exp_huge_ring.py [--mb 4096] [--threads 16] [--rounds 5] [--file PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MB = 1 << 20
HUGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def huge_buffer(nbytes: int) -> tuple[Any, int, int]:
    """(the mapping, the 2 MiB-aligned address, the length) of an anonymous buffer advised huge and populated."""
    n = -(-nbytes // HUGE) * HUGE
    mm = mmap.mmap(-1, n + HUGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    addr = base + (-base % HUGE)
    _libc.madvise(ctypes.c_void_p(addr), n, MADV_HUGEPAGE)
    _libc.madvise(ctypes.c_void_p(addr), n, MADV_POPULATE_WRITE)
    return mm, addr, n


def anon_huge_kib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


def make_seams(device: str) -> dict[str, Any]:
    import torch

    from hwtui.engine.replication.reader import ALIGN, TorchSeam

    class HugeSeam(TorchSeam):
        """TorchSeam whose host slices are huge pages registered with CUDA."""

        held: list[Any] = []

        def host_buffer(self, nbytes: int) -> tuple[Any, memoryview]:
            mm, addr, n = huge_buffer(nbytes + ALIGN)
            err = torch.cuda.cudart().cudaHostRegister(addr, n, 0)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister failed: {err}")
            off = addr - ctypes.addressof(ctypes.c_char.from_buffer(mm))
            buf = torch.frombuffer(memoryview(mm)[off:off + nbytes], dtype=torch.uint8)
            self.held.append((mm, addr))
            return buf, memoryview(buf.numpy()).cast("B")

    return {"pinned (torch)": TorchSeam(device), "huge + registered": HugeSeam(device)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=4096)
    ap.add_argument("--threads", default="16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--file", default="/tmp/hwtui-huge-ring.bin")
    args = ap.parse_args()
    import numpy as np
    import torch

    from hwtui.engine.replication.reader import Extent, HostSeam, ParallelReader, WeightFile

    path = Path(args.file)
    nbytes = args.mb * MB
    if not path.exists() or path.stat().st_size != nbytes:
        block = np.random.default_rng(0).integers(0, 256, 64 * MB, dtype=np.uint8)
        with open(path, "wb") as f:
            for k in range(nbytes // (64 * MB)):
                f.write((block ^ np.uint8(k % 251 + 1)).tobytes())
    with open(path, "rb") as f:
        while f.read(256 * MB):
            pass  # warm
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip() if Path(
        "/sys/kernel/mm/transparent_hugepage/enabled").exists() else "?"
    print(f"file {path} ({fs}), {args.mb} MiB warm; kernel {os.uname().release}; THP {thp}; cores {os.cpu_count()}")
    threads = [int(t) for t in args.threads.split(",")]
    gpu = torch.cuda.is_available()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda") if gpu else None
    plain_host = torch.empty(nbytes, dtype=torch.uint8)
    plain_host.fill_(0)
    hmm, haddr, _ = huge_buffer(nbytes)
    hoff = haddr - ctypes.addressof(ctypes.c_char.from_buffer(hmm))
    huge_host = torch.frombuffer(memoryview(hmm)[hoff:hoff + nbytes], dtype=torch.uint8)
    print(f"AnonHugePages after the huge host destination: {anon_huge_kib() >> 10} MiB")
    readers: dict[str, tuple[Any, Any]] = {}
    for t in threads:
        readers[f"read-only T={t} into plain host"] = (ParallelReader(HostSeam(), threads=t), plain_host)
        readers[f"read-only T={t} into huge host"] = (ParallelReader(HostSeam(), threads=t), huge_host)
        if gpu:
            for name, seam in make_seams("cuda").items():
                r = ParallelReader(seam, threads=t)
                r.warm()
                readers[f"file -> GPU T={t}, ring {name}"] = (r, dst)
    print(f"AnonHugePages with every ring: {anon_huge_kib() >> 10} MiB")
    times: dict[str, list[float]] = {k: [] for k in readers}
    exact: dict[str, bool] = {}
    ref = np.fromfile(path, dtype=np.uint8) if gpu else None
    with WeightFile(str(path), "off") as wf:
        for _ in range(args.rounds):
            for name, (reader, out) in readers.items():
                if out.is_cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                reader.read(wf, [Extent(0, nbytes, 0)], out)
                times[name].append(time.perf_counter() - t0)
                if out.is_cuda and name not in exact:
                    exact[name] = bool(np.array_equal(out.cpu().numpy(), ref))
                    out.zero_()
    for name, ts in times.items():
        gbps = nbytes / statistics.median(ts) / 1e9
        print(f"  {name:<52} {gbps:7.2f} GB/s (median of {len(ts)}; best {nbytes / min(ts) / 1e9:.2f})"
              + (f", bit-exact {exact[name]}" if name in exact else ""))
    for r, _ in readers.values():
        r.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
