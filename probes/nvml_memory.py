"""A GPU's memory as nvidia-smi reports it: NVML's v2 figures where the driver has them, v1 otherwise.

Why v2: NVML's original ``nvmlDeviceGetMemoryInfo`` counts the memory the driver reserves for itself
as used, so an idle H200 reads 615 MiB "used" where nvidia-smi (which asks for ``nvmlMemory_v2``)
says 0 MiB and lists the 615 MiB as reserved. The TUI and ``--check`` show what nvidia-smi shows;
the reserved part is kept beside it (and recorded, so a replay shows the same figures).
"""

from __future__ import annotations

from typing import Any

V1, V2 = 1, 2


def read_memory(nvml: Any, handle: Any, try_v2: bool = True) -> dict[str, int]:
    """``{"total", "used", "free", "version"}`` (+ ``"reserved"`` with v2), in bytes.

    An NVMLError from the v1 call propagates (the caller records why the field is missing); a
    driver or binding without v2 (FunctionNotFound, a version mismatch, no ``version`` argument)
    falls back to v1 silently, since v1 is then exactly what nvidia-smi shows too. A poller passes
    ``try_v2=False`` once a device answered v1, so an old driver costs one call per tick, not two.
    """
    version = getattr(nvml, "nvmlMemory_v2", None) if try_v2 else None
    if version is not None:
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return {"total": int(mem.total), "used": int(mem.used), "free": int(mem.free),
                    "reserved": int(mem.reserved), "version": V2}
        except TypeError:  # an nvidia-ml-py whose call takes no version
            pass
        except nvml.NVMLError as exc:
            if "lost" in type(exc).__name__.lower():
                raise  # a lost GPU is not an old driver: the caller reports it as lost
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    return {"total": int(mem.total), "used": int(mem.used), "free": int(mem.free), "version": V1}
