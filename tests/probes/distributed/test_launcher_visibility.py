"""Launcher variables and device visibility on recorded nodes."""

from __future__ import annotations

import pytest

from hwtui.probes.distributed.launcher import job_shape
from hwtui.probes.host import FsHost
from tests.machines import amd_gpu, nvidia_gpu
from tests.probes.distributed.netsys import basic_node, findings, nvidia_ib_node, status

GIB = 1 << 30


@pytest.fixture(scope="module")
def gpu4(tmp_path_factory):
    return nvidia_ib_node(tmp_path_factory.mktemp("gpu4"), gpus=4)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return basic_node(tmp_path_factory.mktemp("plain"))


def run(ns, **env):
    return findings(FsHost(ns.root, env))


def test_no_launcher_is_a_skip(plain):
    f = run(plain)
    assert status(f, "launcher.detected") == "skip"
    assert not any(k.startswith(("launcher.rank", "visibility.")) for k in f)


def test_torchrun_worker_consistent(gpu4):
    f = run(gpu4, WORLD_SIZE="8", RANK="5", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4", GROUP_RANK="1", GROUP_WORLD_SIZE="2",
            TORCHELASTIC_RUN_ID="job", TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="3")
    assert f["launcher.detected"].data["launcher"] == "torchrun"
    for fid in ("launcher.rank", "launcher.local_rank", "launcher.torchelastic", "visibility.local_rank"):
        assert status(f, fid) == "pass", f[fid].title
    assert "launcher.rank_layout" not in f
    assert f["visibility.local_rank"].data["pci"] == "0000:19:00.0"


@pytest.mark.parametrize(("env", "fid", "want", "text"), [
    ({"WORLD_SIZE": "4", "RANK": "4"}, "launcher.rank", "fail", "RANK=4 is not below WORLD_SIZE=4"),
    ({"WORLD_SIZE": "4", "RANK": "x"}, "launcher.rank", "fail", "'x' is not an integer"),
    ({"RANK": "0"}, "launcher.incomplete", "fail", "RANK is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "launcher.local_rank", "fail", "LOCAL_RANK=2"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "launcher.local_world_size", "fail", "exceeds"),
    ({"WORLD_SIZE": "6", "RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "launcher.local_world_size", "warn", "not a multiple"),
    ({"WORLD_SIZE": "8", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"},
     "launcher.rank_layout", "warn", "GROUP_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK=5"),
    ({"WORLD_SIZE": "8", "RANK": "0", "NODE_RANK": "2", "NNODES": "2"}, "launcher.node_rank", "fail", "node rank 2"),
    ({"WORLD_SIZE": "8", "RANK": "0", "NPROC_PER_NODE": "8", "LOCAL_WORLD_SIZE": "4"}, "launcher.nproc_per_node", "warn", "NPROC_PER_NODE=8"),
    ({"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3"},
     "launcher.torchelastic", "warn", "restarted 2 time"),
    ({"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_RESTART_COUNT": "4", "TORCHELASTIC_MAX_RESTARTS": "3"},
     "launcher.torchelastic", "fail", "exceeds"),
])
def test_launcher_mistakes(plain, env, fid, want, text):
    f = run(plain, **env)
    assert status(f, fid) == want
    assert text in f[fid].title


def test_slurm_agreement(plain):
    base = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3"}
    f = run(plain, **base, RANK="3", WORLD_SIZE="8", LOCAL_RANK="3")
    assert status(f, "launcher.slurm_agree") == "pass"
    f = run(plain, **base, RANK="2", WORLD_SIZE="8", LOCAL_RANK="3")
    assert status(f, "launcher.slurm_agree") == "fail"
    assert "SLURM_PROCID=3 but RANK=2" in f["launcher.slurm_agree"].title
    assert "export RANK=$SLURM_PROCID" in f["launcher.slurm_agree"].remedy
    f = run(plain, **base)  # srun python train.py: no RANK at all
    assert status(f, "launcher.slurm_agree") == "warn"
    assert "export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS" in f["launcher.slurm_agree"].remedy


def test_srun_torchrun_compares_node_ranks(plain):
    # `srun --ntasks-per-node=1 torchrun ...`: SLURM's task id is the node rank, not the global rank.
    env = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1",
           "TORCHELASTIC_RUN_ID": "7", "RANK": "5", "WORLD_SIZE": "8", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}
    f = run(plain, **env)
    assert status(f, "launcher.slurm_agree") == "pass"
    f = run(plain, **{**env, "SLURM_NTASKS_PER_NODE": "4(x2)"})
    assert status(f, "launcher.slurm_tasks") == "warn"


def test_job_shape_multi_node():
    assert job_shape({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}).multi_node is True
    assert job_shape({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}).multi_node is False
    assert job_shape({"SLURM_NNODES": "3"}).multi_node is True
    assert job_shape({"PET_NNODES": "1:4"}).nnodes == 4
    assert job_shape({}).multi_node is None


def test_cuda_visible_devices_names_existing_devices(gpu4):
    f = run(gpu4, CUDA_VISIBLE_DEVICES="2,3")
    assert status(f, "visibility.cuda_visible_devices") == "pass"
    assert "cuda:0 -> 0000:1a:00.0" in f["visibility.cuda_visible_devices"].detail
    f = run(gpu4, CUDA_VISIBLE_DEVICES="1,7,2")
    v = f["visibility.cuda_visible_devices"]
    assert v.status.value == "fail" and "names device 7 but only 4 are present" in v.title
    assert v.data["visible"] == 1  # CUDA stops at the bad ordinal: device 2 is dropped too
    f = run(gpu4, CUDA_VISIBLE_DEVICES="-1")
    assert status(f, "visibility.cuda_visible_devices") == "warn"


def test_local_rank_must_land_on_a_visible_device(gpu4):
    # SLURM --gpus-per-task=1: one device visible per rank, LOCAL_RANK still counts up.
    f = run(gpu4, CUDA_VISIBLE_DEVICES="3", LOCAL_RANK="3", RANK="3", WORLD_SIZE="4")
    lr = f["visibility.local_rank"]
    assert lr.status.value == "fail" and "visible 1 cuda" in lr.title
    assert "use device index 0" in lr.remedy
    f = run(gpu4, LOCAL_RANK="5", RANK="5", WORLD_SIZE="8")
    assert status(f, "visibility.local_rank") == "fail"
    assert "--nproc-per-node=4" in f["visibility.local_rank"].remedy


def test_mixed_vendor_masks(tmp_path):
    ns = basic_node(tmp_path)
    nvidia_gpu(ns, "0000:01:00.0", 0x2684, 0)
    nvidia_gpu(ns, "0000:02:00.0", 0x2204, 1)
    amd_gpu(ns, "0000:03:00.0", 0x744C, 0, 24 * GIB)
    f = run(ns, CUDA_VISIBLE_DEVICES="1", ROCR_VISIBLE_DEVICES="0", HIP_VISIBLE_DEVICES="1")
    # HIP indexes within what ROCr left (one device), so HIP_VISIBLE_DEVICES=1 is out of range.
    assert status(f, "visibility.hip_visible_devices") == "fail"
    assert status(f, "visibility.rocr_visible_devices") == "pass"
    assert status(f, "visibility.cuda_visible_devices") == "pass"
    # Two NVIDIA models without PCI_BUS_ID ordering: CUDA's ordinals are fastest-first.
    assert status(f, "visibility.device_order") == "warn"
    f = run(ns, CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    # Without HIP_VISIBLE_DEVICES, HIP honours CUDA_VISIBLE_DEVICES too: one finding per backend.
    assert status(f, "visibility.cuda_visible_devices[cuda]") == "pass"
    assert status(f, "visibility.cuda_visible_devices[hip]") == "pass"
    assert "visibility.device_order" not in f


def test_mask_without_devices_is_skipped(plain):
    f = run(plain, HABANA_VISIBLE_MODULES="0,1", LOCAL_RANK="0")
    assert status(f, "visibility.habana_visible_modules") == "skip"
    assert status(f, "visibility.local_rank") == "skip"
