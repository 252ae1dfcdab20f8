"""Which transport moves the buckets, decided once per run and announced in one line.

The lines are the vendor guide's, so scripts that grep for them keep working:

- NVIDIA, one rank per GPU: NCCL broadcast, "Using GPU broadcast transport (NCCL)." (inside a
  node NCCL itself may go GPU to GPU over P2P/NVLink; that is NCCL's doing, not hwtui's IPC).
- NVIDIA, more local ranks than GPUs (two ranks on one GPU), chosen without a flag, or
  ``--transport cuda-ipc`` in one node: "Using SOTA CUDA-IPC Transport Layer." -- hwtui's own
  CUDA IPC path (ipc_protocol.py via ipc_path.py: the source exports each bucket by handle, the
  receivers copy it device to device and verify it on the device). The world under it is gloo
  (control, votes), which, unlike NCCL, accepts several ranks on one GPU.
- NVIDIA across nodes: NCCL broadcast (IPC cannot cross a node).
- AMD ROCm: RCCL broadcast, "Using GPU broadcast transport (no IPC)."
- Intel XPU: oneCCL, "Using GPU broadcast transport (Intel oneCCL)." (backend ``xccl`` in
  upstream torch >= 2.8, else ``ccl`` from oneccl_bindings_for_pytorch)
- Intel Gaudi: HCCL.
- CPU: gloo, the embedded default.

``--transport`` overrides the choice; an override that cannot work on the device is bad input.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from hwtui.core.errors import HwtuiError

LINES = {
    "cuda-ipc": "Using SOTA CUDA-IPC Transport Layer.",
    "nccl": "Using GPU broadcast transport (NCCL).",
    "rccl": "Using GPU broadcast transport (no IPC).",
    "xccl": "Using GPU broadcast transport (Intel oneCCL).",
    "ccl": "Using GPU broadcast transport (Intel oneCCL).",
    "hccl": "Using GPU broadcast transport (Habana HCCL).",
    "gloo": "Using CPU broadcast transport (gloo).",
}
# cuda-ipc: the bytes go by IPC handle; the world (control, votes) runs on gloo, which, unlike
# NCCL, accepts several ranks on one GPU.
BACKENDS = {"cuda-ipc": "gloo", "nccl": "nccl", "rccl": "nccl", "xccl": "xccl", "ccl": "ccl", "hccl": "hccl", "gloo": "gloo"}
DEVICES = {"cuda-ipc": {"cuda"}, "nccl": {"cuda"}, "rccl": {"cuda"}, "xccl": {"xpu"}, "ccl": {"xpu"}, "hccl": {"hpu"},
           "gloo": {"cpu", "cuda", "xpu", "hpu"}}
TRANSPORTS = tuple(LINES)
# The replicate ranks move buckets through ipc_protocol (ipc_path.py): "cuda-ipc" may be chosen and
# its line is true. Without that path no run may claim it (the choice falls back to gloo).
IPC_CARRIES_REPLICATE = True


@dataclass(frozen=True)
class TransportChoice:
    name: str
    backend: str  # torch.distributed backend
    comm_device: str  # where the bucket buffers live for the collective
    line: str  # the vendor guide's log line
    reason: str

    def decision_line(self) -> str:
        return f"{self.line} [transport={self.name} backend={self.backend}; {self.reason}]"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_transport(device: str, override: str | None = None, *, rocm: bool = False, multi_node: bool = False,
                     xccl_available: bool = False, shared_gpu: bool = False) -> TransportChoice:
    """Pure decision (facts passed in), so every vendor branch is testable on any machine.

    ``shared_gpu``: more ranks on this node than GPUs visible to them (NCCL refuses that).
    """
    if override == "cuda-ipc" and not IPC_CARRIES_REPLICATE:
        raise HwtuiError("--transport cuda-ipc: hwtui's CUDA IPC path does not carry replicate buckets yet "
                         "(use nccl, or gloo when ranks share a GPU)")
    if override:
        if override not in LINES:
            raise HwtuiError(f"unknown --transport {override!r} (choose from {', '.join(TRANSPORTS)})")
        if device not in DEVICES[override]:
            raise HwtuiError(f"--transport {override} cannot move buckets on --device {device}")
        if override == "cuda-ipc" and multi_node:
            raise HwtuiError("--transport cuda-ipc works inside one node; these ranks span nodes (use nccl)")
        if override == "cuda-ipc" and rocm:
            raise HwtuiError("--transport cuda-ipc is not available on ROCm (use rccl)")
        name, reason = override, "chosen with --transport"
    elif device == "cpu":
        name, reason = "gloo", "device cpu: gloo over TCP is the embedded default"
    elif device == "cuda" and rocm:
        name, reason = "rccl", "AMD ROCm build (torch.version.hip set): RCCL broadcast, CUDA IPC unavailable"
    elif device == "cuda" and multi_node:
        name, reason = "nccl", "NVIDIA GPUs on several nodes: NCCL broadcast (CUDA IPC stops at the node)"
    elif device == "cuda" and shared_gpu and IPC_CARRIES_REPLICATE:
        name, reason = "cuda-ipc", "ranks share a GPU in one node: CUDA IPC handles, copied device to device"
    elif device == "cuda" and shared_gpu:
        name, reason = "gloo", "more ranks than GPUs on this node: NCCL refuses two ranks on one GPU, gloo does not"
    elif device == "cuda":
        name, reason = "nccl", "one rank per NVIDIA GPU: NCCL broadcast"
    elif device == "xpu":
        name = "xccl" if xccl_available else "ccl"
        reason = "Intel XPU: oneCCL via " + ("torch's built-in xccl backend" if xccl_available else "oneccl_bindings_for_pytorch")
    elif device == "hpu":
        name, reason = "hccl", "Intel Gaudi: HCCL via habana_frameworks"
    else:
        raise HwtuiError(f"unknown --device {device!r} (cpu, cuda, xpu or hpu)")
    comm = "cpu" if BACKENDS[name] == "gloo" else device
    return TransportChoice(name, BACKENDS[name], comm, LINES[name], reason)


def torch_build(version_py: str | None = None) -> dict[str, str | None]:
    """``__version__``, ``cuda``, ``hip``, ``xpu`` from torch/version.py, parsed, never imported:
    the launcher must not pay for (or crash on) ``import torch``; only the workers import it."""
    import importlib.util
    import re
    from pathlib import Path

    if version_py is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.origin:
            from hwtui.core.install_hint import install_command

            raise HwtuiError(f"torch is not installed: {install_command('engine')}")
        version_py = str(Path(spec.origin).with_name("version.py"))
    try:
        text = Path(version_py).read_text(encoding="utf-8")
    except OSError:
        return {"__version__": None, "cuda": None, "hip": None, "xpu": None}
    out: dict[str, str | None] = {}
    for key in ("__version__", "cuda", "hip", "xpu"):
        m = re.search(rf"^{key}\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        out[key] = m.group(1) if m else None
    return out


# The wheel that drives each device (pip install torch --index-url ...): named in the error so the
# fix is one copy-paste. The CUDA/ROCm versions are the current stable ones of pytorch.org.
WHEELS = {
    "cuda": "pip install torch --index-url https://download.pytorch.org/whl/cu128",
    "hip": "pip install torch --index-url https://download.pytorch.org/whl/rocm6.4",
    "xpu": "pip install torch --index-url https://download.pytorch.org/whl/xpu",
    "hpu": "install Intel Gaudi's PyTorch (habana_frameworks) from the Gaudi software stack",
}


def validate_device(device: str, build: dict[str, str | None] | None = None, *,
                    habana: bool | None = None) -> str:
    """The torch device a ``--device`` runs on, or bad input naming the wheel to install.

    Checked from torch/version.py (never by importing torch), before any transport is chosen or
    announced: a torch that cannot drive the device must not print a vendor's transport line and
    then fail inside a worker. ``hip`` is an AMD GPU, which a ROCm build of torch drives as "cuda".
    """
    if device == "cpu":
        return "cpu"
    if device not in WHEELS:
        raise HwtuiError(f"unknown --device {device!r} (cpu, cuda, hip, xpu or hpu)")
    build = build if build is not None else torch_build()
    version = build.get("__version__") or "unknown"
    if device == "cuda" and not (build.get("cuda") or build.get("hip")):
        raise HwtuiError(f"--device cuda needs a CUDA (or ROCm) build of torch; this torch {version} has neither: {WHEELS['cuda']}")
    if device == "hip" and not build.get("hip"):
        raise HwtuiError(f"--device hip needs a ROCm build of torch; this torch {version} is not one: {WHEELS['hip']}")
    if device == "xpu" and not build.get("xpu"):
        raise HwtuiError(f"--device xpu needs an XPU build of torch; this torch {version} is not one: {WHEELS['xpu']}")
    if device == "hpu":
        if habana is None:
            import importlib.util

            habana = importlib.util.find_spec("habana_frameworks") is not None
        if not habana:
            raise HwtuiError(f"--device hpu needs habana_frameworks, which is not installed: {WHEELS['hpu']}")
    return "cuda" if device == "hip" else device


def detect_facts(device: str, env: dict[str, str], build: dict[str, str | None] | None = None) -> dict[str, bool]:
    """The facts choose_transport needs, from the torch build and the launcher environment."""
    build = build if build is not None else torch_build()
    world = int(env.get("WORLD_SIZE", "1") or 1)
    local = int(env.get("LOCAL_WORLD_SIZE", str(world)) or world)
    version = (build.get("__version__") or "0.0").split("+")[0].split(".")
    try:
        major_minor = (int(version[0]), int(version[1]))
    except (ValueError, IndexError):
        major_minor = (0, 0)
    # Upstream XPU wheels ship the xccl backend from torch 2.8 on; older setups need oneCCL bindings.
    xccl = bool(build.get("xpu")) and major_minor >= (2, 8)
    facts = {"rocm": bool(build.get("hip")), "multi_node": local < world, "xccl_available": xccl}
    if device == "cuda" and not facts["rocm"]:
        gpus = visible_nvidia_gpus(env)
        facts["shared_gpu"] = gpus is not None and local > gpus
    return facts


def visible_nvidia_gpus(env: dict[str, str], proc_gpus: str = "/proc/driver/nvidia/gpus") -> int | None:
    """How many NVIDIA GPUs the ranks will see, without importing torch: the driver's list under
    /proc, narrowed by CUDA_VISIBLE_DEVICES; None when it cannot tell (no driver here)."""
    try:
        present = len(os.listdir(proc_gpus))
    except OSError:
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    # torch stops at the first entry it cannot parse; "" and "-1" hide every GPU.
    n = 0
    for item in visible.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        n += 1
    return min(n, present)


def prepare_backend(choice: TransportChoice, local_rank: int) -> None:
    """Vendor imports and device binding that must happen before init_process_group."""
    import importlib

    import torch

    if choice.comm_device == "cuda":
        torch.cuda.set_device(local_rank % max(1, torch.cuda.device_count()))
    elif choice.comm_device == "xpu":
        torch.xpu.set_device(local_rank % max(1, torch.xpu.device_count()))
        if choice.backend == "ccl":
            importlib.import_module("oneccl_bindings_for_pytorch")
    elif choice.comm_device == "hpu":
        # Gaudi wants WORLD_SIZE/RANK/LOCAL_RANK in the environment before this import (they are).
        importlib.import_module("habana_frameworks.torch.distributed.hccl")
