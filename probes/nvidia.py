"""NVIDIA through NVML (nvidia-ml-py), with the kernel driver's own files as the fallback.

NVML runs in hwtui's process: it is a thin C library (no CUDA context, no device memory) and the
dashboard needs its handles kept open for millisecond sampling. Every field is read on its own,
because consumer boards answer NotSupported for half of them (NVLink, MIG, throughput) and one
unsupported field must not lose the rest of the device. Errors at init are the interesting part:
each NVMLError kind maps to a finding whose remedy says exactly what to do (reboot after a driver
upgrade, load the module, fix device permissions, reset a lost GPU).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from hwtui.core.finding import Finding, Status, fail, passed, skip, warn
from hwtui.probes.devices import build_devices
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import FactUnavailable, Host
from hwtui.probes.libpaths import find_library
from hwtui.probes.nvml_extra import read_extra
from hwtui.probes.nvml_fact import NvmlDevice, NvmlErrorInfo, NvmlFact
from hwtui.probes.nvml_memory import read_memory
from hwtui.probes.pci import pci_fact

# NVML return codes (nvml.h); NVMLError(code) builds the matching subclass in nvidia-ml-py.
ERROR_KINDS = {
    1: "Uninitialized", 2: "InvalidArgument", 3: "NotSupported", 4: "NoPermission", 6: "NotFound",
    9: "DriverNotLoaded", 10: "Timeout", 12: "LibraryNotFound", 13: "FunctionNotFound", 15: "GpuIsLost",
    17: "OperatingSystem", 18: "LibRmVersionMismatch", 999: "Unknown",
}
NVLINK_MAX_LINKS = 18
_TEMPERATURE_GPU = 0
_PCIE_TX, _PCIE_RX = 0, 1


def _kind(exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    if code in ERROR_KINDS:
        return ERROR_KINDS[code]
    return type(exc).__name__.removeprefix("NVMLError_") or "Unknown"


def _error(exc: BaseException) -> NvmlErrorInfo:
    return {"kind": _kind(exc), "code": getattr(exc, "value", None), "message": str(exc)}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: Any) -> str:
    """NVML's '00000000:01:00.0' -> sysfs's '0000:01:00.0'."""
    text = _text(bus_id).strip().lower()
    m = re.match(r"^([0-9a-f]+):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$", text)
    if not m:
        return text
    return f"{int(m.group(1), 16):04x}:{m.group(2)}:{m.group(3)}.{m.group(4)}"


class _Lost(Exception):
    """The GPU fell off the bus while being read: stop reading it."""


def _reader(nvml: Any, unsupported: dict[str, str]) -> Callable[..., Any]:
    def read(field: str, fn_name: str, *args: Any, call: Callable[..., Any] | None = None) -> Any:
        try:
            return (call or getattr(nvml, fn_name))(*args)
        except nvml.NVMLError as exc:
            kind = _kind(exc)
            if kind == "GpuIsLost":
                raise _Lost(str(exc)) from None
            unsupported[field] = kind if kind == "NotSupported" else f"{kind}: {exc}"
            return None
        except AttributeError:  # an older nvidia-ml-py without this call
            unsupported[field] = f"{fn_name} missing from this nvidia-ml-py"
            return None
    return read


def _read_nvlink(nvml: Any, handle: Any, unsupported: dict[str, str]) -> int | None:
    up = 0
    for link in range(NVLINK_MAX_LINKS):
        try:
            up += 1 if nvml.nvmlDeviceGetNvLinkState(handle, link) else 0
        except nvml.NVMLError as exc:
            kind = _kind(exc)
            if kind == "GpuIsLost":
                raise _Lost(str(exc)) from None
            if link == 0:
                unsupported["nvlink"] = kind
                return None
            break  # InvalidArgument/NotSupported past the last link this GPU has
    return up


def read_device(nvml: Any, index: int) -> NvmlDevice:
    """Every field of one GPU, each on its own; ``unsupported`` says why a field is None."""
    unsupported: dict[str, str] = {}
    dev: NvmlDevice = {"index": index, "unsupported": unsupported, "lost": False}
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        dev["error"] = _error(exc)
        dev["lost"] = _kind(exc) == "GpuIsLost"
        return dev
    read = _reader(nvml, unsupported)
    try:
        name = read("name", "nvmlDeviceGetName", handle)
        dev["name"] = None if name is None else _text(name)
        uuid = read("uuid", "nvmlDeviceGetUUID", handle)
        dev["uuid"] = None if uuid is None else _text(uuid)
        pci = read("pci_bus_id", "nvmlDeviceGetPciInfo", handle)
        dev["pci"] = None if pci is None else normalize_bus_id(getattr(pci, "busId", pci))
        dev["minor_number"] = read("minor_number", "nvmlDeviceGetMinorNumber", handle)
        # v2 where the driver has it: "used" as nvidia-smi shows it, the driver's reservation apart.
        dev["memory"] = read("memory", "nvmlDeviceGetMemoryInfo", nvml, handle, call=read_memory)
        util = read("utilization", "nvmlDeviceGetUtilizationRates", handle)
        dev["utilization"] = None if util is None else {"gpu": int(util.gpu), "memory": int(util.memory)}
        dev["temperature_c"] = read("temperature", "nvmlDeviceGetTemperature", handle, _TEMPERATURE_GPU)
        power = read("power", "nvmlDeviceGetPowerUsage", handle)
        dev["power_w"] = None if power is None else power / 1000.0
        limit = read("power_limit", "nvmlDeviceGetEnforcedPowerLimit", handle)
        dev["power_limit_w"] = None if limit is None else limit / 1000.0
        dev["pcie"] = {
            "cur_gen": read("pcie.cur_gen", "nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "max_gen": read("pcie.max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "cur_width": read("pcie.cur_width", "nvmlDeviceGetCurrPcieLinkWidth", handle),
            "max_width": read("pcie.max_width", "nvmlDeviceGetMaxPcieLinkWidth", handle),
            "tx_kbps": read("pcie.tx", "nvmlDeviceGetPcieThroughput", handle, _PCIE_TX),
            "rx_kbps": read("pcie.rx", "nvmlDeviceGetPcieThroughput", handle, _PCIE_RX),
        }
        dev["nvlink_up"] = _read_nvlink(nvml, handle, unsupported)
        cc = read("compute_capability", "nvmlDeviceGetCudaComputeCapability", handle)
        dev["compute_capability"] = None if cc is None else [int(cc[0]), int(cc[1])]
        mig = read("mig_mode", "nvmlDeviceGetMigMode", handle)
        dev["mig"] = None if mig is None else {"current": int(mig[0]), "pending": int(mig[1])}
        dev.update(read_extra(nvml, handle))  # clocks, fan, ECC, clocks-event reasons, NVLink KiB
        procs = read("processes", "nvmlDeviceGetComputeRunningProcesses", handle)
        dev["processes"] = None if procs is None else [
            {"pid": int(p.pid), "used_memory": None if getattr(p, "usedGpuMemory", None) is None else int(p.usedGpuMemory)}
            for p in procs
        ]
    except _Lost as exc:
        dev["lost"] = True
        dev["error"] = {"kind": "GpuIsLost", "code": 15, "message": str(exc)}
    return dev


def read_nvml(nvml: Any) -> NvmlFact:
    """The whole NVML picture as a JSON-able fact (what a snapshot records)."""
    if nvml is None:
        return {"ok": False, "error": {"kind": "ModuleMissing", "code": None, "message": "nvidia-ml-py is not installed"}}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return {"ok": False, "error": _error(exc)}
    try:
        unsupported: dict[str, str] = {}
        out: NvmlFact = {"ok": True, "error": None, "unsupported": unsupported}
        read = _reader(nvml, unsupported)
        driver = read("driver_version", "nvmlSystemGetDriverVersion")
        out["driver_version"] = None if driver is None else _text(driver)
        cuda = read("cuda_driver_version", "nvmlSystemGetCudaDriverVersion")
        out["cuda_driver_version"] = None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}"
        lib = read("nvml_version", "nvmlSystemGetNVMLVersion")
        out["nvml_version"] = None if lib is None else _text(lib)
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            return {"ok": False, "error": _error(exc)}
        out["devices"] = [read_device(nvml, i) for i in range(count)]
        return out
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library that half-failed
            pass


def import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class NvmlCollector:
    """Collector callable; ``nvml`` is the module to use (tests pass a FakeNVML)."""

    def __init__(self, nvml: Any = None, factory: Callable[[], Any] = import_pynvml):
        self._nvml = nvml
        self._factory = factory

    def __call__(self, host: Host) -> NvmlFact:
        try:
            return host.fact("nvml", lambda: read_nvml(self._nvml if self._nvml is not None else self._factory()))
        except FactUnavailable:
            # A tree or snapshot taken without NVML answers: the /proc fallback still works.
            return {"ok": False, "error": {"kind": "NotRecorded", "code": None,
                                           "message": "NVML answers were not recorded with this machine"}}


# -- the kernel driver without NVML ---------------------------------------------------------

_PROC_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_proc_version(text: str | None) -> str | None:
    """'NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.04  Release Build ...' -> '570.124.04'."""
    if not text:
        return None
    m = _PROC_VERSION.search(text)
    if m:
        return m.group(1)
    m = re.search(r"\b(\d{3}\.\d+(?:\.\d+)?)\b", text)
    return m.group(1) if m else None


def collect_driver(host: Host) -> dict[str, Any]:
    """Kernel module version (/proc, /sys) and the user-space library version (libnvidia-ml.so.X)."""
    proc = parse_proc_version(host.read_text("/proc/driver/nvidia/version"))
    module = (host.read_text("/sys/module/nvidia/version") or "").strip() or None
    libs = find_library(host, "libnvidia-ml.so.*")
    lib_versions = sorted({m.group(1) for p in libs if (m := re.search(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$", p))})
    return {"kernel_version": proc or module, "proc": proc, "sys_module": module, "library_versions": lib_versions,
            "libraries": libs}


def driver_version(facts: Facts) -> str | None:
    """Best driver version known: NVML's answer, else the kernel module's."""
    nvml = facts.get("nvml") or {}
    if nvml.get("ok") and nvml.get("driver_version"):
        return str(nvml["driver_version"])
    return (facts.get("nvidia_driver") or {}).get("kernel_version")


# -- rules ----------------------------------------------------------------------------------

def _user(facts: Facts) -> str:
    try:
        return facts.host.user().name if facts.host else "$USER"
    except Exception:  # noqa: BLE001 - a replay without the user fact
        return "$USER"


def _error_finding(err: dict[str, Any], facts: Facts, n_gpus: int) -> Finding:
    kind = err.get("kind")
    msg = err.get("message", "")
    drv = facts.get("nvidia_driver") or {}
    kernel, libs = drv.get("kernel_version"), drv.get("library_versions") or []
    data = {"kind": kind, "code": err.get("code")}
    if kind == "LibraryNotFound":
        return fail("nvidia.nvml", f"NVML library not found, {n_gpus} NVIDIA GPU(s) on the bus",
                    "libnvidia-ml.so.1 ships with the NVIDIA driver; without it nvidia-smi, NVML and CUDA all fail."
                    + (f" Kernel module {kernel} is loaded, so the user-space part is missing (a container without the"
                       " NVIDIA runtime?)." if kernel else ""),
                    "sudo apt install nvidia-driver-570-server (or your distribution's driver package); in a container: "
                    "docker run --gpus all ... with nvidia-container-toolkit installed", **data)
    if kind == "DriverNotLoaded":
        return fail("nvidia.nvml", "NVIDIA kernel driver is not loaded",
                    "NVML is installed but the nvidia kernel module is not running; CUDA cannot see any GPU.",
                    "sudo modprobe nvidia (if it fails: sudo dmesg | grep -i nvidia; with Secure Boot on, "
                    "`mokutil --sb-state` and sign or enroll the module)", **data)
    if kind == "NoPermission":
        return fail("nvidia.nvml", "no permission to open the NVIDIA device nodes",
                    "NVML could not open /dev/nvidiactl or /dev/nvidia*; CUDA will fail the same way.",
                    f"ls -l /dev/nvidia*; sudo usermod -aG video {_user(facts)} and log in again (or fix the modes with "
                    "sudo nvidia-modprobe -c=0 -u)", **data)
    if kind == "LibRmVersionMismatch":
        detail = "The driver was upgraded but the old kernel module is still running"
        if kernel or libs:
            detail += f" (kernel module {kernel or '?'}, library {', '.join(libs) or '?'})"
        return fail("nvidia.nvml", "NVIDIA driver/library version mismatch: reboot needed", detail + ".",
                    "sudo reboot (or, with no GPU process running: sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia "
                    "&& sudo modprobe nvidia)", kernel_version=kernel, library_versions=libs, **data)
    if kind == "GpuIsLost":
        return fail("nvidia.nvml", "an NVIDIA GPU fell off the bus (GPU is lost)",
                    "The GPU stopped responding (Xid 79 in dmesg); it stays lost until reset.",
                    "sudo dmesg | grep -i xid; sudo nvidia-smi -r (reset) or reboot; recurring: reseat the card and check "
                    "its power cables", **data)
    if kind == "FunctionNotFound":
        return warn("nvidia.nvml", "the NVIDIA driver is older than nvidia-ml-py expects", msg,
                    "sudo apt install nvidia-driver-570-server (a driver from the last two years)", **data)
    if kind == "NotRecorded":
        return skip("nvidia.nvml", "NVML answers not recorded with this machine", msg, **data)
    if kind == "ModuleMissing":
        return warn("nvidia.nvml", "nvidia-ml-py is not installed: no live NVIDIA figures",
                    "Names, memory, utilization and power need NVML; the kernel driver version still comes from /proc.",
                    "pip install nvidia-ml-py", **data)
    return Finding("nvidia.nvml", Status.ERROR, f"NVML failed: {kind}", msg,
                   "sudo nvidia-smi -q > nvidia-smi.txt and attach it to a hwtui issue", data=data)


def nvml_rules(facts: Facts) -> Iterator[Finding]:
    nvml = facts["nvml"]
    pci_nv = [d for d in build_devices(pci_fact(facts)) if d.vendor == "NVIDIA"]
    usable = [d for d in pci_nv if d.usable]
    if not nvml.get("ok"):
        err = nvml.get("error") or {}
        if not usable:
            if pci_nv or err.get("kind") not in ("LibraryNotFound", "ModuleMissing", "DriverNotLoaded"):
                yield skip("nvidia.nvml", f"NVML not available ({err.get('kind')}); no NVIDIA GPU usable here")
            return
        yield _error_finding(err, facts, len(usable))
        kernel = (facts.get("nvidia_driver") or {}).get("kernel_version")
        if kernel:
            yield passed("nvidia.driver", f"NVIDIA kernel driver {kernel} (from /proc/driver/nvidia/version)",
                         driver_version=kernel)
        return
    devices = nvml.get("devices") or []
    yield passed("nvidia.nvml", f"NVML: driver {nvml.get('driver_version')}, CUDA driver API "
                 f"{nvml.get('cuda_driver_version')}, {len(devices)} GPU(s)",
                 driver_version=nvml.get("driver_version"), cuda_driver_version=nvml.get("cuda_driver_version"),
                 count=len(devices))
    seen = {d.get("pci") for d in devices}
    missing = [d for d in usable if d.pci not in seen]
    if missing:
        yield fail("nvidia.nvml.count", f"{len(missing)} NVIDIA GPU(s) on the PCI bus are invisible to NVML",
                   ", ".join(f"{d.pci} {d.name}" for d in missing) + ": the driver failed to initialise them.",
                   "sudo dmesg | grep -iE 'nvrm|xid' shows why; then reboot or reseat the card", missing=[d.pci for d in missing])
    for dev in devices:
        yield from _device_findings(dev)


def _fmt_bytes(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def _device_findings(dev: NvmlDevice) -> Iterator[Finding]:
    subject = dev.get("pci") or f"nvml{dev['index']}"
    fid = f"nvidia.device[{subject}]"
    if dev.get("lost") or dev.get("error"):
        err: dict[str, Any] = dict(dev.get("error") or {})
        yield fail(fid, f"NVIDIA GPU {dev['index']} ({subject}) cannot be read: {err.get('kind')}", err.get("message", ""),
                   f"sudo dmesg | grep -i xid; sudo nvidia-smi -r -i {dev['index']} (reset) or reboot", **err)
        return
    mem = dev.get("memory") or {}
    parts = [f"{_fmt_bytes(mem.get('used'))} / {_fmt_bytes(mem.get('total'))}"]
    if cc := dev.get("compute_capability"):
        parts.append("sm_{}{}".format(*cc))
    if dev.get("temperature_c") is not None:
        parts.append(f"{dev['temperature_c']} C")
    if dev.get("power_w") is not None:
        parts.append(f"{dev['power_w']:.0f}/{dev.get('power_limit_w') or 0:.0f} W")
    unsupported = dev.get("unsupported") or {}
    detail = ("not reported: " + ", ".join(f"{k} ({v})" for k, v in sorted(unsupported.items()))) if unsupported else ""
    yield passed(fid, f"cuda:{dev['index']} {dev.get('name')}: " + ", ".join(parts), detail,
                 **{k: v for k, v in dev.items() if k not in ("unsupported",)})
    mig = dev.get("mig")
    if mig and mig["current"] != mig["pending"]:
        yield warn(f"nvidia.mig[{subject}]", f"{dev.get('name')}: MIG mode change pending",
                   f"MIG is {'on' if mig['current'] else 'off'} now and becomes {'on' if mig['pending'] else 'off'} after a reset.",
                   f"sudo nvidia-smi -r -i {dev['index']}")
    elif mig and mig["current"]:
        yield warn(f"nvidia.mig[{subject}]", f"{dev.get('name')} is in MIG mode",
                   "torch sees MIG instances, not the whole GPU, and only one instance per process.",
                   "nvidia-smi -L lists the MIG-<uuid> ids: export CUDA_VISIBLE_DEVICES=MIG-<uuid>; or disable MIG with "
                   f"sudo nvidia-smi -i {dev['index']} -mig 0")


def driver_rules(facts: Facts) -> Iterator[Finding]:
    """Kernel driver vs NVML's library when NVML itself answered (a mismatch NVML did not flag)."""
    nvml = facts.get("nvml") or {}
    drv = facts["nvidia_driver"]
    kernel = drv.get("kernel_version")
    if nvml.get("ok") and kernel and nvml.get("driver_version") and kernel != nvml["driver_version"]:
        yield warn("nvidia.driver", f"kernel module {kernel} differs from the NVML driver {nvml['driver_version']}",
                   "The running kernel module and the user-space driver disagree: a pending upgrade.", "sudo reboot")


COLLECTORS = [
    Collector("nvml", NvmlCollector(), "gpu", timeout=15.0),
    Collector("nvidia_driver", collect_driver, "gpu", timeout=5.0),
]
RULES = [
    Rule("nvml", nvml_rules, "gpu", needs=("nvml", "pci")),
    Rule("nvidia_driver", driver_rules, "gpu", needs=("nvidia_driver",)),
]


def nvml_enricher(facts: Facts) -> dict[str, dict[str, Any]]:
    """Inventory fields from NVML: the marketing name, VRAM, the CUDA (NVML) index."""
    out: dict[str, dict[str, Any]] = {}
    nvml = facts.get("nvml") or {}
    for dev in nvml.get("devices") or []:
        if not dev.get("pci"):
            continue
        mem = dev.get("memory") or {}
        out[dev["pci"]] = {
            "name": dev.get("name"), "vram_total": mem.get("total"), "vram_used": mem.get("used"),
            "nvml_index": dev["index"], "uuid": dev.get("uuid"), "compute_capability": dev.get("compute_capability"),
            "utilization": (dev.get("utilization") or {}).get("gpu"), "temperature_c": dev.get("temperature_c"),
            "power_w": dev.get("power_w"), "power_limit_w": dev.get("power_limit_w"),
        }
    return out
