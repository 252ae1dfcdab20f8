"""Functions that run INSIDE a probe child process (see probes/child.py run_in_child).

They import the heavy or misbehaving vendor runtimes (torch, oneCCL bindings, habana_frameworks,
amdsmi) so hwtui's own process never does. Each returns plain JSON. Every optional part is
wrapped on its own: a missing oneCCL binding must not hide the CUDA devices, and amdsmi without
ROCm prints to stdout and raises KeyError on import, which must come back as a reason, not a
crash.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from typing import Any

_ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
             "HSA_OVERRIDE_GFX_VERSION", "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR", "HABANA_VISIBLE_DEVICES")


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def _pci_of(props: Any) -> str | None:
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    domain = getattr(props, "pci_domain_id", 0) or 0
    device = getattr(props, "pci_device_id", 0) or 0
    return f"{int(domain):04x}:{int(bus):02x}:{int(device):02x}.0"


def _cuda_facts(torch: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"available": False, "device_count": 0, "devices": [], "error": None, "warnings": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["available"] = bool(torch.cuda.is_available())
            if out["available"]:
                out["device_count"] = torch.cuda.device_count()
                for i in range(out["device_count"]):
                    p = torch.cuda.get_device_properties(i)
                    out["devices"].append({
                        "index": i, "name": p.name, "capability": [p.major, p.minor],
                        "total_memory": int(p.total_memory), "multi_processor_count": getattr(p, "multi_processor_count", None),
                        "gcn_arch": getattr(p, "gcnArchName", None) or None, "pci": _pci_of(p),
                    })
            elif torch.version.cuda or torch.version.hip:
                # is_available() swallows the reason; init() raises it ("Found no NVIDIA driver",
                # "The NVIDIA driver on your system is too old", ...).
                try:
                    torch.cuda.init()
                except Exception as exc:  # noqa: BLE001
                    out["error"] = _err(exc)
        except Exception as exc:  # noqa: BLE001
            out["error"] = _err(exc)
    out["warnings"] = [str(w.message)[:500] for w in caught]
    return out


def _xpu_facts(torch: Any) -> dict[str, Any] | None:
    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return None
    out: dict[str, Any] = {"available": False, "device_count": 0, "devices": [], "error": None}
    try:
        out["available"] = bool(xpu.is_available())
        if out["available"]:
            out["device_count"] = xpu.device_count()
            for i in range(out["device_count"]):
                p = xpu.get_device_properties(i)
                dev = {"index": i, "name": p.name, "driver_version": getattr(p, "driver_version", None),
                       "total_memory": int(getattr(p, "total_memory", 0) or 0) or None, "free_memory": None}
                with contextlib.suppress(Exception):
                    free, total = xpu.mem_get_info(i)
                    dev["free_memory"], dev["total_memory"] = int(free), int(total)
                out["devices"].append(dev)
    except Exception as exc:  # noqa: BLE001
        out["error"] = _err(exc)
    return out


def _optional_backend(dist: Any, backend: str, module: str) -> dict[str, Any]:
    """Import the bindings that register ``backend``, then ask torch whether it is there."""
    import importlib

    try:
        importlib.import_module(module)
        return {backend: bool(dist.is_backend_available(backend))}
    except Exception as exc:  # noqa: BLE001 - a broken vendor stack is a finding, not a crash
        return {backend: False, f"{backend}_error": _err(exc)}


def _backends(torch: Any, probe_ccl: bool, probe_hccl: bool) -> dict[str, Any]:
    dist = torch.distributed
    out: dict[str, Any] = {}
    if not dist.is_available():
        return {"distributed": False}
    for name in ("nccl", "gloo", "mpi", "ucc", "xccl"):
        fn = getattr(dist, f"is_{name}_available", None)
        try:
            out[name] = bool(fn()) if fn else None
        except Exception:  # noqa: BLE001
            out[name] = None
    # 'ccl' and 'hccl' register only once their bindings are imported.
    if probe_ccl:
        out.update(_optional_backend(dist, "ccl", "oneccl_bindings_for_pytorch"))
    if probe_hccl:
        out.update(_optional_backend(dist, "hccl", "habana_frameworks.torch.distributed.hccl"))
    return out


def _hpu_facts() -> dict[str, Any]:
    out: dict[str, Any] = {"available": False, "device_count": 0, "names": [], "error": None}
    try:
        import habana_frameworks.torch.hpu as hpu

        out["available"] = bool(hpu.is_available())
        if out["available"]:
            out["device_count"] = hpu.device_count()
            out["names"] = [hpu.get_device_name(i) for i in range(out["device_count"])]
    except Exception as exc:  # noqa: BLE001
        out["error"] = _err(exc)
    return out


def _ipex() -> dict[str, Any] | None:
    try:
        from importlib.metadata import version

        return {"version": version("intel-extension-for-pytorch")}
    except Exception:  # noqa: BLE001 - not installed
        return None


def torch_facts(probe_xpu: bool = True, probe_ccl: bool = False, probe_hpu: bool = False) -> dict[str, Any]:
    """Everything the wheel verdicts need that only an imported torch can say."""
    import torch

    facts: dict[str, Any] = {
        "version": {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
                    "xpu": getattr(torch.version, "xpu", None), "git": getattr(torch.version, "git_version", None)},
        "arch_list": [],
        "env": {k: os.environ[k] for k in _ENV_KEYS if k in os.environ},
    }
    with contextlib.suppress(Exception):
        facts["arch_list"] = list(torch.cuda.get_arch_list())
    facts["cuda"] = _cuda_facts(torch)
    facts["xpu"] = _xpu_facts(torch) if probe_xpu else None
    if probe_xpu and facts["xpu"] is not None:
        with contextlib.suppress(Exception):
            facts["xpu_arch_list"] = list(torch.xpu.get_arch_list())
    facts["hpu"] = _hpu_facts() if probe_hpu else None
    facts["backends"] = _backends(torch, probe_ccl, probe_hpu)
    facts["ipex"] = _ipex()
    return facts


# -- AMD ------------------------------------------------------------------------------------

def _na(value: Any) -> Any:
    return None if value in ("N/A", None) else value


def amdsmi_facts(module: str = "amdsmi") -> dict[str, Any]:
    """amdsmi's view of the AMD GPUs, or why it is not available.

    ``module`` is the import name (tests point it at a fake with the same API).
    """
    import importlib

    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            amdsmi = importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - KeyError('libamd_smi.so') without ROCm
        reason = _err(exc)
        if isinstance(exc, KeyError):
            reason = f"ROCm's {exc.args[0] if exc.args else 'libamd_smi.so'} is not installed ({reason})"
        return {"available": False, "reason": reason, "printed": printed.getvalue()[-500:]}
    out: dict[str, Any] = {"available": True, "reason": None, "rocm_version": None, "devices": []}
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:  # noqa: BLE001
        return {"available": False, "reason": f"amdsmi_init failed: {_err(exc)}", "printed": printed.getvalue()[-500:]}
    try:
        with contextlib.suppress(Exception):
            ok, version = amdsmi.amdsmi_get_rocm_version()
            out["rocm_version"] = version if ok else None
        for i, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
            out["devices"].append(_amd_device(amdsmi, i, handle))
    finally:
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()
    return out


def _amd_device(amdsmi: Any, index: int, handle: Any) -> dict[str, Any]:
    dev: dict[str, Any] = {"index": index, "unsupported": {}}

    def get(field: str, fn: str, *args: Any) -> Any:
        try:
            return getattr(amdsmi, fn)(handle, *args)
        except Exception as exc:  # noqa: BLE001 - AmdSmiLibraryException per unsupported field
            dev["unsupported"][field] = _err(exc)[:200]
            return None

    bdf = get("pci", "amdsmi_get_gpu_device_bdf")
    dev["pci"] = str(bdf).lower() if bdf else None
    asic = get("asic", "amdsmi_get_gpu_asic_info") or {}
    dev["name"] = _na(asic.get("market_name"))
    gfx = _na(asic.get("target_graphics_version"))
    dev["gfx"] = str(gfx) if gfx else None
    vram = get("vram", "amdsmi_get_gpu_vram_usage") or {}
    dev["vram_total"] = None if _na(vram.get("vram_total")) is None else int(vram["vram_total"]) * 2**20
    dev["vram_used"] = None if _na(vram.get("vram_used")) is None else int(vram["vram_used"]) * 2**20
    activity = get("activity", "amdsmi_get_gpu_activity") or {}
    dev["util"] = _na(activity.get("gfx_activity"))
    power = get("power", "amdsmi_get_power_info") or {}
    current = _na(power.get("current_socket_power"))
    dev["power_w"] = current if current is not None else _na(power.get("average_socket_power"))
    limit = _na(power.get("power_limit"))
    # power_limit is in microwatts in ROCm 6.x, watts before; anything above 10 kW is microwatts.
    dev["power_limit_w"] = None if limit is None else (limit / 1e6 if limit > 10000 else limit)
    temp_type = getattr(amdsmi, "AmdSmiTemperatureType", None)
    metric = getattr(amdsmi, "AmdSmiTemperatureMetric", None)
    dev["temp_c"] = None
    if temp_type is not None and metric is not None:
        dev["temp_c"] = _na(get("temperature", "amdsmi_get_temp_metric", temp_type.EDGE, metric.CURRENT))
    driver = get("driver", "amdsmi_get_gpu_driver_info") or {}
    dev["driver_version"] = _na(driver.get("driver_version"))
    return dev
