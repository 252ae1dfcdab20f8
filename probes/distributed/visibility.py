"""Device visibility masks must name devices that exist, and LOCAL_RANK must land on one.

The masks are applied by the vendor runtime before torch sees anything, and they fail quietly: an
out-of-range ordinal makes CUDA drop it and everything after it, ``-1`` hides every GPU, and
SLURM's ``--gpus-per-task=1`` leaves each rank one visible device while LOCAL_RANK still counts
up, so ``torch.cuda.set_device(LOCAL_RANK)`` fails on every rank but the first.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from hwtui.core.finding import Finding, fail, passed, skip, warn
from hwtui.probes.devices import Device
from hwtui.probes.distributed.launcher import env_int
from hwtui.probes.distributed.parsers import VisibleList, parse_module_list, parse_visible_devices, parse_ze_affinity_mask
from hwtui.probes.framework import Facts, Rule
from hwtui.probes.inventory import devices_from_facts

# Which masks each backend's runtime applies, in the order it applies them.
MASKS: dict[str, tuple[str, ...]] = {
    "cuda": ("CUDA_VISIBLE_DEVICES",),
    # ROCr filters first; HIP then indexes within what ROCr left. HIP also honours
    # CUDA_VISIBLE_DEVICES when HIP_VISIBLE_DEVICES is unset.
    "hip": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
    "xpu": ("ZE_AFFINITY_MASK",),
    "hpu": ("HABANA_VISIBLE_MODULES",),
}
VENDOR_OF_BACKEND = {"cuda": "NVIDIA", "hip": "AMD", "xpu": "Intel", "hpu": "Gaudi", "tpu": "TPU"}
ALL_MASK_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
                 "HABANA_VISIBLE_MODULES")


def parse_mask(name: str, raw: str) -> VisibleList:
    if name == "ZE_AFFINITY_MASK":
        return parse_ze_affinity_mask(raw)
    if name == "HABANA_VISIBLE_MODULES":
        return parse_module_list(raw)
    return parse_visible_devices(raw, name)


@dataclass
class MaskOutcome:
    variable: str
    backend: str
    visible: list[Device]
    problems: list[str]
    unverified: list[str]  # UUIDs hwtui could not match


def apply_mask(name: str, raw: str, devices: list[Device], backend: str = "") -> MaskOutcome:
    """The devices a runtime exposes after one mask, in the mask's order."""
    parsed = parse_mask(name, raw)
    problems = list(parsed.problems)
    visible: list[Device] = []
    unverified: list[str] = []
    strict_stop = name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
    for entry in parsed.entries:
        if entry.uuid is not None:
            match = [d for d in devices if str(d.extra.get("uuid", "")).lower() == entry.uuid.lower()]
            if match:
                visible.append(match[0])
            else:
                unverified.append(entry.uuid)
            continue
        idx = entry.index if entry.index is not None else -1
        if idx >= len(devices):
            problems.append(f"{name} names device {idx} but only {len(devices)} "
                            f"{'is' if len(devices) == 1 else 'are'} present (ordinals 0..{len(devices) - 1})")
            if strict_stop:
                break  # the CUDA/HIP runtimes stop at an invalid ordinal
            continue
        if devices[idx] not in visible:
            visible.append(devices[idx])
    return MaskOutcome(name, backend, visible, problems, unverified)


def visible_by_backend(env: Mapping[str, str], devices: list[Device]) -> tuple[dict[str, list[Device]], list[MaskOutcome]]:
    """Usable devices per backend after every mask that applies, and each mask's outcome."""
    by_backend: dict[str, list[Device]] = {}
    for dev in devices:
        if dev.usable and dev.backend:
            by_backend.setdefault(dev.backend, []).append(dev)
    for devs in by_backend.values():
        devs.sort(key=lambda d: d.index if d.index is not None else 0)
    outcomes: list[MaskOutcome] = []
    for backend, names in MASKS.items():
        current = by_backend.get(backend, [])
        names = names if backend != "hip" or "HIP_VISIBLE_DEVICES" in env else names + ("CUDA_VISIBLE_DEVICES",)
        for name in names:
            if name not in env or backend not in by_backend:
                continue
            outcome = apply_mask(name, env[name], current, backend)
            outcomes.append(outcome)
            current = outcome.visible if not outcome.unverified else current
        if backend in by_backend:
            by_backend[backend] = current
    return by_backend, outcomes


def _listing(devs: list[Device], backend: str) -> str:
    return "; ".join(f"{backend}:{i} -> {d.pci} {d.name}" for i, d in enumerate(devs))


def visibility_rules(facts: Facts) -> Iterator[Finding]:
    env = facts.host.env if facts.host else {}
    devices = [d for d in devices_from_facts(facts) if d.usable]
    by_backend, outcomes = visible_by_backend(env, devices)
    present = {d.backend for d in devices}

    for name in ALL_MASK_VARS:
        if name not in env:
            continue
        fid = f"visibility.{name.lower()}"
        mine = [o for o in outcomes if o.variable == name]
        if not mine:
            backends = [b for b, names in MASKS.items() if name in names]
            vendor = VENDOR_OF_BACKEND.get(backends[0], "matching") if backends else "matching"
            yield skip(fid, f"{name} is set but this node has no {vendor} device", "The variable has no effect here.")
            continue
        base_id = fid
        for outcome in mine:
            backend = outcome.backend
            # CUDA_VISIBLE_DEVICES applies to NVIDIA and (through HIP) AMD on a mixed node.
            fid = f"{base_id}[{backend}]" if len(mine) > 1 else base_id
            total = len([d for d in devices if d.backend == backend])
            if outcome.problems:
                yield fail(fid, outcome.problems[0], "; ".join(outcome.problems[1:]) or
                           f"Visible after the mask: {_listing(outcome.visible, backend) or 'none'}.",
                           f"export {name}={','.join(str(i) for i in range(total)) or '0'}  "
                           f"(ordinals 0..{max(total - 1, 0)} on this node)", visible=len(outcome.visible))
            elif not outcome.visible and not outcome.unverified:
                yield warn(fid, f"{name}={env[name]!r} hides every {VENDOR_OF_BACKEND.get(backend, '')} device",
                           "torch will report no device; the job falls back to CPU or fails.",
                           f"unset {name}", visible=0)
            elif outcome.unverified:
                yield passed(fid, f"{name} selects {len(outcome.unverified)} device(s) by UUID",
                             "hwtui cannot match UUIDs without the vendor library; the runtime checks them at init: "
                             + ", ".join(outcome.unverified), unverified=outcome.unverified)
            else:
                yield passed(fid, f"{name} exposes {len(outcome.visible)} of {total} device(s)",
                             _listing(outcome.visible, backend), visible=len(outcome.visible))

    nvidia = [d for d in devices if d.backend == "cuda"]
    if len({d.name for d in nvidia}) > 1 and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        yield warn("visibility.device_order", "mixed NVIDIA models without CUDA_DEVICE_ORDER=PCI_BUS_ID",
                   "CUDA numbers devices fastest first, so cuda:N and CUDA_VISIBLE_DEVICES ordinals differ from "
                   "nvidia-smi's and hwtui's PCI order.", "export CUDA_DEVICE_ORDER=PCI_BUS_ID")

    yield from _local_rank_findings(env, by_backend, present)


def _local_rank_findings(env: Mapping[str, str], by_backend: dict[str, list[Device]], present: set[str]) -> Iterator[Finding]:
    local_rank = env_int(env, "LOCAL_RANK")
    if local_rank is None:
        return
    accel = {b: devs for b, devs in by_backend.items() if b in present}
    if not accel:
        yield skip("visibility.local_rank", f"LOCAL_RANK={local_rank}: no accelerator on this node (CPU/gloo run)")
        return
    landing = [(b, devs[local_rank]) for b, devs in accel.items() if local_rank < len(devs)]
    if landing:
        backend, dev = landing[0]
        yield passed("visibility.local_rank", f"LOCAL_RANK {local_rank} lands on {backend}:{local_rank}",
                     f"{dev.pci} {dev.name}", backend=backend, pci=dev.pci)
        return
    counts = ", ".join(f"{len(d)} {b}" for b, d in accel.items())
    masked = [n for n in ALL_MASK_VARS if n in env]
    if any(len(d) == 1 for d in accel.values()) and masked:
        remedy = (f"{masked[0]} already gives this rank one device: use device index 0 "
                  "(torch.cuda.set_device(LOCAL_RANK % torch.cuda.device_count()))")
    else:
        most = max(len(d) for d in accel.values())
        remedy = f"torchrun --nproc-per-node={most} ... (one rank per visible device)"
    yield fail("visibility.local_rank", f"LOCAL_RANK={local_rank} has no device: visible {counts}",
               "set_device(LOCAL_RANK) raises 'invalid device ordinal' on this rank.", remedy, visible=counts)


RULES = [Rule("visibility", visibility_rules, "env", needs=("pci",))]
