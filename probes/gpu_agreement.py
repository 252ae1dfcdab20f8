"""Do independent views of the same NVIDIA GPUs agree? Pure functions for GPU validation (issue 17).

``make gpu-check`` compares, on a machine with a GPU: NVML's answer against torch.cuda's (count,
names, memory, driver and CUDA versions), and the TUI device panel's sample against
``nvidia-smi --query-gpu`` taken at the same moment. The comparisons live here, as pure functions
of recorded answers, so CPU-only CI runs them on the recorded NVML fakes and they cannot rot
between GPU loans. Each returns a list of disagreements in words; empty means they agree.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

# The query the device panel is compared with; nounits keeps numbers bare (MiB, %, C, W).
SMI_FIELDS = ("index", "pci.bus_id", "name", "memory.total", "memory.used", "utilization.gpu", "temperature.gpu",
              "power.draw", "power.limit", "driver_version")
SMI_ARGV = ("nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,nounits")
MIB = 1 << 20


def _version(text: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(text or ""))[:3])


def short_pci(bus_id: str) -> str:
    """NVML's and nvidia-smi's "00000000:01:00.0" -> sysfs's "0000:01:00.0"."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id


def nvml_torch_agreement(nvml: Mapping[str, Any], runtime: Mapping[str, Any], kernel_driver: str | None = None,
                         mem_tolerance: float = 0.05) -> list[str]:
    """Disagreements between NVML's facts and the torch child's (probes/runtime_child.torch_facts).

    torch's total_memory is cudaDeviceProp.totalGlobalMem, a little below NVML's total (the driver
    reserves some), so memory agrees within ``mem_tolerance`` and never exceeds NVML's figure.
    """
    problems: list[str] = []
    if not nvml.get("ok"):
        return [f"NVML did not answer: {(nvml.get('error') or {}).get('message', 'unknown error')}"]
    cuda = runtime.get("cuda") or {}
    if not cuda.get("available"):
        return [f"torch.cuda is not available: {cuda.get('error') or 'no reason given'}"]
    visible = (runtime.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    n_nvml, n_torch = len(nvml.get("devices") or []), int(cuda.get("device_count") or 0)
    if n_nvml != n_torch and visible is None:
        problems.append(f"device count: NVML {n_nvml}, torch.cuda {n_torch}")
    by_pci = {d.get("pci"): d for d in nvml.get("devices") or []}
    for dev in cuda.get("devices") or []:
        problems += _device_disagreements(dev, by_pci.get(dev.get("pci")), mem_tolerance)
    torch_cuda = (runtime.get("version") or {}).get("cuda")
    driver_cuda = nvml.get("cuda_driver_version")
    if torch_cuda and driver_cuda and _version(driver_cuda)[:1] < _version(torch_cuda)[:1]:
        problems.append(f"CUDA: the driver supports {driver_cuda}, torch was built for {torch_cuda} (a newer major)")
    if kernel_driver and nvml.get("driver_version") and _version(kernel_driver) != _version(nvml["driver_version"]):
        problems.append(f"driver: NVML {nvml['driver_version']}, kernel module {kernel_driver}")
    return problems


def _device_disagreements(dev: Mapping[str, Any], ref: Mapping[str, Any] | None, mem_tolerance: float) -> list[str]:
    """One device as torch saw it against NVML's record of the same PCI address (None: no record)."""
    label = f"cuda:{dev.get('index')} ({dev.get('pci')})"
    if ref is None:
        return [f"{label}: torch sees it, NVML does not"]
    problems: list[str] = []
    if ref.get("name") != dev.get("name"):
        problems.append(f"{label}: name NVML {ref.get('name')!r}, torch {dev.get('name')!r}")
    total = (ref.get("memory") or {}).get("total")
    got = dev.get("total_memory")
    if total and got and not (total * (1 - mem_tolerance) <= got <= total):
        problems.append(f"{label}: memory NVML {total / 2**30:.2f} GiB, torch {got / 2**30:.2f} GiB")
    cap = ref.get("compute_capability")
    if cap and dev.get("capability") and list(cap) != list(dev["capability"]):
        problems.append(f"{label}: compute capability NVML {cap}, torch {dev['capability']}")
    return problems


def _number(text: str) -> float | None:
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "Not Supported"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_smi_csv(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,nounits`` -> one dict per GPU (bytes, %, C, W)."""
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    if not rows:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
    out = []
    for row in rows[1:]:
        if not row or len(row) != len(header):
            continue
        raw = dict(zip(header, (c.strip() for c in row), strict=True))
        total, used = _number(raw.get("memory.total", "")), _number(raw.get("memory.used", ""))
        out.append({
            "index": int(raw["index"]) if raw.get("index", "").isdigit() else None,
            "pci": short_pci(raw.get("pci.bus_id", "")),
            "name": raw.get("name"),
            "mem_total": None if total is None else int(total) * MIB,
            "mem_used": None if used is None else int(used) * MIB,
            "util": _number(raw.get("utilization.gpu", "")),
            "temp_c": _number(raw.get("temperature.gpu", "")),
            "power_w": _number(raw.get("power.draw", "")),
            "power_limit_w": _number(raw.get("power.limit", "")),
            "driver_version": raw.get("driver_version"),
        })
    return out


def panel_agreement(smi: Sequence[Mapping[str, Any]], samples: Sequence[Mapping[str, Any]],
                    pci_of: Mapping[str, str], *, used_tol: int = 512 * MIB, temp_tol: float = 5.0,
                    power_tol: float = 0.25) -> list[str]:
    """The device panel's samples (DeviceSample.to_dict(), keyed "cuda:N") against nvidia-smi's rows.

    ``pci_of`` maps a sample key to its PCI address (from the inventory). Totals and names must be
    equal (MiB rounding aside); used memory, temperature and power move between two reads taken
    "at the same moment", so they agree within tolerances; utilisation is too bursty to compare.
    """
    problems: list[str] = []
    rows = {r["pci"]: r for r in smi}
    nvidia = [s for s in samples if str(s.get("key", "")).startswith("cuda:")]
    if len(nvidia) != len(rows):
        problems.append(f"GPU count: panel {len(nvidia)}, nvidia-smi {len(rows)}")
    for s in nvidia:
        key = s["key"]
        row = rows.get(pci_of.get(key, ""))
        if row is None:
            problems.append(f"{key}: not in nvidia-smi's list ({pci_of.get(key)})")
            continue
        if s.get("name") != row["name"]:
            problems.append(f"{key}: name panel {s.get('name')!r}, nvidia-smi {row['name']!r}")
        if s.get("mem_total") is not None and row["mem_total"] is not None and abs(s["mem_total"] - row["mem_total"]) >= MIB:
            problems.append(f"{key}: memory total panel {s['mem_total']}, nvidia-smi {row['mem_total']} bytes")
        if s.get("mem_used") is not None and row["mem_used"] is not None and abs(s["mem_used"] - row["mem_used"]) > used_tol:
            problems.append(f"{key}: memory used panel {s['mem_used'] / MIB:.0f} MiB, nvidia-smi {row['mem_used'] / MIB:.0f} MiB")
        if s.get("temp_c") is not None and row["temp_c"] is not None and abs(s["temp_c"] - row["temp_c"]) > temp_tol:
            problems.append(f"{key}: temperature panel {s['temp_c']} C, nvidia-smi {row['temp_c']} C")
        if s.get("power_w") is not None and row["power_w"] is not None:
            allowed = max(20.0, power_tol * max(s["power_w"], row["power_w"]))
            if abs(s["power_w"] - row["power_w"]) > allowed:
                problems.append(f"{key}: power panel {s['power_w']:.0f} W, nvidia-smi {row['power_w']:.0f} W")
        limit, smi_limit = s.get("power_limit_w"), row["power_limit_w"]
        if limit is not None and smi_limit is not None and abs(limit - smi_limit) > 1.0:
            problems.append(f"{key}: power limit panel {limit} W, nvidia-smi {smi_limit} W")
        if s.get("mem_total") is None and row["mem_total"] is not None:
            problems.append(f"{key}: the panel shows no memory figures, nvidia-smi does")
    return problems
