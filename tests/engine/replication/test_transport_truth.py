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


def test_two_ranks_on_one_gpu_choose_cuda_ipc_without_a_flag_over_a_gloo_world() -> None:
    c = choose_transport("cuda", None, shared_gpu=True)
    assert (c.name, c.line, c.backend, c.comm_device) == ("cuda-ipc", "Using SOTA CUDA-IPC Transport Layer.", "gloo",
                                                          "cpu")
    assert "ranks share a GPU" in c.reason


def test_one_rank_per_gpu_is_nccl_and_says_so_not_ipc() -> None:
    c = choose_transport("cuda")
    assert (c.name, c.backend) == ("nccl", "nccl") and c.line == LINES["nccl"] != LINES["cuda-ipc"]
    assert "IPC" not in c.reason
    assert choose_transport("cuda", "cuda-ipc").backend == "gloo"  # forced: IPC in one node, on a gloo world
    with pytest.raises(HwtuiError, match="inside one node"):
        choose_transport("cuda", "cuda-ipc", multi_node=True)
    with pytest.raises(HwtuiError, match="ROCm"):
        choose_transport("cuda", "cuda-ipc", rocm=True)


def test_the_ipc_line_is_never_claimed_without_the_ipc_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "IPC_CARRIES_REPLICATE", False)
    facts: list[dict[str, bool]] = [{}, {"shared_gpu": True}, {"multi_node": True}, {"rocm": True}]
    for f in facts:
        assert choose_transport("cuda", None, **f).line != LINES["cuda-ipc"]
    assert choose_transport("cuda", None, shared_gpu=True).name == "gloo"
    with pytest.raises(HwtuiError, match="cuda-ipc"):
        choose_transport("cuda", "cuda-ipc")


def test_the_ipc_path_is_what_cuda_ipc_selects() -> None:
    from hwtui.engine.replication.ipc_path import ipc_wanted

    assert ipc_wanted("cuda-ipc", "cuda", {}) is True
    assert ipc_wanted("nccl", "cuda", {}) is False
    assert ipc_wanted("gloo", "cpu", {}) is False
    assert ipc_wanted("gloo", "cpu", {"HWTUI_TEST_IPC": "host"}) is True  # the CPU test seam
    assert ipc_wanted("nccl", "cuda", {"HWTUI_TEST_IPC": "host"}) is False


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
    assert choose_transport("cuda", None, **detect_facts("cuda", {"WORLD_SIZE": "2"}, CUDA_BUILD)).name == "cuda-ipc"
