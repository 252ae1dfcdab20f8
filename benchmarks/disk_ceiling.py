"""How fast this disk makes N bytes durable in a new file, every way hwtui could write them.

The floor under ``--commit --out`` (issue 23): whatever the commit path costs above the plain
transfer, the disk must at least write the copy and flush it. Each way writes ``N`` bytes into a
new file (exclusive, owner-only, never through a symlink) beside where the staging copy goes, from
one page-aligned, already-touched buffer (no page faults, no hashing in the timed part), then
``fsync``s it; the best of them is the disk alone:

- buffered ``pwrite`` of 32 MiB slices, then ``fsync`` (write-back does it all at the end);
- the same with ``sync_file_range(WRITE)`` started per slice from a second thread (write-behind);
- ``O_DIRECT``, one 32 MiB write at a time (``dd oflag=direct``'s path; last round's only line);
- ``O_DIRECT`` with 2, 4 or 8 writes in flight (threads) of 4, 16 or 64 MiB;
- preallocated (``fallocate``, as hwtui's staging file is) unless the name says "sparse";
- "into cached pages": reserved and its pages brought into the page cache before the clock starts
  (``MADV_POPULATE_READ``, as hwtui's mapped staging file is while the world forms), so the timed
  part is the copy into existing pages, the write-out and the ``fsync``.

    PYTHONPATH=. .venv/bin/python benchmarks/disk_ceiling.py [DIR] [--mb 1000] [--rounds 3]

prints each way's median and the best. ``benchmarks/bench_replication.py --commit`` runs every way
in its first round and then, each round, the best one and the old ``O_DIRECT`` QD1 line.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MB = 1 << 20
STEP = 32 * MB


def _open(path: Path, direct: bool) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags | (os.O_DIRECT if direct else 0), 0o600)


def _writes(nbytes: int, step: int, direct: bool) -> list[tuple[int, int]]:
    out = []
    for off in range(0, nbytes, step):
        n = min(step, nbytes - off)
        if direct and n % 4096:
            n += 4096 - n % 4096  # the tail rounded up to a block: a few KiB more, never less
        out.append((off, n))
    return out


def _timed(directory: Path, nbytes: int, buf: mmap.mmap, *, direct: bool, step: int, inflight: int,
           behind: bool, prealloc: bool, cached: bool = False) -> float:
    from hwtui.engine.replication.disk import preallocate, start_write_out
    from hwtui.engine.replication.staging import MADV_POPULATE_READ, populate

    view = memoryview(buf)
    path = directory / f"disk-ceiling-{os.getpid()}.bin"
    fd = _open(path, direct)
    try:
        if cached:  # reserved and its pages cached before the clock, as hwtui's PrefaultedFile does
            preallocate(fd, nbytes, "the disk-ceiling probe")
            with open(path, "rb") as fh, mmap.mmap(fh.fileno(), nbytes, prot=mmap.PROT_READ) as mm:
                populate(mm, MADV_POPULATE_READ)
        t0 = time.perf_counter()
        if prealloc and not cached:
            preallocate(fd, nbytes, "the disk-ceiling probe")
        writes = _writes(nbytes, step, direct)
        if inflight == 1 and not behind:
            for off, n in writes:
                os.pwrite(fd, view[:n], off)
        elif behind:  # buffered: write here, start each slice's write-out from a second thread
            with ThreadPoolExecutor(1) as kicker:
                for off, n in writes:
                    os.pwrite(fd, view[:n], off)
                    kicker.submit(start_write_out, fd, off, n)
        else:
            with ThreadPoolExecutor(inflight) as pool:
                list(pool.map(lambda w: os.pwrite(fd, view[:w[1]], w[0]), writes))
        os.fsync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
        view.release()


def ways(directory: Path, nbytes: int, buf: mmap.mmap) -> dict[str, Callable[[], float]]:
    """Every way, by name; O_DIRECT ones only where the filesystem takes O_DIRECT."""
    def way(**kw: object) -> Callable[[], float]:
        return lambda: _timed(directory, nbytes, buf, **kw)  # type: ignore[arg-type]

    out = {"buffered 32 MiB + fsync": way(direct=False, step=STEP, inflight=1, behind=False, prealloc=True),
           "buffered 32 MiB + write-behind thread + fsync": way(direct=False, step=STEP, inflight=1, behind=True,
                                                                prealloc=True),
           "buffered 32 MiB into cached pages + write-behind + fsync": way(direct=False, step=STEP, inflight=1,
                                                                          behind=True, prealloc=True, cached=True)}
    if direct_ok(directory):
        out["O_DIRECT 32 MiB x1 + fsync"] = way(direct=True, step=STEP, inflight=1, behind=False, prealloc=True)
        for step, inflight in ((4, 4), (16, 2), (16, 4), (16, 8), (64, 4)):
            out[f"O_DIRECT {step} MiB x{inflight} + fsync"] = way(direct=True, step=step * MB, inflight=inflight,
                                                                behind=False, prealloc=True)
        out["O_DIRECT 16 MiB x4 + fsync, sparse"] = way(direct=True, step=16 * MB, inflight=4, behind=False,
                                                         prealloc=False)
    return out


def direct_ok(directory: Path) -> bool:
    path = directory / f"disk-ceiling-probe-{os.getpid()}"
    try:
        os.close(_open(path, True))
    except OSError:
        return False
    finally:
        path.unlink(missing_ok=True)
    return True


def source_buffer() -> mmap.mmap:
    """Page-aligned (as O_DIRECT needs), random and touched: nothing to skip, no fault while timed."""
    buf = mmap.mmap(-1, 64 * MB)
    for off in range(0, len(buf), 4 * MB):
        buf[off:off + 4 * MB] = os.urandom(4 * MB)
    return buf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default=tempfile.gettempdir())
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    nbytes = args.mb * 1000 * 1000
    buf = source_buffer()
    every = ways(Path(args.dir), nbytes, buf)
    got: dict[str, list[float]] = {k: [] for k in every}
    for _ in range(args.rounds):  # interleaved: each round runs every way once
        for name, fn in every.items():
            got[name].append(fn())
    print(f"{nbytes / 1e9:.2f} GB made durable in a new file under {args.dir} (medians of {args.rounds}; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}):")
    for name, v in sorted(got.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"  {name:58} {statistics.median(v):.3f} s [{min(v):.3f}-{max(v):.3f}] = "
              f"{nbytes / statistics.median(v) / 1e9:.2f} GB/s")
    best = min(got, key=lambda k: statistics.median(got[k]))
    print(f"the disk alone: {statistics.median(got[best]):.3f} s ({best})")
    buf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
