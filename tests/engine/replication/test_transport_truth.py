"""Every transport line is true (issue 23.2): "Using SOTA CUDA-IPC Transport Layer." only where
hwtui's own IPC path carries the bytes, and two ranks on one GPU run with no flag (gloo, since
NCCL refuses a duplicate GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication import transport
from hwtui.engine.replication.transport import LINES, choose_transport, detect_facts, visible_nvidia_gpus

CUDA_BUILD = {"__version__": "2.11.0+cu130", "cuda": "13.0", "hip": None, "xpu": None}


def _gpus(tmp_path: Path, n: int) -> str:
    d = tmp_path / "gpus"
    d.mkdir()
    for i in range(n):
        (d / f"0000:0{i}:00.0").mkdir()
    return str(d)


def test_no_run_claims_cuda_ipc_while_ipc_does_not_carry_replicate() -> None:
    assert transport.IPC_CARRIES_REPLICATE is False
    facts: list[dict[str, bool]] = [{}, {"shared_gpu": True}, {"multi_node": True}, {"rocm": True}]
    for f in facts:
        assert choose_transport("cuda", None, **f).line != LINES["cuda-ipc"]
    with pytest.raises(HwtuiError, match="cuda-ipc"):
        choose_transport("cuda", "cuda-ipc")


def test_two_ranks_on_one_gpu_choose_gloo_without_a_flag() -> None:
    c = choose_transport("cuda", shared_gpu=True)
    assert (c.name, c.backend, c.comm_device) == ("gloo", "gloo", "cpu")
    assert "NCCL refuses two ranks on one GPU" in c.reason


def test_once_ipc_carries_the_bytes_its_line_is_chosen_for_a_shared_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "IPC_CARRIES_REPLICATE", True)
    c = choose_transport("cuda", shared_gpu=True)
    assert (c.name, c.line, c.backend) == ("cuda-ipc", "Using SOTA CUDA-IPC Transport Layer.", "gloo")
    assert choose_transport("cuda").name == "nccl"  # one rank per GPU: NCCL
    with pytest.raises(HwtuiError, match="inside one node"):
        choose_transport("cuda", "cuda-ipc", multi_node=True)


def test_visible_gpus_from_proc_and_cuda_visible_devices(tmp_path: Path) -> None:
    proc = _gpus(tmp_path, 2)
    assert visible_nvidia_gpus({}, proc) == 2
    assert visible_nvidia_gpus({"CUDA_VISIBLE_DEVICES": "1"}, proc) == 1
    assert visible_nvidia_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, proc) == 2
    assert visible_nvidia_gpus({"CUDA_VISIBLE_DEVICES": ""}, proc) == 0
    assert visible_nvidia_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, proc) == 1
    assert visible_nvidia_gpus({}, str(tmp_path / "absent")) is None


def test_detect_facts_marks_a_shared_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    proc = _gpus(tmp_path, 1)
    monkeypatch.setattr(transport, "visible_nvidia_gpus", lambda env: visible_nvidia_gpus(env, proc))
    assert detect_facts("cuda", {"WORLD_SIZE": "2"}, CUDA_BUILD)["shared_gpu"] is True
    assert detect_facts("cuda", {"WORLD_SIZE": "1"}, CUDA_BUILD)["shared_gpu"] is False
    assert choose_transport("cuda", None, **detect_facts("cuda", {"WORLD_SIZE": "2"}, CUDA_BUILD)).name == "gloo"
