"""The replication planner and plan loading at 10k / 100k / 1M tensors (issue 13, items 3 and 4).

For each size, in a fresh interpreter (so peak RSS belongs to that size alone), on a real safetensors
file of n small F32 tensors in shuffled name order:
  plan_s       index the file (header parse + validation) and build the plan (every tensor hashed);
               plan_cpu_s the same in process CPU seconds (the box may be shared: CPU is the steadier figure)
  write_s      write the plan file atomically
  validate_s   the coordinator's load: every invariant plus the digest
  rank_load_s  a rank's load: the digest and the tables, no re-validation (rank_cpu_s: its CPU seconds)
  peak_rss_mb  the child's peak resident memory (ru_maxrss) over all of the above
Medians of --runs runs. Targets: 1M planned in < 5 s and < 1 GB; 100k in < 0.5 s; 1M loaded < 2 s.
``--reader general`` plans with the stdlib-JSON header reader only (the fast reader switched off),
for a side-by-side comparison in one run.

    .venv/bin/python benchmarks/bench_planner.py [--sizes 10000,100000,1000000] [--runs 3] [--reader auto|general]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_safetensors(path: Path, n: int) -> None:
    """n tensors of 4 x F32, written header-first without torch (a million tensors in about a second)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    for i in range(n):
        k = (i * 7919) % n  # names shuffled against file order: the planner sorts
        header[f"layers.{k:07d}.w"] = {"dtype": "F32", "shape": [4], "data_offsets": [16 * i, 16 * i + 16]}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.write(os.urandom(16 * n))


def one_run(n: int, workdir: Path, reader: str = "auto") -> dict[str, float]:
    from hwtui.engine.replication import plan as P

    if reader == "general":
        from hwtui.engine.replication import st_header

        st_header.regular_header = lambda *a: None

    model = workdir / f"m{n}.safetensors"
    if not model.exists():
        make_safetensors(model, n)
    out = workdir / f"plan{n}"
    t, c = time.perf_counter(), time.process_time()
    plan = P.build_plan_from_files([str(model)], model="bench", version="v1", bucket_bytes=32 << 20)
    t_plan, c_plan = time.perf_counter() - t, time.process_time() - c
    t = time.perf_counter()
    writer = getattr(P, "write_plan", None) or P.write_json_atomic
    writer(out, plan)
    t_write = time.perf_counter() - t
    del plan
    t = time.perf_counter()
    P.load_plan(out)
    t_validate = time.perf_counter() - t
    rank_loader = getattr(P, "load_plan_for_rank", None) or P.load_plan
    t, c = time.perf_counter(), time.process_time()
    rank_loader(out)
    t_rank, c_rank = time.perf_counter() - t, time.process_time() - c
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"plan_s": t_plan, "plan_cpu_s": c_plan, "rank_load_cpu_s": c_rank, "write_s": t_write, "validate_s": t_validate, "rank_load_s": t_rank,
            "peak_rss_mb": rss, "plan_file_mb": out.stat().st_size / 1e6}


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(one_run(int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reader", choices=["auto", "general"], default="auto",
                    help="general: the stdlib-JSON safetensors header reader only (for comparison)")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with tempfile.TemporaryDirectory(prefix="hwtui-bench-planner-") as tmp:
        print(f"{'tensors':>9} {'plan_s':>8} {'plan_cpu_s':>10} {'write_s':>8} {'validate_s':>10} {'rank_load_s':>11} "
              f"{'rank_cpu_s':>10} {'peak_rss_mb':>11} {'plan_file_mb':>12}")
        for n in (int(s) for s in args.sizes.split(",") if s.strip()):
            rows = []
            for _ in range(args.runs):
                r = subprocess.run([sys.executable, __file__, "--child", str(n), tmp, args.reader], capture_output=True, text=True,
                                   env=env, timeout=600)
                if r.returncode != 0:
                    raise SystemExit(f"planner run at {n} tensors failed: {r.stderr[-1500:]}")
                rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
            print(f"{n:>9} {med['plan_s']:>8.3f} {med['plan_cpu_s']:>10.3f} {med['write_s']:>8.3f} "
                  f"{med['validate_s']:>10.3f} {med['rank_load_s']:>11.3f} {med['rank_load_cpu_s']:>10.3f} "
                  f"{med['peak_rss_mb']:>11.0f} {med['plan_file_mb']:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
