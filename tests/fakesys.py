"""Build recorded machine trees in tmp_path: the sysfs / dev / proc layout hwtui's probes read.

This fakes only the library boundary (the kernel's files); the probes under test are the real
ones, reading through a real FsHost rooted at the tree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hwtui.probes.host import FACTS_FILE, FsHost

SPEEDS = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe", 6: "64.0 GT/s PCIe"}


class FakeSys:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._port = 0
        for d in ("sys/bus/pci/devices", "sys/module", "dev", "proc", "etc"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.file("/etc/group", "root:x:0:\nvideo:x:44:\nrender:x:109:\n")

    # -- primitives -------------------------------------------------------------------------
    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")

    def file(self, p: str, text: str = "") -> Path:
        path = self.path(p)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def symlink(self, p: str, target: str) -> None:
        path = self.path(p)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        os.symlink(target, path)

    def facts(self, **facts: Any) -> None:
        path = self.root / FACTS_FILE
        current = json.loads(path.read_text()) if path.exists() else {}
        current.update(facts)
        path.write_text(json.dumps(current))

    def host(self, env: dict[str, str] | None = None) -> FsHost:
        return FsHost(self.root, env or {})

    # -- devices ----------------------------------------------------------------------------
    def pci(self, addr: str, vendor: int, device: int, cls: int = 0x030000, driver: str | None = None, *,
            numa: int = 0, gen: tuple[int, int] = (4, 4), width: tuple[int, int] = (16, 16),
            slot: tuple[int, int] | None = None, drm: tuple[str, ...] = (), files: dict[str, str] | None = None) -> str:
        """Add a PCI function behind its own root port. ``gen``/``width`` are (current, max)."""
        self._port += 1
        port = f"0000:00:{self._port:02x}.0"
        port_dir = f"/sys/devices/pci0000:00/{port}"
        slot_gen, slot_width = slot or (gen[1], width[1])
        self.file(f"{port_dir}/max_link_speed", SPEEDS[slot_gen] + "\n")
        self.file(f"{port_dir}/max_link_width", f"{slot_width}\n")
        sysdir = f"{port_dir}/{addr}"
        self.file(f"{sysdir}/vendor", f"0x{vendor:04x}\n")
        self.file(f"{sysdir}/device", f"0x{device:04x}\n")
        self.file(f"{sysdir}/class", f"0x{cls:06x}\n")
        self.file(f"{sysdir}/numa_node", f"{numa}\n")
        self.file(f"{sysdir}/current_link_speed", SPEEDS[gen[0]] + "\n")
        self.file(f"{sysdir}/max_link_speed", SPEEDS[gen[1]] + "\n")
        self.file(f"{sysdir}/current_link_width", f"{width[0]}\n")
        self.file(f"{sysdir}/max_link_width", f"{width[1]}\n")
        for name in drm:
            self.path(f"{sysdir}/drm/{name}").mkdir(parents=True, exist_ok=True)
        for name, text in (files or {}).items():
            self.file(f"{sysdir}/{name}", text)
        if driver:
            self.path(f"/sys/bus/pci/drivers/{driver}").mkdir(parents=True, exist_ok=True)
            self.symlink(f"{sysdir}/driver", f"../../../../bus/pci/drivers/{driver}")
        self.symlink(f"/sys/bus/pci/devices/{addr}", f"../../../devices/pci0000:00/{port}/{addr}")
        return sysdir

    def devnode(self, p: str, mode: int = 0o666, gid: int = 0) -> None:
        path = self.file(p)
        os.chmod(path, mode)
        os.chown(path, 0, gid)

    def module(self, name: str, version: str | None = None, state: str = "live") -> None:
        self.file(f"/sys/module/{name}/initstate", state + "\n")
        if version:
            self.file(f"/sys/module/{name}/version", version + "\n")
        modules = self.path("/proc/modules")
        existing = modules.read_text() if modules.exists() else ""
        modules.write_text(existing + f"{name} 1000 0 - {state.capitalize()} 0x0\n")
