"""Which torch build is installed, and does it fit this machine's GPUs and drivers?

hwtui never imports torch in its own process. The build comes from parsing ``torch/version.py``
(``ast``, no exec); what only an imported torch can say (arch list, device capabilities,
collective backends) comes from a child process, cached per torch install (torch_cache.py).

Each verdict that fails carries the exact reinstall command for THIS host: the index URL chosen
from its GPUs' architectures, its driver version and its Python interpreter.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any, TypedDict, cast

from hwtui.core.bounded_read import SMALL_FILE_CAP, decode_text, read_capped
from hwtui.core.finding import Finding, Status, error, fail, passed, skip, warn
from hwtui.probes import torch_cache
from hwtui.probes.child import ChildError, run_in_child
from hwtui.probes.devices import Device, build_devices
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import FactUnavailable, Host
from hwtui.probes.pci import pci_fact

INDEX_URL = "https://download.pytorch.org/whl"
# The ROCm index current torch releases publish (torch 2.8/2.9: rocm6.4).
ROCM_TAG = "rocm6.4"
# The torch release `hwtui setup` pins (`torch==<release>+<tag>`), per index tag where the newest
# release on that index is older: cu118 ended with 2.7, cu129 with 2.8. `--torch-version` overrides.
TORCH_RELEASE = "2.9.1"
TORCH_RELEASE_FOR_TAG = {"cu118": "2.7.1", "cu129": "2.8.0"}

# Minimum Linux driver per CUDA toolkit (NVIDIA's CUDA release notes, table 3).
CUDA_MIN_DRIVER: dict[str, str] = {
    "11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.3": "545.23.06",
    "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03", "12.8": "570.26", "12.9": "575.51.03",
    "13.0": "580.65.06",
}
# Minor-version compatibility: a toolkit of this major runs on any driver from this floor on,
# except that PTX compiled by a newer toolkit cannot be JIT-compiled by an older driver.
MINOR_COMPAT_FLOOR = {11: "450.80.02", 12: "525.60.13", 13: "580"}

# SASS targets of the official wheels, used when the torch child could not run.
DEFAULT_ARCH_LISTS: dict[str, list[str]] = {
    "cu118": ["sm_50", "sm_60", "sm_61", "sm_70", "sm_75", "sm_80", "sm_86", "sm_37", "sm_90"],
    "cu121": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
    "cu124": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
    "cu126": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
    "cu128": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
    "cu129": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
    "cu130": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_110", "sm_120"],
    "rocm6": ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1102"],
    "rocm6.4": ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1101",
                "gfx1102", "gfx1200", "gfx1201"],
}
# Wheels hwtui may recommend for NVIDIA, most preferred first.
NVIDIA_TAGS = ("cu128", "cu126", "cu130", "cu118")


# -- reading the build ----------------------------------------------------------------------

class TorchBuild(TypedDict, total=False):
    """The ``torch_build`` fact: the installed wheel as its version.py says (fact_schema's _TORCH_BUILD)."""

    installed: bool  # always present
    not_recorded: bool  # a recording made without it
    error: str  # version.py could not be read
    version: str  # "2.9.1+cu128"
    local: str | None  # "cu128"
    cuda: str | None  # torch.version.cuda
    hip: str | float | None  # torch.version.hip (a number in some builds)
    xpu: str | float | None
    debug: bool | None
    git_version: str | None
    variant: str  # cuda, rocm, xpu or cpu
    tag: str  # the wheel index tag: cu128, rocm6.4, xpu, cpu
    path: str  # the torch package directory
    dist_info: str | None


class TorchVersion(TypedDict, total=False):
    torch: str | None
    cuda: str | None
    hip: str | float | None
    xpu: str | float | None
    git: str | None


class ProbeError(TypedDict):
    kind: str | None  # timeout, crash, exit ... (core.supervisor's ChildError kinds)
    message: str | None
    stderr: str | None


class TorchRuntime(TypedDict, total=False):
    """The ``torch_runtime`` fact: what the runtime child saw when it imported torch (fact_schema's
    _TORCH_RUNTIME checks a recorded one). Per accelerator (cuda, xpu, hpu) the child's own record."""

    installed: bool  # always present
    not_recorded: bool  # a recording made without it
    cached: bool  # read from the runtime cache, not a fresh child
    arch_list: list[str] | None
    xpu_arch_list: list[str] | None
    backends: dict[str, bool | None]  # gloo, nccl, ... -> available
    env: dict[str, str | None]
    version: TorchVersion
    cuda: dict[str, Any]
    xpu: dict[str, Any]
    hpu: dict[str, Any]
    ipex: Any
    error: ProbeError  # the child failed: no other field


class ProbeArgs(TypedDict):
    """What the runtime child is asked to probe beyond torch itself (it is also the cache key's input)."""

    probe_xpu: bool
    probe_ccl: bool  # oneCCL: only with an Intel GPU on the bus
    probe_hpu: bool  # habana: only with a Gaudi on the bus


def parse_version_py(text: str) -> dict[str, Any]:
    """``torch/version.py`` -> its constants. Literal assignments only; nothing is executed."""
    out: dict[str, Any] = {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return out
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        else:
            continue
        try:
            out[name] = ast.literal_eval(value)
        except ValueError:
            continue
    return out


def _version_tuple(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def describe_build(consts: dict[str, Any]) -> TorchBuild:
    """Variant and index tag of a build: ('cuda', 'cu128'), ('rocm', 'rocm6.3'), ('xpu', 'xpu'), ('cpu', 'cpu')."""
    version = str(consts.get("__version__") or "")
    local = version.split("+", 1)[1] if "+" in version else ""
    cuda, hip, xpu = consts.get("cuda"), consts.get("hip"), consts.get("xpu")
    if cuda:
        variant, tag = "cuda", local if local.startswith("cu") else "cu" + "".join(str(cuda).split(".")[:2])
    elif hip:
        variant = "rocm"
        tag = local if local.startswith("rocm") else "rocm" + ".".join(str(consts.get("rocm") or hip).split(".")[:2])
    elif xpu or local == "xpu":
        variant, tag = "xpu", "xpu"
    else:
        variant, tag = "cpu", "cpu"
    return {"installed": True, "version": version, "local": local or None, "cuda": cuda, "hip": hip, "xpu": xpu,
            "debug": consts.get("debug"), "git_version": consts.get("git_version"), "variant": variant, "tag": tag}


def _live_build() -> TorchBuild:
    location = torch_cache.locate_torch()
    if location is None:
        return {"installed": False}
    try:
        consts = parse_version_py(decode_text(read_capped(location["version_py"], SMALL_FILE_CAP)))
    except OSError as exc:
        return {"installed": True, "error": f"cannot read {location['version_py']}: {exc.strerror}",
                "path": location["package"]}
    return {**describe_build(consts), "path": location["package"], "dist_info": location["dist_info"]}


NOT_RECORDED: TorchBuild = {"installed": False, "not_recorded": True}


def collect_torch_build(host: Host) -> TorchBuild:
    try:
        return host.fact("torch_build", _live_build)
    except FactUnavailable:
        return NOT_RECORDED.copy()


# -- the runtime child, cached --------------------------------------------------------------

def probe_args_for(pci: Mapping[str, Any] | None) -> ProbeArgs:
    vendors = {d.get("vendor") for d in (pci or {}).get("devices", [])}
    return {"probe_xpu": True, "probe_ccl": "Intel" in vendors, "probe_hpu": "Habana" in vendors}


def live_runtime(probe_args: ProbeArgs, timeout: float = 90.0) -> TorchRuntime:
    """Torch facts from the cache, or from one child process (then cached)."""
    location = torch_cache.locate_torch()
    if location is None:
        return {"installed": False}
    key = torch_cache.runtime_key(location, probe_args)
    cached = torch_cache.load(key)
    if cached is not None:
        return cast("TorchRuntime", {**cached, "cached": True})
    env = dict(os.environ)
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # indices in PCI order, like NVML and hwtui's ids
    try:
        facts = run_in_child("hwtui.probes.runtime_child:torch_facts", probe_args, timeout=timeout, env=env)
    except ChildError as exc:
        # Not cached: a timeout on a loaded machine must not stick.
        return {"installed": True, "error": {"kind": exc.kind, "message": str(exc), "stderr": exc.stderr_tail[-1500:]}}
    facts = {"installed": True, **facts}
    torch_cache.store(key, facts)
    # The child's JSON, as torch_facts writes it (tests/probes/test_typed_facts.py holds the two together).
    return cast("TorchRuntime", {**facts, "cached": False})


def collect_torch_runtime(host: Host) -> TorchRuntime:
    def produce() -> TorchRuntime:
        from hwtui.probes.pci import collect_pci

        # Only the optional imports depend on the hardware (oneCCL with Intel, habana with Gaudi).
        return live_runtime(probe_args_for(collect_pci(host)))

    try:
        return host.fact("torch_runtime", produce)
    except FactUnavailable:
        return {"installed": False, "not_recorded": True}


# -- what the machine needs -------------------------------------------------------------------

def nvidia_capabilities(facts: Facts) -> dict[str, tuple[int, int]]:
    """PCI address -> compute capability, from NVML, else from torch's own device list."""
    out: dict[str, tuple[int, int]] = {}
    for dev in (facts.get("nvml") or {}).get("devices") or []:
        if dev.get("pci") and dev.get("compute_capability"):
            out[dev["pci"]] = cast("tuple[int, int]", tuple(dev["compute_capability"]))
    runtime = facts.get("torch_runtime") or {}
    version = runtime.get("version") or {}
    if not version.get("hip"):
        for dev in (runtime.get("cuda") or {}).get("devices") or []:
            if dev.get("pci") and dev.get("capability") and dev["pci"] not in out:
                out[dev["pci"]] = cast("tuple[int, int]", tuple(dev["capability"]))
    return out


def amd_targets(facts: Facts) -> dict[str, str]:
    """PCI address -> native gfx target (amdsmi, KFD topology, or torch's gcnArchName)."""
    out: dict[str, str] = {}
    for dev in (facts.get("amd") or {}).get("devices") or []:
        if dev.get("pci") and dev.get("gfx"):
            out[dev["pci"]] = dev["gfx"]
    runtime = facts.get("torch_runtime") or {}
    if (runtime.get("version") or {}).get("hip"):
        for dev in (runtime.get("cuda") or {}).get("devices") or []:
            if dev.get("pci") and dev.get("gcn_arch") and dev["pci"] not in out:
                out[dev["pci"]] = dev["gcn_arch"].split(":")[0]
    return out


def nvidia_driver_version(facts: Facts) -> str | None:
    from hwtui.probes.nvidia import driver_version

    return driver_version(facts)


def python_of(facts: Facts) -> tuple[str, str | None]:
    host = facts.get("host") or {}
    return host.get("python_executable") or "python3", host.get("python")


def _sm_list(arch_list: list[str]) -> list[tuple[str, int, int, str]]:
    out = []
    for entry in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", entry)
        if m:
            out.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)))
    return out


def cuda_arch_support(cc: tuple[int, int], arch_list: list[str]) -> str | None:
    """'sass' when the wheel has a binary for the GPU, 'ptx' when only JIT works, None when neither.

    SASS for sm_XY runs on compute capability X.Z with Z >= Y (same major); arch-specific
    ``sm_90a`` runs only on 9.0. PTX ``compute_XY`` JIT-compiles for any capability >= X.Y.
    """
    major, minor = cc
    kind = None
    for what, m_major, m_minor, suffix in _sm_list(arch_list):
        if what == "sm" and m_major == major and (m_minor == minor if suffix else m_minor <= minor):
            return "sass"
        if what == "compute" and (m_major, m_minor) <= (major, minor):
            kind = "ptx"
    return kind


def gfx_from_override(value: str) -> str | None:
    """HSA_OVERRIDE_GFX_VERSION '10.3.0' -> 'gfx1030', '9.0.10' -> 'gfx90a', '9.4.2' -> 'gfx942'."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", value or "")
    if not m:
        return None
    return f"gfx{int(m.group(1))}{int(m.group(2))}{int(m.group(3)):x}"


def override_for(gfx: str) -> str | None:
    """The HSA_OVERRIDE_GFX_VERSION that maps a consumer RDNA part onto its supported sibling."""
    m = re.fullmatch(r"gfx(\d+)(\d)([0-9a-f])", gfx)
    if not m:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    siblings = {(10, 3): "10.3.0", (11, 0): "11.0.0", (12, 0): "12.0.1", (9, 0): "9.0.6"}
    return siblings.get((major, minor))


def compare_driver(cuda: str, driver: str) -> tuple[Status, str]:
    """The CUDA-wheel-vs-driver verdict, from NVIDIA's table and the minor-version rules."""
    drv = _version_tuple(driver)
    key = ".".join(cuda.split(".")[:2])
    minimum = CUDA_MIN_DRIVER.get(key)
    major = _version_tuple(cuda)[0] if _version_tuple(cuda) else 0
    floor = MINOR_COMPAT_FLOOR.get(major)
    if minimum and drv >= _version_tuple(minimum):
        return Status.PASS, f"driver {driver} >= {minimum}, the minimum for CUDA {key}"
    if floor and drv >= _version_tuple(floor):
        why = f"below {minimum}, CUDA {key}'s minimum" if minimum else f"CUDA {key} is not in hwtui's table"
        return Status.WARN, (f"driver {driver} is {why}; it runs under CUDA {major}.x minor-version compatibility "
                             f"(driver >= {floor}), where kernels shipped only as newer PTX fail to JIT "
                             "('the provided PTX was compiled with an unsupported toolchain')")
    need = minimum or floor or "?"
    return Status.FAIL, (f"driver {driver} is below {need}, the minimum for CUDA {key}"
                         + (f" (and below the CUDA {major}.x minor-version floor {floor})" if floor else "")
                         + "; torch.cuda.is_available() will be False")


def pick_nvidia_tag(caps: list[tuple[int, int]], driver: str | None) -> tuple[str, bool]:
    """The wheel for these GPUs: (tag, driver_ok). Prefers a wheel the driver fully supports."""
    drv = _version_tuple(driver)
    covering = [t for t in NVIDIA_TAGS if all(cuda_arch_support(c, DEFAULT_ARCH_LISTS[t]) == "sass" for c in caps)]
    if not covering:
        covering = ["cu128"]
    for tag in covering:
        cuda = f"{tag[2:-1]}.{tag[-1]}"
        if not drv or drv >= _version_tuple(CUDA_MIN_DRIVER.get(cuda, "0")):
            return tag, True
    return covering[0], False


def recommended_tag(facts: Facts, devices: list[Device]) -> tuple[str | None, str]:
    """Index tag for this host's hardware, with a prefix step (driver upgrade) when one is needed."""
    usable = [d for d in devices if d.usable]
    vendors = {d.vendor for d in usable}
    if "NVIDIA" in vendors:
        caps = [c for pci, c in nvidia_capabilities(facts).items() if any(d.pci == pci for d in usable)]
        driver = nvidia_driver_version(facts)
        tag, ok = pick_nvidia_tag(caps, driver)
        cuda = f"{tag[2:-1]}.{tag[-1]}"
        pre = "" if ok else f"sudo apt install nvidia-driver-570-server (driver >= {CUDA_MIN_DRIVER[cuda]} for CUDA {cuda}) && "
        return tag, pre
    if "AMD" in vendors:
        return ROCM_TAG, ""
    if "Intel" in vendors:
        return "xpu", ""
    if vendors & {"Habana", "Google"}:
        return None, ""
    return "cpu", ""


def install_command(tag: str, python: str) -> str:
    """Reinstall, not install: pip treats 2.7.0+cu126 as satisfying 'torch' and would do nothing."""
    return (f"{python} -m pip uninstall -y torch && "
            f"{python} -m pip install torch --index-url {INDEX_URL}/{tag}")


def remedy_for(facts: Facts, devices: list[Device]) -> str:
    python, pyver = python_of(facts)
    tag, pre = recommended_tag(facts, devices)
    vendors = {d.vendor for d in devices if d.usable}
    if tag is None:
        if "Habana" in vendors:
            return "use Intel Gaudi's PyTorch (docker image vault.habana.ai/gaudi-docker/...-pytorch-installer, or " \
                   "./habanalabs-installer.sh install --type pytorch)"
        return f"{python} -m pip install torch 'torch_xla[tpu]'"
    cmd = pre + install_command(tag, python)
    if pyver and _version_tuple(pyver) < (3, 10):
        cmd = f"python3.12 -m venv .venv && .venv/bin/python -m pip install torch --index-url {INDEX_URL}/{tag}"
    return cmd


# -- verdicts -------------------------------------------------------------------------------

_WHEEL_FOR = {"cuda": "NVIDIA", "rocm": "AMD", "xpu": "Intel"}


def wheel_rules(facts: Facts) -> Iterator[Finding]:
    build = facts["torch_build"]
    devices = build_devices(pci_fact(facts))
    usable = [d for d in devices if d.usable]
    vendors = {d.vendor for d in usable}
    remedy = remedy_for(facts, devices)
    if build.get("not_recorded"):
        yield skip("torch.wheel.build", "the torch build was not recorded with this machine")
        return
    if not build.get("installed"):
        if vendors & {"NVIDIA", "AMD", "Intel"}:
            yield warn("torch.wheel.build", "torch is not installed", "The engine (replicate, train) needs torch.", remedy)
        else:
            # No GPU to match, but the line to type is still exact (the README promises it): a
            # fresh install needs no uninstall step, and the CPU index keeps CUDA wheels out.
            python, _ = python_of(facts)
            tag, _ = recommended_tag(facts, devices)
            fresh = f"{python} -m pip install torch --index-url {INDEX_URL}/{tag}" if tag else remedy
            yield Finding("torch.wheel.build", Status.SKIP, "torch is not installed",
                          "The engine (replicate, train) needs torch.", fresh)
        return
    if build.get("error"):
        yield error("torch.wheel.build", "cannot read the installed torch build", build["error"], remedy)
        return
    variant, tag = build["variant"], build["tag"]
    what = {"cuda": f"CUDA {build.get('cuda')}", "rocm": f"ROCm {'.'.join(str(build.get('hip')).split('.')[:2])}", "xpu": "XPU", "cpu": "CPU only"}[variant]
    yield passed("torch.wheel.build", f"torch {build['version']} ({what})", build.get("path") or "",
                 variant=variant, tag=tag, version=build["version"])

    # The wheel's vendor against the GPUs present.
    gpu_vendors = vendors & {"NVIDIA", "AMD", "Intel"}
    if variant == "cpu":
        if gpu_vendors:
            yield fail("torch.wheel.variant", f"CPU-only torch on a host with {'/'.join(sorted(gpu_vendors))} GPU(s)",
                       f"torch {build['version']} has no GPU support; every GPU here is unused.", remedy)
        else:
            yield passed("torch.wheel.variant", "CPU torch on a host without a GPU")
    else:
        wanted = _WHEEL_FOR[variant]
        if wanted in vendors:
            others = gpu_vendors - {wanted}
            detail = (f"One torch build drives one vendor: the {', '.join(sorted(others))} GPU(s) need their own "
                      "virtualenv with their own wheel.") if others else ""
            yield passed("torch.wheel.variant", f"{what} torch for the {wanted} GPU(s)", detail)
        elif gpu_vendors:
            yield fail("torch.wheel.variant", f"{what} torch, but this host has {'/'.join(sorted(gpu_vendors))} GPU(s) "
                       f"and no {wanted} GPU", f"torch {build['version']} cannot use any GPU here.", remedy)
        else:
            yield warn("torch.wheel.variant", f"{what} torch on a host without a {wanted} GPU",
                       "A GPU wheel without its GPU runs on CPU only and is gigabytes larger.", remedy)

    runtime = facts.get("torch_runtime") or {}
    if variant == "cuda" and "NVIDIA" in vendors:
        yield from _driver_verdict(facts, build, usable, remedy)
        yield from _cuda_arch_verdicts(facts, build, runtime, usable, remedy)
    if variant == "rocm" and "AMD" in vendors:
        yield from _rocm_arch_verdicts(facts, build, runtime, usable)
    if facts.host is not None and "AMD" in vendors:
        yield from _hsa_override(facts, build, runtime, usable)
    if variant == "xpu":
        yield from _level_zero_verdict(facts, vendors)


def _driver_verdict(facts: Facts, build: dict[str, Any], usable: list[Device], remedy: str) -> Iterator[Finding]:
    driver = nvidia_driver_version(facts)
    cuda = str(build.get("cuda") or "")
    fid = "nvidia.driver.cuda_compat"
    if not driver:
        yield skip(fid, f"CUDA {cuda} wheel: NVIDIA driver version unknown (no NVML, no /proc/driver/nvidia/version)")
        return
    status, detail = compare_driver(cuda, driver)
    minimum = CUDA_MIN_DRIVER.get(".".join(cuda.split(".")[:2]))
    title = {Status.PASS: f"driver {driver} supports the CUDA {cuda} wheel",
             Status.WARN: f"driver {driver} runs the CUDA {cuda} wheel only under minor-version compatibility",
             Status.FAIL: f"driver {driver} is too old for the CUDA {cuda} wheel"}[status]
    fix = "" if status == Status.PASS else (
        f"sudo apt install nvidia-driver-570-server (>= {minimum or '?'}), or match the wheel to the driver: {remedy}")
    yield Finding(fid, status, title, detail, fix, data={"driver": driver, "cuda": cuda, "minimum": minimum})


def _arch_list(runtime: dict[str, Any], tag: str, default_key: str) -> tuple[list[str], bool]:
    listed = runtime.get("arch_list") if not runtime.get("error") else None
    if listed:
        return list(listed), False
    return list(DEFAULT_ARCH_LISTS.get(tag) or DEFAULT_ARCH_LISTS.get(default_key, [])), True


def _cuda_arch_verdicts(facts: Facts, build: dict[str, Any], runtime: dict[str, Any], usable: list[Device],
                        remedy: str) -> Iterator[Finding]:
    caps = nvidia_capabilities(facts)
    arch_list, assumed = _arch_list(runtime, build["tag"], "cu126")
    note = f" (arch list assumed from the official {build['tag']} wheel: torch runtime facts unavailable)" if assumed else ""
    for dev in (d for d in usable if d.vendor == "NVIDIA"):
        fid = f"torch.wheel.arch[{dev.pci}]"
        cc = caps.get(dev.pci)
        if cc is None:
            yield skip(fid, f"{dev.name}: compute capability unknown (NVML unavailable)")
            continue
        sm = f"sm_{cc[0]}{cc[1]}"
        support = cuda_arch_support(cc, arch_list)
        listing = "wheel targets: " + " ".join(arch_list) + note
        if support == "sass":
            yield passed(fid, f"{dev.name} ({sm}) has kernels in torch {build['version']}", listing, sm=sm)
        elif support == "ptx":
            yield warn(fid, f"{dev.name} ({sm}) runs only through PTX JIT", listing + "; the first run of each kernel "
                       "compiles it (minutes) and some kernels are missing.", remedy, sm=sm)
        else:
            need = "cu128 or newer (torch >= 2.7)" if cc >= (10, 0) else "cu126" if cc < (7, 0) else "a wheel that lists it"
            yield fail(fid, f"{dev.name} ({sm}) has no kernels in torch {build['version']}: needs {need}",
                       listing + f"; torch fails with 'no kernel image is available for execution on the device' "
                       f"('{sm} is not compatible with the current PyTorch installation').", remedy, sm=sm)


def _rocm_arch_verdicts(facts: Facts, build: dict[str, Any], runtime: dict[str, Any], usable: list[Device]) -> Iterator[Finding]:
    targets = amd_targets(facts)
    arch_list, assumed = _arch_list(runtime, build["tag"], "rocm6")
    note = f" (arch list assumed from the official {build['tag']} wheel)" if assumed else ""
    env = facts.host.env if facts.host else {}
    override = gfx_from_override(env.get("HSA_OVERRIDE_GFX_VERSION", ""))
    python, _ = python_of(facts)
    for dev in (d for d in usable if d.vendor == "AMD"):
        fid = f"torch.wheel.arch[{dev.pci}]"
        gfx = targets.get(dev.pci)
        if not gfx:
            yield skip(fid, f"{dev.name}: gfx target unknown (no amdsmi, no KFD topology)")
            continue
        listing = "wheel targets: " + " ".join(arch_list) + note
        if gfx in arch_list:
            yield passed(fid, f"{dev.name} ({gfx}) has kernels in torch {build['version']}", listing, gfx=gfx)
        elif override and override in arch_list:
            yield warn(fid, f"{dev.name} ({gfx}) runs only through HSA_OVERRIDE_GFX_VERSION as {override}",
                       listing + "; an unsupported configuration: kernels built for another ISA may crash or miscompute.",
                       "", gfx=gfx, override=override)
        else:
            newer = [t for t in ("rocm6.4",) if gfx in DEFAULT_ARCH_LISTS[t] and t != build["tag"]]
            sibling = override_for(gfx)
            if newer:
                fix = install_command(newer[0], python)
            elif sibling and gfx_from_override(sibling) in arch_list:
                fix = f"export HSA_OVERRIDE_GFX_VERSION={sibling} (runs {gfx_from_override(sibling)} kernels; unsupported by AMD)"
            else:
                fix = f"build torch from source with PYTORCH_ROCM_ARCH={gfx}"
            yield fail(fid, f"{dev.name} ({gfx}) is not in torch's ROCm arch list", listing +
                       "; torch fails with 'HIP error: invalid device function'.", fix, gfx=gfx)


def _hsa_override(facts: Facts, build: dict[str, Any], runtime: dict[str, Any], usable: list[Device]) -> Iterator[Finding]:
    value = facts.host.env.get("HSA_OVERRIDE_GFX_VERSION") if facts.host else None
    if not value:
        return
    forced = gfx_from_override(value)
    targets = {p: g for p, g in amd_targets(facts).items() if any(d.pci == p for d in usable)}
    arch_list, _ = _arch_list(runtime, build.get("tag") or "", "rocm6")
    fid = "torch.wheel.hsa_override"
    if forced is None:
        yield fail(fid, f"HSA_OVERRIDE_GFX_VERSION={value} is not a valid version (expected like 11.0.0)", "",
                   "unset HSA_OVERRIDE_GFX_VERSION")
        return
    native_ok = bool(targets) and all(g in arch_list for g in targets.values())
    families = {g[:-1] for g in targets.values()}
    if native_ok and build.get("variant") == "rocm":
        yield warn(fid, f"HSA_OVERRIDE_GFX_VERSION={value} forces {forced}, but every GPU is supported natively",
                   "native targets: " + ", ".join(sorted(set(targets.values()))), "unset HSA_OVERRIDE_GFX_VERSION",
                   forced=forced)
    elif len(families) > 1:
        yield warn(fid, f"HSA_OVERRIDE_GFX_VERSION={value} forces {forced} on GPUs of different families",
                   "native targets: " + ", ".join(sorted(set(targets.values()))) + "; the override applies to every "
                   "GPU, so at least one runs another family's ISA.",
                   "export ROCR_VISIBLE_DEVICES=<the GPUs of one family> per process", forced=forced)
    else:
        yield warn(fid, f"HSA_OVERRIDE_GFX_VERSION={value} forces {forced}",
                   "native targets: " + (", ".join(sorted(set(targets.values()))) or "unknown")
                   + "; a workaround AMD does not support: expect crashes or wrong results in some kernels.", "",
                   forced=forced)


def _level_zero_verdict(facts: Facts, vendors: set[str]) -> Iterator[Finding]:
    intel = facts.get("intel") or {}
    lz = intel.get("level_zero") or {}
    fid = "torch.wheel.level_zero"
    if not lz.get("loader"):
        yield fail(fid, "XPU torch without the Level Zero loader (libze_loader.so.1)",
                   "torch.xpu needs Level Zero and Intel's GPU compute runtime; without them torch.xpu.is_available() "
                   "is False.", "sudo apt install libze1 libze-intel-gpu1 intel-opencl-icd (Ubuntu 24.04+; older releases: "
                   "Intel's client GPU driver repository, dgpu-docs.intel.com)")
    elif not lz.get("gpu_driver"):
        yield fail(fid, "Level Zero loader found, but no Intel GPU driver for it (libze_intel_gpu.so.1)",
                   ", ".join(lz["loader"]), "sudo apt install libze-intel-gpu1 intel-opencl-icd")
    else:
        yield passed(fid, "Level Zero loader and Intel GPU driver present", ", ".join(lz["loader"] + lz["gpu_driver"]))


_ERROR_TITLES: dict[str | None, str] = {"timeout": "importing torch timed out", "crash": "importing torch crashed"}


def runtime_rules(facts: Facts) -> Iterator[Finding]:
    """What the torch child saw: init errors, availability, collective backends."""
    runtime = facts["torch_runtime"]
    if not runtime.get("installed"):
        return
    devices = [d for d in build_devices(pci_fact(facts)) if d.usable]
    vendors = {d.vendor for d in devices}
    err = runtime.get("error")
    if err:
        yield _probe_error(err)
        return
    version = runtime.get("version") or {}
    remedy = remedy_for(facts, build_devices(pci_fact(facts)))
    if (version.get("cuda") and "NVIDIA" in vendors) or (version.get("hip") and "AMD" in vendors):
        yield _cuda_finding(runtime, devices, remedy)
    if version.get("xpu") and "Intel" in vendors:
        yield _xpu_finding(runtime.get("xpu") or {})
    yield _backends_finding(runtime, remedy)


def _probe_error(err: dict[str, Any]) -> Finding:
    title = _ERROR_TITLES.get(err.get("kind"), "the torch probe failed")
    # The child's last stderr line says why (an exception's last line); its traceback stays out
    # of the finding, which is one line per field for people and tools alike.
    last = next((ln.strip() for ln in reversed(str(err.get("stderr") or "").splitlines()) if ln.strip()), "")
    return error("torch.runtime", title, (err.get("message") or "") + (f" (stderr: {last})" if last else ""),
                 "python -c 'import torch; print(torch.cuda.is_available())' shows the same failure in the open")


def _cuda_finding(runtime: dict[str, Any], devices: list[Any], remedy: str) -> Finding:
    """A CUDA or ROCm wheel with that vendor's GPUs: does torch see them all?"""
    version = runtime.get("version") or {}
    cuda = runtime.get("cuda") or {}
    want = sum(1 for d in devices if d.vendor == ("AMD" if version.get("hip") else "NVIDIA"))
    api = "ROCm" if version.get("hip") else "CUDA"
    if not cuda.get("available"):
        return fail("torch.runtime.cuda", f"torch.cuda.is_available() is False with a {api} wheel and {want} GPU(s)",
                    cuda.get("error") or "torch gave no reason", remedy)
    if cuda.get("device_count", 0) < want and not (runtime.get("env") or {}):
        return warn("torch.runtime.cuda", f"torch sees {cuda['device_count']} of {want} {api} GPU(s)",
                    "; ".join(cuda.get("warnings") or []), "sudo dmesg | tail -50 (a GPU failed to initialise)")
    return passed("torch.runtime.cuda", f"torch sees {cuda.get('device_count')} {api} device(s)"
                  + (" (cached)" if runtime.get("cached") else ""),
                  "; ".join(f"{d['index']}: {d['name']}" for d in cuda.get("devices") or []))


def _xpu_finding(xpu: dict[str, Any]) -> Finding:
    if xpu.get("available"):
        return passed("torch.runtime.xpu", f"torch sees {xpu.get('device_count')} XPU device(s)",
                      "; ".join(f"{d['index']}: {d['name']} (driver {d.get('driver_version')})" for d in xpu.get("devices") or []))
    return fail("torch.runtime.xpu", "torch.xpu.is_available() is False with an XPU wheel and an Intel GPU",
                xpu.get("error") or "", "sudo apt install libze1 libze-intel-gpu1 intel-opencl-icd; "
                "and add the user to the render group")


def _backends_finding(runtime: dict[str, Any], remedy: str) -> Finding:
    cuda = runtime.get("cuda") or {}
    backends = runtime.get("backends") or {}
    have = sorted(k for k, v in backends.items() if v is True)
    data = {k: v for k, v in backends.items() if not k.endswith("_error")}
    n_cuda = cuda.get("device_count", 0) if cuda.get("available") else 0
    if n_cuda > 1 and backends.get("nccl") is False:
        return warn("torch.runtime.backends", f"{n_cuda} GPUs but torch has no NCCL", "available: " + ", ".join(have),
                    remedy, **data)
    return passed("torch.runtime.backends", "collective backends: " + (", ".join(have) or "none"),
                  "; ".join(f"{k}: {v}" for k, v in backends.items() if k.endswith("_error")), **data)


COLLECTORS = [
    Collector("torch_build", collect_torch_build, "gpu", timeout=5.0),
    Collector("torch_runtime", collect_torch_runtime, "gpu", timeout=120.0),
]
RULES = [
    Rule("torch_wheel", wheel_rules, "gpu", needs=("torch_build", "pci", "host")),
    Rule("torch_runtime", runtime_rules, "gpu", needs=("torch_runtime", "pci", "host")),
]
