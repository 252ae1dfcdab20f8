"""FakeNVML: the nvidia-ml-py API answered from recorded data, raising nvidia-ml-py's REAL errors.

Only the library boundary is faked: the probe under test is the real one, and an error is
``pynvml.NVMLError(code)`` (which builds the real subclass, NVMLError_NotSupported and so on), so
the probe's ``except nvml.NVMLError`` and its kind mapping are exercised exactly as on a machine.

Recorded data (tests/data/vendor/nvml_*.json): system fields, ``devices`` with one entry per GPU,
``errors`` per device mapping an NVML function name to the return code it answers with, and a
top-level ``init_error`` code to fail nvmlInit.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml


class FakeNVML:
    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.initialised = 0
        self.calls: list[str] = []

    # -- helpers ----------------------------------------------------------------------------
    def _raise(self, code: int) -> None:
        raise pynvml.NVMLError(code)

    def _check_init(self) -> None:
        if self.initialised <= 0:
            self._raise(pynvml.NVML_ERROR_UNINITIALIZED)

    def _dev(self, handle: Any, fn: str) -> dict[str, Any]:
        self._check_init()
        self.calls.append(fn)
        dev = self.data["devices"][handle]
        code = (dev.get("errors") or {}).get(fn)
        if code:
            self._raise(code)
        return dev

    # -- system -----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.data.get("init_error"):
            self._raise(self.data["init_error"])
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.data["driver_version"]

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init()
        return self.data["cuda_driver_version"]

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check_init()
        return self.data["nvml_version"]

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        if self.data.get("count_error"):
            self._raise(self.data["count_error"])
        return len(self.data["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check_init()
        if index >= len(self.data["devices"]):
            self._raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        code = (self.data["devices"][index].get("errors") or {}).get("nvmlDeviceGetHandleByIndex")
        if code:
            self._raise(code)
        return index

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> int:
        self._check_init()
        want = bus_id.lower()[-12:]
        for i, dev in enumerate(self.data["devices"]):
            if dev["pci_bus_id"].lower()[-12:] == want:
                return i
        self._raise(pynvml.NVML_ERROR_NOT_FOUND)

    # -- per device -------------------------------------------------------------------------
    def nvmlDeviceGetName(self, h):
        return self._dev(h, "nvmlDeviceGetName")["name"]

    def nvmlDeviceGetUUID(self, h):
        return self._dev(h, "nvmlDeviceGetUUID")["uuid"]

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._dev(h, "nvmlDeviceGetPciInfo")["pci_bus_id"])

    def nvmlDeviceGetMinorNumber(self, h):
        return self._dev(h, "nvmlDeviceGetMinorNumber")["minor_number"]

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        """v1 from ``memory``; with ``version`` (nvmlMemory_v2) from ``memory_v2``, which a recorded
        device without it answers as an old driver does: the _v2 entry point is not found."""
        dev = self._dev(h, "nvmlDeviceGetMemoryInfo")
        if not version:
            return SimpleNamespace(**dev["memory"])
        assert version == pynvml.nvmlMemory_v2
        if "memory_v2" not in dev:
            self._raise(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(**dev["memory_v2"])

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(**self._dev(h, "nvmlDeviceGetUtilizationRates")["utilization"])

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._dev(h, "nvmlDeviceGetTemperature")["temperature"]

    def nvmlDeviceGetPowerUsage(self, h):
        return self._dev(h, "nvmlDeviceGetPowerUsage")["power_mw"]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._dev(h, "nvmlDeviceGetEnforcedPowerLimit")["power_limit_mw"]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._dev(h, "nvmlDeviceGetCurrPcieLinkGeneration")["pcie"]["cur_gen"]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._dev(h, "nvmlDeviceGetMaxPcieLinkGeneration")["pcie"]["max_gen"]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._dev(h, "nvmlDeviceGetCurrPcieLinkWidth")["pcie"]["cur_width"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._dev(h, "nvmlDeviceGetMaxPcieLinkWidth")["pcie"]["max_width"]

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        pcie = self._dev(h, "nvmlDeviceGetPcieThroughput")["pcie"]
        return pcie["tx_kbps"] if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else pcie["rx_kbps"]

    def nvmlDeviceGetNvLinkState(self, h, link):
        links = self._dev(h, "nvmlDeviceGetNvLinkState")["nvlink"]
        if links is None:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(links):
            self._raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return tuple(self._dev(h, "nvmlDeviceGetCudaComputeCapability")["compute_capability"])

    def nvmlDeviceGetMigMode(self, h):
        mig = self._dev(h, "nvmlDeviceGetMigMode")["mig"]
        if mig is None:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(mig)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used_memory"])
                for p in self._dev(h, "nvmlDeviceGetComputeRunningProcesses")["processes"]]

    def nvmlDeviceGetProcessUtilization(self, h, since):
        """Recorded ``process_utilization`` samples newer than ``since`` (µs); as the driver answers:
        NotFound when none is newer, NotSupported for a device without the sample buffer."""
        samples = self._dev(h, "nvmlDeviceGetProcessUtilization").get("process_utilization")
        if samples is None:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        newer = [SimpleNamespace(**s) for s in samples if s["timeStamp"] > since]
        if not newer:
            self._raise(pynvml.NVML_ERROR_NOT_FOUND)
        return newer

    def _recorded(self, h, fn, key):
        value = self._dev(h, fn).get(key)
        if value is None:  # not recorded: the board has no such figure (a passive H100 has no fan)
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetClockInfo(self, h, clock):
        clocks = self._recorded(h, "nvmlDeviceGetClockInfo", "clocks")
        return clocks["sm" if clock == pynvml.NVML_CLOCK_SM else "mem"]

    def nvmlDeviceGetFanSpeed(self, h):
        return self._recorded(h, "nvmlDeviceGetFanSpeed", "fan_pct")

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        ecc = self._recorded(h, "nvmlDeviceGetTotalEccErrors", "ecc")
        return ecc["uncorrected" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._recorded(h, "nvmlDeviceGetCurrentClocksEventReasons", "clocks_event_mask")

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        """NVLink KiB counters (recorded ``nvlink_kib``), each field answering NotSupported without them."""
        kib = self._dev(h, "nvmlDeviceGetFieldValues").get("nvlink_kib")
        names = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "tx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "rx"}
        return [SimpleNamespace(fieldId=f, nvmlReturn=pynvml.NVML_ERROR_NOT_SUPPORTED if kib is None else 0,
                                value=SimpleNamespace(ullVal=(kib or {}).get(names.get(f), 0))) for f in field_ids]
