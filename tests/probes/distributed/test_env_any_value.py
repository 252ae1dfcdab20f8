"""Every variable the env checks read: any string yields findings, never an exception.

The checks run end to end (collectors + rules through run_checks) on a recorded node that has
every kind of device, so each vendor's rules are live. An exception inside a rule or collector
would surface as an ``hwtui.rule.*`` / ``hwtui.probe.*`` error finding; none may appear.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtui.core.finding import Status
from hwtui.probes.distributed.launcher import INT_VARS, OTHER_VARS
from hwtui.probes.distributed.visibility import ALL_MASK_VARS
from hwtui.probes.host import FsHost
from tests.machines import GOOGLE, HABANA, intel_gpu
from tests.probes.distributed.netsys import nvidia_ib_node, run_env

VARIABLES = sorted(set(INT_VARS) | set(OTHER_VARS) | set(ALL_MASK_VARS) | {
    "MASTER_ADDR", "MASTER_PORT", "CUDA_DEVICE_ORDER", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX", "NCCL_MESH_GID_INDEX", "NCCL_NET_PLUGIN", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
    "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SHM_DISABLE", "NCCL_CONF_FILE", "HOME", "LD_LIBRARY_PATH",
    "CCL_ROOT", "CCL_ATL_TRANSPORT", "CCL_LOG_LEVEL", "CCL_WORKER_COUNT", "PJRT_DEVICE", "PL_TORCH_DISTRIBUTED_BACKEND",
    "XRT_TPU_CONFIG", "HOTWEIGHTS_IPC_INFLIGHT_BUCKETS", "HOTWEIGHTS_BCAST_CHUNK_MB", "HWTUI_BUCKET_MB",
    "HOTWEIGHTS_BUCKET_MB", "HOTWEIGHTS_UCX_NET_DEVICES", "HWTUI_CHECKPOINT_DIR",
})

BASE_ENV = {"WORLD_SIZE": "8", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0",
            "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "HOME": "/home/alice", "NCCL_IB_HCA": "mlx5",
            "SLURM_PROCID": "1", "SLURM_NTASKS": "8", "OMPI_COMM_WORLD_RANK": "1"}

VALUES = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from(list("^=,:.-_/ 0123456789mlxethGPU[]\x00")), max_size=24),
    st.sampled_from(["", "0", "-1", "99999999999999999999", "=mlx5_0:1", "^lo", "tcp://h:1", "a:b:c", "1(x2)"]),
)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    ns = nvidia_ib_node(tmp_path_factory.mktemp("anyvalue"), gpus=2)
    intel_gpu(ns, "0000:83:00.0", 0x0BD5, 1)
    ns.pci("0000:90:00.0", HABANA, 0x1020, cls=0x120000, driver="habanalabs")
    ns.pci("0000:91:00.0", GOOGLE, 0x005E, cls=0x120000, driver="vfio-pci")
    ns.file("/etc/nccl.conf", "NCCL_DEBUG=WARN\n")
    ns.mounts([("/dev/sda1", "/", "ext4", "rw")])
    return ns


@pytest.mark.parametrize("variable", VARIABLES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES)
def test_any_value_yields_findings(tree, variable, value):
    host = FsHost(tree.root, {**BASE_ENV, variable: value})
    result = run_env(host)
    assert result.findings
    broken = [f for f in result.findings if f.id.startswith(("hwtui.rule.", "hwtui.probe.")) and f.status == Status.ERROR]
    assert not broken, f"{variable}={value!r}: {broken[0].title}\n{broken[0].detail}"
