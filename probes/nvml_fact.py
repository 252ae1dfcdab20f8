"""The shape of the ``nvml`` fact: what ``read_nvml`` writes and the NVIDIA rules, the inventory,
the sampler and the process list read.

Every field is optional (``total=False``): a GPU that cannot be read has only ``index``, ``lost``
and ``error``, a field NVML does not answer is None with the reason in ``unsupported``, and a
recording from elsewhere is checked against ``probes/fact_schema.py`` (which this mirrors) when it
is loaded. The producers' output is held against these types in tests/probes/test_typed_facts.py.
"""

from __future__ import annotations

from typing import TypedDict


class NvmlErrorInfo(TypedDict):
    kind: str  # "DriverNotLoaded", "GpuIsLost", ... (NVML's error name without NVMLError_)
    code: int | None
    message: str


class NvmlExtra(TypedDict, total=False):
    """The detail figures ``nvml_extra.read_extra`` reads (issue 25)."""

    clocks: dict[str, int | None] | None  # {"sm_mhz", "mem_mhz"}
    fan_pct: int | None
    ecc: dict[str, int | None] | None  # {"uncorrected", "corrected"}
    clocks_event: dict[str, object] | None  # {"mask": int, "reasons": [str]}
    nvlink_kib: dict[str, int] | None


class NvmlDevice(NvmlExtra, total=False):
    index: int  # always present
    lost: bool
    error: NvmlErrorInfo
    unsupported: dict[str, str]  # field -> why it is None
    name: str | None
    uuid: str | None
    pci: str | None  # sysfs form, "0000:01:00.0"
    minor_number: int | None
    memory: dict[str, int] | None  # bytes: total, used, free, version (+ reserved with v2)
    utilization: dict[str, int] | None  # percent: gpu, memory
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    pcie: dict[str, int | None]  # cur/max gen and width, tx/rx KB/s
    nvlink_up: int | None
    compute_capability: list[int] | None
    mig: dict[str, int] | None  # {"current", "pending"}
    processes: list[dict[str, int | None]] | None  # {"pid", "used_memory"}


class NvmlFact(TypedDict, total=False):
    ok: bool  # always present
    error: NvmlErrorInfo | None
    unsupported: dict[str, str]
    driver_version: str | None
    cuda_driver_version: str | None  # "12.8"
    nvml_version: str | None
    devices: list[NvmlDevice]
