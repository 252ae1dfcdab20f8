"""Which processes use each accelerator: PID, user, device memory and command line.

Two sources, as nvitop and all-smi use them: NVML's running-process lists for NVIDIA devices
(``nvmlDeviceGetComputeRunningProcesses`` and the graphics list), and for every other device the
DRM ``fdinfo`` that amdgpu, i915/xe and others publish per open file (``drm-pdev``, and
``drm-memory-vram`` / ``drm-total-vram0``/``drm-total-local0`` for the memory). Only a live host
has processes; a replayed one has none to show (the caller says so rather than showing an
empty table as if the machine were idle).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hwtui.probes.host import Host

_DRM_MEM_KEYS = ("drm-memory-vram", "drm-total-vram0", "drm-total-local0", "drm-resident-vram0")


@dataclass(frozen=True)
class DeviceProcess:
    device: str  # the dashboard's device key (cuda:0, or the PCI address for DRM devices)
    pid: int
    user: str
    mem_bytes: int | None
    command: str


def parse_drm_fdinfo(text: str) -> tuple[str, int | None] | None:
    """``(pci address, memory bytes)`` of one DRM fdinfo file; None for a non-DRM file."""
    pdev, mem = None, None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if key == "drm-pdev":
            pdev = value
        elif key in _DRM_MEM_KEYS and mem is None:
            number, _, unit = value.partition(" ")
            if number.isdigit():
                mem = int(number) * {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}.get(unit.strip(), 1)
    return (pdev, mem) if pdev else None


def _owner(pid: int) -> tuple[str, str]:
    """``(user, command line)`` of a live process; "?" where it cannot be read (gone, not ours)."""
    try:
        import psutil

        p = psutil.Process(pid)
        with p.oneshot():
            cmd = " ".join(p.cmdline()) or p.name()
            return p.username(), cmd
    except Exception:  # noqa: BLE001 - psutil missing, the process ended, or access denied
        return "?", "?"


def drm_processes(host: Host, pci_to_key: dict[str, str], pids: Iterable[int] | None = None) -> list[DeviceProcess]:
    """Processes holding a DRM file of a device in ``pci_to_key``, memory summed per (pid, device)."""
    seen: dict[tuple[int, str], int | None] = {}
    for entry in pids if pids is not None else (int(p) for p in host.listdir("/proc") if p.isdigit()):
        for fd in host.listdir(f"/proc/{entry}/fdinfo"):
            parsed = parse_drm_fdinfo(host.read_text(f"/proc/{entry}/fdinfo/{fd}") or "")
            if parsed is None or parsed[0] not in pci_to_key:
                continue
            key = (int(entry), pci_to_key[parsed[0]])
            before = seen.get(key)
            # The same buffer shows in every fd of one client: keep the largest, not the sum.
            seen[key] = parsed[1] if before is None else max(before, parsed[1] or 0)
    rows = []
    for (pid, dev), mem in sorted(seen.items()):
        user, cmd = _owner(pid)
        rows.append(DeviceProcess(dev, pid, user, mem, cmd))
    return rows


def nvml_processes(nvml: Any, handles: dict[str, Any]) -> list[DeviceProcess]:
    """NVML's compute and graphics processes per device key (``handles``: key -> NVML handle)."""
    out: dict[tuple[int, str], int | None] = {}
    for key, handle in handles.items():
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                procs = getattr(nvml, getter)(handle)
            except Exception:  # noqa: BLE001 - NVMLError, or the call is missing in this driver
                continue
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                out[(int(p.pid), key)] = used if isinstance(used, int) and used >= 0 else None
    rows = []
    for (pid, key), mem in sorted(out.items()):
        user, cmd = _owner(pid)
        rows.append(DeviceProcess(key, pid, user, mem, cmd))
    return rows


def device_processes(host: Host, devices: list[Any], nvml: Any = None, handles: dict[str, Any] | None = None) -> list[DeviceProcess] | None:
    """Every process on the devices of a live host; None when the host is not live (a replay)."""
    if not host.is_live:
        return None
    rows = nvml_processes(nvml, handles) if nvml is not None and handles else []
    covered = set(handles or {})
    pci_to_key = {d.pci: d.device for d in devices if getattr(d, "pci", None) and d.device and d.device not in covered}
    if pci_to_key:
        rows += drm_processes(host, pci_to_key)
    return rows
