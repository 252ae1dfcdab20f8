"""Device memory as nvidia-smi reports it: NVML v2 where the driver has it, v1 otherwise (issue 25).

The figures are the H200's from ../shared/GPU.md (nvidia-smi: total 143771, reserved 615, used 0,
free 143155 MiB), where v1 said 615 MiB used.
"""

from __future__ import annotations

import copy
import json

import pytest

from hwtui.probes.host import RecordingHost, ReplayHost
from hwtui.probes.inventory import detect_devices
from hwtui.probes.nvml_memory import read_memory
from hwtui.probes.sampling import Sampler
from tests import machines
from tests.probes.fakenvml import FakeNVML
from tests.probes.livehost import LiveTreeHost
from tests.probes.recorded import GIB, h100x8, load, nvml_fact, record

MIB = 2**20
H200_V1 = {"total": 143771 * MIB, "used": 615 * MIB, "free": 143156 * MIB}
H200_V2 = {"total": 143771 * MIB, "reserved": 615 * MIB, "used": 0, "free": 143155 * MIB}


def _with_v2(data: dict) -> dict:
    data = copy.deepcopy(data)
    for dev in data["devices"]:
        dev["memory"] = dict(H200_V1)
        dev["memory_v2"] = dict(H200_V2)
    return data


def test_v2_is_what_the_probe_records():
    fact = nvml_fact(_with_v2(load("nvml_h100x8")))
    mem = fact["devices"][0]["memory"]
    assert mem == {"total": H200_V2["total"], "used": 0, "free": H200_V2["free"], "reserved": 615 * MIB, "version": 2}


def test_an_old_driver_without_v2_gives_v1():
    data = load("nvml_h100x8")  # no memory_v2: the fake answers _v2 with FunctionNotFound
    fact = nvml_fact(data)
    mem = fact["devices"][0]["memory"]
    assert mem["version"] == 1 and mem["used"] == data["devices"][0]["memory"]["used"]
    assert "memory" not in fact["devices"][0]["unsupported"], "the fallback is not a missing field"


def test_a_binding_without_the_version_argument_gives_v1():
    class OldBinding(FakeNVML):
        def nvmlDeviceGetMemoryInfo(self, h):  # nvidia-ml-py before the version argument
            return super().nvmlDeviceGetMemoryInfo(h)

    fake = OldBinding(_with_v2(load("nvml_h100x8")))
    fake.nvmlInit()
    assert read_memory(fake, 0) == {**H200_V1, "version": 1}


def test_a_lost_gpu_is_not_taken_for_an_old_driver():
    import pynvml

    data = _with_v2(load("nvml_h100x8"))
    data["devices"][0]["errors"] = {"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_GPU_IS_LOST}
    fake = FakeNVML(data)
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError):
        read_memory(fake, 0)


def test_live_panel_and_replay_show_nvidia_smis_used(tmp_path):
    """The live sampler shows v2's used (0 on the idle H200); a snapshot replays the same figure."""
    fs = h100x8(tmp_path / "tree")
    data = _with_v2(load("nvml_h100x8"))
    devices, _ = detect_devices(fs.host())
    live = {s.key: s for s in Sampler(LiveTreeHost(fs.root, {}), devices, nvml=FakeNVML(data)).sample()}
    assert live["cuda:0"].mem_used == 0 and live["cuda:0"].mem_total == H200_V2["total"]

    # A machine recorded with v2 facts (as `hwtui snapshot` now records them) replays the same figure.
    tree = machines.h100_x8(tmp_path / "v2")
    record(tree, nvml=data, torch="torch_cu128_h100x8", mem_total=2015 * GIB, cpus=224)
    rec = RecordingHost(tree.host())
    devices, _ = detect_devices(rec)
    Sampler(rec, devices).sample()
    snap = json.loads(json.dumps(rec.snapshot()))
    replayed = {s.key: s for s in Sampler(ReplayHost(snap)).sample()}
    assert replayed["cuda:0"].mem_used == 0 == live["cuda:0"].mem_used


def test_an_old_driver_costs_one_call_per_tick(tmp_path):
    """The live sampler learns once that v2 is missing: v1 alone on every later tick."""
    fs = h100x8(tmp_path)
    fake = FakeNVML(load("nvml_h100x8"))
    devices, _ = detect_devices(fs.host())
    sampler = Sampler(LiveTreeHost(fs.root, {}), devices, nvml=fake)
    sampler.sample()
    fake.calls.clear()
    sampler.sample()
    assert fake.calls.count("nvmlDeviceGetMemoryInfo") == 8
