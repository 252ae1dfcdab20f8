"""The environment variables the probes read: the only ones ``hwtui snapshot`` records.

A snapshot is meant to be shared, and an environment holds database passwords, CI tokens and
webhook URLs under names no redaction rule can guess, so the snapshot keeps an allow-list rather
than masking a deny-list. Tests in tests/adversarial/test_secrets.py derive the names from the code and
fail when this list misses one: a static scan of every ``env.get("X")``, ``env["X"]``, ``"X" in env``
and ``*_VARS`` table under probes/, and a run of every probe on every recorded machine through a
:class:`~hwtui.probes.host.RecordingHost` that notes each name looked up. Another asserts
docs/trust.md documents exactly these names. A snapshot also keeps any name a probe looked
up during that run, so a forgotten entry costs replay fidelity, never a secret.
"""

from __future__ import annotations

# Grouped by the probe that reads them.
PROBE_ENV_NAMES: frozenset[str] = frozenset({
    # host and library paths (host.which, libpaths, nccl conf lookup, torch cache, hostinfo)
    "PATH", "HOME", "LD_LIBRARY_PATH", "XDG_CACHE_HOME", "container",
    # launcher / job shape (probes/distributed/launcher.py)
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "NPROC_PER_NODE", "NNODES", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NNODES", "SLURM_NODEID",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "PET_NNODES",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
    # rendezvous
    "MASTER_ADDR", "MASTER_PORT",
    # device visibility
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "HABANA_VISIBLE_MODULES",
    "CUDA_DEVICE_ORDER", "HSA_OVERRIDE_GFX_VERSION", "ONEAPI_DEVICE_SELECTOR",
    "HABANA_VISIBLE_DEVICES",
    # NCCL, gloo, InfiniBand
    "NCCL_CONF_FILE", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA",
    "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET_PLUGIN", "NCCL_IB_GID_INDEX",
    "NCCL_MESH_GID_INDEX",
    # engine knobs and hygiene
    "HWTUI_BUCKET_MB", "HOTWEIGHTS_BUCKET_MB", "HOTWEIGHTS_BCAST_CHUNK_MB", "HOTWEIGHTS_IPC_INFLIGHT_BUCKETS", "HOTWEIGHTS_UCX_NET_DEVICES",
    "HWTUI_CHECKPOINT_DIR",
    # vendor collective libraries and runtimes (oneCCL, HCCL, TPU)
    "SETVARS_COMPLETED", "PJRT_DEVICE", "PL_TORCH_DISTRIBUTED_BACKEND", "XRT_TPU_CONFIG",
    # frameworks and GPU-direct storage (probes/frameworks.py, probes/gds.py, probes/vendor_envs.py)
    "ACCELERATE_CONFIG_FILE", "HF_HOME", "PWD", "XDG_CONFIG_HOME", "CUDA_HOME", "CUDA_PATH", "CUFILE_ENV_PATH_JSON",
    "KVIKIO_COMPAT_MODE", "XDG_DATA_HOME",
})

# Families a probe scans as a whole (``any(k.startswith("TORCHELASTIC_") ...)``, oneCCL's CCL_*,
# NCCL_* for the conf-file overlay).
PROBE_ENV_PREFIXES: tuple[str, ...] = ("NCCL_", "CCL_", "TORCHELASTIC_", "HCCL_")


def probe_reads(name: str) -> bool:
    """Whether ``name`` is a variable the probes read (and a snapshot may therefore record)."""
    return name in PROBE_ENV_NAMES or name.startswith(PROBE_ENV_PREFIXES)
