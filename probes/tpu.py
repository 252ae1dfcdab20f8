"""Google TPU: from the PCI id and the presence of libtpu / torch_xla, never by initialising libtpu.

libtpu takes an exclusive lock on the chips when it initialises; a checker that did so would
fight (or block) the user's training job. So hwtui only looks: PCI ids, device nodes, installed
packages (found by import machinery without importing them) and PJRT_DEVICE.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

from hwtui.core.finding import Finding, fail, passed, warn
from hwtui.probes.devices import build_devices
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import FactUnavailable, Host
from hwtui.probes.pci import pci_fact

GENERATIONS = {0x0027: "v2/v3", 0x005E: "v4", 0x0062: "v5p", 0x0063: "v5e", 0x006F: "v6e"}
LOCKFILE = "/tmp/libtpu_lockfile"


def _python_packages() -> dict[str, bool]:
    out = {}
    for name in ("libtpu", "torch_xla", "jax"):
        try:
            out[name] = importlib.util.find_spec(name) is not None  # finds, does not import
        except (ImportError, ValueError):
            out[name] = False
    return out


def _packages(host: Host) -> dict[str, bool] | None:
    try:
        return host.fact("tpu_packages", _python_packages)
    except FactUnavailable:
        return None  # not recorded: say nothing about the runtime rather than guess


def collect_tpu(host: Host) -> dict[str, Any]:
    from hwtui.probes.amd import vendor_functions

    addrs = vendor_functions(host, 0x1AE0)
    if not addrs:
        return {"chips": []}
    chips = []
    for a in addrs:
        dev_id = host.read_int(f"/sys/bus/pci/devices/{a}/device", 16) or 0
        chips.append({"pci": a, "generation": GENERATIONS.get(dev_id, f"unknown (0x{dev_id:04x})")})
    return {
        "chips": chips,
        "packages": _packages(host),
        "pjrt_device": host.env.get("PJRT_DEVICE"),
        "lockfile": host.exists(LOCKFILE),
        "accel_nodes": [n for n in host.listdir("/dev") if n.startswith("accel")] + host.listdir("/dev/vfio"),
    }


def tpu_rules(facts: Facts) -> Iterator[Finding]:
    tpu = facts["tpu"]
    chips = tpu.get("chips") or []
    usable = [d for d in build_devices(pci_fact(facts)) if d.usable and d.vendor == "Google"]
    if not chips:
        return
    gens = sorted({c["generation"] for c in chips})
    yield passed("tpu.chips", f"{len(chips)} TPU chip(s), generation {', '.join(gens)}", f"{len(usable)} usable",
                 count=len(chips))
    python = (facts.get("host") or {}).get("python_executable") or "python3"
    pkgs = tpu.get("packages")
    if pkgs is None:
        return
    if not (pkgs.get("libtpu") or pkgs.get("torch_xla") or pkgs.get("jax")):
        yield fail("tpu.runtime", "no TPU runtime installed (libtpu, torch_xla or jax)", "",
                   f"{python} -m pip install torch 'torch_xla[tpu]'")
    else:
        yield passed("tpu.runtime", "TPU runtime: " + ", ".join(k for k, v in pkgs.items() if v))
    pjrt = tpu.get("pjrt_device")
    if pkgs.get("torch_xla"):
        if pjrt == "TPU":
            yield passed("tpu.pjrt", "PJRT_DEVICE=TPU")
        else:
            yield warn("tpu.pjrt", f"PJRT_DEVICE is {pjrt!r}, torch_xla needs TPU" if pjrt else "PJRT_DEVICE is not set",
                       "torch_xla picks its device from PJRT_DEVICE; unset it falls back to CPU with a warning.",
                       "export PJRT_DEVICE=TPU (Lightning: also PL_TORCH_DISTRIBUTED_BACKEND=xla)")
    if tpu.get("lockfile"):
        yield warn("tpu.lock", f"{LOCKFILE} exists: another process may hold the TPU",
                   "libtpu allows one process per host to open the chips; a stale lock file after a crash also blocks.",
                   "sudo lsof -w /dev/accel* /dev/vfio/* (if nothing holds it: rm /tmp/libtpu_lockfile)")


COLLECTORS = [Collector("tpu", collect_tpu, "gpu", timeout=5.0)]
RULES = [Rule("tpu", tpu_rules, "gpu", needs=("tpu", "pci"))]
