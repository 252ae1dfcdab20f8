"""Planner, delta, validation, transport choice, window and pool: no worker processes."""

from __future__ import annotations

import copy
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from hwtui.app.cli import main
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication import faults
from hwtui.engine.replication.plan import (
    PlanInputs,
    SourceTensor,
    build_plan,
    load_plan,
    manifest_of,
    plan_digest,
    validate_plan,
    write_json_atomic,
)
from hwtui.engine.replication.pool import BufferPool, PoolExhausted
from hwtui.engine.replication.transport import LINES, choose_transport
from hwtui.engine.replication.weights import TensorInfo
from hwtui.engine.replication.window import Window
from tests.engine.replication.helpers import files, make_model, write_plan


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    d = tmp_path_factory.mktemp("model")
    return d, make_model(d)


def _bucket_bytes(plan: Any, b: int) -> list[tuple[Any, Any, Any, Any]]:
    """Rebuild bucket b from the source tensors the way a receiver unpacks it."""
    return [(it["name"], it["tensor_offset"], it["nbytes"], it["offset"]) for it in plan["items"] if it["bucket"] == b]


def test_plan_covers_every_byte_and_splits_big_tensors(model: Any, tmp_path: Path) -> None:
    d, expected = model
    plan = write_plan(d, tmp_path / "p.json", version="v1", bucket_kib=64)
    loaded = load_plan(tmp_path / "p.json")  # validates every invariant, including the digest
    assert loaded.digest == plan["digest"] == plan_digest(plan)
    sizes = {n: t.numel() * t.element_size() for n, t in expected.items()}
    assert {t["name"]: t["nbytes"] for t in plan["tensors"]} == sizes
    assert plan["total_bytes"] == sum(sizes.values())  # align 1: no padding at all
    pieces = [it for it in plan["items"] if it["name"] == "embed.big"]
    assert len(pieces) >= sizes["embed.big"] // (64 * 1024)  # split at bucket boundaries
    assert sum(p["nbytes"] for p in pieces) == sizes["embed.big"]
    assert all(b["size"] == 64 * 1024 for b in plan["buckets"][:-1])  # every bucket but the last is full
    # The bucket checksum is the xxh3 of exactly the bytes the items describe.
    from hwtui.engine.replication.checksum import xxh3_hex

    for b in plan["buckets"]:
        buf = bytearray(b["size"])
        for name, toff, n, off in _bucket_bytes(plan, b["id"]):
            raw = expected[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            buf[off:off + n] = raw[toff:toff + n]
        assert xxh3_hex(bytes(buf)) == b["checksum"]


def test_alignment_pads_inside_buckets(model: Any, tmp_path: Path) -> None:
    d, _ = model
    plan = write_plan(d, tmp_path / "p.json", version="v1", bucket_kib=64, align=64)
    for it in plan["items"]:
        if it["tensor_offset"] == 0:
            assert it["offset"] % 64 == 0
    load_plan(tmp_path / "p.json")


def test_delta_sends_only_changed_tensors_and_records_deletions(model: Any, tmp_path: Path) -> None:
    d, expected = model
    base = write_plan(d, tmp_path / "v1.json", version="v1")
    write_json_atomic(tmp_path / "v1.manifest.json", manifest_of(base))
    d2 = tmp_path / "m2"
    new = dict(expected)
    new["layers.3.weight"] = new["layers.3.weight"] + 1
    del new["layers.4.weight"]
    new["added"] = torch.arange(10, dtype=torch.int64)
    st = {k: v for k, v in new.items() if not k.startswith("head.")}
    d2.mkdir()
    save_file(st, str(d2 / "model.safetensors"))
    torch.save({"head": {"w": expected["head.w"], "b": expected["head.b"]}}, d2 / "head.pt")
    plan = write_plan(d2, tmp_path / "v2.json", version="v2", prev=tmp_path / "v1.manifest.json")
    assert plan["prev_version"] == "v1"
    assert sorted(t["name"] for t in plan["tensors"] if t["send"]) == ["added", "layers.3.weight"]
    assert plan["deleted"] == ["layers.4.weight"]
    assert plan["total_bytes"] == new["added"].numel() * 8 + new["layers.3.weight"].numel() * 4
    # A previous plan works as a manifest too, and an empty manifest means a full push.
    again = write_plan(d2, tmp_path / "v2b.json", version="v2", prev=tmp_path / "v1.json")
    assert again["total_bytes"] == plan["total_bytes"]
    (tmp_path / "empty.json").write_text(json.dumps({"schema": "hwtui.manifest/1", "tensors": []}))
    full = write_plan(d2, tmp_path / "v2c.json", version="v2", prev=tmp_path / "empty.json")
    assert full["prev_version"] is None and all(t["send"] for t in full["tensors"])


def _synthetic(n: int, bucket: int) -> float:
    """Plan n tiny tensors from memory; returns seconds (checksums included)."""
    payload = torch.arange(n * 4 % 251, dtype=torch.uint8)
    data = memoryview(bytes(range(256)) * 1)
    tensors = [SourceTensor(0, TensorInfo(f"t{(i * 7919) % n:07d}", "F32", (1,), 4, 8 + 4 * ((i * 7919) % n)))
               for i in range(n)]
    inputs = PlanInputs([{"path": "/x", "format": "safetensors", "size": 8 + 4 * n}], tensors,
                        lambda s: data[(s.info.file_offset % 200):(s.info.file_offset % 200) + 4])
    del payload
    # The collector off while timed: a full collection of whatever the shard process has built up
    # by then lands in one run or the other and says nothing about the planner (it failed the ratio
    # once at 11x, in a shard process late in the suite).
    gc.collect()
    gc.disable()
    try:
        t = time.process_time()
        plan = build_plan(inputs, model="m", version="v1", bucket_bytes=bucket)
        dt = time.process_time() - t
    finally:
        gc.enable()
    assert len(plan["tensors"]) == n and plan["total_bytes"] == 4 * n
    return dt


@pytest.mark.timeout(60)
def test_planner_scales_n_log_n() -> None:
    # 4x the tensors must cost well under 4^2 = 16x the time (the public tool was quadratic); measured
    # ~4.7x. Process CPU time, best of three: the box is shared, and a stall makes one run slow, never fast.
    small = min(_synthetic(5_000, 4096) for _ in range(3))
    large = min(_synthetic(20_000, 4096) for _ in range(3))
    assert large < 10 * max(small, 0.005), (small, large)


# ----------------------------------------------------------------------------- bad plans


@pytest.fixture(scope="module")
def good_plan(model: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    d, _ = model
    p = tmp_path_factory.mktemp("plans") / "good.json"
    plan: Any = write_plan(d, p, version="v1", bucket_kib=64)
    return json.loads(json.dumps(plan.to_v1()))  # the JSON plan format earlier hwtui wrote


def _with_digest(raw: dict[str, Any]) -> Any:
    raw["digest"] = plan_digest(raw)
    return raw


def _overlap(raw: dict[str, Any]) -> Any:
    b = max(range(len(raw["buckets"])), key=lambda k: sum(i["bucket"] == k for i in raw["items"]))
    its = [i for i in raw["items"] if i["bucket"] == b]
    its[1]["offset"] = its[0]["offset"]
    return _with_digest(raw)


def _dtype(raw: dict[str, Any]) -> Any:
    raw["tensors"][0]["dtype"] = "F12"
    return _with_digest(raw)


def _gap(raw: dict[str, Any]) -> Any:
    its = [i for i in raw["items"] if i["name"] == "embed.big"]
    its[1]["tensor_offset"] += 1
    return _with_digest(raw)


def _outside(raw: dict[str, Any]) -> Any:
    raw["items"][0]["offset"] = raw["bucket_bytes"]
    return _with_digest(raw)


def _edited(raw: dict[str, Any]) -> Any:
    raw["buckets"][0]["checksum"] = "0" * 16  # digest left stale
    return raw


def _schema(raw: dict[str, Any]) -> Any:
    raw["schema"] = "hotweights/0"
    return raw


def _missing_field(raw: dict[str, Any]) -> Any:
    del raw["buckets"]
    return raw


def _bad_version(raw: dict[str, Any]) -> Any:
    raw["version"] = "../../etc"
    return _with_digest(raw)


@pytest.mark.parametrize("mutate, words", [
    (_overlap, "overlap"), (_dtype, "unknown dtype"), (_gap, "gap"), (_outside, "outside bucket"),
    (_edited, "digest mismatch"), (_schema, "schema"), (_missing_field, "buckets"), (_bad_version, "not a valid version"),
])
def test_bad_plans_are_rejected_with_one_line(good_plan: Any, mutate: Any, words: Any) -> None:
    raw = mutate(copy.deepcopy(good_plan))
    with pytest.raises(HwtuiError) as exc:
        validate_plan(raw, "p.json")
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_good_plan_validates(good_plan: Any) -> None:
    validate_plan(copy.deepcopy(good_plan))


@pytest.mark.parametrize("content", ["", '{"schema": "hwtui.plan/1", "model": "x", "ver', "[1, 2]"])
def test_truncated_plan_via_cli_exits_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: Any) -> None:
    p = tmp_path / "plan.json"
    p.write_text(content)
    out, ev, rep = tmp_path / "out", tmp_path / "ev.jsonl", tmp_path / "rep.json"
    code = main(["replicate", "--plan", str(p), "--nproc", "2", "--commit", "--out", str(out), "--events", str(ev),
                 "--report", str(rep)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("hwtui: error: ")
    assert not out.exists() and not ev.exists() and not rep.exists()


def test_changed_or_missing_weight_file_is_bad_input(model: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d, expected = model
    src = tmp_path / "src"
    make_model(src)
    plan = tmp_path / "plan.json"
    write_plan(src, plan, version="v1")
    (src / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes() + b"x")  # size changed
    assert main(["replicate", "--plan", str(plan), "--nproc", "2"]) == 2
    assert "changed since planning" in capsys.readouterr().err
    (src / "head.pt").unlink()
    make_model(src)  # restore the safetensors file
    (src / "head.pt").unlink()
    assert main(["replicate", "--plan", str(plan), "--nproc", "2"]) == 2
    assert "missing" in capsys.readouterr().err


def test_plan_cli_writes_plan_and_manifest(model: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d, _ = model
    code = main(["plan", "--weights", *files(d), "--bucket-mb", "0.05", "-o", str(tmp_path / "p.json"),
                 "--manifest", str(tmp_path / "m.json"), "--version", "2024-06-01.1", "--model", "tiny"])
    assert code == 0 and "hwtui 0." not in capsys.readouterr().out  # not the top-level --version
    plan = load_plan(tmp_path / "p.json")
    assert (plan["version"], plan["model"], plan["bucket_bytes"]) == ("2024-06-01.1", "tiny", int(0.05 * (1 << 20)))
    man = json.loads((tmp_path / "m.json").read_text())
    assert man["version"] == plan["version"] and len(man["tensors"]) == len(plan["tensors"])
    assert main(["plan", "--weights", str(tmp_path / "nope.safetensors"), "-o", str(tmp_path / "q.json")]) == 2
    assert not (tmp_path / "q.json").exists()


# ----------------------------------------------------------------------------- transport, window, pool, faults


@pytest.mark.parametrize("device, facts, name, line", [
    ("cpu", {}, "gloo", LINES["gloo"]),
    ("cuda", {}, "nccl", LINES["nccl"]),
    ("cuda", {"shared_gpu": True}, "cuda-ipc", "Using SOTA CUDA-IPC Transport Layer."),
    ("cuda", {"multi_node": True}, "nccl", LINES["nccl"]),
    ("cuda", {"rocm": True}, "rccl", "Using GPU broadcast transport (no IPC)."),
    ("xpu", {"xccl_available": True}, "xccl", "Using GPU broadcast transport (Intel oneCCL)."),
    ("xpu", {}, "ccl", "Using GPU broadcast transport (Intel oneCCL)."),
    ("hpu", {}, "hccl", LINES["hccl"]),
])
def test_transport_per_vendor(device: Any, facts: Any, name: Any, line: Any) -> None:
    c = choose_transport(device, **facts)
    assert c.name == name and c.line == line
    assert c.decision_line().startswith(line) and c.reason in c.decision_line()


def test_transport_override_and_bad_overrides() -> None:
    assert choose_transport("cuda", "gloo").comm_device == "cpu"
    assert choose_transport("cuda", "nccl").reason == "chosen with --transport"
    for device, name in (("cpu", "nccl"), ("xpu", "hccl"), ("cuda", "carrier-pigeon")):
        with pytest.raises(HwtuiError):
            choose_transport(device, name)
    with pytest.raises(HwtuiError, match="inside one node"):
        choose_transport("cuda", "cuda-ipc", multi_node=True)


def test_window_limits_and_byte_cap() -> None:
    w = Window(3, max_bytes=250)
    for _ in range(2):
        assert w.can_admit(100)
        w.admit(100)
    assert not w.can_admit(100)  # 300 > 250 bytes
    w.retire(100, 0.01)
    assert w.can_admit(100)
    big = Window(2, max_bytes=10)
    assert big.can_admit(1000)  # one bucket always fits, or nothing would ever move


def test_adaptive_window_steers_towards_target() -> None:
    w = Window(8, adaptive=True, target_s=0.1)
    start = w.limit
    for _ in range(10):
        w.admit(1)
        w.retire(1, 0.01)  # much faster than the target: grow
    assert w.limit == 8 > start
    for _ in range(10):
        w.admit(1)
        w.retire(1, 1.0)  # much slower: shrink
    assert w.limit == 1


def test_pool_recycles_and_bounds() -> None:
    pool = BufferPool(2, 1000)
    a, b = pool.acquire(10), pool.acquire(1000)
    with pytest.raises(PoolExhausted):
        pool.acquire(1)
    pool.release(a)
    c = pool.acquire(5)
    assert c.data_ptr() == a.data_ptr()  # recycled, not reallocated
    assert pool.peak_bytes == 2000 and pool.allocated_bytes == 2000
    with pytest.raises(ValueError):
        pool.acquire(1001)
    del b


def test_fault_spec_parsing() -> None:
    fs = faults.parse("corrupt:bucket=3,rank=1; kill:rank=2,phase=prepare")
    assert fs[0] == faults.Fault("corrupt", 1, 3, None) and fs[1] == faults.Fault("kill", 2, None, "prepare")
    with pytest.raises(ValueError):
        faults.parse("explode:rank=1")
    inj = faults.Injector(1, "corrupt:bucket=3")
    assert inj.corrupts(3) and not inj.corrupts(2)


def test_knobs_default_from_the_vendor_guide_env() -> None:
    from hwtui.engine.replication.launcher import ReplicationOptions, resolve_settings

    base = resolve_settings(ReplicationOptions(plan="p", env={}))
    assert base.window == 4 and base.chunk_bytes == 64 << 20
    env = {"HOTWEIGHTS_IPC_INFLIGHT_BUCKETS": "7", "HOTWEIGHTS_BCAST_CHUNK_MB": "2.5"}
    got = resolve_settings(ReplicationOptions(plan="p", env=env))
    assert got.window == 7 and got.chunk_bytes == int(2.5 * (1 << 20))
    flags = resolve_settings(ReplicationOptions(plan="p", env=env, window=2, chunk_mb=1))
    assert flags.window == 2 and flags.chunk_bytes == 1 << 20  # flags beat the environment
    for bad in ({"HOTWEIGHTS_IPC_INFLIGHT_BUCKETS": "four"}, {"HOTWEIGHTS_BCAST_CHUNK_MB": "-1"}):
        with pytest.raises(HwtuiError, match=next(iter(bad))):
            resolve_settings(ReplicationOptions(plan="p", env=bad))
    with pytest.raises(HwtuiError, match="--out"):
        resolve_settings(ReplicationOptions(plan="p", env={}, commit=True))


def test_joined_world_from_torchrun_and_slurm_env() -> None:
    from hwtui.engine.replication.launcher import joined_world

    assert joined_world({}) is None
    tr = joined_world({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                       "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert tr is not None and (tr["rank"], tr["world_size"], tr["local_rank"], tr["local_world_size"]) == (3, 8, 1, 4)
    sl = joined_world({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "8(x2)",
                       "MASTER_ADDR": "n1", "MASTER_PORT": "29500"})
    assert sl is not None and (sl["rank"], sl["world_size"], sl["local_world_size"]) == (5, 16, 8)
    with pytest.raises(HwtuiError, match="MASTER_ADDR"):
        joined_world({"RANK": "0", "WORLD_SIZE": "2"})


def test_torch_build_is_parsed_not_imported(tmp_path: Path) -> None:
    from hwtui.engine.replication.transport import detect_facts, torch_build

    v = tmp_path / "version.py"
    v.write_text("__version__ = '2.5.1+rocm6.2'\ncuda: Optional[str] = None\nhip: Optional[str] = '6.2.41133'\n")
    build = torch_build(str(v))
    assert build == {"__version__": "2.5.1+rocm6.2", "cuda": None, "hip": "6.2.41133", "xpu": None}
    assert detect_facts("cuda", {"WORLD_SIZE": "2"}, build)["rocm"] is True
    xpu = {"__version__": "2.8.0+xpu", "cuda": None, "hip": None, "xpu": "20250101"}
    assert detect_facts("xpu", {}, xpu)["xccl_available"] is True
    assert detect_facts("cuda", {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, build)["multi_node"] is True
    here = torch_build()
    assert here["__version__"] and here["__version__"].split("+")[0] in torch.__version__


def test_collective_groups_merge_only_contiguous_buckets(tmp_path: Path) -> None:
    from hwtui.engine.replication.plan import load_plan
    from hwtui.engine.replication.source_reader import collective_groups
    from tests.engine.replication.helpers import make_model, write_plan

    make_model(tmp_path, seed=3)
    write_plan(tmp_path, tmp_path / "p.json", version="v1", bucket_kib=64)
    plan = load_plan(tmp_path / "p.json")
    n, sizes = len(plan.buckets), [b["size"] for b in plan.buckets]
    groups = collective_groups(plan, chunk_bytes=64 << 20, max_group=2, enabled=True)
    assert [b for g in groups for b in g] == list(range(n))  # every bucket once, in order
    assert any(len(g) == 2 for g in groups) and all(len(g) <= 2 for g in groups)
    for g in groups:
        if len(g) > 1:  # one byte range of one safetensors file, bucket after bucket
            first = [plan.bucket_items[b][0] for b in g]
            assert len({plan.bucket_items[b][i]["file"] for b in g for i in range(len(plan.bucket_items[b]))}) == 1
            assert all(plan["files"][f["file"]]["format"] == "safetensors" for f in first)
            starts = [f["file_offset"] - f["offset"] for f in first]
            assert all(starts[i + 1] == starts[i] + sizes[g[i]] for i in range(len(g) - 1))
    # the chunk size caps a group's bytes; off (GPU) or a window too small to overlap: one bucket each
    assert all(len(g) == 1 for g in collective_groups(plan, chunk_bytes=max(sizes), max_group=2, enabled=True))
    assert collective_groups(plan, chunk_bytes=64 << 20, max_group=1, enabled=True) == [[b] for b in range(n)]
    assert collective_groups(plan, chunk_bytes=64 << 20, max_group=4, enabled=False) == [[b] for b in range(n)]
    # padded buckets (alignment) are never a plain byte range: no merging
    write_plan(tmp_path, tmp_path / "a.json", version="v1", bucket_kib=64, align=4096)
    padded = load_plan(tmp_path / "a.json")
    pad = [b for b in range(len(padded.buckets))
           if sum(i["nbytes"] for i in padded.bucket_items[b]) != padded.buckets[b]["size"]]
    assert pad
    assert all(len(g) == 1 for g in collective_groups(padded, chunk_bytes=64 << 20, max_group=2, enabled=True)
               if any(b in pad for b in g))


def test_planning_safetensors_does_not_import_torch(tmp_path: Path) -> None:
    # Planning only reads headers and hashes bytes: no 1.5 s torch import for `hwtui plan`.
    code = f"""
import sys
import numpy as np
from safetensors.numpy import save_file
save_file({{"a": np.arange(1000, dtype=np.float32), "b": np.ones((7, 3), dtype=np.int64)}}, {str(tmp_path / 'm.safetensors')!r})
from hwtui.engine.replication.plan import build_plan_from_files
plan = build_plan_from_files([{str(tmp_path / 'm.safetensors')!r}], model=None, version=None, bucket_bytes=1024)
print(len(plan["tensors"]), "torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["2", "False"], out.stdout + out.stderr
