"""Live per-device figures for the dashboard: one ``sample()`` per tick, about a millisecond a device.

Nothing is spawned per sample. NVML handles are opened once and kept; AMD and Intel figures are
sysfs reads (amdgpu's mem_info_vram_*, gpu_busy_percent and hwmon; Intel's hwmon energy counter,
turned into watts from the difference between two ticks); the CPU entry comes from psutil.

On a host that is not live (``--sysroot`` tree or ``--replay`` snapshot) the same call returns
the figures recorded with the machine (NVML's answer, the sysfs files, /proc/meminfo), so the TUI
can show a colleague's machine exactly as it was captured.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from hwtui.probes.devices import Device
from hwtui.probes.host import FactUnavailable, Host
from hwtui.probes.host_counters import host_memory
from hwtui.probes.nvml_extra import read_extra
from hwtui.probes.nvml_memory import V2, read_memory
from hwtui.probes.sysfs_gpu import hwmon_dir, read_sysfs_gpu


@dataclass
class DeviceSample:
    key: str  # "cuda:0", "hip:0", ..., "cpu"
    name: str
    mem_used: int | None  # bytes
    mem_total: int | None
    util: float | None  # percent
    temp_c: float | None
    power_w: float | None
    power_limit_w: float | None
    # The detail figures (issue 25): None where the device or driver does not say.
    sm_clock_mhz: int | None = None  # graphics / SM clock (amdgpu: sclk)
    mem_clock_mhz: int | None = None
    fan_pct: int | None = None
    pcie_gen: int | None = None  # the link as it runs now (it drops at idle to save power)
    pcie_width: int | None = None
    pcie_rx_kbps: int | None = None  # KB/s, as NVML reports it
    pcie_tx_kbps: int | None = None
    nvlink_up: int | None = None  # links up; None: no NVLink
    nvlink_rx_kbps: float | None = None  # KiB/s over all links, between two ticks (live only)
    nvlink_tx_kbps: float | None = None
    ecc_uncorrected: int | None = None  # since the driver loaded
    ecc_corrected: int | None = None
    throttle: tuple[str, ...] | None = None  # NVML clocks-event reasons; () when none

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)



class DeviceHistoryView(Protocol):
    """What a display reads of the recent samples (the TUI's ``DeviceHistory`` keeps them): the widgets
    below the app are typed by this, and mypy checks that the app's history still provides it."""

    @property
    def latest(self) -> Mapping[str, DeviceSample]:
        """device key -> its newest sample."""

    @property
    def series(self) -> Mapping[str, Mapping[str, Sequence[float | None]]]:
        """device key -> metric ("util", "temp_c", "power_w") -> its recent readings, oldest first."""

    def keys(self) -> list[str]: ...

class Sampler:
    """Keep what is expensive to open (NVML handles, hwmon paths); read the cheap figures per tick."""

    def __init__(self, host: Host, devices: list[Device] | None = None, nvml: Any = None):
        self.host = host
        if devices is None:
            from hwtui.probes.inventory import detect_devices

            devices, _ = detect_devices(host)
        self.devices = [d for d in devices if d.usable and d.device]
        self._nvml: Any = None
        self._handles: dict[str, Any] = {}
        self._power_limits: dict[str, float | None] = {}
        self._memory_v2: dict[str, bool] = {}  # pci -> the driver answers NVML memory v2
        self._hwmon = {d.pci: hwmon_dir(host, d.pci) for d in self.devices if d.backend in ("hip", "xpu")}
        self._energy: dict[str, tuple[float, int]] = {}
        self._nvlink: dict[str, tuple[float, int, int]] = {}  # pci -> (time, tx KiB, rx KiB) of the last tick
        self._nvlink_up: dict[str, int | None] = {}  # links up: read once (a link going down is a reset)
        self._recorded_nvml: dict[str, dict[str, Any]] = {}
        self._closed = False
        self._cpu_name = _cpu_name(host)  # /proc/cpuinfo is large on big machines: read it once
        if host.is_live:
            self._open_nvml(nvml)
            self._prime_cpu()
        else:
            self._load_recorded_nvml()

    # -- setup ------------------------------------------------------------------------------
    def _open_nvml(self, nvml: Any) -> None:
        nv = [d for d in self.devices if d.backend == "cuda"]
        if not nv:
            return
        if nvml is None:
            from hwtui.probes.nvidia import import_pynvml

            nvml = import_pynvml()
        if nvml is None:
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError:
            return  # the check reports why; the dashboard shows empty cells
        self._nvml = nvml
        for dev in nv:
            try:
                self._handles[dev.pci] = nvml.nvmlDeviceGetHandleByPciBusId(dev.pci)
            except nvml.NVMLError:
                continue

    def _load_recorded_nvml(self) -> None:
        try:
            recorded: dict[str, Any] | None = self.host.fact("nvml", lambda: None)
        except FactUnavailable:
            return
        nvml = recorded or {}
        self._recorded_nvml = {d["pci"]: d for d in nvml.get("devices") or [] if d.get("pci")}

    def _prime_cpu(self) -> None:
        try:
            import psutil

            psutil.cpu_percent(interval=None)  # the first call only starts the measurement window
        except Exception:  # noqa: BLE001
            pass

    # -- per tick ---------------------------------------------------------------------------
    def sample(self) -> list[DeviceSample]:
        out = [self._sample_device(d) for d in self.devices]
        out.append(self._sample_cpu())
        return out

    def _sample_device(self, dev: Device) -> DeviceSample:
        key = dev.device or dev.pci
        if dev.backend == "cuda":
            return self._sample_nvidia(dev, key)
        if dev.backend in ("hip", "xpu"):
            return self._sample_sysfs(dev, key)
        return DeviceSample(key, dev.name, dev.vram_used, dev.vram_total, None, None, None, None)

    def _sample_nvidia(self, dev: Device, key: str) -> DeviceSample:
        if not self.host.is_live:
            rec = self._recorded_nvml.get(dev.pci, {})
            mem = rec.get("memory") or {}
            sample = DeviceSample(key, rec.get("name") or dev.name, mem.get("used"), mem.get("total"),
                                  (rec.get("utilization") or {}).get("gpu"), rec.get("temperature_c"),
                                  rec.get("power_w"), rec.get("power_limit_w"))
            pcie = _dict(rec.get("pcie"))
            _apply_extra(sample, rec, pcie.get("cur_gen"), pcie.get("cur_width"), pcie.get("rx_kbps"), pcie.get("tx_kbps"))
            sample.nvlink_up = _count(rec.get("nvlink_up"))
            return sample
        nvml, handle = self._nvml, self._handles.get(dev.pci)
        sample = DeviceSample(key, dev.name, dev.vram_used, dev.vram_total, None, None, None, None)
        if nvml is None or handle is None or self._closed:
            return sample

        def get(fn: str, *args: Any) -> Any:
            try:
                return getattr(nvml, fn)(handle, *args)
            except nvml.NVMLError:
                return None
            except AttributeError:  # an nvidia-ml-py without this call
                return None

        try:
            # nvidia-smi's figures (v2), as the check records them; v1 once the driver showed it has no v2.
            mem = read_memory(nvml, handle, try_v2=self._memory_v2.get(dev.pci, True))
            self._memory_v2[dev.pci] = mem["version"] == V2
            sample.mem_used, sample.mem_total = mem["used"], mem["total"]
        except nvml.NVMLError:
            pass
        util = get("nvmlDeviceGetUtilizationRates")
        sample.util = None if util is None else float(util.gpu)
        temp = get("nvmlDeviceGetTemperature", 0)
        sample.temp_c = None if temp is None else float(temp)
        power = get("nvmlDeviceGetPowerUsage")
        sample.power_w = None if power is None else power / 1000.0
        if dev.pci not in self._power_limits:  # changes only by admin action: read once
            limit = get("nvmlDeviceGetEnforcedPowerLimit")
            self._power_limits[dev.pci] = None if limit is None else limit / 1000.0
        sample.power_limit_w = self._power_limits[dev.pci]
        extra = read_extra(nvml, handle)
        _apply_extra(sample, extra, get("nvmlDeviceGetCurrPcieLinkGeneration"), get("nvmlDeviceGetCurrPcieLinkWidth"),
                     get("nvmlDeviceGetPcieThroughput", 1), get("nvmlDeviceGetPcieThroughput", 0))
        if dev.pci not in self._nvlink_up:
            from hwtui.probes.nvidia import _read_nvlink

            try:
                self._nvlink_up[dev.pci] = _read_nvlink(nvml, handle, {})
            except Exception:  # noqa: BLE001 - a lost GPU: no NVLink figure
                self._nvlink_up[dev.pci] = None
        sample.nvlink_up = self._nvlink_up[dev.pci]
        kib = extra.get("nvlink_kib")
        if kib is not None:
            now = time.monotonic()
            prev = self._nvlink.get(dev.pci)
            self._nvlink[dev.pci] = (now, kib["tx"], kib["rx"])
            if prev and now > prev[0] and kib["tx"] >= prev[1] and kib["rx"] >= prev[2]:
                sample.nvlink_tx_kbps = (kib["tx"] - prev[1]) / (now - prev[0])
                sample.nvlink_rx_kbps = (kib["rx"] - prev[2]) / (now - prev[0])
        return sample

    def _sample_sysfs(self, dev: Device, key: str) -> DeviceSample:
        raw = read_sysfs_gpu(self.host, dev.pci, self._hwmon.get(dev.pci))
        power = raw["power_w"]
        if power is None and raw["energy_uj"] is not None and self.host.is_live:
            # Intel exposes only an energy counter: watts = delta energy / delta time.
            now = time.monotonic()
            prev = self._energy.get(dev.pci)
            self._energy[dev.pci] = (now, raw["energy_uj"])
            if prev and now > prev[0] and raw["energy_uj"] >= prev[1]:
                power = (raw["energy_uj"] - prev[1]) / 1e6 / (now - prev[0])
        return DeviceSample(key, dev.name, raw["mem_used"] if raw["mem_used"] is not None else dev.vram_used,
                            raw["mem_total"] or dev.vram_total, None if raw["util"] is None else float(raw["util"]),
                            raw["temp_c"], power, raw["power_limit_w"], sm_clock_mhz=raw["sclk_mhz"],
                            mem_clock_mhz=raw["mclk_mhz"], fan_pct=raw["fan_pct"], pcie_gen=raw["pcie_gen"],
                            pcie_width=raw["pcie_width"], ecc_uncorrected=raw["ecc_uncorrected"],
                            ecc_corrected=raw["ecc_corrected"])

    def _sample_cpu(self) -> DeviceSample:
        if self.host.is_live:
            try:
                import psutil

                vm = psutil.virtual_memory()
                return DeviceSample("cpu", self._cpu_name, int(vm.total - vm.available), int(vm.total),
                                    float(psutil.cpu_percent(interval=None)), None, None, None)
            except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable
                pass
        used, total = host_memory(self.host)
        return DeviceSample("cpu", self._cpu_name, used, total, None, None, None, None)

    def close(self) -> None:
        if self._nvml is not None and not self._closed:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        self._closed = True

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _apply_extra(sample: DeviceSample, extra: Mapping[str, object], gen: Any, width: Any, rx: Any, tx: Any) -> None:
    """The detail figures of :func:`read_extra` (live) or of a recorded NVML device (replay). A
    snapshot is untrusted input: a figure of the wrong type is unknown, never an exception."""
    clocks, ecc, event = _dict(extra.get("clocks")), _dict(extra.get("ecc")), _dict(extra.get("clocks_event"))
    sample.sm_clock_mhz, sample.mem_clock_mhz = _count(clocks.get("sm_mhz")), _count(clocks.get("mem_mhz"))
    sample.fan_pct = _count(extra.get("fan_pct"))
    sample.ecc_uncorrected, sample.ecc_corrected = _count(ecc.get("uncorrected")), _count(ecc.get("corrected"))
    reasons = event.get("reasons")
    sample.throttle = tuple(r for r in reasons if isinstance(r, str))[:16] if isinstance(reasons, list) else None
    sample.pcie_gen, sample.pcie_width = _count(gen), _count(width)
    sample.pcie_rx_kbps, sample.pcie_tx_kbps = _count(rx), _count(tx)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int | None:
    """A non-negative whole figure, or None (NVML answers ints; a replay may hold anything)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 2**63:
        return None
    return int(value)


def _cpu_name(host: Host) -> str:
    for line in (host.read_text("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "CPU"
