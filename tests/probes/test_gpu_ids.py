"""--gpu-ids / --cuda-ids against every recorded machine of the mixed-vendor design."""

from __future__ import annotations

import pytest

from hwtui.probes.gpu_ids import DeviceRef, GpuIdError, parse_cuda_ids, parse_gpu_ids
from hwtui.probes.inventory import detect_devices
from tests.machines import MACHINES

# machine -> the usable devices as (global id, backend id) in id order.
EXPECTED = {
    "rtx3090_arc_a770": [(0, "cuda:0"), (1, "xpu:0")],
    "rx7900xtx_rtx2080ti": [(0, "cuda:0"), (1, "hip:0")],
    "arc_a380_rx6600": [(0, "xpu:0"), (1, "hip:0")],
    "rtx4090_rx7800xt_arc_a750": [(0, "cuda:0"), (1, "xpu:0"), (2, "hip:0")],
    "h100_x8": [(i, f"cuda:{i}") for i in range(8)],
    "gaudi2_node": [(i, f"hpu:{i}") for i in range(8)],
    "tpu_vm": [(i, f"tpu:{i}") for i in range(4)],
    "vfio_passthrough": [(0, "cuda:0")],
    "laptop_no_gpu": [],
}


@pytest.fixture(scope="module")
def devices(tmp_path_factory):
    out = {}
    for name, builder in MACHINES.items():
        fs = builder(tmp_path_factory.mktemp(name))
        out[name], _ = detect_devices(fs.host())
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_configuration_lists_backends_and_ids(devices, name):
    usable = [(d.id, d.device) for d in devices[name] if d.usable]
    assert usable == EXPECTED[name]
    # Every global id and every backend id resolves to the same device, in the order given.
    for gid, spec in usable:
        by_global = parse_gpu_ids(str(gid), devices[name])
        by_backend = parse_gpu_ids(spec, devices[name])
        assert by_global == by_backend
        assert by_global[0].spec == spec and by_global[0].global_id == gid


def test_mixed_backend_ids_keep_order_and_vendor(devices):
    refs = parse_gpu_ids("hip:0, cuda:0,xpu:0,cpu", devices["rtx4090_rx7800xt_arc_a750"])
    assert [r.spec for r in refs] == ["hip:0", "cuda:0", "xpu:0", "cpu:0"]
    assert [r.vendor for r in refs] == ["AMD", "NVIDIA", "Intel", "CPU"]
    assert refs[0].torch_device == "cuda:0"  # ROCm torch drives AMD through the cuda API
    assert refs[3].global_id is None


def test_rocm_alias_and_cpu_ranks(devices):
    assert parse_gpu_ids("rocm:0", devices["rx7900xtx_rtx2080ti"])[0].vendor == "AMD"
    refs = parse_gpu_ids("cpu:0,cpu:1", devices["laptop_no_gpu"])
    assert refs == [DeviceRef("cpu", 0, None, "CPU", "CPU"), DeviceRef("cpu", 1, None, "CPU rank 1", "CPU")]


@pytest.mark.parametrize("spec, fragment", [
    ("cuda:3", "no device cuda:3"),
    ("7", "no device with global id 7"),
    ("0,,1", "empty entry"),
    ("", "is empty"),
    ("0,cuda:0", "names cuda:0 twice"),
    ("cpu,cpu:0", "names cpu:0 twice"),
    ("npu:0", "unknown backend"),
    ("cuda-0", "cannot read"),
])
def test_bad_ids_name_the_devices_that_exist(devices, spec, fragment):
    with pytest.raises(GpuIdError) as exc:
        parse_gpu_ids(spec, devices["rtx3090_arc_a770"])
    msg = str(exc.value)
    assert fragment in msg
    if "available" in msg:
        assert "0=cuda:0 (GeForce RTX 3090)" in msg and "1=xpu:0 (Arc A770)" in msg


def test_passthrough_gpu_is_named_as_not_usable(devices):
    with pytest.raises(GpuIdError) as exc:
        parse_gpu_ids("cuda:1", devices["vfio_passthrough"])
    assert "0000:02:00.0" in str(exc.value) and "vfio-pci" in str(exc.value)


def test_cuda_id_hint_on_amd_only_host(tmp_path):
    from tests.probes.recorded import rx7900xtx

    devs, _ = detect_devices(rx7900xtx(tmp_path).host())
    with pytest.raises(GpuIdError, match="hip:N"):
        parse_gpu_ids("cuda:0", devs)
    # The legacy --cuda-ids means torch.cuda indices: on ROCm those are the AMD GPUs.
    assert [r.spec for r in parse_cuda_ids("0", devs)] == ["hip:0"]


def test_legacy_cuda_ids(devices):
    refs = parse_cuda_ids("1,0", devices["h100_x8"])
    assert [r.spec for r in refs] == ["cuda:1", "cuda:0"]
    with pytest.raises(GpuIdError, match="no cuda:8"):
        parse_cuda_ids("8", devices["h100_x8"])
    with pytest.raises(GpuIdError, match="--gpu-ids"):
        parse_cuda_ids("cuda:0", devices["h100_x8"])
    with pytest.raises(GpuIdError, match="no CUDA or ROCm device"):
        parse_cuda_ids("0", devices["arc_a380_rx6600"][:1])
