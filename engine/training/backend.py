"""One device abstraction for every backend the trainer runs on: cuda, hip, xpu, hpu and cpu.

The mixed-vendor design spread ``if backend == 'cuda' ... elif 'xpu'`` over every method. Here the
differences live in one table, :data:`BACKENDS`: each row names the torch device type, how to get
the backend's runtime module (``torch.cuda``, ``torch.xpu``, Habana's ``hpu`` module or a small CPU
stand-in with the same methods), whether bf16 autocast is worth using, and whether fp16 needs a
gradient scaler. :class:`TrainDevice` then calls the runtime without branching on the name.

Facts the table encodes:

* ROCm builds of torch drive AMD GPUs through the ``torch.cuda`` API (``torch.version.hip`` set),
  so ``hip`` uses device type ``cuda`` -- but a CUDA build cannot drive an AMD GPU, which we check.
* bf16 autocast needs no loss scaler (same exponent range as fp32); fp16 does on cuda/hip/xpu.
* CPU autocast in bf16 is slower than fp32 on most CPUs without AMX, so ``auto`` keeps CPU in fp32.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used (start-up time; CPU-only tools)
    import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


class BackendError(RuntimeError):
    """The requested device cannot be used by this torch build / runtime; the message says why."""


class _CpuRuntime:
    """Stands in for ``torch.cuda`` on CPU ranks so :class:`TrainDevice` never branches on 'cpu'."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return os.cpu_count() or 1

    @staticmethod
    def set_device(_device: Any) -> None:
        """CPU ranks have no current device."""

    @staticmethod
    def synchronize(_device: Any = None) -> None:
        """CPU ops are synchronous."""

    @staticmethod
    def Stream(device: Any = None) -> None:  # noqa: N802 - mirrors torch.cuda.Stream
        return None

    @staticmethod
    def mem_get_info(_device: Any = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    @staticmethod
    def memory_reserved(_device: Any = None) -> int:
        import psutil

        return int(psutil.Process().memory_info().rss)

    @staticmethod
    def is_bf16_supported() -> bool:
        return False  # usable, but slower than fp32 on most CPUs: "auto" keeps fp32


class _HpuRuntime:
    """Habana's runtime module with the few calls it spells differently filled in."""

    def __init__(self, module: Any):
        self._m = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._m, name)

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        stats = self._m.memory_stats(device)
        total = int(stats.get("Limit", 0))
        return total - int(stats.get("InUse", 0)), total

    def memory_reserved(self, device: Any = None) -> int:
        return int(self._m.memory_stats(device).get("InUse", 0))

    @staticmethod
    def is_bf16_supported() -> bool:
        return True

    def Stream(self, device: Any = None) -> Any:  # noqa: N802
        return self._m.Stream()


def _torch_module(name: str) -> Callable[[], Any]:
    def load() -> Any:
        import torch

        module = getattr(torch, name, None)
        if module is None:
            raise BackendError(f"this torch build ({torch.__version__}) has no torch.{name}")
        return module

    return load


def _hpu() -> Any:
    try:
        importlib.import_module("habana_frameworks.torch.core")
        return _HpuRuntime(importlib.import_module("habana_frameworks.torch.hpu"))
    except ImportError as exc:
        raise BackendError(f"hpu needs Habana's habana_frameworks.torch ({exc})") from None


def _check_cuda_build() -> None:
    import torch

    if torch.version.cuda is None:
        raise BackendError(f"cuda device requested but torch {torch.__version__} is not a CUDA build "
                           f"(install from https://download.pytorch.org/whl/cu128)")


def _check_hip_build() -> None:
    import torch

    if getattr(torch.version, "hip", None) is None:
        raise BackendError(f"hip device requested but torch {torch.__version__} is not a ROCm build "
                           f"(install from https://download.pytorch.org/whl/rocm6.4; set HWTUI_PYTHON_HIP to "
                           f"an interpreter that has one to mix it with a CUDA build)")


@dataclass(frozen=True)
class BackendSpec:
    name: str
    torch_type: str  # the device type torch uses
    runtime: Callable[[], Any]  # -> module-like object (is_available, set_device, synchronize, ...)
    fp16_needs_scaler: bool
    check_build: Callable[[], None] = lambda: None


BACKENDS: dict[str, BackendSpec] = {
    "cuda": BackendSpec("cuda", "cuda", _torch_module("cuda"), True, _check_cuda_build),
    "hip": BackendSpec("hip", "cuda", _torch_module("cuda"), True, _check_hip_build),
    "xpu": BackendSpec("xpu", "xpu", _torch_module("xpu"), True),
    "hpu": BackendSpec("hpu", "hpu", _hpu, False),
    "cpu": BackendSpec("cpu", "cpu", lambda: _CpuRuntime(), False),
}


class TrainDevice:
    """One device as the trainer sees it, whatever its vendor."""

    def __init__(self, backend: str, index: int):
        if backend not in BACKENDS:
            raise BackendError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
        self.spec = BACKENDS[backend]
        self.index = index
        self.spec.check_build()
        self.runtime = self.spec.runtime()
        if not self.runtime.is_available():
            raise BackendError(f"{backend}:{index}: torch.{self.spec.torch_type} is not available "
                               f"(driver not loaded or no device visible to this process)")
        count = self.runtime.device_count()
        if self.spec.name != "cpu" and index >= count:
            raise BackendError(f"{backend}:{index}: this process sees only {count} {backend} device(s)")

    @property
    def name(self) -> str:
        return f"{self.spec.name}:{self.index}"

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device("cpu") if self.spec.torch_type == "cpu" else torch.device(self.spec.torch_type, self.index)

    def set_device(self) -> None:
        self.runtime.set_device(self.device)

    def synchronize(self) -> None:
        self.runtime.synchronize(self.device)

    def stream(self) -> Any:
        """A side stream for overlap (None on CPU, where everything is synchronous)."""
        return self.runtime.Stream(device=self.device)

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes on the device (host RAM for CPU ranks)."""
        free, total = self.runtime.mem_get_info(self.device)
        return int(free), int(total)

    def memory_used(self) -> int:
        """Bytes this process holds on the device (resident set size for CPU ranks)."""
        return int(self.runtime.memory_reserved(self.device))

    def bf16_supported(self) -> bool:
        probe = getattr(self.runtime, "is_bf16_supported", None)
        try:
            return bool(probe()) if probe else False
        except Exception:  # some runtimes raise instead of answering False
            return False

    def resolve_precision(self, requested: str) -> str:
        """``auto`` -> bf16 where the device does it natively, else fp32; explicit choices are kept."""
        if requested not in PRECISIONS:
            raise BackendError(f"precision {requested!r}: use one of {', '.join(PRECISIONS)}")
        if requested == "auto":
            return "bf16" if self.bf16_supported() else "fp32"
        return requested

    def autocast(self, precision: str) -> contextlib.AbstractContextManager[Any]:
        """The autocast context for this backend; fp32 gets a no-op context."""
        import torch

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.spec.torch_type, dtype=dtype)

    def grad_scaler(self, precision: str) -> torch.amp.GradScaler | None:
        """A GradScaler only where one is needed: fp16 on backends whose fp16 underflows (not bf16)."""
        if precision != "fp16" or not self.spec.fp16_needs_scaler:
            return None
        import torch

        return torch.amp.GradScaler(self.spec.torch_type)
