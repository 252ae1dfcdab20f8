"""The shipped example snapshots replay: devices, samples and verdicts come back as recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from hwtui.core.finding import Status
from hwtui.probes.catalog import catalog
from hwtui.probes.framework import run_checks
from hwtui.probes.host import ReplayHost
from hwtui.probes.inventory import detect_devices
from hwtui.probes.sampling import Sampler
from tests.probes import make_examples

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def test_h100x8_replays():
    host = ReplayHost.load(EXAMPLES / "h100x8.snapshot.json")
    devices, _ = detect_devices(host)
    assert [d.device for d in devices if d.usable] == [f"cuda:{i}" for i in range(8)]
    assert {d.name for d in devices} == {"NVIDIA H100 80GB HBM3"} and devices[0].vram_total == 85520809984
    samples = Sampler(host, devices).sample()
    assert [s.key for s in samples] == [f"cuda:{i}" for i in range(8)] + ["cpu"]
    assert all(s.util and s.power_w and s.temp_c for s in samples[:8])
    collectors, rules = catalog()
    got = {f.id: f for f in run_checks(host, collectors, rules, only={"gpu"}).findings}
    assert got["nvidia.driver.cuda_compat"].status == Status.PASS
    assert got["torch.runtime.backends"].data["nccl"] is True
    assert not [f for f in got.values() if f.id.startswith("hwtui.probe.")]  # every fact was recorded


def test_mixed3_replays():
    host = ReplayHost.load(EXAMPLES / "mixed3.snapshot.json")
    devices, _ = detect_devices(host)
    assert [(d.device, d.vendor) for d in devices if d.usable] == [("cuda:0", "NVIDIA"), ("xpu:0", "Intel"), ("hip:0", "AMD")]
    by_key = {s.key: s for s in Sampler(host, devices).sample()}
    assert by_key["hip:0"].temp_c == 44.0 and by_key["cuda:0"].mem_total == 25757220864
    assert next(d for d in devices if d.vendor == "AMD").extra["gfx"] == "gfx1101"


@pytest.mark.parametrize("name", sorted(make_examples.EXAMPLES))
def test_regeneration_runs(tmp_path, name):
    builder, host_name, description = make_examples.EXAMPLES[name]
    snap = make_examples.snapshot_of(builder, host_name, description, tmp_path)
    assert snap["source"]["host"] == host_name and "nvml" in snap["facts"]
    assert not any(k.startswith(str(tmp_path)) for k in snap["files"])  # machine paths, not the tree's
