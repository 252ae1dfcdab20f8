"""Device abstraction, memory estimate, corpus split: in-process, no workers."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

from hwtui.engine.training import backend, data, memory  # noqa: E402
from hwtui.engine.training.model import ModelConfig, build_model  # noqa: E402


def test_cpu_device_goes_through_the_same_interface():
    dev = backend.TrainDevice("cpu", 1)
    assert dev.device == torch.device("cpu") and dev.name == "cpu:1"
    dev.set_device()
    dev.synchronize()
    assert dev.stream() is None
    free, total = dev.memory()
    assert 0 < free <= total
    assert dev.memory_used() > 0
    assert dev.resolve_precision("auto") == "fp32"  # bf16 on CPU is slower than fp32 without AMX
    assert isinstance(dev.autocast("fp32"), contextlib.nullcontext)
    with dev.autocast("bf16"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert dev.grad_scaler("bf16") is None and dev.grad_scaler("fp32") is None
    with pytest.raises(backend.BackendError):
        dev.resolve_precision("fp8")


def test_backend_table_covers_every_vendor_and_knows_rocm_speaks_cuda():
    assert set(backend.BACKENDS) == {"cuda", "hip", "xpu", "hpu", "cpu"}
    assert backend.BACKENDS["hip"].torch_type == "cuda"
    assert backend.BACKENDS["hpu"].fp16_needs_scaler is False
    if torch.version.hip is None:
        with pytest.raises(backend.BackendError, match="not a ROCm build"):
            backend.TrainDevice("hip", 0)
    if torch.version.cuda is None:
        with pytest.raises(backend.BackendError, match="not a CUDA build"):
            backend.TrainDevice("cuda", 0)
    with pytest.raises(backend.BackendError, match="unknown backend"):
        backend.TrainDevice("tpu", 0)


def test_param_count_matches_the_built_model():
    for cfg in (ModelConfig(), ModelConfig(context=32, d_model=48, layers=3, heads=6)):
        model = build_model(cfg, seed=1)
        assert cfg.param_count() == sum(p.numel() for p in model.parameters())
        assert model.positions.dtype == torch.int64


def test_memory_estimate_and_refusal_say_what_to_change():
    cfg = ModelConfig()
    small = memory.estimate(cfg, 8, "fp32")
    assert small.params == small.grads == cfg.param_count() * 4 and small.optimizer == cfg.param_count() * 8
    assert memory.estimate(cfg, 16, "fp32").activations > small.activations
    assert memory.estimate(cfg, 16, "bf16").activations < memory.estimate(cfg, 16, "fp32").activations
    assert memory.estimate(cfg, 16, "fp32", True).activations < memory.estimate(cfg, 16, "fp32").activations
    assert memory.check_fits("cpu:0", cfg, 8, "fp32", False, free=small.total + 1) is None
    free = memory.estimate(cfg, 100, "fp32").total
    msg = memory.check_fits("cuda:1", cfg, 1000, "fp32", False, free=free)
    best = memory.largest_batch(cfg, free, "fp32", False)
    assert 100 <= best < 1000
    assert msg.startswith("cuda:1 needs about") and f"--batch-size {best}" in msg
    assert "--precision bf16" in msg and "--activation-checkpointing" in msg
    assert memory.estimate(cfg, best, "fp32").total <= free < memory.estimate(cfg, best + 1, "fp32").total


def test_corpus_split_is_deterministic_and_disjoint():
    files = sorted(p.name for p in data.stdlib_dir().glob("*.py"))
    held = [f for f in files if data.is_heldout(f)]
    assert held and len(held) < len(files) / 4
    a, b = data.load_corpus(max_bytes=1 << 20), data.load_corpus(max_bytes=1 << 20)
    assert a.fingerprint == b.fingerprint and torch.equal(a.train, b.train)
    assert a.heldout.numel() > 0
    x1, y1 = data.chunk_batch(a, 7, 4, 32, seed=3)
    x2, _ = data.chunk_batch(b, 7, 4, 32, seed=3)
    x3, _ = data.chunk_batch(a, 8, 4, 32, seed=3)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next byte
    sample = bytes(a.heldout[:2000].tolist())
    assert sample in bytes(a.heldout.tolist()) and sample not in bytes(a.train.tolist())


def test_evaluation_rounds_follow_eval_every_and_always_include_the_last():
    from hwtui.engine.training.launcher import is_eval_round

    assert [r for r in range(1, 13) if is_eval_round(r, r == 12, 5)] == [5, 10, 12]
    assert [r for r in range(1, 4) if is_eval_round(r, r == 3, 1)] == [1, 2, 3]
    assert [r for r in range(1, 4) if is_eval_round(r, r == 3, 100)] == [3]
