"""Every collector and rule hwtui runs, in one place.

Modules are listed by name and imported on demand so ``hwtui --help`` stays fast; each module
exposes ``COLLECTORS`` and/or ``RULES`` built from the functions it defines.
"""

from __future__ import annotations

import importlib

from hwtui.probes.framework import Collector, Rule
from hwtui.probes.hardware_rules import device_node_rules, host_rules, module_rules, pci_rules
from hwtui.probes.hostinfo import collect_host
from hwtui.probes.pci import collect_device_nodes, collect_modules, collect_pci

# Rule and collector areas are the groups `--check --only` selects: "hardware" (this module),
# "gpu" (vendor runtimes, drivers and wheels) and "env" (distributed environment and network).
# A finding's own area (its id's first segment) is what the report groups by.
CORE_COLLECTORS = [
    Collector("pci", collect_pci, "hardware", timeout=5.0),
    Collector("devnodes", collect_device_nodes, "hardware", timeout=5.0),
    Collector("modules", collect_modules, "hardware", timeout=5.0),
    Collector("host", collect_host, "hardware", timeout=5.0),
]
CORE_RULES = [
    Rule("pci", pci_rules, "hardware", needs=("pci",)),
    Rule("devnodes", device_node_rules, "hardware", needs=("pci", "devnodes")),
    Rule("modules", module_rules, "hardware", needs=("modules",)),
    Rule("host", host_rules, "hardware", needs=("host",)),
]

# Modules that add their own COLLECTORS / RULES (vendor probes, distributed environment...).
EXTENSION_MODULES: list[str] = ["hwtui.probes.nvidia", "hwtui.probes.amd", "hwtui.probes.intel", "hwtui.probes.gaudi",
                                  "hwtui.probes.tpu", "hwtui.probes.torchwheel",
                                  "hwtui.probes.distributed.netif", "hwtui.probes.distributed.launcher", "hwtui.probes.distributed.visibility",
                                  "hwtui.probes.distributed.rendezvous", "hwtui.probes.distributed.nccl", "hwtui.probes.distributed.ib",
                                  "hwtui.probes.distributed.vendor_ccl", "hwtui.probes.distributed.knobs", "hwtui.probes.distributed.hygiene",
                                  "hwtui.probes.frameworks", "hwtui.probes.gds", "hwtui.probes.distributed.nccl_plugin",
                                  "hwtui.probes.vendor_envs"]


def catalog() -> tuple[list[Collector], list[Rule]]:
    collectors, rules = list(CORE_COLLECTORS), list(CORE_RULES)
    for name in EXTENSION_MODULES:
        module = importlib.import_module(name)
        collectors += getattr(module, "COLLECTORS", [])
        rules += getattr(module, "RULES", [])
    return collectors, rules


def areas() -> list[str]:
    collectors, rules = catalog()
    return sorted({r.area for r in rules} | {c.area for c in collectors})
