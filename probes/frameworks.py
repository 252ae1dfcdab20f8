"""The training frameworks the hardware guide names: Accelerate, Lightning, DeepSpeed.

Each is checked against the detected hardware, not in the abstract: an Accelerate config that asks
for ``MULTI_GPU`` with 8 processes on a host with 2 GPUs, a Lightning ``trainer.accelerator: tpu``
on a GPU box, a DeepSpeed whose prebuilt ops were compiled against another torch. Nothing is
imported: installed packages are found by their distribution metadata (a host fact, so snapshots
carry it), configs are read through the host with a bounded YAML-subset reader
(probes/yaml_subset.py), and DeepSpeed's build record ``git_version_info_installed.py`` is parsed
with ``ast`` like torch's version.py.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator, Mapping
from typing import Any

from hwtui.core.finding import Finding, fail, passed, skip, warn
from hwtui.probes.devices import Device, build_devices
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import FactUnavailable, Host
from hwtui.probes.pci import pci_fact
from hwtui.probes.torchwheel import nvidia_capabilities, parse_version_py
from hwtui.probes.yaml_subset import YamlSubsetError, loads

# Distributions whose presence and version the checks need (dist name -> import name).
PACKAGES = {"accelerate": "accelerate", "lightning": "lightning", "pytorch-lightning": "pytorch_lightning",
            "deepspeed": "deepspeed", "kvikio": "kvikio", "kvikio-cu12": "kvikio", "kvikio-cu11": "kvikio",
            "kvikio-cu13": "kvikio", "cupy": "cupy", "cupy-cuda11x": "cupy", "cupy-cuda12x": "cupy",
            "cupy-cuda13x": "cupy", "cupy-rocm-5-0": "cupy", "cupy-rocm-6-0": "cupy"}
LIGHTNING_CONFIG = "configs/distributed.yaml"


# -- collection -----------------------------------------------------------------------------------

def _live_packages() -> dict[str, Any]:
    """Installed distributions of interest: version and the import package's directory."""
    import importlib.metadata as md
    import importlib.util

    out: dict[str, Any] = {}
    for dist, module in PACKAGES.items():
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            continue
        except Exception:  # noqa: BLE001 - a broken dist-info must not hide the others
            continue
        location = None
        try:
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.submodule_search_locations:
                location = list(spec.submodule_search_locations)[0]
        except (ImportError, ValueError):
            pass
        out[dist] = {"version": version, "module": module, "location": location}
    return out


def installed_packages(host: Host) -> dict[str, Any] | None:
    """The package fact; None when this host (a sysroot or replay without it) cannot say."""
    try:
        packages: dict[str, Any] = host.fact("python_packages", _live_packages)
        return packages
    except FactUnavailable:
        return None


def accelerate_config_path(env: Mapping[str, str]) -> str:
    """Where ``accelerate launch`` looks for its default config (accelerate/commands/config/config_args.py)."""
    if env.get("ACCELERATE_CONFIG_FILE"):
        return env["ACCELERATE_CONFIG_FILE"]
    home = env.get("HOME", "~")
    cache = env.get("XDG_CACHE_HOME") or posixpath.join(home, ".cache")
    hf_home = env.get("HF_HOME") or posixpath.join(cache, "huggingface")
    return posixpath.join(hf_home, "accelerate", "default_config.yaml")


def _working_dir(host: Host) -> str | None:
    try:
        cwd: str = host.fact("cwd", os.getcwd)
        return cwd
    except FactUnavailable:
        return host.env.get("PWD")


def read_yaml(host: Host, path: str) -> dict[str, Any]:
    text = host.read_text(path)
    if text is None:
        return {"path": path, "exists": host.exists(path), "config": None, "error": None}
    try:
        config = loads(text)
    except YamlSubsetError as exc:
        return {"path": path, "exists": True, "config": None, "error": str(exc)}
    if config is not None and not isinstance(config, dict):
        return {"path": path, "exists": True, "config": None, "error": "top level is not a mapping"}
    return {"path": path, "exists": True, "config": config or {}, "error": None}


def collect_frameworks(host: Host) -> dict[str, Any]:
    cwd = _working_dir(host)
    packages = installed_packages(host)
    deepspeed = None
    ds = (packages or {}).get("deepspeed")
    if ds and ds.get("location"):
        record = host.read_text(posixpath.join(ds["location"], "git_version_info_installed.py"))
        deepspeed = parse_version_py(record) if record else None
    return {
        "packages": packages,
        "accelerate": read_yaml(host, accelerate_config_path(host.env)),
        "lightning": read_yaml(host, posixpath.join(cwd, LIGHTNING_CONFIG)) if cwd else None,
        "deepspeed_build": _jsonable(deepspeed),
        "cuda_home": _cuda_home(host),
        "env": {k: host.env[k] for k in ("PL_TORCH_DISTRIBUTED_BACKEND", "PJRT_DEVICE") if k in host.env},
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _cuda_home(host: Host) -> str | None:
    """A CUDA toolkit with nvcc, which DeepSpeed needs to JIT-compile ops that were not prebuilt."""
    for base in (host.env.get("CUDA_HOME"), host.env.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and host.exists(posixpath.join(base, "bin", "nvcc")):
            return base
    nvcc = host.which("nvcc")
    return posixpath.dirname(posixpath.dirname(nvcc)) if nvcc else None


# -- hardware summary -----------------------------------------------------------------------------

def hardware(facts: Facts) -> dict[str, list[Device]]:
    """Usable accelerators by the name frameworks use for them."""
    usable = [d for d in build_devices(pci_fact(facts)) if d.usable]
    return {"cuda": [d for d in usable if d.vendor in ("NVIDIA", "AMD")],  # ROCm torch drives AMD as "cuda"
            "nvidia": [d for d in usable if d.vendor == "NVIDIA"],
            "xpu": [d for d in usable if d.vendor == "Intel"],
            "hpu": [d for d in usable if d.vendor == "Habana"],
            "tpu": [d for d in usable if d.vendor == "Google"]}


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _hw_line(hw: Mapping[str, list[Device]]) -> str:
    parts = [f"{len(v)} {k.upper()}" for k, v in hw.items() if v and k != "nvidia"]
    return ", ".join(parts) or "no accelerator"


# -- Accelerate -----------------------------------------------------------------------------------

# distributed_type -> (hardware key, what it needs)
ACCELERATE_NEEDS = {"MULTI_GPU": "cuda", "FSDP": "cuda", "DEEPSPEED": "cuda", "MEGATRON_LM": "cuda", "MULTI_XPU": "xpu",
                    "MULTI_HPU": "hpu", "XLA": "tpu", "TPU": "tpu"}
ACCELERATE_TYPES = set(ACCELERATE_NEEDS) | {"NO", "MULTI_CPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA"}
TYPE_FOR = {"cuda": "MULTI_GPU", "xpu": "MULTI_XPU", "hpu": "MULTI_HPU", "tpu": "XLA"}


def accelerate_findings(acc: Mapping[str, Any], hw: Mapping[str, list[Device]], packages: Mapping[str, Any] | None,
                        caps: Mapping[str, tuple[int, int]]) -> Iterator[Finding]:
    path = acc["path"]
    if acc.get("error"):
        yield fail("frameworks.accelerate.config", f"cannot read the Accelerate config {path}", acc["error"],
                   f"accelerate config --config_file {path}  (regenerates it)")
        return
    cfg = acc.get("config")
    if cfg is None:
        if packages and "accelerate" in packages:
            yield passed("frameworks.accelerate.config", "no Accelerate config: `accelerate launch` uses its defaults",
                         f"looked for {path}")
        return
    dtype = str(cfg.get("distributed_type", "NO")).upper()
    ctx = f"{path}: distributed_type {dtype}"
    if dtype not in ACCELERATE_TYPES:
        yield fail("frameworks.accelerate.distributed_type", f"{ctx} is not a type Accelerate knows",
                   f"Known: {', '.join(sorted(ACCELERATE_TYPES))}.", f"accelerate config --config_file {path}")
        return
    want = ACCELERATE_NEEDS.get(dtype)
    yield _accelerate_type_finding(path, ctx, dtype, cfg, hw)
    yield from _accelerate_process_findings(path, cfg, hw, want)
    yield from _accelerate_precision_findings(path, cfg, hw, want, caps)
    if dtype == "DEEPSPEED" and packages is not None and "deepspeed" not in packages:
        yield fail("frameworks.accelerate.deepspeed", f"{ctx} but DeepSpeed is not installed", "",
                   "python3 -m pip install deepspeed")


def _accelerate_type_finding(path: str, ctx: str, dtype: str, cfg: Mapping[str, Any],
                             hw: Mapping[str, list[Device]]) -> Finding:
    """distributed_type (and use_cpu) against the accelerators this host has."""
    best = next((k for k in ("cuda", "xpu", "hpu", "tpu") if hw[k]), None)
    want = ACCELERATE_NEEDS.get(dtype)
    use_cpu = cfg.get("use_cpu") is True
    if want and not hw[want]:
        fix = f"set distributed_type: {TYPE_FOR[best]} in {path}" if best else f"set distributed_type: MULTI_CPU (or NO) in {path}"
        return fail("frameworks.accelerate.distributed_type", f"{ctx} needs {want.upper()} devices; this host has {_hw_line(hw)}",
                    "accelerate launch would start ranks that find no device.", fix)
    if dtype in ("NO", "MULTI_CPU") and best and not use_cpu:
        return warn("frameworks.accelerate.distributed_type", f"{ctx} on a host with {_hw_line(hw)}",
                    f"{'One process' if dtype == 'NO' else 'CPU processes'}: the other accelerators stay idle.",
                    f"set distributed_type: {TYPE_FOR[best]} and num_processes: {len(hw[best])} in {path}")
    if use_cpu and best:
        return warn("frameworks.accelerate.use_cpu", f"{path}: use_cpu: true on a host with {_hw_line(hw)}",
                    "Accelerate runs on the CPU and ignores every GPU.", f"set use_cpu: false in {path}")
    return passed("frameworks.accelerate.distributed_type", f"{ctx} fits this host ({_hw_line(hw)})")


def _accelerate_process_findings(path: str, cfg: Mapping[str, Any], hw: Mapping[str, list[Device]],
                                 want: str | None) -> Iterator[Finding]:
    """num_processes and gpu_ids against this host's devices; main_process_ip when several machines."""
    machines = _count(cfg.get("num_machines", 1)) or 1
    procs = _count(cfg.get("num_processes", 1))
    if want and hw[want] and procs is not None:
        local = -(-procs // machines)
        gpu_ids = cfg.get("gpu_ids")
        ids = [int(x) for x in re.findall(r"\d+", str(gpu_ids))] if gpu_ids not in (None, "all") else []
        have = len(hw[want])
        if local > have:
            yield fail("frameworks.accelerate.num_processes",
                       f"{path}: {procs} process(es) on {machines} machine(s) = {local} per machine, but this host has {have} "
                       f"{want.upper()} device(s)", "The extra ranks fail to find a device or share one and run out of memory.",
                       f"set num_processes: {have * machines} in {path}")
        elif ids and max(ids) >= have:
            yield fail("frameworks.accelerate.gpu_ids", f"{path}: gpu_ids {gpu_ids} names device {max(ids)}; this host has "
                       f"{have} ({', '.join(d.device or '?' for d in hw[want])})", "",
                       f"set gpu_ids: all in {path}")
        else:
            yield passed("frameworks.accelerate.num_processes", f"{path}: {local} process(es) per machine for {have} device(s)")
    if machines > 1 and not cfg.get("main_process_ip"):
        yield fail("frameworks.accelerate.main_process", f"{path}: num_machines {machines} without main_process_ip",
                   "Every machine must know where rank 0 listens.", f"set main_process_ip: <rank-0 address> in {path}")


# mixed_precision -> the lowest NVIDIA compute capability that has it
_PRECISION_FLOOR = {"bf16": (8, 0), "fp8": (8, 9)}


def _accelerate_precision_findings(path: str, cfg: Mapping[str, Any], hw: Mapping[str, list[Device]], want: str | None,
                                   caps: Mapping[str, tuple[int, int]]) -> Iterator[Finding]:
    precision = str(cfg.get("mixed_precision", "no")).lower()
    if precision in _PRECISION_FLOOR and want == "cuda" and hw["nvidia"]:
        floor = _PRECISION_FLOOR[precision]
        low = [d for d in hw["nvidia"] if d.pci in caps and tuple(caps[d.pci]) < floor]
        if low:
            yield fail("frameworks.accelerate.mixed_precision",
                       f"{path}: mixed_precision {precision} needs compute capability {floor[0]}.{floor[1]}+",
                       "; ".join(f"{d.device} {d.name}: sm_{caps[d.pci][0]}{caps[d.pci][1]}" for d in low),
                       f"set mixed_precision: fp16 in {path}")


# -- Lightning ------------------------------------------------------------------------------------

def _lookup(cfg: Mapping[str, Any], dotted: str) -> Any:
    """``trainer.accelerator`` as a nested key, or written flat (Hydra overrides style)."""
    if dotted in cfg:
        return cfg[dotted]
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


LIGHTNING_ACCELERATORS = {"cpu": None, "gpu": "cuda", "cuda": "cuda", "tpu": "tpu", "hpu": "hpu", "mps": "mps", "auto": None,
                          "xpu": "xpu"}
REMOVED_STRATEGIES = {"dp": "Lightning 2.0 removed DataParallel", "horovod": "Lightning 2.0 removed Horovod",
                      "ddp_sharded": "Lightning 2.0 removed ddp_sharded; use fsdp",
                      "tpu_spawn": "Lightning 2.0 renamed tpu_spawn to xla"}


def lightning_findings(lit: Mapping[str, Any], hw: Mapping[str, list[Device]], packages: Mapping[str, Any] | None,
                       env: Mapping[str, str], accelerate: Mapping[str, Any]) -> Iterator[Finding]:
    path = lit["path"]
    if lit.get("error"):
        yield fail("frameworks.lightning.config", f"cannot read {path}", lit["error"], f"edit {path}")
        return
    cfg = lit.get("config")
    if cfg is None:
        return
    accel = str(_lookup(cfg, "trainer.accelerator") or "auto").lower()
    strategy = str(_lookup(cfg, "trainer.strategy") or "auto").lower()
    devices = _lookup(cfg, "trainer.devices")
    tpu_cores = _lookup(cfg, "trainer.tpu_cores")
    best = next((k for k in ("cuda", "tpu", "hpu", "xpu") if hw[k]), None)
    if accel not in LIGHTNING_ACCELERATORS:
        yield fail("frameworks.lightning.accelerator", f"{path}: trainer.accelerator={accel} is not a Lightning accelerator",
                   f"Known: {', '.join(sorted(LIGHTNING_ACCELERATORS))}.", f"set trainer.accelerator: {_accel_name(best)} in {path}")
        return
    want = LIGHTNING_ACCELERATORS[accel]
    yield _lightning_accelerator_finding(path, accel, want, best, hw)
    target = want or best
    n = _count(devices)
    if target and target != "mps" and hw.get(target) and n is not None and n > len(hw[target]):
        yield fail("frameworks.lightning.devices", f"{path}: trainer.devices={n} but this host has {len(hw[target])} "
                   f"{target.upper()} device(s)", "", f"set trainer.devices: {len(hw[target])} (or -1 for all) in {path}")
    yield _lightning_strategy_finding(path, strategy, accel, packages)
    if accel == "tpu":
        yield from _lightning_tpu_findings(path, tpu_cores, env)
    if packages is not None and not ({"lightning", "pytorch-lightning"} & set(packages)):
        yield warn("frameworks.lightning.installed", f"{path} configures Lightning but Lightning is not installed", "",
                   "python3 -m pip install lightning")
    if str(cfg.get("backend", "")).lower() == "accelerate" and accelerate.get("config") is None and not accelerate.get("error"):
        yield warn("frameworks.lightning.accelerate_backend", f"{path}: backend: accelerate but there is no Accelerate config",
                   f"looked for {accelerate['path']}", "accelerate config")


def _lightning_accelerator_finding(path: str, accel: str, want: str | None, best: str | None,
                                   hw: Mapping[str, list[Device]]) -> Finding:
    if want == "mps" or (want and not hw[want]):
        extra = " (Lightning's 'gpu' means CUDA or ROCm; Intel XPUs need a third-party accelerator)" if hw["xpu"] and want == "cuda" else ""
        return fail("frameworks.lightning.accelerator", f"{path}: trainer.accelerator={accel} but this host has {_hw_line(hw)}",
                    "Trainer() raises MisconfigurationException before the first step." + extra,
                    f"set trainer.accelerator: {_accel_name(best)} in {path}")
    if accel == "cpu" and best:
        return warn("frameworks.lightning.accelerator", f"{path}: trainer.accelerator=cpu on a host with {_hw_line(hw)}",
                    "Every accelerator stays idle.", f"set trainer.accelerator: {_accel_name(best)} in {path}")
    return passed("frameworks.lightning.accelerator", f"{path}: trainer.accelerator={accel} fits this host ({_hw_line(hw)})")


def _lightning_strategy_finding(path: str, strategy: str, accel: str, packages: Mapping[str, Any] | None) -> Finding:
    fid = "frameworks.lightning.strategy"
    if strategy in REMOVED_STRATEGIES:
        return fail(fid, f"{path}: trainer.strategy={strategy}", REMOVED_STRATEGIES[strategy] + ".",
                    f"set trainer.strategy: {'xla' if accel == 'tpu' else 'ddp'} in {path}")
    if strategy.startswith("xla") and accel != "tpu":
        return fail(fid, f"{path}: trainer.strategy={strategy} with accelerator {accel}",
                    "The XLA strategy runs on TPUs only.", f"set trainer.strategy: ddp in {path}")
    if strategy.startswith("ddp") and accel == "tpu":
        return fail(fid, f"{path}: trainer.strategy={strategy} on TPU",
                    "TPUs use the XLA strategy; DDP needs NCCL or gloo devices.", f"set trainer.strategy: xla in {path}")
    if strategy.startswith("deepspeed") and packages is not None and "deepspeed" not in packages:
        return fail(fid, f"{path}: trainer.strategy={strategy} but DeepSpeed is not installed", "",
                    "python3 -m pip install deepspeed")
    return passed(fid, f"{path}: trainer.strategy={strategy}")


def _lightning_tpu_findings(path: str, tpu_cores: Any, env: Mapping[str, str]) -> Iterator[Finding]:
    if tpu_cores is not None:
        cores = _count(tpu_cores)
        if cores not in (1, 8):
            yield fail("frameworks.lightning.tpu_cores", f"{path}: trainer.tpu_cores={tpu_cores}",
                       "A TPU v3 host has 8 cores; Lightning accepts 1 or 8.", f"set trainer.devices: 8 in {path}")
        else:
            yield warn("frameworks.lightning.tpu_cores", f"{path}: trainer.tpu_cores={cores} is gone in Lightning 2.x",
                       "Lightning 2.0 removed the tpu_cores argument.", f"replace trainer.tpu_cores with trainer.devices: {cores} in {path}")
    backend = env.get("PL_TORCH_DISTRIBUTED_BACKEND")
    if backend != "xla":
        yield warn("frameworks.lightning.tpu_backend", f"PL_TORCH_DISTRIBUTED_BACKEND is {backend or 'unset'} with a TPU accelerator",
                   "The hardware guide requires xla for TPU launches.", "export PL_TORCH_DISTRIBUTED_BACKEND=xla")


def _accel_name(best: str | None) -> str:
    return {"cuda": "gpu", "tpu": "tpu", "hpu": "hpu", "xpu": "xpu"}.get(best or "", "cpu")


# -- DeepSpeed ------------------------------------------------------------------------------------

def _major_minor(text: Any) -> str | None:
    found = re.findall(r"\d+", str(text or ""))
    return ".".join(found[:2]) if len(found) >= 2 else None


def deepspeed_findings(fw: Mapping[str, Any], build: Mapping[str, Any] | None, hw: Mapping[str, list[Device]],
                       python: str) -> Iterator[Finding]:
    packages = fw.get("packages")
    if packages is None:
        yield skip("frameworks.deepspeed", "installed packages were not recorded with this machine")
        return
    ds = packages.get("deepspeed")
    if ds is None:
        return
    record = fw.get("deepspeed_build") or {}
    torch_info: dict[str, Any] = record["torch_info"] if isinstance(record.get("torch_info"), dict) else {}
    ops: dict[str, Any] = record["installed_ops"] if isinstance(record.get("installed_ops"), dict) else {}
    prebuilt = sorted(k for k, v in ops.items() if v)
    reinstall = f"{python} -m pip install --force-reinstall --no-cache-dir deepspeed=={ds['version']}"
    if not build or not build.get("installed"):
        yield fail("frameworks.deepspeed.torch", f"DeepSpeed {ds['version']} is installed but torch is not", "",
                   f"{python} -m pip install torch")
        return
    torch_mm, built_mm = _major_minor(build.get("version")), _major_minor(torch_info.get("version"))
    problems = []
    if built_mm and torch_mm and built_mm != torch_mm:
        problems.append(f"built against torch {built_mm}, torch {build.get('version')} is installed")
    for key, name in (("cuda_version", "cuda"), ("hip_version", "hip")):
        built, have = _major_minor(torch_info.get(key)), _major_minor(build.get(name))
        if built and built != "0.0" and have and built != have:
            problems.append(f"built for {name.upper()} {built}, torch uses {have}")
    if problems and prebuilt:
        yield fail("frameworks.deepspeed.torch", f"DeepSpeed {ds['version']}: prebuilt ops do not match the installed torch",
                   "; ".join(problems) + f". Prebuilt ops ({', '.join(prebuilt[:6])}) fail with 'PyTorch version mismatch'.",
                   reinstall)
    elif problems:
        yield warn("frameworks.deepspeed.torch", f"DeepSpeed {ds['version']} was installed with another torch",
                   "; ".join(problems) + ". Its ops are JIT-compiled at first use, so this works if a matching toolkit is present.",
                   reinstall)
    else:
        detail = f"built against torch {built_mm}" if built_mm else "no build record (git_version_info_installed.py) found"
        yield passed("frameworks.deepspeed.torch", f"DeepSpeed {ds['version']} with torch {build.get('version')}", detail,
                     prebuilt_ops=prebuilt)
    if hw["nvidia"] and build.get("variant") == "cuda" and not prebuilt and not fw.get("cuda_home"):
        yield warn("frameworks.deepspeed.toolkit", "DeepSpeed has no prebuilt ops and no CUDA toolkit (nvcc) is found",
                   "Fused Adam and the ZeRO kernels are compiled at first use and fail without nvcc.",
                   f"sudo apt install cuda-toolkit-{str(build.get('cuda') or '12.8').replace('.', '-')}  "
                   "(or export CUDA_HOME=<toolkit dir>)")


# -- rules ----------------------------------------------------------------------------------------

def framework_rules(facts: Facts) -> Iterator[Finding]:
    fw = facts["frameworks"]
    hw = hardware(facts)
    packages = fw.get("packages")
    yield from accelerate_findings(fw["accelerate"], hw, packages, nvidia_capabilities(facts))
    if fw.get("lightning"):
        yield from lightning_findings(fw["lightning"], hw, packages, fw.get("env") or {}, fw["accelerate"])
    host = facts.get("host") or {}
    yield from deepspeed_findings(fw, facts.get("torch_build"), hw, host.get("python_executable") or "python3")


COLLECTORS = [Collector("frameworks", collect_frameworks, "env", timeout=5.0)]
RULES = [Rule("frameworks", framework_rules, "env", needs=("frameworks", "pci"))]
