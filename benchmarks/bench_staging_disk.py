"""Staging on disk: what each way of writing a receiver's copy costs (issue 23, item 4).

One process, no ranks: a model file in the page cache (warm) is copied into a new staging file the
way the same-host path does it (1 MiB ``pwrite`` slices, each hashed with xxh3 through the file's
shared mapping right after it lands, bucket by bucket), then fsynced. Each option is timed for its
set-up, the copy (the transfer phase's share) and the fsync (what ``prepare`` pays before the
vote); rounds are interleaved so background load hits every option alike.

- ``sparse``: ``ftruncate`` only (hwtui up to 7309e8d);
- ``fallocate``: every block reserved first (``fallocate(2)``, an unwritten extent);
- ``write-behind``: sparse, ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` per bucket from the copying thread;
- ``fallocate+write-behind``: both, from the copying thread;
- ``fallocate+write-behind-thread``: both, write-out started on a second thread (hwtui's choice);
- ``fallocate+write-behind-lag``: write-out of the bucket before the one just copied;
- ``spare``: a file of the right size whose pages are in the page cache already (a reused spare);
- ``direct``: ``O_DIRECT`` writes of whole aligned buckets (hashed from the source, not as landed).

    .venv/bin/python benchmarks/bench_staging_disk.py [--mb 1000] [--rounds 5] [--dir DIR] [--options a,b]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MB = 1 << 20
BUCKET = 32 * MB
STEP = MB
OPTIONS = ["sparse", "fallocate", "write-behind", "fallocate+write-behind", "fallocate+write-behind-thread",
           "fallocate+write-behind-lag", "spare", "direct"]


class Bench:
    def __init__(self, src: Any, where: Path):
        self.src = src
        self.n = int(src.size)
        self.where = where
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        self.libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        self.pool = ThreadPoolExecutor(1)

    def _kick(self, fd: int, off: int, n: int) -> None:
        self.libc.sync_file_range(fd, off, n, 2)  # SYNC_FILE_RANGE_WRITE: start, never wait

    def _copy_hashed(self, fd: int, mm: Any, behind: str) -> None:
        import xxhash

        for b in range(0, self.n, BUCKET):
            h = xxhash.xxh3_64()
            for c in range(b, min(self.n, b + BUCKET), STEP):
                piece = self.src[c:c + STEP]
                os.pwrite(fd, piece, c)
                h.update(mm[c:c + piece.size])
            size = min(BUCKET, self.n - b)
            if behind == "inline":
                self._kick(fd, b, size)
            elif behind == "thread":
                self.pool.submit(self._kick, fd, b, size)
            elif behind == "lag" and b:
                self._kick(fd, b - BUCKET, BUCKET)

    def _direct(self, path: Path) -> tuple[float, float, float]:
        import xxhash

        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
        try:
            t0 = time.perf_counter()
            self.libc.fallocate(fd, 0, 0, self.n)
            t1 = time.perf_counter()
            full = self.n // 4096 * 4096  # the unaligned tail would go by a buffered write
            for b in range(0, full, BUCKET):
                piece = self.src[b:min(full, b + BUCKET)]
                xxhash.xxh3_64_intdigest(piece)
                os.pwrite(fd, piece, b)
            t2 = time.perf_counter()
            os.fsync(fd)
            return t1 - t0, t2 - t1, time.perf_counter() - t2
        finally:
            os.close(fd)
            path.unlink()

    def run(self, option: str) -> tuple[float, float, float]:
        import numpy as np

        path = self.where / f"staging.{option}"
        if option == "direct":
            return self._direct(path)
        reuse = option == "spare" and path.exists()
        fd = os.open(path, os.O_RDWR) if reuse else os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            t0 = time.perf_counter()
            if option.startswith("fallocate"):
                self.libc.fallocate(fd, 0, 0, self.n)
            elif not reuse:
                os.ftruncate(fd, self.n)
            mm = np.memmap(path, dtype=np.uint8, mode="r+", shape=(self.n,))
            t1 = time.perf_counter()
            behind = {"write-behind": "inline", "fallocate+write-behind": "inline",
                      "fallocate+write-behind-thread": "thread", "fallocate+write-behind-lag": "lag"}.get(option, "")
            self._copy_hashed(fd, mm, behind)
            t2 = time.perf_counter()
            self.pool.submit(lambda: None).result()  # the kicks queued so far have run (as Staging.flush drains)
            os.fsync(fd)
            t3 = time.perf_counter()
            del mm
            return t1 - t0, t2 - t1, t3 - t2
        finally:
            os.close(fd)
            if option != "spare":
                path.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary directory under /tmp)")
    ap.add_argument("--options", default=",".join(OPTIONS))
    args = ap.parse_args()
    import numpy as np
    import xxhash

    options = [o for o in args.options.split(",") if o]
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        print(f"bench_staging_disk: unknown option(s) {unknown}; known: {OPTIONS}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hwtui-staging-bench-", dir=args.dir))
    try:
        model = work / "model.bin"
        model.write_bytes(np.random.default_rng(0).integers(0, 255, args.mb * 1_000_000, dtype=np.uint8).tobytes())
        src = np.memmap(model, dtype=np.uint8, mode="r")
        xxhash.xxh3_64_intdigest(memoryview(model.read_bytes()))  # warm: the source is in the page cache, as a replicate's is
        bench = Bench(src, work)
        res: dict[str, list[tuple[float, float, float]]] = {o: [] for o in options}
        for _ in range(args.rounds):
            for o in options:
                res[o].append(bench.run(o))
        print(f"{args.mb} MB, {args.rounds} interleaved rounds, {os.cpu_count()} CPU(s), load {os.getloadavg()[0]:.1f}; "
              "seconds, median [min-max]")
        print(f"{'option':31} {'set-up':>7} {'copy+hash':>22} {'fsync':>22} {'copy+fsync':>10}")
        for o in options:
            setup, copy, sync = (list(x) for x in zip(*res[o], strict=True))
            both = [a + b for a, b in zip(copy, sync, strict=True)]
            print(f"{o:31} {statistics.median(setup):7.3f} {statistics.median(copy):7.3f} [{min(copy):.3f}-{max(copy):.3f}] "
                  f"{statistics.median(sync):7.3f} [{min(sync):.3f}-{max(sync):.3f}] {statistics.median(both):10.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
