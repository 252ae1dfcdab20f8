"""The agent's data sources on one Host: live samples, the local check, the facts nodes are compared on.

Each is a plain callable the refreshers run on their own threads; all results are JSON and pass
through ``redact`` before anything can serve them.
"""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable, Mapping
from typing import Any

from hwtui.core.redact import redact_doc

_DRIVER_MODULES = ("nvidia", "amdgpu", "xe", "i915", "habanalabs")


def sampler_source(host: Any) -> Callable[[], list[dict[str, Any]]]:
    """Samples through one long-lived Sampler, opened on first use (detection can take a second)."""
    holder: dict[str, Any] = {}
    lock = threading.Lock()

    def sample() -> list[dict[str, Any]]:
        with lock:
            if "sampler" not in holder:
                from hwtui.probes.sampling import Sampler

                holder["sampler"] = Sampler(host)
            # "key" would read as a secret's name to redact(): the agent calls it "device".
            return [{"device": d.pop("key"), **d} for d in (s.to_dict() for s in holder["sampler"].sample())]

    return sample


def check_source(host: Any, timeout_scale: float = 1.0) -> Callable[[], dict[str, Any]]:
    """hwtui's own check of ``host``: findings, summary, and the driver versions the comparison uses."""

    def check() -> dict[str, Any]:
        from hwtui.core.finding import summarize
        from hwtui.probes.catalog import catalog
        from hwtui.probes.framework import run_checks

        collectors, rules = catalog()
        result = run_checks(host, collectors, rules, timeout_scale=timeout_scale)
        modules = (result.facts.get("modules") or {}).get("modules", {})
        info = result.facts.get("host") or {}
        return redact_doc({
            "worst": result.worst.value,
            "findings": [f.to_dict() for f in result.findings],
            "summary": summarize(result.findings),
            "drivers": {name: m.get("version") for name, m in modules.items()
                        if name in _DRIVER_MODULES and m.get("version")},
            "os": info.get("os"), "kernel": info.get("kernel"),
            "duration_s": round(result.duration_s, 3),
        })

    return check


def facts_source(env: Mapping[str, str] | None = None,
                 torch_facts: Callable[[], dict[str, Any]] | None = None) -> Callable[[], dict[str, Any]]:
    """The node facts ``engine.cluster.compare`` reads that the local check does not give.

    torch is imported on this thread only (a second, once); a node without torch reports none.
    ``merge_facts`` adds the check's part at request time, so the check runs once for both.
    """
    from hwtui.engine.cluster import local

    def facts() -> dict[str, Any]:
        the_env = os.environ if env is None else env
        try:
            torch = (torch_facts or local.torch_facts)()
        except ImportError:
            torch = {"version": None, "cuda": None, "hip": None, "nccl": None, "device_count": 0}
        return redact_doc({
            "schema": local.SCHEMA,
            "hwtui": local._hwtui_version(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "torch": torch,
            "interfaces": local.interfaces(),
            "route": {"master": None, "local_addr": None, "interface": None},
            "env": local.env_of_interest(the_env),
            "plugin": local.plugin_facts(the_env),
        })

    return facts


def merge_facts(facts: Mapping[str, Any] | None, check: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A report in the shape of schema hwtui.cluster.rank/1 (less rank and node, which the reader adds)."""
    if not facts:
        return None
    check = check or {}
    out = dict(facts)
    out["platform"] = {"machine": out.pop("machine", None), "kernel": check.get("kernel"), "os": check.get("os")}
    out["drivers"] = check.get("drivers") or {}
    out["check"] = {"worst": check.get("worst", "skip"), "findings": check.get("findings", [])}
    return out
