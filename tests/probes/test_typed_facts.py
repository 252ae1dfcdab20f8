"""The TypedDicts of the hand-overs (issue 27) say what the producers really write.

A TypedDict is only a claim to mypy; these tests hold each claim against the producer's actual
output on every recorded machine, so a field added, dropped or renamed in the producer fails here
instead of leaving the type describing a shape nobody writes.
"""

import pytest

from hwtui.core.finding import Finding, FindingDict, fail, passed
from hwtui.probes.framework import Facts
from hwtui.probes.nvidia import read_nvml
from hwtui.probes.nvml_fact import NvmlDevice, NvmlErrorInfo, NvmlFact
from hwtui.probes.pci import PciDevice, PciLink, collect_pci, pci_fact
from hwtui.probes.torchwheel import (
    NOT_RECORDED,
    ProbeArgs,
    ProbeError,
    TorchBuild,
    TorchRuntime,
    TorchVersion,
    _live_build,
    collect_torch_build,
    collect_torch_runtime,
    describe_build,
    parse_version_py,
    probe_args_for,
)
from tests import machines
from tests.probes.fakenvml import FakeNVML
from tests.probes.recorded import load


def _keys_fit(value: dict, td: type) -> None:
    keys = set(value)
    assert td.__required_keys__ <= keys, f"missing {sorted(td.__required_keys__ - keys)}"
    assert keys <= td.__required_keys__ | td.__optional_keys__, f"undeclared {sorted(keys - td.__required_keys__ - td.__optional_keys__)}"


@pytest.mark.parametrize("name", sorted(machines.MACHINES))
def test_pci_fact_is_what_collect_pci_writes(tmp_path, name):
    pci = collect_pci(machines.MACHINES[name](tmp_path).host())
    assert set(pci) == {"devices"}
    for dev in pci["devices"]:
        _keys_fit(dev, PciDevice)
        _keys_fit(dev["link"], PciLink)
        # The optional VRAM fields are AMD's (sysfs mem_info_vram_*) and only theirs.
        assert ("vram_total" in dev) == (dev["vendor"] == "AMD")


def test_pci_fact_of_facts_without_pci_has_no_devices():
    assert pci_fact(Facts()) == {"devices": []}
    assert pci_fact(Facts(values={"pci": None})) == {"devices": []}
    recorded = {"devices": [{"address": "0000:01:00.0"}]}
    assert pci_fact(Facts(values={"pci": recorded})) is recorded


@pytest.mark.parametrize("finding", [passed("a.b", "fine"), fail("a.c", "bad", "why", "fix", figure=3)])
def test_finding_dict_is_what_to_dict_writes_and_reads_back(finding: Finding):
    raw = finding.to_dict()
    _keys_fit(dict(raw), FindingDict)
    assert ("data" in raw) == bool(finding.data)
    assert Finding.from_dict(raw) == finding and Finding.from_dict(raw).data == finding.data



@pytest.mark.parametrize("name", ["nvml_h100x8", "nvml_rtx2080ti", "nvml_rtx3090", "nvml_rtx4090", "nvml_rtx5090"])
def test_nvml_fact_is_what_read_nvml_writes(name):
    fact = read_nvml(FakeNVML(load(name)))
    _keys_fit(fact, NvmlFact)
    assert fact["ok"] is True and fact["devices"]
    for dev in fact["devices"]:
        _keys_fit(dev, NvmlDevice)
        assert isinstance(dev["index"], int)


def test_nvml_fact_without_the_library_is_an_error_record():
    fact = read_nvml(None)
    _keys_fit(fact, NvmlFact)
    assert fact["ok"] is False
    _keys_fit(fact["error"], NvmlErrorInfo)


@pytest.mark.parametrize("version_py", [
    "__version__ = '2.9.1+cu128'\ncuda = '12.8'\nhip = None\ndebug = False\ngit_version = 'abc'\n",
    "__version__ = '2.9.1+rocm6.4'\ncuda = None\nhip = '6.4.43482'\n",
    "__version__ = '2.9.1+xpu'\nxpu = '20250101'\n",
    "__version__ = '2.9.1'\n",
])
def test_torch_build_is_what_describe_build_writes(version_py):
    build = describe_build(parse_version_py(version_py))
    _keys_fit(dict(build), TorchBuild)
    assert build["installed"] is True and build["variant"] in ("cuda", "rocm", "xpu", "cpu")


def test_torch_build_of_this_interpreter_and_of_a_recording_without_it(tmp_path):
    _keys_fit(dict(_live_build()), TorchBuild)
    fs = machines.MACHINES["laptop_no_gpu"](tmp_path)
    got = collect_torch_build(fs.host())
    _keys_fit(dict(got), TorchBuild)
    assert got == NOT_RECORDED and got is not NOT_RECORDED  # a copy: a consumer may change its own


def test_torch_runtime_is_what_the_recorded_h200_and_this_interpreters_child_write(tmp_path):
    """The real H200's recorded runtime fact, and a fresh child on this machine (torch is installed
    for the tests), both fit TorchRuntime; a recording without it is the not-recorded record."""
    import json
    from pathlib import Path

    from hwtui.probes.host import ReplayHost
    from hwtui.probes.runtime_child import torch_facts

    snap = json.loads((Path(__file__).resolve().parents[1] / "data/recordings/h200.snapshot.json").read_text())
    recorded = snap["facts"]["torch_runtime"]
    _keys_fit(recorded, TorchRuntime)
    _keys_fit(recorded["version"], TorchVersion)
    assert collect_torch_runtime(ReplayHost(snap)) == recorded
    fresh = {"installed": True, **torch_facts(probe_xpu=False)}
    _keys_fit(fresh, TorchRuntime)
    _keys_fit(fresh["version"], TorchVersion)
    got = collect_torch_runtime(machines.MACHINES["laptop_no_gpu"](tmp_path).host())
    _keys_fit(dict(got), TorchRuntime)
    assert got == {"installed": False, "not_recorded": True}
    _keys_fit({"kind": "timeout", "message": "m", "stderr": ""}, ProbeError)


def test_probe_args_are_the_three_switches():
    args = probe_args_for({"devices": [{"vendor": "Intel"}, {"vendor": "NVIDIA"}]})
    _keys_fit(dict(args), ProbeArgs)
    assert args == {"probe_xpu": True, "probe_ccl": True, "probe_hpu": False}
    assert probe_args_for(None) == {"probe_xpu": True, "probe_ccl": False, "probe_hpu": False}
