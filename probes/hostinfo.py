"""Host probe: CPU, memory, OS, Python, container, /dev/shm."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from hwtui.probes.host import FactUnavailable, Host


def _live_runtime() -> dict[str, Any]:
    import psutil

    vm = psutil.virtual_memory()
    shm_total: int | None = None
    shm_free: int | None = None
    try:
        shm = os.statvfs("/dev/shm")
        shm_total = shm.f_frsize * shm.f_blocks
        shm_free = shm.f_frsize * shm.f_bavail
    except OSError:
        pass
    return {
        "cpu_logical": psutil.cpu_count(logical=True),
        "cpu_physical": psutil.cpu_count(logical=False),
        "mem_total": vm.total,
        "mem_available": vm.available,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "kernel": platform.release(),
        "machine": platform.machine(),
        "hostname": platform.node(),
        "shm_total": shm_total,
        "shm_free": shm_free,
    }


def _cpu_model(host: Host) -> str | None:
    for line in (host.read_text("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def _os_release(host: Host) -> str | None:
    for line in (host.read_text("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def _container(host: Host) -> str | None:
    if host.exists("/.dockerenv"):
        return "docker"
    if host.exists("/run/.containerenv"):
        return "podman"
    cgroup = host.read_text("/proc/1/cgroup") or ""
    for marker in ("kubepods", "docker", "containerd", "lxc"):
        if marker in cgroup:
            return marker
    if host.env.get("container"):
        return host.env["container"]
    return None


def collect_host(host: Host) -> dict[str, Any]:
    try:
        runtime = host.fact("host_runtime", _live_runtime)
    except FactUnavailable:
        runtime = {}
    meminfo = host.read_text("/proc/meminfo") or ""
    mem_total = runtime.get("mem_total")
    if mem_total is None:
        for line in meminfo.splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    return {
        **runtime,
        "mem_total": mem_total,
        "cpu_model": _cpu_model(host),
        "os": _os_release(host),
        "container": _container(host),
        "wsl": host.exists("/dev/dxg") or "microsoft" in (host.read_text("/proc/version") or "").lower(),
    }
