"""``--gpu-ids`` and the legacy ``--cuda-ids``: user text to concrete devices, or a clear error.

Accepted forms (comma separated, whitespace ignored):

* global ids ``0,1,2`` -- the ``id`` column of ``hwtui list-gpus`` (CUDA first, then XPU, HIP...);
* backend ids ``cuda:0,xpu:0,hip:0,hpu:0`` -- per-backend indices in PCI bus order (``rocm:N``
  is accepted as an alias of ``hip:N`` because ROCm users think of it that way);
* ``cpu`` or ``cpu:0,cpu:1`` -- CPU ranks (gloo), one per entry.

Forms may be mixed (``cuda:0,cpu``). A duplicate (``0,cuda:0`` when global 0 is cuda:0 counts),
an empty entry or an id that does not exist raises :class:`GpuIdError`, whose message lists the
devices that *do* exist, because "no such GPU" without the alternatives is what sends users to
the issue tracker.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hwtui.probes.devices import Device

_VENDOR_OF_BACKEND = {"cuda": "NVIDIA", "hip": "AMD", "xpu": "Intel", "hpu": "Habana", "tpu": "Google", "cpu": "CPU"}
_ALIASES = {"rocm": "hip", "gpu": "cuda"}
# ASCII digits, at most 9: str.isdigit() and \d accept '²' and other Unicode digits that int()
# rejects, and int() refuses 5,000-digit text; either was an internal error instead of exit 2.
_BACKEND_ID = re.compile(r"([a-z]{1,16}):([0-9]{1,9})")
_GLOBAL_ID = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class DeviceRef:
    backend: str  # "cuda" | "hip" | "xpu" | "hpu" | "tpu" | "cpu"
    index: int  # per-backend index (cpu:N -> N)
    global_id: int | None  # None for cpu
    name: str
    vendor: str  # "NVIDIA" | "AMD" | "Intel" | "Habana" | "Google" | "CPU"

    @property
    def spec(self) -> str:
        return f"{self.backend}:{self.index}"

    @property
    def torch_device(self) -> str:
        """The device string torch uses: ROCm builds drive AMD GPUs through the ``cuda`` API."""
        return f"cuda:{self.index}" if self.backend == "hip" else self.spec


class GpuIdError(ValueError):
    """Bad ``--gpu-ids`` / ``--cuda-ids`` text; the message names the devices that exist."""


def _usable(devices: Sequence[Device]) -> list[Device]:
    return [d for d in devices if d.usable and d.id is not None and d.index is not None]


def available_text(devices: Sequence[Device]) -> str:
    """'0=cuda:0 (GeForce RTX 4090), 1=xpu:0 (Arc A750), cpu' -- what the user can choose from."""
    parts = [f"{d.id}={d.backend}:{d.index} ({d.name})" for d in _usable(devices)]
    unusable = [d for d in devices if not d.usable]
    text = ", ".join(parts + ["cpu"])
    if unusable:
        text += "; not usable: " + ", ".join(f"{d.pci} {d.name} ({d.reason})" for d in unusable)
    return text


def _ref(dev: Device) -> DeviceRef:
    assert dev.index is not None
    return DeviceRef(dev.backend, dev.index, dev.id, dev.name, dev.vendor)


def _cpu_ref(index: int) -> DeviceRef:
    return DeviceRef("cpu", index, None, "CPU" if index == 0 else f"CPU rank {index}", "CPU")


def _quoted(text: str, limit: int = 40) -> str:
    """A user value for a one-line message: repr shows control characters, the length is capped."""
    shown = repr(text[:limit])
    return shown if len(text) <= limit else shown[:-1] + "...'"


def _entries(spec: str, option: str) -> list[str]:
    if spec is None or not str(spec).strip():
        raise GpuIdError(f"{option} is empty: name devices such as 0,1 or cuda:0,cpu (see hwtui list-gpus)")
    entries = [e.strip().lower() for e in str(spec).split(",")]
    if any(not e for e in entries):
        raise GpuIdError(f"{option} {_quoted(spec)} has an empty entry (stray comma?)")
    return entries


def _check_duplicates(refs: list[DeviceRef], option: str, spec: str) -> list[DeviceRef]:
    seen: dict[str, int] = {}
    for pos, ref in enumerate(refs):
        if ref.spec in seen:
            raise GpuIdError(f"{option} {_quoted(spec)} names {ref.spec} twice (entries {seen[ref.spec] + 1} and {pos + 1})")
        seen[ref.spec] = pos
    return refs


def parse_gpu_ids(spec: str, devices: list[Device]) -> list[DeviceRef]:
    """Resolve ``--gpu-ids`` text against the detected devices, in the order given."""
    usable = _usable(devices)
    by_global = {d.id: d for d in usable}
    by_backend = {(d.backend, d.index): d for d in usable}
    refs: list[DeviceRef] = []
    for entry in _entries(spec, "--gpu-ids"):
        if entry == "cpu":
            refs.append(_cpu_ref(0))
            continue
        if _GLOBAL_ID.fullmatch(entry):
            dev = by_global.get(int(entry))
            if dev is None:
                raise GpuIdError(f"--gpu-ids: no device with global id {entry}; available: {available_text(devices)}")
            refs.append(_ref(dev))
            continue
        m = _BACKEND_ID.fullmatch(entry)
        if not m:
            raise GpuIdError(f"--gpu-ids: cannot read {_quoted(entry)} (use 0,1 or cuda:0,xpu:0,hip:0,hpu:0,cpu); "
                             f"available: {available_text(devices)}")
        backend, index = _ALIASES.get(m.group(1), m.group(1)), int(m.group(2))
        if backend == "cpu":
            refs.append(_cpu_ref(index))
            continue
        if backend not in _VENDOR_OF_BACKEND:
            raise GpuIdError(f"--gpu-ids: unknown backend {m.group(1)!r} in {_quoted(entry)} "
                             f"(known: cuda, hip, xpu, hpu, tpu, cpu); available: {available_text(devices)}")
        dev = by_backend.get((backend, index))
        if dev is None:
            hint = ""
            if backend == "cuda" and not any(d.backend == "cuda" for d in usable) and any(d.backend == "hip" for d in usable):
                hint = " (AMD GPUs are hip:N here even though ROCm's torch calls them cuda:N)"
            raise GpuIdError(f"--gpu-ids: no device {backend}:{index}{hint}; available: {available_text(devices)}")
        refs.append(_ref(dev))
    return _check_duplicates(refs, "--gpu-ids", spec)


def parse_cuda_ids(spec: str, devices: list[Device]) -> list[DeviceRef]:
    """The legacy ``--cuda-ids 0,1``: indices of torch.cuda devices.

    On an NVIDIA host these are the CUDA devices; on an AMD-only host ROCm's torch exposes the
    AMD GPUs through torch.cuda, so the same numbers mean hip devices.
    """
    usable = _usable(devices)
    backend = "cuda" if any(d.backend == "cuda" for d in usable) else "hip"
    pool = {d.index: d for d in usable if d.backend == backend}
    refs: list[DeviceRef] = []
    for entry in _entries(spec, "--cuda-ids"):
        if not _GLOBAL_ID.fullmatch(entry):
            raise GpuIdError(f"--cuda-ids takes plain indices such as 0,1 (got {_quoted(entry)}); "
                             f"use --gpu-ids for cuda:0,xpu:0 forms")
        dev = pool.get(int(entry))
        if dev is None:
            what = "no CUDA or ROCm device" if not pool else f"no {backend}:{entry}"
            raise GpuIdError(f"--cuda-ids: {what}; available: {available_text(devices)}")
        refs.append(_ref(dev))
    return _check_duplicates(refs, "--cuda-ids", spec)
