"""The IPC receiver's copy and device checksum (issue 23.2): is 1 GiB copied *and verified* at
>= 1,000 GB/s on one GPU, and which way gets there.

An IPC receiver copies a bucket device to device out of the source's exported slot, then checks
the device checksum of its copy (engine.replication.device_checksum). This prints, rounds
interleaved, medians:

- the copy alone (the IPC copy's memory traffic: a same-process device-to-device copy);
- the checksum alone, as the receiver takes it (one Triton kernel where Triton imports) and with
  the two torch reductions;
- copy, then checksum, both ways;
- checksums that read the bucket once, for the record (row sums alone, column sums alone, the
  Triton sums alone);

each as ms and GB/s of bucket copied and verified, every digest checked equal and every copy exact.
Measured on an H200 (round nine): copy 0.52 ms per GiB, then the checksum 0.98 ms in all (1,098
GB/s; 877 with the torch reductions). The copy fused into the checksum slice by slice, which this
once measured too, lost at every slice size there and is gone. On CPU (``--device cpu``) the same
code runs: the figures there say nothing about a GPU, only that the paths agree.

    python3 benchmarks/bench_device_checksum.py [--device cuda] [--mb 1024] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MB = 1 << 20


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _timed(device: str, fn: Any) -> tuple[float, Any]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def _one_pass_candidates(device: str, n: int) -> dict[str, Any]:
    """Checksums that read the bucket once, for the record beside the two-pass digest: the row sums
    alone (they see any changed byte, not two words swapped in a row), the column sums alone, and
    both from one Triton kernel (engine.replication.device_sums_triton, which device_digest uses on
    a GPU where Triton imports). Measured and dropped (H200, round nine): int8 tensor-core products with fixed
    weights (torch._int_mm), 0.59-0.65 ms per GiB column-major and 2.4 ms row-major, slower than
    either torch reduction alone."""
    import torch

    from hwtui.engine.replication.device_checksum import ROW_WORDS

    out: dict[str, Any] = {}
    if n % (ROW_WORDS * 4):
        return out

    def rows_only(buf: Any) -> Any:
        return buf.view(torch.int32).view(-1, ROW_WORDS).sum(1, dtype=torch.int32).cpu()

    def cols_only(buf: Any) -> Any:
        return buf.view(torch.int32).view(-1, ROW_WORDS).sum(0, dtype=torch.int32).cpu()

    out["rows only (one pass)"] = rows_only
    out["columns only (one pass)"] = cols_only
    from hwtui.engine.replication.device_sums_triton import available, row_col_sums

    if available():
        out["triton rows+columns (one read)"] = lambda buf: row_col_sums(buf.view(torch.int32).view(-1, ROW_WORDS))
    else:
        print("  triton one-read sums: not measured (Triton is not installed)", file=sys.stderr)
    return out


def run(device: str, mb: int, rounds: int) -> dict[str, Any]:
    import torch

    from hwtui.engine.replication.device_checksum import device_digest

    n = mb * MB
    g = torch.Generator(device=device).manual_seed(23)
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=device, generator=g)
    dst = torch.zeros(n, dtype=torch.uint8, device=device)
    want = device_digest(src)
    def torch_reductions(buf: Any) -> str:  # the two-reduction digest, where Triton would be used
        os.environ["HWTUI_DEVICE_CHECKSUM"] = "torch"
        try:
            return device_digest(buf)
        finally:
            del os.environ["HWTUI_DEVICE_CHECKSUM"]

    methods: dict[str, Any] = {
        "copy alone": lambda: (dst.copy_(src), None)[1],
        "checksum alone": lambda: device_digest(src),
        "checksum alone, torch reductions": lambda: torch_reductions(src),
        "copy, then checksum (the receiver today)": lambda: (dst.copy_(src), device_digest(dst))[1],
        "copy, then checksum, torch reductions": lambda: (dst.copy_(src), torch_reductions(dst))[1],
    }
    candidates = _one_pass_candidates(device, n)
    one_pass = {name: (lambda fn=fn: (fn(src), None)[1]) for name, fn in candidates.items()}
    methods.update(one_pass)
    for fn in methods.values():  # warm: kernels loaded, allocator primed
        fn()
    times: dict[str, list[float]] = {k: [] for k in methods}
    exact = True
    for _ in range(rounds):
        for name, fn in methods.items():
            dst.zero_()
            dt, digest = _timed(device, fn)
            times[name].append(dt)
            if digest is not None:
                exact &= digest == want
            if name.startswith("copy"):
                exact &= bool(torch.equal(dst, src))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = {k: {"ms": round(v * 1e3, 4), "gbps": round(n / v / 1e9, 1)} for k, v in med.items()}
    verified = {k: v for k, v in med.items() if k.startswith("copy,")}
    best = min(verified, key=lambda k: verified[k])
    return {"device": device, "bytes": n, "rounds": rounds, "methods": rows, "exact": exact, "best_verified": best,
            "best_verified_gbps": rows[best]["gbps"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_device_checksum: no CUDA device here; --device cpu runs the same paths; nothing measured",
              file=sys.stderr)
        return 0
    if args.mb < 1 or args.rounds < 1:
        print("bench_device_checksum: --mb and --rounds must be at least 1", file=sys.stderr)
        return 2
    res = run(args.device, args.mb, args.rounds)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"{args.mb} MiB on {name}, medians of {args.rounds} interleaved rounds; every digest equal and every copy "
          f"exact: {res['exact']}")
    for k, row in res["methods"].items():
        print(f"  {k:<48} {row['ms']:9.3f} ms  {row['gbps']:9.1f} GB/s")
    print(f"copied and verified, best way: {res['best_verified']}: {res['best_verified_gbps']:.1f} GB/s "
          f"(issue 23: >= 1000 GB/s for 1 GiB on one GPU)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0 if res["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
