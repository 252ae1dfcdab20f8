"""A rank report as rank 0 may trust it: size-capped, type-checked, secrets masked.

Reports arrive from other machines. A peer with a 1 MB environment variable (or a hostile one)
must cost rank 0 a bounded amount of work, so every string is cut to ``MAX_STRING`` characters and
every list or object to ``MAX_ITEMS`` entries *before* anything else (redaction, comparison,
printing) touches it. The shape check then turns a wrong-typed field into one line naming the
rank, instead of an exception deep inside a comparison rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from hwtui.core.redact import MASK

MAX_STRING = 4096  # an interface list or LD_LIBRARY_PATH fits; a 1 MB value is cut
MAX_ITEMS = 256  # findings, interfaces, variables
MAX_DEPTH = 8
MIN_SECRET_LEN = 4  # shorter --env values ("1", "WARN") would mask ordinary words everywhere


class PeerReportError(ValueError):
    """A peer's report has the wrong shape; the message names the rank and the field."""


def cap(value: Any, depth: int = 0) -> Any:
    """The same JSON value with every string, list and object cut to the limits above."""
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING else f"{value[:MAX_STRING]}...[{len(value) - MAX_STRING} characters cut]"
    if depth >= MAX_DEPTH and isinstance(value, (list, dict)):
        return "<nested too deeply>"
    if isinstance(value, list):
        return [cap(v, depth + 1) for v in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        return {cap(str(k), depth + 1): cap(v, depth + 1) for k, v in list(value.items())[:MAX_ITEMS]}
    return value


def mask_values(value: Any, secrets: Iterable[str]) -> Any:
    """Replace every occurrence of each secret value, in any string of ``value``, with the mask.

    Linear in the size of ``value`` per secret (str.replace), so capped reports stay cheap."""
    wanted = sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)
    if not wanted:
        return value

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            for s in wanted:
                if s in v:
                    v = v.replace(s, MASK)
            return v
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {walk(k): walk(x) for k, x in v.items()}
        return v

    return walk(value)


def mask_env(env: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """``env`` with the values of ``names`` (the --env variables of cluster.json) masked."""
    hidden = set(names)
    return {k: (MASK if k in hidden else v) for k, v in env.items()}


# -- shape --------------------------------------------------------------------------------------

_OPT_STR = (str, type(None))


def _need(ok: bool, rank: int, field: str, want: str) -> None:
    if not ok:
        raise PeerReportError(f"rank {rank} sent a malformed report: {field} must be {want}")


def _str_map(value: Any, allowed: tuple[type, ...]) -> bool:
    return isinstance(value, dict) and all(isinstance(v, allowed) for v in value.values())


def checked_report(raw: Any, slot: int, schema: str) -> dict[str, Any]:
    """``raw`` (already capped) if it has the shape the comparison reads; else PeerReportError."""
    _need(isinstance(raw, dict), slot, "the report", "a JSON object")
    _need(raw.get("schema") == schema, slot, "schema", repr(schema))
    rank = raw.get("rank")
    _need(isinstance(rank, int) and not isinstance(rank, bool) and rank == slot, slot, "rank", f"its own rank ({slot})")
    for name in ("node", "python", "hwtui"):
        _need(isinstance(raw.get(name), str) and bool(raw[name]), slot, name, "a non-empty string")
    _need(isinstance(raw.get("local_rank"), int), slot, "local_rank", "a number")
    torch = raw.get("torch")
    _need(isinstance(torch, dict), slot, "torch", "an object")
    for name in ("version", "cuda", "hip", "nccl"):
        _need(isinstance(torch.get(name), _OPT_STR), slot, f"torch.{name}", "a string or null")
    _need(isinstance(torch.get("device_count", 0), int), slot, "torch.device_count", "a number")
    _need(_str_map(raw.get("drivers", {}), _OPT_STR), slot, "drivers", "an object of strings")
    _need(_str_map(raw.get("env", {}), (str,)), slot, "env", "an object of strings")
    interfaces = raw.get("interfaces", {})
    _need(_str_map(interfaces, (dict,)), slot, "interfaces", "an object of objects")
    for name, info in interfaces.items():
        addrs = info.get("addresses", [])
        _need(isinstance(addrs, list) and all(isinstance(a, str) for a in addrs), slot,
              f"interfaces.{name}.addresses", "a list of strings")
    route = raw.get("route", {})
    _need(isinstance(route, dict) and isinstance(route.get("interface"), _OPT_STR)
          and isinstance(route.get("local_addr"), _OPT_STR), slot, "route", "an object with interface and local_addr")
    plugin = raw.get("plugin")
    _need(plugin is None or (isinstance(plugin, dict) and isinstance(plugin.get("value"), _OPT_STR)
                             and isinstance(plugin.get("path"), _OPT_STR)), slot, "plugin", "null or {value, path}")
    check = raw.get("check")
    _need(isinstance(check, dict) and isinstance(check.get("worst"), str), slot, "check", "an object with worst")
    findings = check.get("findings", [])
    _need(isinstance(findings, list) and all(isinstance(f, dict) and all(isinstance(f.get(k), str)
                                                                          for k in ("id", "status", "title"))
                                             for f in findings), slot, "check.findings", "a list of findings")
    return cast("dict[str, Any]", raw)  # every field a reader indexes was checked above
