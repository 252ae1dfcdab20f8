"""CuPy, KvikIO and GPUDirect Storage (GDS) readiness.

KvikIO reads files straight into GPU memory through cuFile when GDS works: the ``nvidia_fs``
kernel module is loaded, libcufile is on the linker path and ``/etc/cufile.json`` (or
``CUFILE_ENV_PATH_JSON``) allows it. Otherwise it silently falls back to "compatibility mode"
(POSIX reads through a bounce buffer) unless the config forbids that, in which case every read
fails. CuPy wheels are built per CUDA major (cupy-cuda12x); two of them side by side shadow each
other. All facts come through the host; nothing is imported or dlopen()ed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from hwtui.core.finding import Finding, fail, passed, warn
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.frameworks import hardware, installed_packages
from hwtui.probes.host import Host
from hwtui.probes.libpaths import find_library

CUFILE_JSON = "/etc/cufile.json"
MAX_CONFIG = 1024 * 1024


def strip_json_comments(text: str) -> str:
    """cufile.json ships with // and /* */ comments, which JSON does not allow; drop them outside strings."""
    out, i, n, in_str = [], 0, len(text), False
    while i < n:
        ch = text[i]
        if in_str:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
            out.append(ch)
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        else:
            out.append(ch)
        i += 1
    # Trailing commas before } or ] are accepted by cuFile's parser too.
    return re.sub(r",(\s*[}\]])", r"\1", "".join(out))


def parse_cufile(text: str) -> dict[str, Any]:
    if len(text) > MAX_CONFIG:
        return {"error": "larger than 1 MiB"}
    try:
        raw = json.loads(strip_json_comments(text))
    except ValueError as exc:
        return {"error": str(exc)}
    if not isinstance(raw, dict):
        return {"error": "top level is not an object"}
    props: dict[str, Any] = raw["properties"] if isinstance(raw.get("properties"), dict) else {}
    return {"error": None, "allow_compat_mode": props.get("allow_compat_mode"), "use_poll_mode": props.get("use_poll_mode"),
            "max_direct_io_size_kb": props.get("max_direct_io_size_kb")}


def collect_gds(host: Host) -> dict[str, Any]:
    path = host.env.get("CUFILE_ENV_PATH_JSON") or CUFILE_JSON
    text = host.read_text(path)
    return {
        "packages": installed_packages(host),
        "nvidia_fs": host.exists("/sys/module/nvidia_fs"),
        "nvidia_fs_proc": host.exists("/proc/driver/nvidia-fs/stats"),
        "libcufile": find_library(host, "libcufile.so*")[:4],
        "cufile": {"path": path, "from_var": "CUFILE_ENV_PATH_JSON" in host.env, "exists": text is not None,
                   **(parse_cufile(text) if text is not None else {})},
        "env": {k: host.env[k] for k in ("KVIKIO_COMPAT_MODE", "CUFILE_ENV_PATH_JSON") if k in host.env},
    }


def _cuda_major(dist: str) -> int | None:
    match = re.search(r"(?:cuda|cu)(\d+)", dist)
    return int(match.group(1)) if match else None


def cupy_findings(packages: Mapping[str, Any], driver_cuda: str | None, torch_cuda: str | None) -> Iterator[Finding]:
    cupys = sorted(d for d in packages if d.startswith("cupy"))
    if not cupys:
        return
    if len(cupys) > 1:
        yield fail("gds.cupy", f"{len(cupys)} CuPy packages installed: {', '.join(cupys)}",
                   "They install the same 'cupy' module; whichever was installed last wins and the other's libraries mismatch.",
                   "python3 -m pip uninstall -y " + " ".join(cupys) + f" && python3 -m pip install {cupys[-1]}")
        return
    dist = cupys[0]
    major = _cuda_major(dist)
    version = packages[dist]["version"]
    if major and driver_cuda and int(driver_cuda.split(".")[0]) < major:
        yield fail("gds.cupy", f"{dist} {version} needs a CUDA {major} driver; the driver supports CUDA {driver_cuda}",
                   "", f"python3 -m pip uninstall -y {dist} && python3 -m pip install cupy-cuda{driver_cuda.split('.')[0]}x")
    elif major and torch_cuda and int(torch_cuda.split(".")[0]) != major:
        yield warn("gds.cupy", f"{dist} {version} is built for CUDA {major}, torch for CUDA {torch_cuda}",
                   "Two CUDA runtimes in one process: zero-copy exchange (DLPack) works, but memory pools are separate.",
                   f"python3 -m pip uninstall -y {dist} && python3 -m pip install cupy-cuda{torch_cuda.split('.')[0]}x")
    else:
        yield passed("gds.cupy", f"{dist} {version}")


def gds_findings(gds: Mapping[str, Any], n_nvidia: int) -> Iterator[Finding]:
    packages = gds.get("packages") or {}
    kvikio = next((d for d in sorted(packages) if d.startswith("kvikio")), None)
    cufile = gds["cufile"]
    if cufile.get("exists") and cufile.get("error"):
        yield fail("gds.cufile_json", f"{cufile['path']} is not valid JSON", cufile["error"],
                   f"fix {cufile['path']} (cuFile ignores the whole file and uses its defaults)")
    elif cufile.get("from_var") and not cufile.get("exists"):
        yield fail("gds.cufile_json", f"CUFILE_ENV_PATH_JSON={cufile['path']} does not exist", "",
                   "export CUFILE_ENV_PATH_JSON=/etc/cufile.json (or unset it)")
    if not kvikio or not n_nvidia:
        return
    version = packages[kvikio]["version"]
    compat_env = str((gds.get("env") or {}).get("KVIKIO_COMPAT_MODE", "")).upper()
    if compat_env in ("ON", "TRUE", "1", "YES"):
        yield passed("gds.kvikio", f"{kvikio} {version}: KVIKIO_COMPAT_MODE={compat_env} (POSIX reads, GDS off by choice)")
        return
    missing = []
    if not gds.get("nvidia_fs"):
        missing.append("the nvidia_fs kernel module is not loaded")
    if not gds.get("libcufile"):
        missing.append("libcufile.so is not on the linker path")
    if not missing:
        yield passed("gds.kvikio", f"{kvikio} {version}: GPUDirect Storage ready (nvidia_fs loaded, {gds['libcufile'][0]})")
        return
    remedy = "sudo apt install nvidia-gds && sudo modprobe nvidia_fs" if not gds.get("nvidia_fs") else \
        "sudo apt install libcufile-12-8  (or export LD_LIBRARY_PATH=<dir with libcufile.so>)"
    if cufile.get("allow_compat_mode") is False:
        yield fail("gds.kvikio", f"{kvikio} {version}: GDS unavailable and {cufile['path']} forbids compatibility mode",
                   "; ".join(missing) + ". Every cuFile read fails.", remedy)
    else:
        yield warn("gds.kvikio", f"{kvikio} {version}: no GPUDirect Storage, KvikIO falls back to compatibility mode",
                   "; ".join(missing) + ". Reads go through a host bounce buffer at page-cache speed.", remedy)


def gds_rules(facts: Facts) -> Iterator[Finding]:
    gds = facts["gds"]
    hw = hardware(facts)
    nvml = facts.get("nvml") or {}
    driver_cuda = nvml.get("cuda_driver_version") if isinstance(nvml.get("cuda_driver_version"), str) else None
    torch_cuda = (facts.get("torch_build") or {}).get("cuda")
    yield from cupy_findings(gds.get("packages") or {}, driver_cuda, str(torch_cuda) if torch_cuda else None)
    yield from gds_findings(gds, len(hw["nvidia"]))


COLLECTORS = [Collector("gds", collect_gds, "gpu", timeout=5.0)]
RULES = [Rule("gds", gds_rules, "gpu", needs=("gds", "pci"))]
