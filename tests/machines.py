"""The recorded machines the test suite runs on, built with FakeSys.

Each builder returns the FakeSys; ``MACHINES`` maps a short name to its builder so tests can be
parametrised over all of them. Device ids are the real PCI ids of those products.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.fakesys import FakeSys

NV, AMD, INTEL, HABANA, GOOGLE = 0x10DE, 0x1002, 0x8086, 0x1DA3, 0x1AE0
GIB = 1024**3


def _base(fs: FakeSys) -> None:
    # Things every real machine has that must NOT be counted as GPUs.
    fs.pci("0000:00:00.0", INTEL, 0x9A14, cls=0x060000)  # host bridge, vendor Intel
    fs.pci("0000:00:1f.3", INTEL, 0xA0C8, cls=0x040300)  # HD audio
    fs.file("/proc/cpuinfo", "processor\t: 0\nmodel name\t: Test CPU @ 3.0GHz\n")
    fs.file("/proc/meminfo", "MemTotal:       65536000 kB\n")
    fs.file("/etc/os-release", 'PRETTY_NAME="Test Linux 12"\n')
    fs.facts(user={"uid": 1000, "gid": 1000, "groups": [1000], "name": "alice"})
    # Every real machine has a loopback and one wired interface (flags IFF_UP|IFF_LOOPBACK / IFF_UP).
    for name, flags, arphrd, state, mac in (("lo", 0x9, 772, "unknown", "00:00:00:00:00:00"),
                                            ("eth0", 0x1003, 1, "up", "02:42:ac:11:00:02")):
        fs.file(f"/sys/class/net/{name}/flags", f"0x{flags:x}\n")
        fs.file(f"/sys/class/net/{name}/type", f"{arphrd}\n")
        fs.file(f"/sys/class/net/{name}/operstate", f"{state}\n")
        fs.file(f"/sys/class/net/{name}/address", f"{mac}\n")
    fs.facts(**{"dist.if_addrs": {"lo": ["127.0.0.1"], "eth0": ["10.1.2.3"]}})


def nvidia_gpu(fs: FakeSys, addr: str, device: int, index: int, *, driver: str = "nvidia", numa: int = 0,
               cls: int = 0x030000, driver_version: str = "570.124.04", **kw) -> None:
    fs.pci(addr, NV, device, cls=cls, driver=driver, numa=numa, **kw)
    if driver == "nvidia":
        fs.devnode(f"/dev/nvidia{index}")
        fs.devnode("/dev/nvidiactl")
        fs.devnode("/dev/nvidia-uvm")
        fs.module("nvidia", driver_version)
        fs.module("nvidia_uvm", driver_version)
        fs.file("/proc/driver/nvidia/version",
                f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version}  Release Build  (dvs-builder@U16)\n"
                "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    # The GPU's HDMI/DP audio function sits beside it and is not a GPU.
    fs.pci(addr[:-1] + "1", NV, 0x1AEF, cls=0x040300, driver="snd_hda_intel")


def amd_gpu(fs: FakeSys, addr: str, device: int, card: int, vram: int, **kw) -> None:
    fs.pci(addr, AMD, device, driver="amdgpu", drm=(f"card{card}", f"renderD{128 + card}"),
           files={"mem_info_vram_total": f"{vram}\n", "mem_info_vram_used": f"{vram // 20}\n", "gpu_busy_percent": "3\n"}, **kw)
    fs.pci(addr[:-1] + "1", AMD, 0xAB30, cls=0x040300, driver="snd_hda_intel")
    fs.devnode("/dev/kfd", 0o660, gid=109)
    fs.devnode(f"/dev/dri/renderD{128 + card}", 0o660, gid=109)
    fs.devnode(f"/dev/dri/card{card}", 0o660, gid=44)
    fs.module("amdgpu")


def intel_gpu(fs: FakeSys, addr: str, device: int, card: int, *, driver: str = "i915", **kw) -> None:
    fs.pci(addr, INTEL, device, driver=driver, drm=(f"card{card}", f"renderD{128 + card}"), **kw)
    fs.devnode(f"/dev/dri/renderD{128 + card}", 0o660, gid=109)
    fs.devnode(f"/dev/dri/card{card}", 0o660, gid=44)
    fs.module(driver)


def rtx3090_arc_a770(root: Path) -> FakeSys:
    fs = FakeSys(root)
    _base(fs)
    nvidia_gpu(fs, "0000:01:00.0", 0x2204, 0)
    intel_gpu(fs, "0000:03:00.0", 0x56A0, 1)
    return fs


def rx7900xtx_rtx2080ti(root: Path) -> FakeSys:
    fs = FakeSys(root)
    _base(fs)
    amd_gpu(fs, "0000:03:00.0", 0x744C, 0, 24 * GIB)
    nvidia_gpu(fs, "0000:0a:00.0", 0x1E07, 0, gen=(3, 3))
    return fs


def arc_a380_rx6600(root: Path) -> FakeSys:
    fs = FakeSys(root)
    _base(fs)
    intel_gpu(fs, "0000:04:00.0", 0x56A5, 0, driver="xe")
    amd_gpu(fs, "0000:08:00.0", 0x73FF, 1, 8 * GIB, width=(8, 8))
    return fs


def rtx4090_rx7800xt_arc_a750(root: Path) -> FakeSys:
    fs = FakeSys(root)
    _base(fs)
    nvidia_gpu(fs, "0000:01:00.0", 0x2684, 0)
    amd_gpu(fs, "0000:05:00.0", 0x747E, 0, 16 * GIB)
    intel_gpu(fs, "0000:09:00.0", 0x56A1, 1)
    return fs


def h100_x8(root: Path) -> FakeSys:
    fs = FakeSys(root)
    _base(fs)
    for i in range(8):
        bus = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB][i]
        nvidia_gpu(fs, f"0000:{bus:02x}:00.0", 0x2330, i, cls=0x030200, numa=i // 4, gen=(5, 5))
    for i in range(4):  # NVSwitches (bridge class) and ConnectX-7 NICs: not GPUs
        fs.pci(f"0000:{0xC0 + i:02x}:00.0", NV, 0x22A3, cls=0x068000, driver="nvidia")
        fs.pci(f"0000:{0x30 + i:02x}:00.0", 0x15B3, 0x1021, cls=0x020700, driver="mlx5_core")
    fs.module("nvidia_peermem", "570.124.04")
    return fs


def gaudi2_node(root: Path) -> FakeSys:
    fs = FakeSys(root)
    _base(fs)
    for i in range(8):
        fs.pci(f"0000:{0x19 + i * 0x10:02x}:00.0", HABANA, 0x1020, cls=0x120000, driver="habanalabs", numa=i // 4)
        fs.devnode(f"/dev/accel/accel{i}", 0o660, gid=44)
        fs.devnode(f"/dev/accel/accel_controlD{i}", 0o660, gid=44)
    fs.module("habanalabs", "1.20.0")
    return fs


def tpu_vm(root: Path) -> FakeSys:
    fs = FakeSys(root)
    _base(fs)
    for i in range(4):
        fs.pci(f"0000:00:{4 + i:02x}.0", GOOGLE, 0x005E, cls=0x120000, driver="vfio-pci")
        fs.devnode(f"/dev/vfio/{i}", 0o666)
    fs.module("vfio_pci")
    return fs


def vfio_passthrough(root: Path) -> FakeSys:
    fs = FakeSys(root)
    _base(fs)
    nvidia_gpu(fs, "0000:01:00.0", 0x2684, 0)
    nvidia_gpu(fs, "0000:02:00.0", 0x2204, 1, driver="vfio-pci")
    fs.module("vfio_pci")
    return fs


def laptop_no_gpu(root: Path) -> FakeSys:
    fs = FakeSys(root)
    _base(fs)
    fs.pci("0000:00:14.3", INTEL, 0x51F0, cls=0x028000, driver="iwlwifi")  # Wi-Fi
    return fs


MACHINES: dict[str, Callable[[Path], FakeSys]] = {
    "rtx3090_arc_a770": rtx3090_arc_a770,
    "rx7900xtx_rtx2080ti": rx7900xtx_rtx2080ti,
    "arc_a380_rx6600": arc_a380_rx6600,
    "rtx4090_rx7800xt_arc_a750": rtx4090_rx7800xt_arc_a750,
    "h100_x8": h100_x8,
    "gaudi2_node": gaudi2_node,
    "tpu_vm": tpu_vm,
    "vfio_passthrough": vfio_passthrough,
    "laptop_no_gpu": laptop_no_gpu,
}
