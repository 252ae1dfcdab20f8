"""Accelerate, Lightning, DeepSpeed, CuPy/KvikIO/GDS: configs and packages against recorded machines."""

from __future__ import annotations

import json

import pytest

from hwtui.core.finding import Status
from hwtui.probes.catalog import catalog
from hwtui.probes.framework import run_checks
from hwtui.probes.gds import parse_cufile, strip_json_comments
from hwtui.probes.host import RecordingHost, ReplayHost
from hwtui.probes.yaml_subset import YamlSubsetError, loads
from tests.probes import recorded
from tests.probes.recorded import PYTHON

HOME = "/home/alice"
ACC = f"{HOME}/.cache/huggingface/accelerate/default_config.yaml"
PROJECT = "/srv/proj"
SITE = "/home/alice/venv/lib/python3.11/site-packages"
WANT = ("pci", "host", "nvml", "torch_build", "frameworks", "gds")


def check(fs, env=None, wanted=WANT):
    collectors, rules = catalog()
    host = fs.host({"HOME": HOME, **(env or {})})
    result = run_checks(host, [c for c in collectors if c.name in wanted], [r for r in rules if r.name in ("frameworks", "gds")])
    return {f.id: f for f in result.findings}


def packages(**versions: str) -> dict:
    module = {"pytorch-lightning": "pytorch_lightning"}
    out = {}
    for dist, version in versions.items():
        dist = dist.replace("_", "-")
        mod = module.get(dist, dist.split("-")[0])
        out[dist] = {"version": version, "module": mod, "location": f"{SITE}/{mod}"}
    return out


# -- the YAML subset ------------------------------------------------------------------------------

def test_yaml_subset_reads_real_accelerate_config():
    text = """compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU   # from `accelerate config`
downcast_bf16: 'no'
gpu_ids: all
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
use_cpu: false
fsdp_config: {}
dynamo_config:
  dynamo_backend: INDUCTOR
  dynamo_mode: "max-autotune"
"""
    cfg = loads(text)
    assert cfg["distributed_type"] == "MULTI_GPU" and cfg["num_processes"] == 8 and cfg["use_cpu"] is False
    assert cfg["downcast_bf16"] == "no" and cfg["tpu_env"] == [] and cfg["fsdp_config"] == {}
    assert cfg["dynamo_config"] == {"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune"}


def test_yaml_subset_lists_and_nesting():
    cfg = loads("trainer:\n  devices: [0, 1]\n  callbacks:\n    - name: ckpt\n      every: 5\n    - early\nseed: 1.5e3\nx: ~\n")
    assert cfg == {"trainer": {"devices": [0, 1], "callbacks": [{"name": "ckpt", "every": 5}, "early"]}, "seed": 1500.0, "x": None}


@pytest.mark.parametrize("text, line", [("a: 1\n  b: 2\n", 2), ("a: &anchor 1\n", 1), ("a: 1\na: 2\n", 2),
                                        ("a: {b: 1}\n", 1), ("a: [1, 2\n", 1), ("\tа: 1\n", 1), ("just text\n", 1)])
def test_yaml_subset_refuses_with_the_line(text, line):
    with pytest.raises(YamlSubsetError) as exc:
        loads(text)
    assert exc.value.line == line


def test_yaml_subset_is_bounded():
    with pytest.raises(YamlSubsetError, match="larger"):
        loads("a: " + "x" * (300 * 1024))
    deep = "".join(" " * (2 * i) + f"k{i}:\n" for i in range(40)) + " " * 80 + "v: 1\n"
    with pytest.raises(YamlSubsetError, match="deeper"):
        loads(deep)


# -- Accelerate -----------------------------------------------------------------------------------

def h100(tmp_path, **facts):
    fs = recorded.h100x8(tmp_path)
    fs.facts(cwd=PROJECT, python_packages=facts.pop("python_packages", packages(accelerate="1.10.0")), **facts)
    return fs


def test_accelerate_multi_gpu_fits_eight_h100(tmp_path):
    fs = h100(tmp_path)
    fs.file(ACC, "distributed_type: MULTI_GPU\nnum_processes: 8\nnum_machines: 1\nmixed_precision: bf16\n")
    got = check(fs)
    assert got["frameworks.accelerate.distributed_type"].status == Status.PASS
    assert got["frameworks.accelerate.num_processes"].status == Status.PASS
    assert "frameworks.accelerate.mixed_precision" not in got  # H100 is sm_90: bf16 is fine


def test_accelerate_too_many_processes_and_bad_gpu_ids(tmp_path):
    fs = h100(tmp_path)
    fs.file(ACC, "distributed_type: MULTI_GPU\nnum_processes: 16\n")
    f = check(fs)["frameworks.accelerate.num_processes"]
    assert f.status == Status.FAIL and "16 per machine" in f.title and f.remedy == f"set num_processes: 8 in {ACC}"
    fs.file(ACC, "distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: '3,9'\n")
    f = check(fs)["frameworks.accelerate.gpu_ids"]
    assert f.status == Status.FAIL and "device 9" in f.title


def test_accelerate_cpu_type_on_gpu_host_and_xla_without_tpu(tmp_path):
    fs = h100(tmp_path)
    fs.file(ACC, "distributed_type: 'NO'\n")
    f = check(fs)["frameworks.accelerate.distributed_type"]
    assert f.status == Status.WARN and f.remedy == f"set distributed_type: MULTI_GPU and num_processes: 8 in {ACC}"
    fs.file(ACC, "distributed_type: XLA\n")
    f = check(fs)["frameworks.accelerate.distributed_type"]
    assert f.status == Status.FAIL and "needs TPU" in f.title and f.remedy == f"set distributed_type: MULTI_GPU in {ACC}"


def test_accelerate_config_file_variable_and_unreadable_config(tmp_path):
    fs = h100(tmp_path)
    fs.file("/etc/acc.yaml", "distributed_type: MULTI_GPU\nnum_processes: 8\nnum_machines: 2\n")
    got = check(fs, {"ACCELERATE_CONFIG_FILE": "/etc/acc.yaml"})
    assert got["frameworks.accelerate.main_process"].status == Status.FAIL
    assert got["frameworks.accelerate.num_processes"].status == Status.PASS  # 8 over 2 machines = 4 each
    fs.file("/etc/acc.yaml", "distributed_type: MULTI_GPU\n  num_processes: 8\n")
    f = check(fs, {"ACCELERATE_CONFIG_FILE": "/etc/acc.yaml"})["frameworks.accelerate.config"]
    assert f.status == Status.FAIL and "line 2" in f.detail


def test_accelerate_bf16_on_turing_and_deepspeed_missing(tmp_path):
    from tests import machines

    fs = recorded.record(machines.rx7900xtx_rtx2080ti(tmp_path), nvml="nvml_rtx2080ti", cwd=PROJECT,
                         python_packages=packages(accelerate="1.10.0"))
    fs.file(ACC, "distributed_type: DEEPSPEED\nnum_processes: 1\nmixed_precision: bf16\n")
    got = check(fs)
    f = got["frameworks.accelerate.mixed_precision"]
    assert f.status == Status.FAIL and "sm_75" in f.detail and f.remedy == f"set mixed_precision: fp16 in {ACC}"
    assert got["frameworks.accelerate.deepspeed"].status == Status.FAIL


# -- Lightning ------------------------------------------------------------------------------------

def lightning(fs, text):
    fs.file(f"{PROJECT}/configs/distributed.yaml", text)


def test_lightning_gpu_ddp_fits_and_tpu_on_gpu_host_fails(tmp_path):
    fs = h100(tmp_path, python_packages=packages(lightning="2.5.0"))
    lightning(fs, "trainer:\n  accelerator: gpu\n  strategy: ddp\n  devices: 8\n")
    got = check(fs)
    assert got["frameworks.lightning.accelerator"].status == Status.PASS
    assert got["frameworks.lightning.strategy"].status == Status.PASS
    assert "frameworks.lightning.devices" not in got
    lightning(fs, "trainer.accelerator: tpu\ntrainer.strategy: ddp\ntrainer.tpu_cores: 8\n")  # flat Hydra style
    got = check(fs)
    assert got["frameworks.lightning.accelerator"].status == Status.FAIL
    assert got["frameworks.lightning.accelerator"].remedy == f"set trainer.accelerator: gpu in {PROJECT}/configs/distributed.yaml"
    assert got["frameworks.lightning.strategy"].status == Status.FAIL


def test_lightning_too_many_devices_removed_strategy_and_not_installed(tmp_path):
    fs = h100(tmp_path, python_packages={})
    lightning(fs, "trainer:\n  accelerator: cuda\n  strategy: dp\n  devices: 16\n")
    got = check(fs)
    assert got["frameworks.lightning.devices"].status == Status.FAIL
    assert got["frameworks.lightning.strategy"].status == Status.FAIL and "removed" in got["frameworks.lightning.strategy"].detail
    assert got["frameworks.lightning.installed"].status == Status.WARN


def test_lightning_on_tpu_vm_wants_xla_backend(tmp_path):
    from tests import machines

    fs = recorded.record(machines.tpu_vm(tmp_path), cwd=PROJECT, python_packages=packages(lightning="2.5.0"))
    lightning(fs, "trainer:\n  accelerator: tpu\n  strategy: xla\n  tpu_cores: 4\n")
    got = check(fs)
    assert got["frameworks.lightning.accelerator"].status == Status.PASS
    assert got["frameworks.lightning.tpu_cores"].status == Status.FAIL
    assert got["frameworks.lightning.tpu_backend"].remedy == "export PL_TORCH_DISTRIBUTED_BACKEND=xla"
    got = check(fs, {"PL_TORCH_DISTRIBUTED_BACKEND": "xla"})
    assert "frameworks.lightning.tpu_backend" not in got


# -- DeepSpeed ------------------------------------------------------------------------------------

def deepspeed(fs, torch="2.7", cuda="12.8", ops=None):
    fs.file(f"{SITE}/deepspeed/git_version_info_installed.py",
            f"version='0.16.4'\ngit_hash='abc'\ninstalled_ops={ops or {'fused_adam': False}!r}\naccelerator_name='cuda'\n"
            f"torch_info={{'version': '{torch}', 'bf16_support': True, 'cuda_version': '{cuda}', 'nccl_version': '2.21', "
            "'hip_version': '0.0'}\n")


def test_deepspeed_matches_torch(tmp_path):
    fs = h100(tmp_path, python_packages=packages(deepspeed="0.16.4"))
    deepspeed(fs, torch="2.8", cuda="12.8", ops={"fused_adam": True})
    f = check(fs)["frameworks.deepspeed.torch"]
    assert f.status == Status.PASS and f.data["prebuilt_ops"] == ["fused_adam"]


def test_deepspeed_prebuilt_ops_for_another_torch_fail(tmp_path):
    fs = h100(tmp_path, python_packages=packages(deepspeed="0.16.4"))
    deepspeed(fs, torch="2.4", cuda="12.1", ops={"fused_adam": True, "cpu_adam": True})
    f = check(fs)["frameworks.deepspeed.torch"]
    assert f.status == Status.FAIL and "torch 2.4" in f.detail and "CUDA 12.1" in f.detail
    assert f.remedy == f"{PYTHON} -m pip install --force-reinstall --no-cache-dir deepspeed==0.16.4"


def test_deepspeed_jit_only_without_nvcc_warns(tmp_path):
    fs = h100(tmp_path, python_packages=packages(deepspeed="0.16.4"))
    deepspeed(fs, torch="2.4")
    got = check(fs)
    assert got["frameworks.deepspeed.torch"].status == Status.WARN
    assert got["frameworks.deepspeed.toolkit"].status == Status.WARN
    fs.file("/usr/local/cuda/bin/nvcc", "")
    assert "frameworks.deepspeed.toolkit" not in check(fs)


def test_not_recorded_packages_skip_instead_of_guessing(tmp_path):
    fs = recorded.h100x8(tmp_path)
    f = check(fs)["frameworks.deepspeed"]
    assert f.status == Status.SKIP


# -- CuPy, KvikIO, GDS ----------------------------------------------------------------------------

CUFILE = """{
    // cuFile's shipped config has comments
    "logging": { "level": "ERROR" },
    "properties": {
        "max_direct_io_size_kb": 16384, /* trailing comment */
        "allow_compat_mode": false,
        "use_poll_mode": false,
    }
}
"""


def test_cufile_json_with_comments_parses():
    assert json.loads(strip_json_comments('{"url": "http://x//y"}')) == {"url": "http://x//y"}
    cfg = parse_cufile(CUFILE)
    assert cfg["error"] is None and cfg["allow_compat_mode"] is False and cfg["max_direct_io_size_kb"] == 16384
    assert parse_cufile("{ nope")["error"]


def test_kvikio_without_nvidia_fs_and_compat_forbidden_fails(tmp_path):
    fs = h100(tmp_path, python_packages=packages(kvikio_cu12="25.6.0", cupy_cuda12x="13.4.0"))
    fs.file("/etc/cufile.json", CUFILE)
    got = check(fs)
    f = got["gds.kvikio"]
    assert f.status == Status.FAIL and "nvidia_fs" in f.detail and f.remedy.startswith("sudo apt install nvidia-gds")
    assert got["gds.cupy"].status == Status.PASS
    fs.file("/etc/cufile.json", CUFILE.replace('"allow_compat_mode": false', '"allow_compat_mode": true'))
    assert check(fs)["gds.kvikio"].status == Status.WARN
    fs.file("/sys/module/nvidia_fs/version", "2.20\n")
    fs.file("/usr/lib/x86_64-linux-gnu/libcufile.so.0", "")
    assert check(fs)["gds.kvikio"].status == Status.PASS


def test_two_cupy_wheels_and_broken_cufile_json(tmp_path):
    fs = h100(tmp_path, python_packages=packages(cupy_cuda11x="12.0.0", cupy_cuda12x="13.4.0"))
    fs.file("/etc/cufile.json", "{ properties: }")
    got = check(fs)
    assert got["gds.cupy"].status == Status.FAIL and "cupy-cuda11x" in got["gds.cupy"].remedy
    assert got["gds.cufile_json"].status == Status.FAIL


def test_cupy_for_a_newer_cuda_than_the_driver(tmp_path):
    fs = h100(tmp_path, python_packages=packages(cupy_cuda13x="14.0.0"))
    f = check(fs)["gds.cupy"]
    assert f.status == Status.FAIL and "cupy-cuda12x" in f.remedy


def test_snapshot_replay_gives_the_same_framework_findings(tmp_path):
    fs = h100(tmp_path, python_packages=packages(deepspeed="0.16.4", accelerate="1.10.0"))
    deepspeed(fs, torch="2.4", ops={"fused_adam": True})
    fs.file(ACC, "distributed_type: MULTI_GPU\nnum_processes: 16\n")
    collectors, rules = catalog()
    collectors = [c for c in collectors if c.name in WANT]
    rules = [r for r in rules if r.name in ("frameworks", "gds")]
    rec = RecordingHost(fs.host({"HOME": HOME}))
    live = run_checks(rec, collectors, rules).findings
    replay = run_checks(ReplayHost(json.loads(json.dumps(rec.snapshot()))), collectors, rules).findings
    key = lambda fs_: sorted((f.id, f.status.value, f.title) for f in fs_)  # noqa: E731
    assert key(live) == key(replay) and any(f.status == Status.FAIL for f in live)
