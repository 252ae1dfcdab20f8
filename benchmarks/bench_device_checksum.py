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
- where Triton runs, the candidate copy fused with the sums (device_sums_triton.copy_row_col_sums,
  not in the product: it verifies the values read from the source, not a re-read of the copy),
  interleaved with the rest: the kernel alone against the copy, then the Triton sums (two
  kernels); with the digest against "copy, then checksum (the receiver today)"; and per bucket of
  the protocol's shape against the copy, then the digest per bucket. Every round checks the copy
  exact and the fused sums equal to the torch reductions of the copy (and the digests equal to
  theirs); a row that raises or differs is FAIL, and the run goes on;

- the protocol's shape: the same bytes as 16 buckets, a digest per bucket (and a copy, then a
  digest, per bucket), so the fixed cost per bucket shows beside the whole buffer's;
- with ``--variants`` (the default where Triton runs): every kernel configuration of
  device_sums_triton.VARIANTS on the same buffer, rounds interleaved, default first: its sums
  alone, the whole digest and the digest per bucket with it, each variant's sums checked against
  the torch reductions every round and its digests against theirs (FAIL, never a crash, for a
  variant that does not compile, raises or differs), and the winners;

each as ms and GB/s of bucket copied and verified, every digest checked equal (to the torch
reductions' digest) and every copy exact.
Measured on an H200 (round nine): copy 0.52 ms per GiB, then the checksum 0.98 ms in all (1,098
GB/s; 877 with the torch reductions). The copy fused into the checksum slice by slice (a torch
copy, then the reductions, per slice, for the cache), which this once measured too, lost at every
slice size there and is gone; the one-kernel fusion above is a different candidate. On CPU (``--device cpu``) the same
code runs: the figures there say nothing about a GPU, only that the paths agree.

    python3 benchmarks/bench_device_checksum.py [--device cuda] [--mb 1024] [--rounds 7] [--no-variants]
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
    if _triton_runs(device):
        from hwtui.engine.replication.device_sums_triton import row_col_sums

        sums = torch.empty(ROW_WORDS + n // (ROW_WORDS * 4), dtype=torch.int32, device=device)
        out["triton rows+columns (one read)"] = lambda buf: row_col_sums(buf.view(torch.int32).view(-1, ROW_WORDS), sums)
    else:
        print("  triton one-read sums: not measured (no Triton here, or a CPU without TRITON_INTERPRET=1)",
              file=sys.stderr)
    return out


FUSED_KERNEL = "copy fused with the sums (one kernel)"
FUSED_BASE = "copy and the Triton sums, two kernels (no digest)"
FUSED_DIGEST = "copy fused with the sums, then digest"
RECEIVER = "copy, then checksum (the receiver today)"
_POISON = 0x5A5A5A5A  # what the sums' tensors hold before a call: one that writes nothing differs


def _fused_rows(device: str, src: Any, dst: Any, bucket_count: int, want: dict[str, Any]) -> dict[str, Any]:
    """The candidate copy fused with the sums (device_sums_triton.copy_row_col_sums) and what it is
    timed against that run() has not already: name -> (prepare, call, check). ``prepare`` runs
    before the clock (it poisons the sums' tensors), ``call`` is timed, ``check`` returns '' or
    why not: the copy exact and the sums equal to the torch reductions' sums of the copy (not of
    the source: what the receiver holds), the digests equal to the torch reductions' digests."""
    import torch

    from hwtui.engine.replication.device_checksum import ROW_WORDS, sums_digest
    from hwtui.engine.replication.device_sums_triton import copy_row_col_sums, row_col_sums

    n = src.numel()
    if not _triton_runs(device) or n % (ROW_WORDS * 4):
        print("  fused copy and sums: not measured (no Triton here, a CPU without TRITON_INTERPRET=1, or not whole "
              "rows of 16 KiB)", file=sys.stderr)
        return {}

    def words(b: Any) -> Any:
        return b.view(torch.int32).view(-1, ROW_WORDS)

    def torch_sums(m: Any) -> Any:
        return torch.cat([m.sum(0, dtype=torch.int32), m.sum(1, dtype=torch.int32)])

    def same(out: Any, m: Any, what: str) -> str:
        if not torch.equal(out, torch_sums(m)):
            return f"{what}: {int((out != torch_sums(m)).sum())} of {out.numel()} sums differ from the torch reductions'"
        return ""

    def copied() -> str:
        return "" if torch.equal(dst, src) else "the copy is not exact"

    sm, dm = words(src), words(dst)
    src_b, dst_b = _buckets(src, bucket_count), _buckets(dst, bucket_count)
    rows: dict[str, Any] = {}
    out_k = torch.empty(ROW_WORDS + sm.shape[0], dtype=torch.int32, device=device)
    out_b = torch.empty_like(out_k)
    rows[FUSED_KERNEL] = (lambda: out_k.fill_(_POISON), lambda: copy_row_col_sums(sm, dm, out_k),
                          lambda _: copied() or same(out_k, dm, "the fused sums"))

    def copy_then_sums() -> None:
        dst.copy_(src)
        row_col_sums(dm, out_b)

    rows[FUSED_BASE] = (lambda: out_b.fill_(_POISON), copy_then_sums, lambda _: copied() or same(out_b, dm, "the sums"))
    last: dict[str, Any] = {}  # the sums' tensors the last call made (allocated in it, as device_sums does)

    def fused_digest() -> str:
        last["whole"] = out = torch.empty(ROW_WORDS + sm.shape[0], dtype=torch.int32, device=device)
        copy_row_col_sums(sm, dm, out)
        return sums_digest(n, out)

    def check_digest(got: Any) -> str:
        if got != want["whole"]:
            return f"its digest {got} is not the torch reductions' {want['whole']}"
        return copied() or same(last["whole"], dm, "the fused sums")

    rows[FUSED_DIGEST] = (lambda: last.clear(), fused_digest, check_digest)
    if src_b[0].numel() % (ROW_WORDS * 4) == 0:
        shaped = f"{src_b[0].numel() / MB:g} MiB bucket x {bucket_count}"

        def fused_buckets() -> list[str]:
            got = []
            last["buckets"] = []
            for s, d in zip(src_b, dst_b, strict=True):
                out = torch.empty(ROW_WORDS + s.numel() // (ROW_WORDS * 4), dtype=torch.int32, device=device)
                last["buckets"].append(out)
                copy_row_col_sums(words(s), words(d), out)
                got.append(sums_digest(int(s.numel()), out))
            return got

        def check_buckets(got: Any) -> str:
            if got != want["buckets"]:
                return "a bucket's digest is not the torch reductions'"
            for i, (out, d) in enumerate(zip(last["buckets"], dst_b, strict=True)):
                why = same(out, words(d), f"bucket {i}'s fused sums")
                if why:
                    return why
            return copied()

        rows[f"protocol-shaped: copy fused with the sums, then digest per {shaped}"] = (
            lambda: last.clear(), fused_buckets, check_buckets)
    return rows


def _fused_round(device: str, row: Any) -> tuple[float, str]:
    """One timed call of a fused row and its check: (seconds, '' or why it failed; an exception
    included: a kernel that does not compile or launch must not end the unattended run)."""
    prepare, call, check = row
    try:
        prepare()
        dt, got = _timed(device, call)
        return dt, check(got)
    except Exception as exc:  # noqa: BLE001 - one row's failure is printed as FAIL, the others go on
        return 0.0, f"{type(exc).__name__}: {str(exc)[:200]}"


def _triton_runs(device: str) -> bool:
    """Whether the Triton kernel can run on ``device`` here: a GPU with Triton, or CPU tensors under
    Triton's interpreter (TRITON_INTERPRET=1: slow, for checking this benchmark's code only)."""
    from hwtui.engine.replication.device_sums_triton import available

    return available() and (device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def _torch_digest(buf: Any) -> str:
    """The digest by the two torch reductions: the reference every other way is checked against."""
    from hwtui.engine.replication.device_checksum import device_digest

    os.environ["HWTUI_DEVICE_CHECKSUM"] = "torch"
    try:
        return device_digest(buf)
    finally:
        del os.environ["HWTUI_DEVICE_CHECKSUM"]


def _buckets(buf: Any, count: int) -> list[Any]:
    """``buf`` cut into ``count`` consecutive views, as the IPC protocol moves a model in buckets."""
    size = buf.numel() // count
    return [buf[i * size: (i + 1) * size] for i in range(count)]


def _methods(device: str, src: Any, dst: Any, bucket_count: int) -> dict[str, Any]:
    """Name -> a call returning the digest(s) it computed (None for a copy alone)."""
    from hwtui.engine.replication.device_checksum import device_digest

    src_b, dst_b = _buckets(src, bucket_count), _buckets(dst, bucket_count)
    size_mb = src_b[0].numel() / MB
    shaped = f"{size_mb:g} MiB bucket x {bucket_count}"

    def per_bucket(copy: bool) -> list[str]:
        out = []
        for s, d in zip(src_b, dst_b, strict=True):
            if copy:
                d.copy_(s)
            out.append(device_digest(d if copy else s))
        return out

    return {
        "copy alone": lambda: (dst.copy_(src), None)[1],
        "checksum alone": lambda: device_digest(src),
        "checksum alone, torch reductions": lambda: _torch_digest(src),
        "copy, then checksum (the receiver today)": lambda: (dst.copy_(src), device_digest(dst))[1],
        "copy, then checksum, torch reductions": lambda: (dst.copy_(src), _torch_digest(dst))[1],
        f"protocol-shaped: digest per {shaped}": lambda: per_bucket(False),
        f"protocol-shaped: copy, then digest per {shaped}": lambda: per_bucket(True),
    }


def run(device: str, mb: int, rounds: int, variants: bool = False) -> dict[str, Any]:
    import torch

    n = mb * MB
    g = torch.Generator(device=device).manual_seed(23)
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=device, generator=g)
    dst = torch.zeros(n, dtype=torch.uint8, device=device)
    bucket_count = 16
    want: dict[str, Any] = {"whole": _torch_digest(src), "buckets": [_torch_digest(b) for b in _buckets(src, bucket_count)]}
    methods = _methods(device, src, dst, bucket_count)
    candidates = _one_pass_candidates(device, n)
    methods.update({name: (lambda fn=fn: (fn(src), None)[1]) for name, fn in candidates.items()})
    try:
        fused = _fused_rows(device, src, dst, bucket_count, want)
    except Exception as exc:  # noqa: BLE001 - the candidate's set-up must not end the run either
        fused, fused_failed = {}, {"(fused rows)": f"{type(exc).__name__}: {str(exc)[:200]}"}
    else:
        fused_failed = {}
    # Interleaved: the fused rows right after the receiver's way, every round.
    order = list(methods)
    at = order.index(RECEIVER) + 1 if RECEIVER in order else len(order)
    order[at:at] = list(fused)
    for name in order:  # warm: kernels loaded (the fused one compiled), allocator primed
        if name in fused:
            dst.zero_()
            _, why = _fused_round(device, fused[name])
            if why:
                fused_failed[name] = why
        else:
            methods[name]()
    times: dict[str, list[float]] = {k: [] for k in order}
    exact = True
    for _ in range(rounds):
        for name in order:
            if name in fused_failed:
                continue
            dst.zero_()
            if name in fused:
                dt, why = _fused_round(device, fused[name])
                if why:
                    fused_failed[name] = why
                else:
                    times[name].append(dt)
                continue
            fn = methods[name]
            dt, digest = _timed(device, fn)
            times[name].append(dt)
            if digest is not None:
                exact &= digest == (want["buckets"] if isinstance(digest, list) else want["whole"])
            if name.startswith("copy") or "copy," in name:
                exact &= bool(torch.equal(dst, src))
    med = {k: statistics.median(v) for k, v in times.items() if v and k not in fused_failed}
    rows = {k: {"ms": round(v * 1e3, 4), "gbps": round(n / v / 1e9, 1)} for k, v in med.items()}
    verified = {k: v for k, v in med.items() if k.startswith("copy,")}
    best = min(verified, key=lambda k: verified[k])
    res = {"device": device, "bytes": n, "rounds": rounds, "methods": rows, "exact": exact, "best_verified": best,
           "best_verified_gbps": rows[best]["gbps"]}
    if fused or fused_failed:
        res["fused"] = {"rows": [k for k in fused if k in rows], "failed": fused_failed}
    if variants:
        res["variants"] = run_variants(device, src, rounds, want, bucket_count)
    return res


def _variant_calls(src: Any, cfg: Any, out: Any, bucket_count: int) -> dict[str, Any]:
    """The three timings of one kernel configuration: its sums alone (the kernel and what finishes
    it, into one preallocated tensor), the digest of the whole buffer with it, and the digest per
    bucket of the protocol's shape with it."""
    import torch

    from hwtui.engine.replication.device_checksum import ROW_WORDS, device_digest
    from hwtui.engine.replication.device_sums_triton import row_col_sums

    m = src.view(torch.int32).view(-1, ROW_WORDS)
    parts = _buckets(src, bucket_count)
    return {"sums": lambda: row_col_sums(m, out, cfg), "digest": lambda: device_digest(src, config=cfg),
            "buckets": lambda: [device_digest(b, config=cfg) for b in parts]}


def run_variants(device: str, src: Any, rounds: int, want: dict[str, Any], bucket_count: int) -> dict[str, Any]:
    """Every device_sums_triton.VARIANTS configuration on the same buffer, rounds interleaved (each
    round runs every variant once, the default first), medians; each checked against the torch
    reductions every round. A variant that does not compile, raises or differs is FAIL, and the
    others go on."""
    import torch

    from hwtui.engine.replication import device_checksum
    from hwtui.engine.replication.device_checksum import ROW_WORDS
    from hwtui.engine.replication.device_sums_triton import VARIANTS

    if src.numel() % (ROW_WORDS * 4):
        return {"skipped": "the buffer is not whole rows of 16 KiB"}
    m = src.view(torch.int32).view(-1, ROW_WORDS)
    ref = torch.cat([m.sum(0, dtype=torch.int32), m.sum(1, dtype=torch.int32)])
    calls: dict[str, dict[str, Any]] = {}
    outs: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name, cfg in VARIANTS.items():
        outs[name] = torch.full_like(ref, 0x5A5A5A5A)  # not zeros: a variant that writes nothing fails
        calls[name] = _variant_calls(src, cfg, outs[name], bucket_count)
        why = _check_variant(device, calls[name], outs[name], ref, want)
        if why:
            failed[name] = why
    times: dict[str, dict[str, list[float]]] = {k: {"sums": [], "digest": [], "buckets": []} for k in calls}
    for _ in range(rounds):
        for name, parts in calls.items():
            if name in failed:
                continue
            try:
                outs[name].fill_(0x5A5A5A5A)  # what the check below sees is this round's sums
                for what, fn in parts.items():
                    dt, _ = _timed(device, fn)
                    times[name][what].append(dt)
                why = _check_variant(device, {}, outs[name], ref, want)  # the last sums: still the reductions'
            except Exception as exc:  # noqa: BLE001 - one variant's failure must not end the run
                why = f"{type(exc).__name__}: {str(exc)[:160]}"
            if why:
                failed[name] = why
    if device_checksum._ONE_READ_BROKEN:  # device_digest fell back to the torch reductions: the figures lie
        failed.setdefault("(device_digest)", f"the Triton path broke: {device_checksum._ONE_READ_BROKEN[0]}")
    n = src.numel()
    table = {name: {what: {"ms": round(statistics.median(v) * 1e3, 4), "gbps": round(n / statistics.median(v) / 1e9, 1)}
                    for what, v in t.items()} for name, t in times.items() if name not in failed and t["sums"]}
    winner = min(table, key=lambda k: table[k]["digest"]["ms"]) if table else None
    per_bucket = min(table, key=lambda k: table[k]["buckets"]["ms"]) if table else None
    return {"table": table, "failed": failed, "winner": winner, "winner_per_bucket": per_bucket}


def _check_variant(device: str, calls: dict[str, Any], out: Any, ref: Any, want: dict[str, Any]) -> str:
    """'' if the variant's calls (run once here; none: only ``out`` looked at) gave the torch
    reductions' sums and the reference digests, else why not (an exception included)."""
    import torch

    from hwtui.engine.replication import device_checksum

    broken = len(device_checksum._ONE_READ_BROKEN)
    try:
        for what, fn in calls.items():
            got = fn()
            if len(device_checksum._ONE_READ_BROKEN) > broken:  # device_digest caught this variant failing
                why = device_checksum._ONE_READ_BROKEN[broken]
                del device_checksum._ONE_READ_BROKEN[broken:]  # the other variants still use the kernel
                return f"device_digest fell back to the torch reductions: {why}"
            if what == "digest" and got != want["whole"]:
                return f"its digest {got} is not the torch reductions' {want['whole']}"
            if what == "buckets" and got != want["buckets"]:
                return "a bucket's digest is not the torch reductions'"
        _sync(device)
        if not torch.equal(out, ref):
            bad = int((out != ref).sum())
            return f"{bad} of {ref.numel()} sums differ from the torch reductions'"
    except Exception as exc:  # noqa: BLE001 - a variant that does not compile or launch: FAIL, and go on
        return f"{type(exc).__name__}: {str(exc)[:160]}"
    return ""


def _print_variants(v: dict[str, Any], n: int) -> None:
    if "skipped" in v:
        print(f"kernel variants: skipped ({v['skipped']})")
        return
    print(f"Triton kernel variants (device_sums_triton.VARIANTS), the same {n / MB:g} MiB, rounds interleaved, "
          f"every sum checked against the torch reductions every round:")
    for name, row in v["table"].items():
        print(f"  {name:<30} sums {row['sums']['ms']:8.3f} ms {row['sums']['gbps']:8.1f} GB/s | digest "
              f"{row['digest']['ms']:8.3f} ms {row['digest']['gbps']:8.1f} GB/s | digest per bucket x16 "
              f"{row['buckets']['ms']:8.3f} ms ({row['buckets']['ms'] / 16:.4f} ms each)  ok")
    for name, why in v["failed"].items():
        print(f"  {name:<30} FAIL: {why}")
    if not v["winner"]:
        print("kernel variant winner: none (every variant failed)")
        return
    t, d = v["table"], v["table"].get("default")
    w, wb = v["winner"], v["winner_per_bucket"]
    base = f"default {d['digest']['ms']:.3f} ms" if d else "the default FAILED"
    print(f"kernel variant winner, whole-buffer digest: {w}: {t[w]['digest']['ms']:.3f} ms ({base}); its sums "
          f"{t[w]['sums']['ms']:.3f} ms = {t[w]['sums']['gbps']:.1f} GB/s read")
    base = f"default {d['buckets']['ms'] / 16:.4f} ms" if d else "the default FAILED"
    print(f"kernel variant winner, digest per bucket x16: {wb}: {t[wb]['buckets']['ms'] / 16:.4f} ms each ({base})")


def _print_fused(res: dict[str, Any]) -> None:
    """The candidate beside what it would replace (rows of the table above, the same rounds)."""
    m, f = res["methods"], res["fused"]
    print("copy fused with the sums (device_sums_triton.copy_row_col_sums; a candidate, not in the product: it "
          "verifies the values read from the source, not a re-read of the copy); copy exact and sums equal to the "
          "torch reductions' of the copy every round:")
    shaped = next((k for k in m if k.startswith("protocol-shaped: copy, then digest per")), None)
    pairs: list[tuple[str, str | None]] = [(FUSED_KERNEL, FUSED_BASE), (FUSED_DIGEST, RECEIVER)]
    pairs += [(k, shaped) for k in f["rows"] if k.startswith("protocol-shaped:")]
    for new, old in pairs:
        if new in f["failed"]:
            continue
        if new not in m or old not in m:
            print(f"  {new}: no figure (its baseline {old!r} has none)")
            continue
        a, b = m[new]["ms"], m[old]["ms"]
        print(f"  {new:<58} {a:9.3f} ms {m[new]['gbps']:9.1f} GB/s  against {old}: {b:.3f} ms "
              f"({b - a:+.3f} ms saved, x{b / a:.2f})" if a else f"  {new}: 0 ms?")
    for name, why in f["failed"].items():
        print(f"  {name:<58} FAIL: {why}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--variants", action=argparse.BooleanOptionalAction, default=None,
                    help="time device_sums_triton's kernel variants (default: where Triton runs)")
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
    variants = _triton_runs(args.device) if args.variants is None else args.variants
    if variants and not _triton_runs(args.device):
        print("bench_device_checksum: --variants needs Triton (on CPU, under TRITON_INTERPRET=1); not measured",
              file=sys.stderr)
        variants = False
    res = run(args.device, args.mb, args.rounds, variants)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"{args.mb} MiB on {name}, medians of {args.rounds} interleaved rounds; every digest equal and every copy "
          f"exact: {res['exact']}")
    for k, row in res["methods"].items():
        print(f"  {k:<58} {row['ms']:9.3f} ms  {row['gbps']:9.1f} GB/s")
    print(f"copied and verified, best way: {res['best_verified']}: {res['best_verified_gbps']:.1f} GB/s "
          f"(issue 23: >= 1000 GB/s for 1 GiB on one GPU)")
    if "fused" in res:
        _print_fused(res)
    if "variants" in res:
        _print_variants(res["variants"], res["bytes"])
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0 if res["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
