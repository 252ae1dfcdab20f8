"""The NVML figures nvitop users look for beyond memory, utilisation, temperature and power:
SM and memory clocks, fan, ECC error counts, clocks-event (throttle) reasons and NVLink traffic.

Shared by the check (``read_device`` records them, so a replay shows them) and the live sampler.
Each figure is read on its own: consumer boards answer NotSupported for ECC and NVLink, passively
cooled data-centre boards for the fan, and one missing figure must not lose the others.
"""

from __future__ import annotations

from typing import Any

from hwtui.probes.nvml_fact import NvmlExtra

_CLOCK_SM, _CLOCK_MEM = 1, 2  # NVML_CLOCK_SM, NVML_CLOCK_MEM
_ECC_CORRECTED, _ECC_UNCORRECTED, _VOLATILE = 0, 1, 0  # since the last driver load, as nvidia-smi -q shows first
_NVLINK_TX, _NVLINK_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX: KiB, all links, cumulative
# nvmlClocksEventReason* bits -> the short name shown (nvidia-smi -q's "Clocks Event Reasons").
REASONS = ((0x1, "idle"), (0x2, "app-clocks"), (0x4, "power-cap"), (0x8, "hw-slowdown"), (0x10, "sync-boost"),
           (0x20, "sw-thermal"), (0x40, "hw-thermal"), (0x80, "power-brake"), (0x100, "display-clocks"))


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS if mask & bit]


def read_extra(nvml: Any, handle: Any, unsupported: dict[str, str] | None = None) -> NvmlExtra:
    """``clocks``, ``fan_pct``, ``ecc``, ``clocks_event`` and ``nvlink_kib`` of one GPU; None where
    the device or the driver has no answer (why, in ``unsupported``)."""
    missing = unsupported if unsupported is not None else {}

    def get(field: str, fn: str, *args: Any) -> Any:
        try:
            return getattr(nvml, fn)(handle, *args)
        except AttributeError:
            missing[field] = f"{fn} missing from this nvidia-ml-py"
        except Exception as exc:  # noqa: BLE001 - NVMLError of any kind: this figure only
            missing[field] = type(exc).__name__.removeprefix("NVMLError_")
        return None

    sm, mem = get("clocks.sm", "nvmlDeviceGetClockInfo", _CLOCK_SM), get("clocks.mem", "nvmlDeviceGetClockInfo", _CLOCK_MEM)
    fan = get("fan", "nvmlDeviceGetFanSpeed")
    unc = get("ecc.uncorrected", "nvmlDeviceGetTotalEccErrors", _ECC_UNCORRECTED, _VOLATILE)
    cor = get("ecc.corrected", "nvmlDeviceGetTotalEccErrors", _ECC_CORRECTED, _VOLATILE)
    mask = get("clocks_event", "nvmlDeviceGetCurrentClocksEventReasons")
    if mask is None and hasattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons"):  # drivers before 535
        mask = get("clocks_event", "nvmlDeviceGetCurrentClocksThrottleReasons")
    return {
        "clocks": None if sm is None and mem is None else {"sm_mhz": _int(sm), "mem_mhz": _int(mem)},
        "fan_pct": _int(fan),
        "ecc": None if unc is None and cor is None else {"uncorrected": _int(unc), "corrected": _int(cor)},
        "clocks_event": None if mask is None else {"mask": int(mask), "reasons": reason_names(int(mask))},
        "nvlink_kib": _nvlink(nvml, handle, missing),
    }


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _nvlink(nvml: Any, handle: Any, missing: dict[str, str]) -> dict[str, int] | None:
    """NVLink data sent and received since the driver loaded, KiB over all links (a rate needs two)."""
    try:
        values = nvml.nvmlDeviceGetFieldValues(handle, [_NVLINK_TX, _NVLINK_RX])
    except AttributeError:
        missing["nvlink_kib"] = "nvmlDeviceGetFieldValues missing from this nvidia-ml-py"
        return None
    except Exception as exc:  # noqa: BLE001
        missing["nvlink_kib"] = type(exc).__name__.removeprefix("NVMLError_")
        return None
    out = {}
    for v, name in zip(values, ("tx", "rx"), strict=False):
        if getattr(v, "nvmlReturn", 1) != 0:
            missing["nvlink_kib"] = "NotSupported"
            return None
        out[name] = int(v.value.ullVal)
    return out if len(out) == 2 else None
