"""Every GPU path on the live machine (issue 17.1); `make gpu-check` runs these. Skipped without a GPU.

Each test drives the real CLI in a child process, the way a user would, and checks the result
against an independent view: NVML against torch.cuda, a snapshot's replay against the live
machine, replicated bytes against the source file, the device panel against nvidia-smi.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hwtui.probes.gpu_agreement import SMI_ARGV, nvml_torch_agreement, panel_agreement, parse_smi_csv

pytestmark = pytest.mark.gpu
GB = 10**9


def hwtui(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hwtui", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def torch_probe(code: str) -> subprocess.CompletedProcess[str]:
    """torch in a child of its own: the check under test must not be the one importing it."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def gpu_count() -> int:
    out = subprocess.run([*SMI_ARGV], capture_output=True, text=True, timeout=60).stdout
    return len(parse_smi_csv(out))


def kernel_driver() -> str | None:
    text = Path("/proc/driver/nvidia/version").read_text()
    match = re.search(r"Kernel Module(?: for \S+)?\s+([\d.]+)", text)
    return match.group(1) if match else None


def test_check_nvml_and_torch_agree_and_torch_stays_out_of_the_parent(tmp_path):
    code = ("import json, sys; from hwtui.probes.catalog import catalog; from hwtui.probes.framework import run_checks; "
            "from hwtui.probes.host import FsHost; c, r = catalog(); res = run_checks(FsHost('/'), c, r, only={'gpu'}); "
            "print(json.dumps({'facts': {k: res.facts.get(k) for k in ('nvml', 'torch_runtime', 'torch_build')}, "
            "'findings': [f.to_dict() for f in res.findings], 'torch_in_parent': 'torch' in sys.modules}))")
    # A fresh cache: the torch facts come from a child started now, not from an earlier run.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["torch_in_parent"] is False
    facts = out["facts"]
    assert nvml_torch_agreement(facts["nvml"], facts["torch_runtime"], kernel_driver()) == []
    # The wheel verdict is right for the installed torch: a kernel really runs iff no wheel verdict fails.
    works = torch_probe("import torch; x = torch.arange(1 << 20, device='cuda', dtype=torch.float32); "
                        "assert float((x * 2).sum()) == float(x.sum()) * 2; print('ok')").stdout.strip() == "ok"
    wheel = {f["id"]: f["status"] for f in out["findings"] if f["id"].startswith(("torch.wheel", "nvidia.driver.cuda_compat",
                                                                                  "torch.runtime"))}
    failed = sorted(k for k, v in wheel.items() if v in ("fail", "error"))
    assert (failed == []) == works, (works, wheel)


def test_list_gpus_snapshot_and_replay_agree(tmp_path):
    snap = tmp_path / "host.json"
    assert hwtui("snapshot", "-o", str(snap)).returncode == 0
    live, replay = hwtui("list-gpus", "--json"), hwtui("list-gpus", "--json", "--replay", str(snap))
    volatile = ("vram_used", "utilization", "temperature_c", "power_w")  # live figures move between two reads

    def stable(text: str) -> list[dict]:
        out = []
        doc = json.loads(text)
        assert doc["schema"] == "hwtui.gpus/1"
        for d in doc["devices"]:
            d = {k: v for k, v in d.items() if k not in volatile}
            d["extra"] = {k: v for k, v in (d.get("extra") or {}).items() if k not in volatile}
            out.append(d)
        return out

    assert stable(live.stdout) == stable(replay.stdout) and json.loads(live.stdout)["devices"]
    live_check = json.loads(hwtui("--check", "--json").stdout)["findings"]
    replay_check = json.loads(hwtui("--check", "--json", "--replay", str(snap)).stdout)["findings"]
    assert sorted((f["id"], f["status"]) for f in live_check) == sorted((f["id"], f["status"]) for f in replay_check)


def make_model(path: Path, nbytes: int) -> None:
    code = ("import sys, torch; from safetensors.torch import save_file; g = torch.Generator().manual_seed(0); "
            f"n = {nbytes} // 8; save_file({{f'w{{i}}': torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) "
            f"for i in range(8)}}, sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=300)


def test_replicate_one_gigabyte_into_gpu_memory_and_commit(tmp_path):
    model, plan, out, report = tmp_path / "m.safetensors", tmp_path / "plan.json", tmp_path / "out", tmp_path / "r.json"
    make_model(model, 1 * GB)
    assert hwtui("plan", "--weights", str(model), "-o", str(plan)).returncode == 0
    n = gpu_count()
    # Several GPUs: one rank per GPU, NCCL between them (hwtui names it cuda-ipc inside a node).
    # One GPU: NCCL refuses two ranks on one device, so both ranks hold the weights on cuda:0 and
    # the buckets travel over gloo (--transport gloo: device memory, host-side collectives).
    extra = ["--nproc", str(min(n, 4))] if n >= 2 else ["--nproc", "2", "--transport", "gloo"]
    proc = hwtui("replicate", "--plan", str(plan), "--device", "cuda", *extra,
                 "--commit", "--out", str(out), "--report", str(report), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    rep = json.loads(report.read_text())
    assert rep["ok"] and rep["committed"] and rep["verify"] and rep["device"] == "cuda" and rep["bytes"] >= GB
    if n >= 2:
        assert rep["transport"] in ("cuda-ipc", "nccl"), rep["transport"]
    check = ("import json, sys, torch; from pathlib import Path; from safetensors.torch import load_file; "
             "out, src = Path(sys.argv[1]), load_file(sys.argv[2]); "
             "cur = json.loads((out / 'rank1' / 'CURRENT').read_text()); got = load_file(str(out / 'rank1' / cur['file'])); "
             "assert sorted(got) == sorted(src) and all(torch.equal(got[k], src[k]) for k in src); print('same')")
    same = subprocess.run([sys.executable, "-c", check, str(out), str(model)], capture_output=True, text=True, timeout=300)
    assert same.stdout.strip() == "same", same.stderr[-2000:]


def test_train_on_cuda_and_cpu_the_gpu_takes_the_larger_share(tmp_path):
    report = tmp_path / "train.json"
    # A model the GPU is physically faster at: the default byte model (d_model 128) is so small that a
    # 16-core CPU worker out-trains a launch-bound GPU worker on it (H200: 4,688 CPU samples against
    # 1,712), and the balancer rightly gave the CPU the larger share.
    proc = hwtui("train", "--gpu-ids", "cuda:0,cpu:0", "--steps", "100", "--d-model", "512", "--layers", "8",
                 "--context", "128", "--batch-size", "32", "--report", str(report), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(report.read_text())
    by_device = {w["device"]: w for w in rep["workers"]}
    print("\ntrain cuda:0 + cpu:0:", {d: {k: w.get(k) for k in ("samples", "samples_per_s", "seconds", "share")}
                                       for d, w in by_device.items()})
    assert by_device["cuda:0"]["samples"] > by_device["cpu:0"]["samples"], by_device
    assert len(rep["rounds"]) >= 2  # merges happened
    first = max(w["loss_first"] for w in rep["workers"] if w["loss_first"] is not None)
    assert rep["final_loss"] < first, (first, rep["final_loss"])


def test_device_panel_matches_nvidia_smi_at_the_same_moment():
    from hwtui.probes.host import FsHost
    from hwtui.probes.inventory import detect_devices
    from hwtui.probes.sampling import Sampler

    host = FsHost("/")
    devices, _ = detect_devices(host)
    sampler = Sampler(host, devices)
    sampler.sample()  # the first tick opens handles; compare the second
    samples = [s.to_dict() for s in sampler.sample()]
    smi = subprocess.run([*SMI_ARGV], capture_output=True, text=True, timeout=60)
    assert smi.returncode == 0, smi.stderr
    pci_of = {d.device: d.pci for d in devices if d.device}
    assert panel_agreement(parse_smi_csv(smi.stdout), samples, pci_of) == []
