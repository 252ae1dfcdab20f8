"""oneCCL / HCCL / TPU environments, replication knobs, checkpoint directory and clock."""

from __future__ import annotations

import pytest

from hwtui.probes.distributed.hygiene import CLOCK_FACT
from hwtui.probes.host import FsHost
from tests.machines import GOOGLE, HABANA, amd_gpu, intel_gpu
from tests.probes.distributed.netsys import basic_node, findings, nvidia_ib_node, status

GIB = 1 << 30
MULTI = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "RANK": "9", "LOCAL_RANK": "1"}


def test_oneccl(tmp_path):
    ns = basic_node(tmp_path)
    intel_gpu(ns, "0000:03:00.0", 0x0BD5, 1)
    ns.file("/opt/intel/oneapi/setvars.sh", "")
    f = findings(FsHost(ns.root, {}))
    assert status(f, "ccl.oneccl") == "warn" and f["ccl.oneccl"].remedy == "source /opt/intel/oneapi/setvars.sh"
    ns.file("/opt/intel/oneapi/ccl/latest/lib/libccl.so.1", "")
    env = {"CCL_ROOT": "/opt/intel/oneapi/ccl/latest", "LD_LIBRARY_PATH": "/opt/intel/oneapi/ccl/latest/lib",
           "SETVARS_COMPLETED": "1", "CCL_ATL_TRANSPORT": "ucx"}
    f = findings(FsHost(ns.root, env))
    assert status(f, "ccl.oneccl") == "pass" and "setvars done" in f["ccl.oneccl"].detail
    assert status(f, "ccl.variable[CCL_ATL_TRANSPORT]") == "warn"
    f = findings(FsHost(ns.root, {"CCL_ROOT": "/opt/old/ccl"}))
    assert status(f, "ccl.oneccl") == "fail"


def test_oneccl_not_checked_without_intel(tmp_path):
    f = findings(FsHost(basic_node(tmp_path).root, {}))
    assert "ccl.oneccl" not in f and "hccl.env" not in f and "tpu.pjrt" not in f


def test_hccl(tmp_path):
    ns = basic_node(tmp_path)
    for i in range(2):
        ns.pci(f"0000:{0x19 + i:02x}:00.0", HABANA, 0x1020, cls=0x120000, driver="habanalabs")
    f = findings(FsHost(ns.root, {}))
    assert status(f, "hccl.env") == "warn" and "initialize_distributed_hpu" in f["hccl.env"].remedy
    f = findings(FsHost(ns.root, {"WORLD_SIZE": "2", "RANK": "0"}))
    assert status(f, "hccl.env") == "fail" and "LOCAL_RANK unset" in f["hccl.env"].title
    f = findings(FsHost(ns.root, {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}))
    assert status(f, "hccl.env") == "pass"
    mpi = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    assert status(findings(FsHost(ns.root, mpi)), "hccl.env") == "pass"


def test_tpu(tmp_path):
    ns = basic_node(tmp_path)
    ns.pci("0000:00:04.0", GOOGLE, 0x005E, cls=0x120000, driver="vfio-pci")
    f = findings(FsHost(ns.root, {}))
    assert status(f, "tpu.pjrt") == "warn" and f["tpu.pjrt"].remedy == "export PJRT_DEVICE=TPU"
    assert status(f, "tpu.lightning_backend") == "warn"
    f = findings(FsHost(ns.root, {"PJRT_DEVICE": "TPU", "PL_TORCH_DISTRIBUTED_BACKEND": "nccl"}))
    assert status(f, "tpu.pjrt") == "pass" and status(f, "tpu.lightning_backend") == "fail"
    f = findings(FsHost(ns.root, {"PJRT_DEVICE": "tpu", "PL_TORCH_DISTRIBUTED_BACKEND": "xla", "XRT_TPU_CONFIG": "x"}))
    assert status(f, "tpu.pjrt") == "pass" and status(f, "tpu.lightning_backend") == "pass"
    assert status(f, "tpu.xrt") == "warn"
    f = findings(FsHost(basic_node(tmp_path / "cpu").root, {"PJRT_DEVICE": "TPU"}))
    assert status(f, "tpu.pjrt") == "fail"


@pytest.fixture
def amd_node(tmp_path):
    ns = basic_node(tmp_path)
    amd_gpu(ns, "0000:03:00.0", 0x744C, 0, 24 * GIB)  # 24 GiB, 1.2 GiB used: 22.8 GiB free
    return ns


def test_window_against_device_memory(amd_node):
    f = findings(FsHost(amd_node.root, {"HOTWEIGHTS_IPC_INFLIGHT_BUCKETS": "4", "HWTUI_BUCKET_MB": "1024"}))
    assert status(f, "knobs.window_memory") == "pass"
    f = findings(FsHost(amd_node.root, {"HOTWEIGHTS_IPC_INFLIGHT_BUCKETS": "16", "HWTUI_BUCKET_MB": "1024"}))
    w = f["knobs.window_memory"]
    assert w.status.value == "warn" and w.data["max_inflight"] == 11  # floor(22.8 GiB / 2 / 1 GiB)
    f = findings(FsHost(amd_node.root, {"HOTWEIGHTS_IPC_INFLIGHT_BUCKETS": "32", "HWTUI_BUCKET_MB": "1024"}))
    assert status(f, "knobs.window_memory") == "fail"
    assert f["knobs.window_memory"].remedy.startswith("export HOTWEIGHTS_IPC_INFLIGHT_BUCKETS=11")


def test_window_against_host_memory_and_bad_knobs(tmp_path):
    ns = basic_node(tmp_path)
    ns.facts(host_runtime={"mem_available": 8 * GIB, "mem_total": 16 * GIB})
    f = findings(FsHost(ns.root, {"HOTWEIGHTS_IPC_INFLIGHT_BUCKETS": "64", "HWTUI_BUCKET_MB": "256",
                                  "HOTWEIGHTS_BCAST_CHUNK_MB": "0.5x"}))
    assert status(f, "knobs.window_memory") == "fail" and "host memory" in f["knobs.window_memory"].title
    assert status(f, "knobs.hotweights_bcast_chunk_mb") == "fail"
    f = findings(FsHost(ns.root, {"HOTWEIGHTS_BCAST_CHUNK_MB": "512"}))
    assert status(f, "knobs.chunk") == "warn"  # 32 MB buckets, window 4: at most 64 MB per broadcast
    assert f["knobs.chunk"].remedy == "export HOTWEIGHTS_BCAST_CHUNK_MB=64"
    f = findings(FsHost(ns.root, {"HOTWEIGHTS_BCAST_CHUNK_MB": "64"}))
    assert "knobs.chunk" not in f
    f = findings(FsHost(basic_node(tmp_path / "bare").root, {}))
    assert status(f, "knobs.window_memory") == "skip"


def test_ucx_devices(tmp_path):
    """hwtui has no UCX path: every UCX finding says so and how NCCL_IB_HCA maps to UCX_NET_DEVICES."""
    ns = nvidia_ib_node(tmp_path, gpus=1)
    f = findings(FsHost(ns.root, {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}))
    u = f["knobs.ucx_net_devices"]
    assert u.title == "no UCX path in hwtui; for UCX programs NCCL_IB_HCA maps to UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1"
    assert "hwtui has no UCX path" in u.detail and "NCCL_IB_HCA=mlx5_0 -> UCX_NET_DEVICES=mlx5_0:1" in u.detail
    f = findings(FsHost(ns.root, {"HOTWEIGHTS_UCX_NET_DEVICES": "mlx5_0:1,eth0"}))
    u = f["knobs.ucx_net_devices"]
    assert u.status.value == "warn" and "hwtui has no UCX path: nothing reads it" in u.title
    assert u.remedy.startswith("unset HOTWEIGHTS_UCX_NET_DEVICES (hwtui never reads it)")
    f = findings(FsHost(ns.root, {"HOTWEIGHTS_UCX_NET_DEVICES": "mlx5_10:1,mlx5_9:1"}))
    u = f["knobs.ucx_net_devices"]
    assert u.status.value == "fail" and "missing mlx5_9:1" in u.title and "inactive mlx5_10:1" in u.title
    assert "hwtui has no UCX path" in u.detail
    f = findings(FsHost(ns.root, {"HOTWEIGHTS_UCX_NET_DEVICES": "mlx5_0:1", "NCCL_IB_HCA": "=mlx5_1"}))
    u = f["knobs.ucx_net_devices"]
    assert u.status.value == "warn" and "for a UCX program: export UCX_NET_DEVICES=mlx5_1:1" in u.remedy


@pytest.fixture
def mounts_node(tmp_path):
    ns = basic_node(tmp_path)
    ns.mounts([("/dev/sda1", "/", "ext4", "rw"), ("fs:/ck", "/shared ck", "nfs4", "rw"),
               ("gcs", "/gcs", "fuse.gcsfuse", "rw"), ("/dev/sdb", "/ro", "xfs", "ro")])
    for d in ("/shared ck/run1", "/gcs/run", "/ro/run", "/local/run"):
        ns.path(d).mkdir(parents=True)
        ns.path(d).chmod(0o777)  # the recorded user (uid 1000) may write there
    return ns


@pytest.mark.parametrize(("path", "env", "want", "text"), [
    ("/shared ck/run1", MULTI, "pass", "nfs4"),
    ("/gcs/run/new/sub", MULTI, "pass", "will be created"),
    ("/local/run", MULTI, "fail", "node-local filesystem (ext4"),
    ("/local/run", {}, "pass", "node-local, fine for a single node"),
    ("/ro/run", {}, "fail", "read-only"),
    ("relative/dir", {}, "warn", "is relative"),
])
def test_checkpoint_dir(mounts_node, path, env, want, text):
    f = findings(FsHost(mounts_node.root, {**env, "HWTUI_CHECKPOINT_DIR": path}))
    c = f["hygiene.checkpoint_dir"]
    assert c.status.value == want and text in c.title


def test_checkpoint_dir_not_writable(mounts_node):
    import os

    os.chmod(mounts_node.path("/local/run"), 0o755)  # owned by the test's uid, the recorded user is uid 1000
    os.chown(mounts_node.path("/local/run"), 0, 0)
    f = findings(FsHost(mounts_node.root, {"HWTUI_CHECKPOINT_DIR": "/local/run"}))
    assert status(f, "hygiene.checkpoint_dir") == "fail" and "not writable" in f["hygiene.checkpoint_dir"].title


@pytest.mark.parametrize(("fact", "marker", "want"), [
    ({"timedatectl": {"NTPSynchronized": "yes"}, "chrony": None}, False, "pass"),
    ({"timedatectl": {"NTPSynchronized": "no"}, "chrony": None}, False, "warn"),
    ({"timedatectl": None, "chrony": {"Leap status": "Not synchronised"}}, False, "warn"),
    ({"timedatectl": None, "chrony": {"Leap status": "Normal", "System time": "0.000012 seconds fast"}}, False, "pass"),
    (None, True, "pass"),
    (None, False, "skip"),
])
def test_clock(tmp_path, fact, marker, want):
    ns = basic_node(tmp_path)
    if fact is not None:
        ns.facts(**{CLOCK_FACT: fact})
    if marker:
        ns.file("/run/systemd/timesync/synchronized", "")
    assert status(findings(FsHost(ns.root, {})), "hygiene.clock") == want
