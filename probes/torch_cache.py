"""Cache of torch runtime facts, keyed on the installed torch distribution.

Importing torch in a child costs seconds (tens of seconds on a cold disk); its answers only change
when torch, the driver, the visible devices or the selection variables change. The key is built
from exactly those: the torch dist-info path, its RECORD's mtime and size (pip rewrites RECORD on
every install), torch's version, the interpreter, the kernel driver versions and the environment
variables that change what torch sees. A warm ``--check`` therefore never imports torch.

The file lives in ``$XDG_CACHE_HOME/hwtui`` (or ``~/.cache/hwtui``), holds a few entries (one per
virtualenv, typically) and is written atomically; a corrupt or foreign file is ignored.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hwtui.core.atomic import atomic_write_text
from hwtui.core.bounded_read import SMALL_FILE_CAP, read_bounded, read_capped

CACHE_SCHEMA = "hwtui.torch-cache/1"
MAX_ENTRIES = 8
# Variables that change what torch reports (visible devices, forced targets, device order).
KEY_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
           "HSA_OVERRIDE_GFX_VERSION", "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR", "HABANA_VISIBLE_DEVICES",
           "LD_LIBRARY_PATH")
# Files whose content identifies the running kernel drivers.
DRIVER_FILES = ("/proc/driver/nvidia/version", "/sys/module/amdgpu/version", "/sys/module/xe/version",
                "/sys/module/i915/version", "/sys/module/habanalabs/version")


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    source: Mapping[str, str] = os.environ if env is None else env
    base = source.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hwtui"


def cache_path(env: Mapping[str, str] | None = None) -> Path:
    return cache_dir(env) / "torch-runtime.json"


def locate_torch() -> dict[str, Any] | None:
    """Where torch is installed for this interpreter, without importing it."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    package = list(spec.submodule_search_locations)[0]
    site = os.path.dirname(package)
    dist_infos = sorted(glob.glob(os.path.join(site, "torch-*.dist-info")))
    return {"package": package, "version_py": os.path.join(package, "version.py"),
            "dist_info": dist_infos[-1] if dist_infos else None}


def _stat(path: str | None) -> list[int] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _driver_fingerprint() -> str:
    h = hashlib.sha256()
    for path in DRIVER_FILES:
        try:
            head, _cut = read_bounded(path, 4096)
        except OSError:
            continue
        h.update(path.encode() + b"\0" + head)
    return h.hexdigest()[:16]


def runtime_key(location: dict[str, Any], probe_args: Mapping[str, Any],
                env: Mapping[str, str] | None = None) -> dict[str, Any]:
    source: Mapping[str, str] = os.environ if env is None else env
    dist_info = location.get("dist_info")
    return {
        "python": sys.executable,
        "package": location.get("package"),
        "dist_info": dist_info,
        "record": _stat(os.path.join(dist_info, "RECORD")) if dist_info else None,
        "version_py": _stat(location.get("version_py")),
        "drivers": _driver_fingerprint(),
        "env": {k: source[k] for k in KEY_ENV if k in source},
        "probe": dict(sorted(probe_args.items())),
    }


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(read_capped(path, SMALL_FILE_CAP))
    except (OSError, ValueError, RecursionError):
        return {"schema": CACHE_SCHEMA, "entries": {}}
    if not isinstance(raw, dict) or raw.get("schema") != CACHE_SCHEMA or not isinstance(raw.get("entries"), dict):
        return {"schema": CACHE_SCHEMA, "entries": {}}
    return raw


def load(key: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any] | None:
    entry = _read(cache_path(env))["entries"].get(_digest(key))
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    return entry.get("facts")


def store(key: dict[str, Any], facts: dict[str, Any], env: dict[str, str] | None = None) -> None:
    path = cache_path(env)
    doc = _read(path)
    entries = doc["entries"]
    entries[_digest(key)] = {"key": key, "facts": facts, "created": time.time()}
    # Keep the newest few: one per virtualenv is the common case.
    newest = sorted(entries.items(), key=lambda kv: kv[1].get("created", 0), reverse=True)[:MAX_ENTRIES]
    doc["entries"] = dict(newest)
    try:
        atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only home must not fail the check; the next run just probes again


def clear(env: dict[str, str] | None = None) -> bool:
    try:
        cache_path(env).unlink()
        return True
    except OSError:
        return False
