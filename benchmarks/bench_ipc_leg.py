"""The IPC leg alone (issue 23.2): how fast a receiver copies and verifies buckets a source on the
same GPU has already exported, with nothing else on the GPU.

In a replicate the receiver's copy runs while the source reads the next bucket from its file onto
the same GPU, and two processes on one GPU share it by time slices: the live test
(tests/gpu/test_ipc_live.py) measured the receiver's copy of 64 MiB buckets at 139 GB/s there,
where a device-to-device copy alone runs at ~2,000 GB/s. This separates the two: the source fills
``--buckets`` slots of the window once, then for each round publishes all of them and the
receiver, once every export of the round is there, times its receive of each (open on a slot's
first use only, the copy, the device checksum, the ack). Rounds after the first reuse the
mappings, as a resident receiver does, and alternate between the two ways a receiver can take
them: ``receive`` (each bucket synced on: its digest back before the next export is taken) and
``submit``/``settle`` (each bucket's copy, sums and their transfer queued, up to window ahead
of their acks: what the replicate rank does where a bucket has its own place). Printed: medians
over rounds of the receiver's wall per round and its copy and verify shares, in GB/s of bucket
copied and verified, for each bucket count and each way. On a GPU the receiver does not sync between the copy and the checksum: copy is the
open (host) plus the copy's device time, verify the sums' device time (CUDA events), and "rest"
the wall outside both (the sums' one transfer to the host, the hash, the ack, the store, Python);
on CPU both are host time and the rest is the ack and the store.

With each synced round, the host clock between the receiver's phases (a hook at each: the export
taken and its mapping found, the copy launched, the sums launched + the device waited for + the
digest + the ack), and the copy out of the mapping timed after the GPU idles 0, 2 and 20 ms.
Round seventeen (H200): one 1 GiB bucket spends 0.28-0.44 ms of host work before its copy starts
and ~0.33 ms after the device is done, around ~0.80 ms of device work. ``--trace`` times the steps
inside that host work (the export's pop and decode, the mapping, the clock, the sums' launch and
transfer, the wait + digest + ack, the ack's push) per bucket, for the next step: which of them a
batched or native receiver must remove.

    python3 benchmarks/bench_ipc_leg.py [--mb 1024] [--buckets 1,4,16] [--rounds 7] [--profile] [--trace]

``--device cpu`` runs the same protocol on the memfd stand-in (what this says about a GPU: nothing).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MB = 1 << 20


def _provider(device: str, run: str) -> Any:
    from hwtui.engine.replication.ipc_provider import CudaIpc, HostStandIn

    return CudaIpc(0) if device == "cuda" else HostStandIn(run)


def _store(port: int, master: bool) -> Any:
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=master, timeout=datetime.timedelta(seconds=120),
                         wait_for_workers=False)


def _run_id(run: str, k: int) -> str:
    return f"{run}{k:02x}"  # one channel (and memfd name) per run


def source(port: int, run: str, device: str, nbytes: int, buckets: int, rounds: int, runs: int, out: Path) -> None:
    """``runs`` whole source lifetimes in one process, as a resident rank serves push after push:
    after each, what torch's allocator still holds (a run's window must not stay behind)."""
    import torch

    from hwtui.engine.replication.ipc_protocol import Channel, IpcSource

    store = _store(port, master=True)
    size = nbytes // buckets
    g = torch.Generator(device=device).manual_seed(7)
    held = []
    buf: Any = None
    for k in range(runs):
        ch = Channel(store, _run_id(run, k), 120.0)
        provider = _provider(device, _run_id(run, k))
        src = IpcSource(ch, provider, [1], window=buckets, capacity=size)
        try:
            for r in range(rounds):
                for i in range(buckets):
                    b = r * buckets + i
                    buf = src.acquire(b, size)  # round r > 0: waits for the receiver's ack of round r - 1
                    if r == 0:
                        buf.copy_(torch.randint(0, 256, (size,), dtype=torch.uint8, device=device, generator=g))
                    src.publish(b, size)
            src.drain()
            ch.take("done", "the receiver's end")
        finally:
            src.close()
        buf = None  # the last slot view: the run holds nothing once it is over
        if device == "cuda":
            torch.cuda.synchronize()
            # shares: torch IPC shares the run made (one per slot: CudaIpc.handle), not one per export
            entry = {"allocated_bytes": torch.cuda.memory_allocated(), "reserved_bytes": torch.cuda.memory_reserved(),
                     "shares": provider.shares}
            # Who holds what is left: CUDA tensors Python still reaches, then the allocator after a
            # collection and torch's IPC limbo sweep (what only the producer's limbo kept).
            import gc

            live = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
            entry["python_cuda_tensors"] = [[list(t.shape), int(t.untyped_storage().nbytes())] for t in live][:20]
            gc.collect()
            torch.cuda.ipc_collect()
            entry["allocated_after_gc_and_ipc_collect"] = torch.cuda.memory_allocated()
            entry["active_blocks_mib"] = sorted((b["active_size"] >> 20 for b in torch.cuda.memory_snapshot()
                                                 if b.get("active_size")), reverse=True)[:20]
            held.append(entry)
    out.write_text(json.dumps(held))


# What --trace times inside the receiver: (the module or class that holds it, its name). Each call
# adds its host time to its name's total; _settle_oldest includes the wait for the device, the
# digest and the ack, _ack the ack's encoding and its push (Ack.encode, Channel.push). On a 2-core
# box a push measured 0.2-0.8 ms here against 3 us alone: the source it wakes takes the receiver's
# core; what a 16-core GPU host shows is what counts.
TRACED = (("ipc_protocol.Channel", "pop"), ("ipc_protocol", "decode_export"), ("ipc_protocol.IpcReceiver", "_open"),
          ("ipc_protocol._Clock", "__init__"), ("ipc_protocol", "device_sums"),
          ("ipc_protocol", "_to_host"), ("ipc_protocol.IpcReceiver", "_settle_oldest"),
          ("ipc_protocol", "sums_digest"), ("ipc_protocol.IpcReceiver", "_ack"), ("ipc_protocol.Channel", "push"),
          ("ipc_protocol.Ack", "encode"))


def _trace(acc: dict[str, list[float]]) -> None:
    """Wrap every TRACED function so that its calls add their host time to ``acc`` [seconds, calls]."""
    from hwtui.engine.replication import ipc_protocol

    for owner_path, name in TRACED:
        owner: Any = ipc_protocol
        for part in owner_path.split(".")[1:]:
            owner = getattr(owner, part)
        if not hasattr(owner, name):
            continue  # a name this version of the protocol does not have

        def wrap(fn: Any, key: str) -> Any:
            @functools.wraps(fn)
            def timed(*a: Any, **kw: Any) -> Any:
                t = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    rec = acc.setdefault(key, [0.0, 0])
                    rec[0] += time.perf_counter() - t
                    rec[1] += 1
            return timed

        setattr(owner, name, wrap(getattr(owner, name), name))


def receiver(port: int, run: str, device: str, nbytes: int, buckets: int, rounds: int, runs: int, out: Path,
             profile: bool, trace: bool = False) -> None:
    import torch

    from hwtui.engine.replication.device_checksum import warm

    store = _store(port, master=False)
    size = nbytes // buckets
    dsts = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(buckets)]
    warm(device)  # the checksum's kernels loaded before any clock
    rows: list[dict[str, float]] = []
    opens = 0
    copies: dict[str, Any] = {}
    traced: dict[str, list[float]] = {}
    if trace:
        _trace(traced)
    prof = None
    if profile:  # where the receiver's host time goes, per function (cProfile slows what it sees)
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    for k in range(runs):
        opens += _receive_run(store, _run_id(run, k), device, size, buckets, rounds, dsts, rows if k == 0 else [],
                              copies if k == 0 else None, traced if k == 0 else None)
    if prof is not None:
        import io
        import pstats

        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        print(f"receiver profile, {buckets} bucket(s), {rounds} rounds x {runs} run(s), by own time:\n"
              + "\n".join(text.getvalue().splitlines()[:45]), file=sys.stderr)
    out.write_text(json.dumps({"rows": rows, "opens": opens, "copies": copies, "trace": traced}))


def _host_split(t0: float, marks: list[tuple[str, float]], wall: float) -> dict[str, float]:
    """A synced round's host clock between the receiver's phases, summed over its buckets: "to_open"
    (the export taken, checked and its mapping found), "open_to_copied" (the copy launched),
    "copied_to_acked" (the sums launched, the device waited for, the digest, the ack sent) and
    "after_ack" (back to the caller). Overlapped rounds interleave buckets: only the total."""
    out = {"to_open": 0.0, "open_to_copied": 0.0, "copied_to_acked": 0.0, "after_ack": 0.0}
    last, prev = t0, "start"
    for phase, t in marks:
        key = {("start", "opened"): "to_open", ("acked", "opened"): "to_open", ("opened", "copied"): "open_to_copied",
               ("copied", "acked"): "copied_to_acked"}.get((prev, phase))
        if key is None:
            return {}
        out[key] += t - last
        last, prev = t, phase
    out["after_ack"] = t0 + wall - last
    return out


def _event_ms(work: Any) -> float:
    """``work()``'s device time in ms, between two CUDA events on the current stream, waited for."""
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    work()
    b.record()
    b.synchronize()
    return float(a.elapsed_time(b))


def _time_after(src: Any, dst: Any, other: Any, reps: int = 5) -> dict[str, Any]:
    """Why the receiver's copy of a mapping takes ~0.9 ms in a round where the same copy repeated
    takes ~0.52 (H200, round seventeen): the copy timed (device time, CUDA events) right after the
    GPU idled 0 / 2 / 20 ms (its clocks), and right after a copy of another 1 GiB of this process
    (its TLBs and caches); the first of each and the median."""
    import torch

    def timed(before: Any) -> float:
        before()
        return _event_ms(lambda: dst.copy_(src))

    def idle(ms: float) -> Any:
        return lambda: (torch.cuda.synchronize(), time.sleep(ms / 1e3))

    def evict() -> None:
        other[1].copy_(other[0])
        torch.cuda.synchronize()

    out: dict[str, Any] = {}
    for name, before in (("back to back", lambda: None), ("after 2 ms idle", idle(2)), ("after 20 ms idle", idle(20)),
                         ("after another 1 GiB copy", evict)):
        times = [timed(before) for _ in range(reps)]
        out[name] = {"first_ms": round(times[0], 4), "median_ms": round(statistics.median(times), 4)}
    return out


def _time_copies(src: Any, dst: Any, reps: int = 7) -> dict[str, Any]:
    """Ways to copy one IPC-mapped source buffer into this process's ``dst``, timed by CUDA events
    (medians of ``reps``), each checked exact, beside the same copies of a buffer of this process.

    Why (round sixteen, H200): the receiver's copy of a 1 GiB mapping took 0.815 ms where a copy
    inside one process took 0.524 ms; the hypothesis was the driver's copy engines. Measured in
    round seventeen: no, a copy out of the mapping runs as fast as a local one (0.52-0.53 ms) and a
    kernel is no faster. The receiver's "copy" includes the host's launch after its start event
    (0.16-0.21 ms for the first bucket of a round): the host clock split says so."""
    import torch

    from hwtui.engine.replication import device_sums_triton
    from hwtui.engine.replication.device_checksum import ROW_WORDS

    n = int(dst.numel())
    local = torch.empty_like(src[:n])
    local.copy_(src[:n])
    ways: dict[str, Any] = {"driver copy (copy_)": lambda s, d: d.copy_(s)}
    if n % 8 == 0:  # a kernel over int64 words: bitwise_or with 0 is the identity
        ways["kernel copy (int64 words)"] = lambda s, d: torch.bitwise_or(s.view(torch.int64), 0, out=d.view(torch.int64))
    rows = n // (ROW_WORDS * 4)
    if device_sums_triton.available() and rows and n == rows * ROW_WORDS * 4:
        sums = torch.empty(ROW_WORDS + rows, dtype=torch.int32, device=dst.device)
        ways["fused copy and sums (Triton)"] = lambda s, d: device_sums_triton.copy_row_col_sums(
            s.view(torch.int32).view(rows, ROW_WORDS), d.view(torch.int32).view(rows, ROW_WORDS), sums)
    out: dict[str, Any] = {"bytes": n}
    for origin, source_buf in (("mapped", src[:n]), ("local", local)):
        for name, way in ways.items():
            dst.zero_()
            times = [_event_ms(functools.partial(way, source_buf, dst)) for _ in range(reps)]
            ms = statistics.median(times[1:])
            out[f"{origin}: {name}"] = {"ms": round(ms, 4), "gbps": round(n / (ms / 1e3) / 1e9, 1),
                                        "exact": bool(torch.equal(dst, source_buf))}
    return out


def _receive_run(store: Any, run: str, device: str, size: int, buckets: int, rounds: int, dsts: list[Any],
                 rows: list[dict[str, Any]], copies: dict[str, Any] | None, traced: dict[str, list[float]] | None) -> int:
    from hwtui.engine.replication.ipc_protocol import Channel, IpcReceiver, exports_to

    ch = Channel(store, run, 120.0)
    marks: list[tuple[str, float]] = []  # (phase, host clock) of every bucket of the round, in order
    rx = IpcReceiver(ch, _provider(device, run), 1, window=buckets,
                     hook=lambda phase, b, dst: marks.append((phase, time.perf_counter())))
    try:
        for r in range(rounds):
            deadline = time.monotonic() + 120
            while ch.backlog(exports_to(1)) < buckets:  # the whole round exported
                if time.monotonic() > deadline:
                    raise TimeoutError("the source did not export a round in 120 s")
                time.sleep(0.001)
            overlap = r % 2 == 1  # interleaved: each bucket synced on (receive), or overlapped (submit)
            marks.clear()
            if r == 1 and traced is not None:
                traced.clear()  # warm rounds only: the first opens the mappings and launches everything once
            t0 = time.perf_counter()
            if overlap:
                got = [x for i in range(buckets) for x in rx.submit(r * buckets + i, dsts[i])]
                got += rx.settle(block=True)
            else:
                got = [rx.receive(r * buckets + i, dsts[i]) for i in range(buckets)]
            wall = time.perf_counter() - t0
            if len(got) != buckets or not all(x.ok for x in got):
                raise RuntimeError(f"a bucket failed its check: {[x.error for x in got if not x.ok]}")
            rows.append({"wall": wall, "copy": sum(x.copy_s for x in got), "verify": sum(x.verify_s for x in got),
                         "overlap": overlap, **_host_split(t0, marks, wall)})
        if copies is not None and device == "cuda":  # the mappings are still open: how fast a copy out of one is
            copies.update(_time_copies(rx.mapped()[0], dsts[0]))
            import torch

            other = [torch.empty(1 << 30, dtype=torch.uint8, device=device) for _ in range(2)]
            copies["after"] = _time_after(rx.mapped()[0][: dsts[0].numel()], dsts[0], other)
            del other
        ch.put("done", b"1")
    finally:
        rx.close()
    return int(rx.opens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--buckets", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=1, help="whole source lifetimes per bucket count (the allocator after each)")
    ap.add_argument("--profile", action="store_true", help="print where the receiver's host time goes (cProfile)")
    ap.add_argument("--trace", action="store_true",
                    help="time the receiver's protocol steps (host clock, warm rounds), per bucket: lighter than --profile")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--role", choices=("source", "receiver"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.buckets.split(",") if x.strip()]
    except ValueError:
        print(f"bench_ipc_leg: --buckets takes counts like 1,4,16, not {args.buckets[:40]!r}", file=sys.stderr)
        return 2
    if args.mb < 1 or args.rounds < 3 or args.runs < 1 or not counts or min(counts) < 1:
        print("bench_ipc_leg: --mb, --runs and every bucket count must be at least 1, --rounds at least 3", file=sys.stderr)
        return 2
    if args.mb * MB // max(counts) < 4096:  # a bucket of 0 bytes waits out the receiver's 120 s
        print(f"bench_ipc_leg: {max(counts)} buckets of {args.mb} MiB are under 4 KiB each; use fewer", file=sys.stderr)
        return 2
    nbytes = args.mb * MB
    if args.role == "source":
        source(args.port, args.run, args.device, nbytes, counts[0], args.rounds, args.runs, Path(args.out))
        return 0
    if args.role == "receiver":
        receiver(args.port, args.run, args.device, nbytes, counts[0], args.rounds, args.runs, Path(args.out),
                 args.profile, args.trace)
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_ipc_leg: no CUDA device here; --device cpu runs the same protocol; nothing measured", file=sys.stderr)
        return 0
    results: dict[str, Any] = {"device": args.device, "bytes": nbytes, "rounds": args.rounds, "by_buckets": {}}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    from hwtui.engine.resident.resident import free_port

    for n in counts:
        port, run = free_port("127.0.0.1"), secrets.token_hex(8)
        out = Path(f"/tmp/bench_ipc_leg.{os.getpid()}.{n}.json")
        common = [sys.executable, __file__, "--device", args.device, "--mb", str(args.mb), "--buckets", str(n),
                  "--rounds", str(args.rounds), "--runs", str(args.runs), "--port", str(port), "--run", run,
                  *(["--profile"] if args.profile else []), *(["--trace"] if args.trace else [])]
        held = out.with_suffix(".source.json")
        src = subprocess.Popen([*common, "--role", "source", "--out", str(held)], env=env)
        rx = subprocess.Popen([*common, "--role", "receiver", "--out", str(out)], env=env)
        try:
            codes = (rx.wait(timeout=300), src.wait(timeout=60))
        except subprocess.TimeoutExpired:
            src.kill()
            rx.kill()
            print(f"bench_ipc_leg: {n} bucket(s) did not finish in 300 s", file=sys.stderr)
            return 1
        if codes != (0, 0):
            print(f"bench_ipc_leg: {n} bucket(s): receiver exit {codes[0]}, source exit {codes[1]}", file=sys.stderr)
            return 1
        doc = json.loads(out.read_text())
        source_held = json.loads(held.read_text())
        out.unlink()
        held.unlink()
        warm = doc["rows"][1:]  # the first round opens each slot's mapping
        by_mode = {}
        for mode, overlap in (("synced", False), ("overlapped", True)):
            rows = [r for r in warm if r["overlap"] == overlap]
            med = {k: statistics.median(r[k] for r in rows) for k in ("wall", "copy", "verify")}
            split = [k for k in ("to_open", "open_to_copied", "copied_to_acked", "after_ack") if all(k in r for r in rows)]
            med.update({k: statistics.median(r[k] for r in rows) for k in split} if not overlap else {})
            by_mode[mode] = {**{f"{k}_ms": round(v * 1e3, 4) for k, v in med.items()},
                             "gbps": round(nbytes / med["wall"] / 1e9, 1), "rounds": len(rows)}
        warm_buckets = n * (args.rounds - 1)
        trace_us = {k: round(v[0] / warm_buckets * 1e6, 1) for k, v in doc.get("trace", {}).items()}
        results["by_buckets"][n] = {**by_mode["synced"], "overlapped": by_mode["overlapped"], "trace_us_per_bucket": trace_us,
                                    "opens": doc["opens"], "copies": doc["copies"],
                                    "first_round_ms": round(doc["rows"][0]["wall"] * 1e3, 3),
                                    "source_after_each_run": source_held}
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"IPC leg on {name}: {args.mb} MiB per round, medians of {args.rounds - 1} warm rounds "
          f"(the first opens the mappings), the source idle while the receiver copies and verifies")
    for n, row in results["by_buckets"].items():
        print(f"  {n:3d} bucket(s) of {args.mb / n:g} MiB (first round {row['first_round_ms']:.3f} ms, {row['opens']} opens):")
        w, ov = row, row["overlapped"]
        print(f"      synced {w['wall_ms']:8.3f} ms = {w['gbps']:7.1f} GB/s copied and verified (copy {w['copy_ms']:.3f} ms, "
              f"verify {w['verify_ms']:.3f} ms, rest {w['wall_ms'] - w['copy_ms'] - w['verify_ms']:.3f} ms); overlapped "
              f"(submit/settle, up to {n} ahead of their acks) {ov['wall_ms']:8.3f} ms = {ov['gbps']:7.1f} GB/s (copy "
              f"{ov['copy_ms']:.3f}, verify {ov['verify_ms']:.3f})")
        if "to_open_ms" in w:
            print(f"        synced host clock: export taken and mapping found {w['to_open_ms']:.3f} ms, copy launched "
                  f"{w['open_to_copied_ms']:.3f}, sums launched + device waited + digest + ack {w['copied_to_acked_ms']:.3f}, "
                  f"back to the caller {w['after_ack_ms']:.3f}")
        if row["trace_us_per_bucket"]:
            print("        host time per bucket, warm rounds (us): "
                  + ", ".join(f"{k} {v:g}" for k, v in row["trace_us_per_bucket"].items()))
        if row["copies"]:
            print(f"      copies of one {row['copies']['bytes'] / MB:g} MiB bucket (device time, medians; every copy exact: "
                  f"{all(v['exact'] for k, v in row['copies'].items() if k not in ('bytes', 'after'))}):")
            for k, v in row["copies"].get("after", {}).items():
                print(f"        the mapped copy_ {k:<40} first {v['first_ms']:.3f} ms, median {v['median_ms']:.3f} ms")
            for k, v in row["copies"].items():
                if k not in ("bytes", "after"):
                    print(f"        {k:<46} {v['ms']:8.3f} ms {v['gbps']:8.1f} GB/s")
        if row["source_after_each_run"]:
            print(f"      the source's allocator after each of {args.runs} run(s), MiB reserved: "
                  f"{[round(h['reserved_bytes'] / MB) for h in row['source_after_each_run']]}, allocated: "
                  f"{[round(h['allocated_bytes'] / MB) for h in row['source_after_each_run']]}, torch IPC shares: "
                  f"{[h['shares'] for h in row['source_after_each_run']]}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
