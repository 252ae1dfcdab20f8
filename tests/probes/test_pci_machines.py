"""The PCI probe and hardware rules on every recorded machine."""

import pytest

from hwtui.core.finding import Status
from hwtui.probes.catalog import CORE_COLLECTORS, CORE_RULES
from hwtui.probes.devices import build_devices
from hwtui.probes.framework import run_checks
from hwtui.probes.pci import GPU_CLASSES, collect_pci, link_gen
from tests import machines

EXPECTED = {
    "rtx3090_arc_a770": [("NVIDIA", "cuda:0", "GeForce RTX 3090"), ("Intel", "xpu:0", "Arc A770")],
    "rx7900xtx_rtx2080ti": [("NVIDIA", "cuda:0", "GeForce RTX 2080 Ti"), ("AMD", "hip:0", "Radeon RX 7900 XTX")],
    "arc_a380_rx6600": [("Intel", "xpu:0", "Arc A380"), ("AMD", "hip:0", "Radeon RX 6600")],
    "rtx4090_rx7800xt_arc_a750": [("NVIDIA", "cuda:0", "GeForce RTX 4090"), ("Intel", "xpu:0", "Arc A750"),
                                  ("AMD", "hip:0", "Radeon RX 7800 XT")],
    "h100_x8": [("NVIDIA", f"cuda:{i}", "H100 SXM5 80GB") for i in range(8)],
    "gaudi2_node": [("Habana", f"hpu:{i}", "Gaudi2") for i in range(8)],
    "tpu_vm": [("Google", f"tpu:{i}", "TPU v4") for i in range(4)],
    "vfio_passthrough": [("NVIDIA", "cuda:0", "GeForce RTX 4090")],
    "laptop_no_gpu": [],
}


def _check(fs):
    return run_checks(fs.host(), CORE_COLLECTORS, CORE_RULES)


@pytest.mark.parametrize("name", sorted(machines.MACHINES))
def test_devices_per_machine(tmp_path, name):
    fs = machines.MACHINES[name](tmp_path)
    pci = collect_pci(fs.host())
    devices = build_devices(pci)
    usable = [(d.vendor, d.device, d.name) for d in devices if d.usable]
    assert usable == EXPECTED[name]
    assert [d.id for d in devices if d.usable] == list(range(len(usable)))
    # Host bridges, audio functions, NVSwitches and NICs never count as GPUs.
    assert all(int(r["class"], 16) >> 8 in GPU_CLASSES for r in pci["devices"])
    assert not [d for d in devices if d.pci in ("0000:00:00.0", "0000:00:1f.3") or d.pci.endswith(".1")]


def test_vfio_device_reported_not_counted(tmp_path):
    fs = machines.vfio_passthrough(tmp_path)
    devices = build_devices(collect_pci(fs.host()))
    passthrough = [d for d in devices if d.driver == "vfio-pci"]
    assert len(passthrough) == 1 and passthrough[0].id is None and not passthrough[0].usable
    assert "vfio-pci" in passthrough[0].reason
    finding = {f.id: f for f in _check(fs).findings}["pci.driver[0000:02:00.0]"]
    assert finding.status is Status.WARN and "drivers_probe" in finding.remedy


def test_tpu_on_vfio_is_normal(tmp_path):
    fs = machines.tpu_vm(tmp_path)
    result = _check(fs)
    assert all(f.status is Status.PASS for f in result.findings if f.id.startswith("pci.driver"))


def test_nouveau_bound_nvidia_fails_with_blacklist_remedy(tmp_path):
    fs = machines.FakeSys(tmp_path)
    machines._base(fs)
    machines.nvidia_gpu(fs, "0000:01:00.0", 0x2204, 0, driver="nouveau")
    f = {f.id: f for f in _check(fs).findings}["pci.driver[0000:01:00.0]"]
    assert f.status is Status.FAIL and "blacklist nouveau" in f.remedy


@pytest.mark.parametrize(
    ("kw", "status", "needle"),
    [
        ({"width": (8, 16)}, Status.WARN, "x8, below its x16"),
        ({"gen": (3, 4), "slot": (3, 16)}, Status.WARN, "limited by its slot to Gen3"),
        ({"gen": (1, 4)}, Status.PASS, "capable of Gen4 x16"),  # idle downshift of a GPU
        ({"gen": (4, 4)}, Status.PASS, "PCIe Gen4 x16"),
    ],
)
def test_link_state(tmp_path, kw, status, needle):
    fs = machines.FakeSys(tmp_path)
    machines._base(fs)
    machines.nvidia_gpu(fs, "0000:01:00.0", 0x2204, 0, **kw)
    f = {f.id: f for f in _check(fs).findings}["pci.link[0000:01:00.0]"]
    assert f.status is status and needle in f.title


def test_link_gen_parsing():
    assert [link_gen(s) for s in ("2.5 GT/s PCIe", "8.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe", "Unknown", None)] == [
        1, 3, 5, 6, None, None]


def test_render_group_membership(tmp_path):
    fs = machines.rx7900xtx_rtx2080ti(tmp_path)
    f = {f.id: f for f in _check(fs).findings}
    assert f["devnodes.kfd"].status is Status.FAIL
    assert f["devnodes.kfd"].remedy == "sudo usermod -aG render alice && log out and back in"
    fs.facts(user={"uid": 1000, "gid": 1000, "groups": [1000, 109], "name": "alice"})
    f = {f.id: f for f in _check(fs).findings}
    assert f["devnodes.kfd"].status is Status.PASS and f["devnodes.render"].status is Status.PASS
    assert f["devnodes.nvidia"].status is Status.PASS


def test_missing_uvm_node(tmp_path):
    fs = machines.rtx3090_arc_a770(tmp_path)
    (tmp_path / "dev" / "nvidia-uvm").unlink()
    f = {f.id: f for f in _check(fs).findings}["devnodes.nvidia"]
    assert f.status is Status.FAIL and "/dev/nvidia-uvm" in f.title and "nvidia-modprobe" in f.remedy


def test_pci_ids_names_preferred_over_fallback(tmp_path):
    fs = machines.rtx3090_arc_a770(tmp_path)
    fs.file("/usr/share/misc/pci.ids", "# test\n10de  NVIDIA Corporation\n\t2204  GA102 [GeForce RTX 3090 Ti-ish]\n"
            "8086  Intel Corporation\n\t56a0  DG2 [Arc A770]\nC 00  Unclassified device\n")
    names = [d.name for d in build_devices(collect_pci(fs.host()))]
    assert names == ["GeForce RTX 3090 Ti-ish", "Arc A770"]


def test_unknown_device_has_readable_fallback(tmp_path):
    fs = machines.FakeSys(tmp_path)
    machines._base(fs)
    fs.pci("0000:01:00.0", machines.NV, 0x9999, driver="nvidia")
    (dev,) = build_devices(collect_pci(fs.host()))
    assert dev.name == "NVIDIA device 9999"


def test_small_shm_warns(tmp_path):
    fs = machines.laptop_no_gpu(tmp_path)
    fs.facts(host_runtime={"shm_total": 64 * 2**20, "python": "3.11.7"})
    f = {f.id: f for f in _check(fs).findings}["host.shm"]
    assert f.status is Status.WARN and "--shm-size" in f.remedy
