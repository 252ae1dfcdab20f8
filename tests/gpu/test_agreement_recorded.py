"""The GPU validation's comparisons, on recorded NVML answers: they run on CPU CI so they cannot rot."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

from hwtui.probes.gpu_agreement import nvml_torch_agreement, panel_agreement, parse_smi_csv, short_pci
from hwtui.probes.inventory import detect_devices
from hwtui.probes.sampling import Sampler
from tests.probes import recorded

CSV = Path(__file__).parent / "data" / "nvidia_smi_h100x8.csv"
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu.py"


def h100_facts():
    return recorded.nvml_fact("nvml_h100x8"), recorded.cuda_runtime_like("torch_cu128_h100x8", "nvml_h100x8")


def test_nvml_and_torch_agree_on_the_recorded_h100s():
    nvml, runtime = h100_facts()
    assert nvml_torch_agreement(nvml, runtime, kernel_driver="570.124.06") == []


def test_each_kind_of_disagreement_is_named():
    nvml, runtime = h100_facts()
    rt = copy.deepcopy(runtime)
    rt["cuda"]["device_count"] = 7
    rt["cuda"]["devices"][3]["name"] = "NVIDIA H100 PCIe"
    rt["cuda"]["devices"][5]["total_memory"] = 40 * 2**30
    rt["cuda"]["devices"][6]["capability"] = [8, 0]
    rt["cuda"]["devices"][7]["pci"] = "0000:ff:00.0"
    rt["version"]["cuda"] = "13.0"
    problems = nvml_torch_agreement(nvml, rt, kernel_driver="570.86.15")
    text = "\n".join(problems)
    for needle in ("device count: NVML 8, torch.cuda 7", "cuda:3 (0000:5d:00.0): name", "cuda:5", "memory NVML 79.65 GiB",
                   "compute capability NVML [9, 0], torch [8, 0]", "torch sees it, NVML does not",
                   "the driver supports 12.8, torch was built for 13.0", "kernel module 570.86.15"):
        assert needle in text, (needle, problems)
    assert nvml_torch_agreement({"ok": False, "error": {"message": "Driver Not Loaded"}}, runtime) == \
        ["NVML did not answer: Driver Not Loaded"]


def test_nvidia_smi_csv_parses_with_units_and_missing_values():
    rows = parse_smi_csv(CSV.read_text())
    assert len(rows) == 8 and rows[0]["pci"] == "0000:18:00.0" and rows[0]["mem_total"] == 85520809984
    assert rows[0]["name"] == "NVIDIA H100 80GB HBM3" and rows[0]["power_limit_w"] == 700.0
    odd = parse_smi_csv("index, pci.bus_id, name, memory.total [MiB], power.draw [W]\n0, 00000000:01:00.0, X, 100, [N/A]\n")
    assert odd[0]["power_w"] is None and odd[0]["mem_total"] == 100 << 20
    assert short_pci("00000000:2A:00.0") == "0000:2a:00.0"


def test_device_panel_sample_matches_recorded_nvidia_smi(tmp_path):
    fs = recorded.h100x8(tmp_path)
    host = fs.host()
    devices, _ = detect_devices(host)
    samples = [s.to_dict() for s in Sampler(host, devices).sample()]
    pci_of = {d.device: d.pci for d in devices if d.device}
    assert panel_agreement(parse_smi_csv(CSV.read_text()), samples, pci_of) == []
    # A panel that shows another GPU's figures is caught.
    samples[0]["mem_used"], samples[1]["temp_c"], samples[2]["name"] = samples[0]["mem_used"] + 2**30, 90.0, "H200"
    problems = panel_agreement(parse_smi_csv(CSV.read_text()), samples, pci_of)
    assert len(problems) == 3, problems
    assert problems[0].startswith("cuda:0: memory used") and problems[1].startswith("cuda:1: temperature panel 90.0 C")
    assert problems[2] == "cuda:2: name panel 'H200', nvidia-smi 'NVIDIA H100 80GB HBM3'"


def test_the_check_never_imports_torch_in_its_own_process():
    code = ("import json, sys; from hwtui.app.cli import main; rc = main(['--check', '--json', '--only', 'gpu']); "
            "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    verdict = json.loads(proc.stderr.strip().splitlines()[-1])
    assert verdict == {"rc": verdict["rc"], "torch": False} and verdict["rc"] in (0, 1), proc.stderr[-1000:]
    assert json.loads(proc.stdout)["schema"] == "hwtui.check/1"


def test_bench_gpu_runs_its_code_paths_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--mb", "8", "--rounds", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())["file_to_device"]
    assert result["exact"] is True and result["bytes"] >= 8 << 20 and result["hwtui_gbps"] > 0
