"""hwtui's CUDA IPC transport on a live NVIDIA GPU (issue 23.2): the same protocol and rank harness
as tests/engine/replication/test_ipc_processes.py, with ipc_provider.CudaIpc instead of the host
stand-in. Skipped without a GPU (tests/gpu/conftest.py says why).

Run: ``python3 -m pytest tests/gpu/test_ipc_live.py -m gpu -v -rs -s -p no:cacheprovider -o addopts=""``
(``-s`` shows the measured IPC copy rate).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
GIB = 1 << 30


def _world(*args, **kwargs):  # type: ignore[no-untyped-def]
    from tests.engine.replication.test_ipc_processes import _world as world

    return world(*args, **kwargs)


def _smi_pids() -> set[int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=60).stdout
    return {int(x) for x in out.split() if x.strip().isdigit()}


def test_device_digest_on_the_gpu_equals_the_reference_and_sees_a_flipped_bit() -> None:
    # On a GPU with Triton the sums come from one kernel (device_sums_triton), else from two torch
    # reductions: both equal the plain-integer reference at every shape of bucket (a short last
    # row, fewer rows than a program's block, many blocks), and each other at 64 MiB + 5.
    code = ("import os, time, torch; import hwtui.engine.replication.device_checksum as dc; "
            "from hwtui.engine.replication.device_checksum import device_digest, reference_digest\n"
            "for n in (1, 5, 4095, 16384, 16387, 300 * 16384 + 7, (1 << 20) + 3):\n"
            "    d = os.urandom(n); t = torch.frombuffer(bytearray(d), dtype=torch.uint8).cuda()\n"
            "    a = device_digest(t); assert a == reference_digest(d), ('differs', n); t[n // 2] ^= 4\n"
            "    assert device_digest(t) != a, ('blind', n)\n"
            "m = torch.randint(0, 256, ((64 << 20) + 5,), dtype=torch.uint8, device='cuda'); one = device_digest(m)\n"
            "os.environ['HWTUI_DEVICE_CHECKSUM'] = 'torch'; assert device_digest(m) == one, 'paths differ'; "
            "del os.environ['HWTUI_DEVICE_CHECKSUM']\n"
            "assert not dc._ONE_READ_BROKEN, dc._ONE_READ_BROKEN\n"
            "big = torch.randint(0, 256, (1 << 30,), dtype=torch.uint8, device='cuda'); "
            "device_digest(big); torch.cuda.synchronize(); t0 = time.perf_counter(); [device_digest(big) for _ in range(5)]; "
            "print('ok', 'device checksum of 1 GiB: %.3f ms' % ((time.perf_counter() - t0) / 5 * 1e3), "
            "'(one read: %s)' % (dc._one_read_sums(big) is not None))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
    print("\n" + proc.stdout.strip())


def test_two_ranks_on_one_gpu_move_1_gib_by_ipc_verified_on_the_device(tmp_path: Path) -> None:
    out = _world(tmp_path, world=2, window=2, device="cuda", sizes=[GIB // 4] * 4, check_bytes=True)
    assert out["codes"] == {0: 0, 1: 0} and out["committed"]
    rx = out["results"][1]
    assert rx["good"] == 4 and rx["opened_after"] == 0
    assert out["results"][0]["peak_exported"] <= 2
    assert rx["opens"] == 2 and rx["opened_during"] == 2  # one mapping per window slot, closed at the end
    seconds, verify = sum(rx["copy_s"]), sum(rx["verify_s"])
    print(f"\nIPC: 1 GiB in 4 buckets: copy (open on a slot's first use + copy + sync) {seconds * 1e3:.2f} ms = "
          f"{GIB / seconds / 1e9:.0f} GB/s; device checksum {verify * 1e3:.2f} ms; copied and verified "
          f"{GIB / (seconds + verify) / 1e9:.0f} GB/s (per bucket copy {[round(s * 1e3, 3) for s in rx['copy_s']]} ms, "
          f"verify {[round(s * 1e3, 3) for s in rx['verify_s']]} ms)")


def test_two_ranks_on_one_gpu_move_1_gib_in_16_buckets(tmp_path: Path) -> None:
    """More buckets than slots: the mappings are reused, so the per-bucket cost is the copy and the
    checksum (the fused pass these figures once chose between was slower at every slice size)."""
    out = _world(tmp_path, world=2, window=2, device="cuda", sizes=[GIB // 16] * 16, check_bytes=False)
    assert out["codes"] == {0: 0, 1: 0} and out["committed"]
    rx = out["results"][1]
    assert rx["opens"] == 2 and rx["opened_after"] == 0
    seconds, verify = sum(rx["copy_s"][1:]), sum(rx["verify_s"][1:])
    moved = GIB * 15 / 16
    print(f"\nIPC: 1 GiB in 16 buckets (the first left out: its slot's open): copy {moved / seconds / 1e9:.0f} GB/s, "
          f"copied and verified {moved / (seconds + verify) / 1e9:.0f} GB/s")


def test_a_long_lived_source_frees_each_runs_window(tmp_path: Path) -> None:
    """A resident rank is a source push after push, so what a run leaves allocated adds up: on an
    H200 the pushing agent's rank grew by ~256 MiB (its window) per push, and 4 source runs of 16 x
    64 MiB left 320/640/768/1024 MiB allocated. The holder was torch's IPC ref counting: each export
    of a slot was a new ``_share_cuda_()`` counting one consumer, and a receiver that keeps its
    mapping closed one (ipc_provider.CudaIpc.handle shares a buffer once and releases the count).
    Four whole source runs in one process (benchmarks/bench_ipc_leg.py --runs 4) must leave the
    allocator where the first left it."""
    import json

    res = tmp_path / "leg.json"
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_ipc_leg.py"
    proc = subprocess.run([sys.executable, str(bench), "--mb", "1024", "--buckets", "16", "--rounds", "3",
                           "--runs", "4", "--json", str(res)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    held = json.loads(res.read_text())["by_buckets"]["16"]["source_after_each_run"]
    reserved = [h["reserved_bytes"] >> 20 for h in held]
    print(f"\nthe source's allocator after each of 4 runs, MiB reserved: {reserved}, allocated: "
          f"{[h['allocated_bytes'] >> 20 for h in held]}")
    assert reserved[-1] <= reserved[0] + 64, reserved
    assert held[-1]["allocated_bytes"] <= held[0]["allocated_bytes"] + (64 << 20), held


def test_a_corrupted_bucket_is_named_on_its_rank_on_the_gpu(tmp_path: Path) -> None:
    out = _world(tmp_path, world=3, device="cuda", sizes=[1 << 20] * 4,
                 fault={"action": "corrupt", "rank": 2, "bucket": 2})
    assert not out["committed"]
    assert any("rank 2: bucket 2 failed its device checksum" in e for e in out["results"][2]["errors"])


@pytest.mark.parametrize("rank, phase", [(0, "exported"), (0, "published"), (1, "opened"), (1, "copied"),
                                         (1, "acked")])
def test_a_rank_killed_at_each_phase_commits_nothing_and_frees_its_device_memory(tmp_path: Path, rank: Any, phase: Any) -> None:
    out = _world(tmp_path, world=2, device="cuda", sizes=[64 << 20] * 4,
                 fault={"action": "kill", "rank": rank, "bucket": 1, "phase": phase})
    assert out["codes"][rank] == -9 and not out["committed"]
    other = out["results"][1 - rank]
    assert other is not None and other["opened_after"] == 0
    # nvidia-smi agrees: no process of this world holds GPU memory any more.
    assert not (_smi_pids() & set(out["pids"])), "a rank of the world still holds device memory"



def test_replicate_two_ranks_on_one_gpu_by_ipc_with_no_flag(tmp_path: Path) -> None:
    """`hwtui replicate --device cuda --nproc 2` on one GPU: no --transport, the IPC line, the ipc
    path for rank 1, byte-exact commit. Prints the transfer and the CLI's wall for the record."""
    import json
    import time

    from tests.gpu.test_gpu_live import hwtui, make_model

    model, plan, out, report = tmp_path / "m.safetensors", tmp_path / "plan.json", tmp_path / "out", tmp_path / "r.json"
    make_model(model, GIB)
    assert hwtui("plan", "--weights", str(model), "-o", str(plan)).returncode == 0
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    t0 = time.perf_counter()
    proc = hwtui("replicate", "--plan", str(plan), "--device", "cuda", "--nproc", "2", "--commit", "--out", str(out),
                 "--report", str(report), timeout=900, env=env)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    assert "Using SOTA CUDA-IPC Transport Layer." in proc.stdout + proc.stderr
    rep = json.loads(report.read_text())
    assert rep["ok"] and rep["committed"] and rep["transport"]["name"] == "cuda-ipc", rep["transport"]
    assert {r["rank"]: r["path"] for r in rep["ranks"]} == {0: "source", 1: "ipc"}
    served = (out / "rank1" / "versions")
    files = list(served.rglob("model.safetensors"))
    assert files and files[0].read_bytes() == model.read_bytes()
    print(f"\nreplicate 1 GiB, 2 ranks on one GPU by IPC: transfer {rep['phases_s'].get('transfer', 0):.4f} s, "
          f"phases {json.dumps(rep['phases_s'])[:400]}; CLI wall {wall:.2f} s; the receiver's buckets started "
          f"ahead of their acks, at most: {rep['ranks'][1].get('window')}, its direct buckets: "
          f"{rep['ranks'][1].get('direct_buckets')}")
