"""The shape of every recorded runtime fact, checked where a recording is loaded.

A replay (``--replay``) or a recorded tree's ``.hwtui-facts.json`` is input from elsewhere: a
colleague's file, an edited one, a hostile one. The probes read recorded facts as the live
producers wrote them (``nvml["devices"][0]["index"]`` is an int), so a recording whose facts have
another shape used to end in an internal error (exit 3) or a probe error with a traceback. Here
each fact key has a schema; ``check_fact`` raises ``BadFact`` naming the first wrong field, and
the loaders turn that into the one-line "bad snapshot" refusal (exit 2).

The schemas say what the consumers rely on, no more: every field is optional unless a consumer
indexes it, fields not listed are left alone (a newer hwtui may record more), and integers are
bounded (a 400-digit JSON number meets float arithmetic in the rules) as are floats (JSON
``NaN`` / ``Infinity`` parse in Python).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any, str], None]
INT_LIMIT = 2**63


class BadFact(ValueError):
    """A recorded fact that does not have the shape its producer writes."""


def _short(value: Any, limit: int = 40) -> str:
    text = type(value).__name__ if isinstance(value, (dict, list)) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(path: str, what: str, value: Any) -> None:
    raise BadFact(f"field {path} must be {what}, not {_short(value)}")


def _any(value: Any, path: str) -> None:
    return None


def _str(value: Any, path: str) -> None:
    if not isinstance(value, str):
        _fail(path, "a string", value)


def _bool(value: Any, path: str) -> None:
    if not isinstance(value, bool):
        _fail(path, "true or false", value)


def _int(value: Any, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -INT_LIMIT < value < INT_LIMIT:
        _fail(path, "an integer below 2**63 in size", value)


def _num(value: Any, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(path, "a number", value)
    if isinstance(value, int) and not -INT_LIMIT < value < INT_LIMIT or isinstance(value, float) and not math.isfinite(value):
        _fail(path, "a finite number below 2**63 in size", value)


_VERSION = re.compile(r"\d+\.\d+[.+\-a-zA-Z0-9]*")


def _version(value: Any, path: str) -> None:
    """A dotted version ("12.8", "3.12.3", "3.13.0rc1"): the rules read its first two numbers."""
    if not isinstance(value, str) or not _VERSION.fullmatch(value):
        _fail(path, "a version such as 12.8", value)


def _scalar(value: Any, path: str) -> None:
    """A string or a number (torch's version.py has held both for ``hip`` and ``xpu``)."""
    if isinstance(value, str):
        return
    _num(value, path)


def choice(*allowed: str) -> Check:
    def run(value: Any, path: str) -> None:
        if value not in allowed or not isinstance(value, str):
            _fail(path, "one of " + ", ".join(allowed), value)
    return run


def opt(check: Check) -> Check:
    def run(value: Any, path: str) -> None:
        if value is not None:
            check(value, path)
    return run


def list_of(item: Check) -> Check:
    def run(value: Any, path: str) -> None:
        if not isinstance(value, list):
            _fail(path, "a list", value)
        for i, x in enumerate(value):
            item(x, f"{path}[{i}]")
    return run


def dict_of(item: Check) -> Check:
    def run(value: Any, path: str) -> None:
        if not isinstance(value, dict):
            _fail(path, "an object", value)
        for k, x in value.items():
            item(x, f"{path}[{_short(k)}]")
    return run


def obj(fields: Mapping[str, Check] | None = None, required: tuple[str, ...] = ()) -> Check:
    """An object whose listed fields, when present, have their shape; ``required`` ones must be present."""
    fields = dict(fields or {})

    def run(value: Any, path: str) -> None:
        if not isinstance(value, dict):
            _fail(path, "an object", value)
        for name in required:
            if name not in value:
                raise BadFact(f"field {path} lacks {name!r}")
        for name, check in fields.items():
            if name in value:
                check(value[name], f"{path}.{name}")
    return run


STR, BOOL, INT, NUM, ANY, VERSION, SCALAR = _str, _bool, _int, _num, _any, _version, _scalar
OSTR, OBOOL, OINT, ONUM, OVERSION, OSCALAR = opt(STR), opt(BOOL), opt(INT), opt(NUM), opt(VERSION), opt(SCALAR)
OOBJ = opt(obj())

_ERROR = opt(obj({"kind": OSTR, "message": OSTR}))
_NVML_DEVICE = obj({
    "index": INT, "name": OSTR, "uuid": OSTR, "pci": OSTR, "minor_number": OINT, "lost": OBOOL, "error": _ERROR,
    "memory": opt(obj({"total": OINT, "used": OINT, "free": OINT})),
    "utilization": opt(obj({"gpu": ONUM, "memory": ONUM})), "temperature_c": ONUM, "power_w": ONUM,
    "power_limit_w": ONUM, "pcie": opt(dict_of(ONUM)), "nvlink_up": ANY,
    "compute_capability": opt(list_of(INT)), "mig": opt(obj({"current": INT, "pending": INT}, required=("current", "pending"))),
    "processes": opt(list_of(obj({"pid": OINT, "used_memory": OINT}))), "unsupported": opt(dict_of(ANY)),
}, required=("index",))
_NVML = obj({"ok": OBOOL, "error": _ERROR, "driver_version": OSTR, "cuda_driver_version": OVERSION,
                 "nvml_version": OSTR, "devices": opt(list_of(_NVML_DEVICE)), "unsupported": opt(dict_of(ANY))})
_AMDSMI = opt(obj({"available": OBOOL, "reason": OSTR, "rocm_version": OSTR, "devices": opt(list_of(obj({
    "index": OINT, "name": OSTR, "pci": OSTR, "gfx": OSTR, "driver_version": OSTR, "temp_c": ONUM, "util": ONUM,
    "power_w": ONUM, "power_limit_w": ONUM, "vram_total": OINT, "vram_used": OINT, "unsupported": opt(dict_of(ANY)),
})))}))
_HOST_RUNTIME = obj({
    "cpu_logical": OINT, "cpu_physical": OINT, "mem_total": OINT, "mem_available": OINT, "shm_total": OINT,
    "shm_free": OINT, "python": OVERSION, "python_executable": OSTR, "kernel": OSTR, "machine": OSTR, "hostname": OSTR,
})
_TORCH_BUILD = obj({"installed": OBOOL, "not_recorded": OBOOL, "version": OSTR, "local": OSTR, "cuda": OVERSION,
                    "hip": OSCALAR, "xpu": OSCALAR, "debug": OBOOL, "git_version": OSTR,
                    "variant": choice("cuda", "rocm", "xpu", "cpu"), "tag": OSTR,
                    "path": OSTR, "dist_info": OSTR, "error": OSTR})
_TORCH_DEVICE = obj({"index": INT, "name": OSTR, "pci": OSTR, "uuid": OSTR, "total_memory": OINT,
                     "free_memory": OINT, "driver_version": OSTR, "capability": opt(list_of(INT)), "gcn_arch": OSTR,
                     "multi_processor_count": OINT}, required=("index",))
_ACCEL = opt(obj({"available": OBOOL, "device_count": INT, "error": ANY, "warnings": opt(list_of(ANY)),
                  "devices": opt(list_of(_TORCH_DEVICE))}))
_TORCH_RUNTIME = obj({
    "installed": OBOOL, "cached": OBOOL, "arch_list": opt(list_of(STR)), "xpu_arch_list": opt(list_of(STR)),
    "backends": opt(dict_of(OBOOL)), "env": opt(dict_of(OSTR)), "version": opt(obj({"torch": OSTR, "cuda": OVERSION, "hip": OSCALAR, "xpu": OSCALAR, "git": OSTR})),
    "cuda": _ACCEL, "xpu": _ACCEL, "hpu": _ACCEL, "ipex": ANY,
    "error": opt(obj({"kind": OSTR, "message": OSTR, "stderr": OSTR})),
})

# Fact key -> its schema. Keys with a ':' suffix (one fact per path) match on the prefix.
SCHEMAS: dict[str, Check] = {
    "user": obj({"uid": INT, "gid": INT, "groups": list_of(INT), "name": STR}, required=("uid", "gid")),
    "host_runtime": _HOST_RUNTIME,
    "nvml": _NVML,
    "amdsmi": _AMDSMI,
    "torch_build": _TORCH_BUILD,
    "torch_runtime": _TORCH_RUNTIME,
    "ipex_version": OSTR,
    "dist.if_addrs": dict_of(list_of(STR)),
    "dist.clock": obj({"timedatectl": opt(dict_of(ANY)), "chrony": opt(dict_of(ANY))}),
    "dist.rendezvous": opt(dict_of(ANY)),
    "pci_names": dict_of(ANY),
    "python_packages": dict_of(dict_of(OSTR)),
    "cwd": STR,
    "hl_smi": ANY,
    "tpu_packages": opt(dict_of(BOOL)),
    "nccl_plugin_load:": opt(dict_of(ANY)),
}


def schema_for(key: str) -> Check:
    check = SCHEMAS.get(key)
    if check is None and ":" in key:
        check = SCHEMAS.get(key.split(":", 1)[0] + ":")
    return check or _any


def check_fact(key: str, value: Any) -> None:
    """Raise BadFact (one line, naming the field) when ``value`` is not what ``key``'s producer writes."""
    schema_for(key)(value, f"facts.{key}" if key.isidentifier() else f"facts[{key!r}]")


def check_facts(facts: Mapping[str, Any]) -> None:
    for key, value in facts.items():
        check_fact(str(key), value)
