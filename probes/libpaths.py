"""Find shared libraries the way the dynamic linker would, through the host seam.

Used for the Level Zero loader (libze_loader.so.1), Intel's Level Zero GPU driver, ROCm's
libamd_smi.so and NVML's libnvidia-ml.so.<version> (whose version tells a driver upgraded
without a reboot apart from other mismatches). Reading directories through the host keeps this
reproducible from a recorded tree or a snapshot; nothing is dlopen()ed.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath

from hwtui.probes.host import Host

DEFAULT_DIRS = (
    "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib",
    "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/wsl/lib",  # WSL2's NVIDIA libraries
)


def _conf_dirs(host: Host, path: str, depth: int = 0) -> list[str]:
    """Directories listed in an ld.so.conf file, following ``include`` lines (bounded depth)."""
    out: list[str] = []
    if depth > 4:
        return out
    for line in (host.read_text(path) or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include "):
            pattern = line.split(None, 1)[1].strip()
            if not pattern.startswith("/"):
                pattern = posixpath.join(posixpath.dirname(path), pattern)
            parent, leaf = posixpath.split(pattern)
            for name in host.listdir(parent):
                if fnmatch.fnmatch(name, leaf):
                    out += _conf_dirs(host, posixpath.join(parent, name), depth + 1)
        else:
            out.append(line)
    return out


def linker_dirs(host: Host) -> list[str]:
    """LD_LIBRARY_PATH first, then /etc/ld.so.conf(.d), then the built-in default directories."""
    dirs = [d for d in host.env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    dirs += _conf_dirs(host, "/etc/ld.so.conf")
    dirs += list(DEFAULT_DIRS)
    return list(dict.fromkeys(dirs))  # first occurrence wins, order kept


def find_library(host: Host, pattern: str, extra_dirs: tuple[str, ...] = ()) -> list[str]:
    """Paths of files matching ``pattern`` (a glob such as ``libze_loader.so*``) on the linker path."""
    found: list[str] = []
    for d in [*linker_dirs(host), *extra_dirs]:
        for name in host.listdir(d):
            if fnmatch.fnmatch(name, pattern):
                found.append(posixpath.join(d, name))
    return found

