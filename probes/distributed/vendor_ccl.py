"""Intel oneCCL, Gaudi HCCL and TPU PJRT environments.

Each of these stacks reads its configuration once, at import or first use, from the environment:
oneCCL needs its runtime on the library path (``setvars.sh``), the Gaudi bridge reads WORLD_SIZE /
RANK / LOCAL_RANK when ``habana_frameworks.torch.distributed.hccl`` is imported, and torch_xla and
Lightning pick their runtime and backend from PJRT_DEVICE and PL_TORCH_DISTRIBUTED_BACKEND. None of
them can be fixed after the fact from inside the process, so they are checked before it starts.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping

from hwtui.core.finding import Finding, fail, passed, skip, warn
from hwtui.probes.distributed.parsers import parse_choice, parse_int
from hwtui.probes.framework import Facts, Rule
from hwtui.probes.host import Host
from hwtui.probes.inventory import devices_from_facts

ONEAPI_SETVARS = ("/opt/intel/oneapi/setvars.sh",)
# The setvars.sh that the oneccl_bindings_for_pytorch wheel ships, for hosts without oneAPI.
ONECCL_BINDINGS_SETVARS_PATH = '$(python -c "import oneccl_bindings_for_pytorch as t; print(t.cwd)")/env/setvars.sh'
ONECCL_BINDINGS_SETVARS = f"source {ONECCL_BINDINGS_SETVARS_PATH}"
CCL_LIBS = ("libccl.so", "libccl.so.1")
PJRT_DEVICES = ("TPU", "CPU", "CUDA", "ROCM", "XPU", "NEURON")


def _backends(facts: Facts) -> set[str]:
    return {d.backend for d in devices_from_facts(facts) if d.usable}


def _ccl_lib_dirs(host: Host, env: Mapping[str, str]) -> list[str]:
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    return [d for d in dirs if any(host.exists(posixpath.join(d, lib)) for lib in CCL_LIBS)]


def oneccl_findings(facts: Facts) -> Iterator[Finding]:
    host = facts.host
    env = host.env if host else {}
    intel = "xpu" in _backends(facts)
    ccl_vars = [k for k in env if k.startswith("CCL_")]
    if not intel and not ccl_vars:
        return
    setvars = next((p for p in ONEAPI_SETVARS if host and host.exists(p)), None)
    remedy = f"source {setvars}" if setvars else ONECCL_BINDINGS_SETVARS
    root = env.get("CCL_ROOT")
    lib_dirs = _ccl_lib_dirs(host, env) if host else []
    if root is not None and host and ("\x00" in root or not host.is_dir(root)):
        yield fail("ccl.oneccl", f"CCL_ROOT={root} does not exist", "A stale setvars from another install.", remedy)
    elif lib_dirs:
        yield passed("ccl.oneccl", "oneCCL runtime on the library path", ", ".join(lib_dirs) +
                     (" (setvars done)" if env.get("SETVARS_COMPLETED") == "1" else ""))
    elif root is not None:
        yield warn("ccl.oneccl", f"CCL_ROOT={root} is set but no directory on LD_LIBRARY_PATH holds libccl.so",
                   "The 'ccl' backend fails to load its runtime.", remedy)
    else:
        yield warn("ccl.oneccl", "oneCCL environment not set (CCL_ROOT unset, libccl.so not on LD_LIBRARY_PATH)",
                   "The 'ccl' backend of oneccl_bindings_for_pytorch needs it; torch 2.8+'s built-in 'xccl' backend "
                   "ships its own and does not.", remedy)
    checks = {
        "CCL_ATL_TRANSPORT": lambda raw: parse_choice(raw, "CCL_ATL_TRANSPORT", ("ofi", "mpi")).problems,
        "CCL_LOG_LEVEL": lambda raw: parse_choice(raw, "CCL_LOG_LEVEL", ("error", "warn", "info", "debug", "trace")).problems,
        "CCL_WORKER_COUNT": lambda raw: parse_int(raw, "CCL_WORKER_COUNT", 1, 256).problems,
    }
    for name, check in checks.items():
        if name in env:
            problems = check(env[name])
            if problems:
                yield warn(f"ccl.variable[{name}]", problems[0], "oneCCL rejects the value at init.", f"unset {name}")


def hccl_findings(facts: Facts) -> Iterator[Finding]:
    env = facts.host.env if facts.host else {}
    gaudi = [d for d in devices_from_facts(facts) if d.usable and d.backend == "hpu"]
    if not gaudi:
        return
    torch_vars = ("WORLD_SIZE", "RANK", "LOCAL_RANK")
    mpi_vars = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
    have = [v for v in torch_vars if v in env]
    if len(have) == 3:
        yield passed("hccl.env", "WORLD_SIZE, RANK and LOCAL_RANK are set for the hccl import",
                     f"world {env['WORLD_SIZE']}, rank {env['RANK']}, local rank {env['LOCAL_RANK']}")
    elif all(v in env for v in mpi_vars):
        yield passed("hccl.env", "launched by mpirun: the Gaudi bridge maps OMPI_COMM_WORLD_* itself")
    elif have:
        missing = [v for v in torch_vars if v not in env]
        yield fail("hccl.env", f"{', '.join(missing)} unset while {', '.join(have)} is set",
                   "habana_frameworks.torch.distributed.hccl reads all three when it is imported; setting them later "
                   "has no effect.", f"export {' '.join(f'{v}=<value>' for v in missing)} before starting Python, or call "
                   "hccl.initialize_distributed_hpu(world_size, rank, local_rank) before init_process_group")
    elif len(gaudi) > 1:
        yield warn("hccl.env", f"{len(gaudi)} Gaudi devices but WORLD_SIZE/RANK/LOCAL_RANK are unset",
                   "A custom launcher must set them before importing habana_frameworks.torch.distributed.hccl.",
                   "torchrun --nproc-per-node=" + str(len(gaudi)) + " train.py (or call "
                   "hccl.initialize_distributed_hpu(world_size, rank, local_rank) before the import is used)")
    else:
        yield skip("hccl.env", "single Gaudi device and no launcher: HCCL is not used")


def tpu_findings(facts: Facts) -> Iterator[Finding]:
    env = facts.host.env if facts.host else {}
    tpu = "tpu" in _backends(facts)
    raw = env.get("PJRT_DEVICE")
    if not tpu:
        if raw is not None and raw.strip().upper() == "TPU":
            yield fail("tpu.pjrt", "PJRT_DEVICE=TPU but this node has no TPU", "torch_xla fails to create a client.",
                       "unset PJRT_DEVICE (or export PJRT_DEVICE=CPU)")
        return
    if raw is None:
        yield warn("tpu.pjrt", "PJRT_DEVICE is unset on a TPU host",
                   "torch_xla guesses the device (with a warning) and older releases fall back to CPU.",
                   "export PJRT_DEVICE=TPU")
    else:
        choice = parse_choice(raw, "PJRT_DEVICE", PJRT_DEVICES)
        if choice.value == "TPU":
            yield passed("tpu.pjrt", "PJRT_DEVICE=TPU")
        elif choice.value is None:
            yield fail("tpu.pjrt", choice.problems[0], "torch_xla refuses an unknown PJRT device.", "export PJRT_DEVICE=TPU")
        else:
            yield warn("tpu.pjrt", f"PJRT_DEVICE={raw} on a TPU host: the TPUs go unused", "", "export PJRT_DEVICE=TPU")
    if "XRT_TPU_CONFIG" in env:
        yield warn("tpu.xrt", "XRT_TPU_CONFIG is set: the XRT runtime was removed in torch_xla 2.x",
                   "PJRT ignores it; stale XRT settings mislead other tools.", "unset XRT_TPU_CONFIG")
    backend = env.get("PL_TORCH_DISTRIBUTED_BACKEND")
    if backend is None:
        yield warn("tpu.lightning_backend", "PL_TORCH_DISTRIBUTED_BACKEND is unset on a TPU host",
                   "The hardware guide exports it for PyTorch Lightning on TPU.", "export PL_TORCH_DISTRIBUTED_BACKEND=xla")
    elif backend.strip().lower() != "xla":
        yield fail("tpu.lightning_backend", f"PL_TORCH_DISTRIBUTED_BACKEND={backend!r} on a TPU host",
                   "Lightning would initialise a GPU/CPU process group on TPU workers.",
                   "export PL_TORCH_DISTRIBUTED_BACKEND=xla")
    else:
        yield passed("tpu.lightning_backend", "PL_TORCH_DISTRIBUTED_BACKEND=xla")


def vendor_rules(facts: Facts) -> Iterator[Finding]:
    yield from oneccl_findings(facts)
    yield from hccl_findings(facts)
    yield from tpu_findings(facts)


RULES = [Rule("vendor_ccl", vendor_rules, "env", needs=("pci",))]
