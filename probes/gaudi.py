"""Intel Gaudi (Habana): devices from the torch child (habana_frameworks), hl-smi, HCCL readiness.

HCCL reads WORLD_SIZE, RANK and LOCAL_RANK when ``habana_frameworks.torch.distributed.hccl`` is
imported (or takes them from ``initialize_distributed_hpu(world_size, rank, local_rank)``); set
after the import they are silently ignored and every process believes it is rank 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hwtui.core.finding import Finding, fail, passed, warn
from hwtui.core.supervisor import run_capture
from hwtui.probes.devices import build_devices
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import FactUnavailable, Host
from hwtui.probes.pci import pci_fact

HCCL_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


def _hl_smi_live(path: str) -> dict[str, Any]:
    try:
        out = run_capture([path, "-Q", "index,name,bus_id,memory.total,memory.used,driver_version", "-f", "csv,noheader"],
                          timeout=15)
    except OSError as exc:
        return {"ok": False, "error": str(exc)}
    if out.timed_out:
        return {"ok": False, "error": f"{path} did not answer within 15 s (killed)"}
    if out.code != 0:
        return {"ok": False, "error": (out.stderr or out.stdout).strip()[-500:]}
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    return {"ok": True, "rows": rows}


def collect_gaudi(host: Host) -> dict[str, Any]:
    hl_smi = host.which("hl-smi")
    result: dict[str, Any] = {"hl_smi_path": hl_smi, "hl_smi": None,
                              "env": {k: host.env[k] for k in HCCL_VARS if k in host.env}}
    if hl_smi:
        try:
            result["hl_smi"] = host.fact("hl_smi", lambda: _hl_smi_live(hl_smi))
        except FactUnavailable:
            result["hl_smi"] = None
    return result


def gaudi_rules(facts: Facts) -> Iterator[Finding]:
    gaudi = facts["gaudi"]
    usable = [d for d in build_devices(pci_fact(facts)) if d.usable and d.vendor == "Habana"]
    if not usable:
        return
    hpu = (facts.get("torch_runtime") or {}).get("hpu")
    yield _runtime_finding(hpu, len(usable))
    smi_finding = _hl_smi_finding(gaudi)
    if smi_finding is not None:
        yield smi_finding
    yield _hccl_env_finding(gaudi.get("env") or {})
    backends = (facts.get("torch_runtime") or {}).get("backends") or {}
    if backends.get("hccl") is False:
        yield fail("gaudi.hccl", "the hccl backend is not registered", backends.get("hccl_error") or "",
                   "import habana_frameworks.torch.distributed.hccl before init_process_group('hccl')")


def _runtime_finding(hpu: dict[str, Any] | None, usable: int) -> Finding:
    """What habana_frameworks saw in the torch probe, against the Gaudi devices on the bus."""
    if hpu is None:
        return warn("gaudi.runtime", f"{usable} Gaudi device(s), but habana_frameworks was not probed",
                    "torch is not installed or its probe failed.",
                    "use Intel Gaudi's PyTorch container (vault.habana.ai/gaudi-docker/<version>/<os>/habanalabs/pytorch-installer-<torch>)")
    if not hpu.get("available"):
        return fail("gaudi.runtime", "habana_frameworks cannot see the Gaudi devices", hpu.get("error") or "",
                    "./habanalabs-installer.sh install --type pytorch (or use the Gaudi PyTorch container); "
                    "check `hl-smi` first")
    if hpu.get("device_count", 0) < usable:
        return warn("gaudi.runtime", f"habana_frameworks sees {hpu['device_count']} of {usable} Gaudi devices",
                    ", ".join(hpu.get("names") or []), "hl-smi; sudo dmesg | grep -i habanalabs")
    return passed("gaudi.runtime", f"habana_frameworks sees {hpu['device_count']} HPU(s)",
                  ", ".join(hpu.get("names") or []), count=hpu["device_count"])


def _hl_smi_finding(gaudi: dict[str, Any]) -> Finding | None:
    smi = gaudi.get("hl_smi")
    if gaudi.get("hl_smi_path") is None:
        return warn("gaudi.hl_smi", "hl-smi not found on PATH", "It ships with the habanalabs driver package.",
                    "sudo apt install habanalabs-firmware-tools (Intel Gaudi software repository)")
    if smi and not smi.get("ok"):
        return fail("gaudi.hl_smi", "hl-smi failed", smi.get("error") or "", "sudo dmesg | grep -i habanalabs")
    if smi:
        return passed("gaudi.hl_smi", f"hl-smi lists {len(smi.get('rows') or [])} device(s)",
                      "; ".join(", ".join(r) for r in smi.get("rows") or []))
    return None


def _hccl_env_finding(env: dict[str, str]) -> Finding:
    """HCCL reads WORLD_SIZE, RANK and LOCAL_RANK when imported: none, or all three."""
    missing = [k for k in HCCL_VARS if k not in env]
    if not env:
        return passed("gaudi.hccl_env", "WORLD_SIZE/RANK/LOCAL_RANK not set: fine for one process",
                      "For multi-process HCCL, set all three before importing habana_frameworks.torch.distributed.hccl, "
                      "or call initialize_distributed_hpu(world_size, rank, local_rank).")
    if missing:
        return fail("gaudi.hccl_env", f"HCCL environment incomplete: {', '.join(missing)} not set",
                    "HCCL reads all three when its module is imported; with one missing every process assumes rank 0.",
                    "export " + " ".join(f"{k}=<{k.lower()}>" for k in missing) + " before importing "
                    "habana_frameworks.torch.distributed.hccl (torchrun sets them), or call "
                    "initialize_distributed_hpu(world_size, rank, local_rank)", set=sorted(env))
    return passed("gaudi.hccl_env", "HCCL environment set: " + " ".join(f"{k}={env[k]}" for k in HCCL_VARS))


COLLECTORS = [Collector("gaudi", collect_gaudi, "gpu", timeout=20.0)]
RULES = [Rule("gaudi", gaudi_rules, "gpu", needs=("gaudi", "pci"))]
