"""Recorded network trees for the distributed checks: /sys/class/net, /sys/class/infiniband, mounts.

Extends the suite's FakeSys (it stays untouched) with the files the env checks read, laid out as
the kernel lays them out, so the probes under test read them through a real FsHost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from hwtui.core.finding import Finding
from hwtui.probes.catalog import catalog
from hwtui.probes.framework import CheckResult, run_checks
from hwtui.probes.host import FsHost, Host
from tests.fakesys import FakeSys

ARPHRD = {"ether": 1, "infiniband": 32, "loopback": 772}
STATES = {"ACTIVE": "4: ACTIVE", "DOWN": "1: DOWN", "INIT": "2: INIT", "ARMED": "3: ARMED"}


class NetSys(FakeSys):
    def __init__(self, root: Path):
        super().__init__(root)
        self.file("/proc/mounts", "")
        self.facts(user={"uid": 1000, "gid": 1000, "groups": [1000], "name": "alice"})

    def netif(self, name: str, *, up: bool = True, kind: str = "ether", operstate: str | None = None,
              mac: str = "02:00:00:00:00:01") -> None:
        loop = kind == "loopback"
        flags = (0x1 if up else 0) | (0x8 if loop else 0x1002)
        base = f"/sys/class/net/{name}"
        self.file(f"{base}/flags", f"0x{flags:x}\n")
        self.file(f"{base}/type", f"{ARPHRD[kind]}\n")
        self.file(f"{base}/operstate", (operstate or ("unknown" if loop else "up" if up else "down")) + "\n")
        self.file(f"{base}/address", ("00:00:00:00:00:00" if loop else mac) + "\n")

    def if_addrs(self, mapping: Mapping[str, list[str]]) -> None:
        self.facts(**{"dist.if_addrs": dict(mapping)})

    def hca_port(self, hca: str, port: int = 1, *, state: str = "ACTIVE", link_layer: str = "InfiniBand",
                 rate: str = "200 Gb/sec (4X HDR)", gids: Mapping[int, tuple[str, str]] | None = None) -> None:
        """``gids`` maps index -> (gid, type) such as ``"RoCE v2"``; every other index reads as zero."""
        base = f"/sys/class/infiniband/{hca}/ports/{port}"
        self.file(f"{base}/state", STATES[state] + "\n")
        self.file(f"{base}/phys_state", ("5: LinkUp" if state == "ACTIVE" else "3: Disabled") + "\n")
        self.file(f"{base}/link_layer", link_layer + "\n")
        self.file(f"{base}/rate", rate + "\n")
        gids = dict(gids or {0: ("fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1")})
        for i in range(max(gids) + 3):
            gid, gtype = gids.get(i, ("0000:0000:0000:0000:0000:0000:0000:0000", ""))
            self.file(f"{base}/gids/{i}", gid + "\n")
            if gtype:
                self.file(f"{base}/gid_attrs/types/{i}", gtype + "\n")

    def mounts(self, entries: Iterable[tuple[str, str, str, str]]) -> None:
        self.file("/proc/mounts", "".join(f"{dev} {mp.replace(' ', chr(92) + '040')} {fs} {opts} 0 0\n"
                                          for dev, mp, fs, opts in entries))

class LiveFactsHost(FsHost):
    """A recorded tree for files, but live answers for runtime facts (sockets, DNS) on this machine."""

    def fact(self, key: str, producer):  # noqa: ANN001
        return producer()


def roce_gids(ipv4: str = "192.168.100.1") -> dict[int, tuple[str, str]]:
    """The GID table a ConnectX port in RoCE mode shows: link-local v1/v2, then IPv4-mapped v1/v2."""
    a, b, c, d = (int(x) for x in ipv4.split("."))
    mapped = f"0000:0000:0000:0000:0000:ffff:{a << 8 | b:04x}:{c << 8 | d:04x}"
    ll = "fe80:0000:0000:0000:0200:00ff:fe00:0001"
    return {0: (ll, "IB/RoCE v1"), 1: (ll, "RoCE v2"), 2: (mapped, "IB/RoCE v1"), 3: (mapped, "RoCE v2")}


def run_env(host: Host) -> CheckResult:
    collectors, rules = catalog()
    return run_checks(host, collectors, rules, only={"env"})


def findings(host: Host) -> dict[str, Finding]:
    """Findings by id; a duplicate id is itself a bug, so it fails here."""
    out: dict[str, Finding] = {}
    for f in run_env(host).findings:
        assert f.id not in out, f"duplicate finding id {f.id}"
        out[f.id] = f
    return out


def status(found: Mapping[str, Finding], fid: str) -> str:
    assert fid in found, f"{fid} missing; have {sorted(found)}"
    return found[fid].status.value


def basic_node(root: Path) -> NetSys:
    """One node: lo, eth0 (up), docker0 (up), eth1 (down)."""
    ns = NetSys(root)
    ns.netif("lo", kind="loopback")
    ns.netif("eth0")
    ns.netif("docker0", mac="02:42:00:00:00:01")
    ns.netif("eth1", up=False)
    ns.if_addrs({"lo": ["127.0.0.1"], "eth0": ["10.0.0.5"], "docker0": ["172.17.0.1"], "eth1": []})
    return ns


def nvidia_ib_node(root: Path, gpus: int = 4) -> NetSys:
    """GPU node with ConnectX ports: mlx5_0/mlx5_1 IB ACTIVE, mlx5_10 down, mlx5_2 RoCE ACTIVE."""
    from tests.machines import nvidia_gpu

    ns = basic_node(root)
    for i in range(gpus):
        nvidia_gpu(ns, f"0000:{0x18 + i:02x}:00.0", 0x2330, i, cls=0x030200)
    ns.hca_port("mlx5_0")
    ns.hca_port("mlx5_1")
    ns.hca_port("mlx5_10", state="DOWN")
    ns.hca_port("mlx5_2", link_layer="Ethernet", rate="100 Gb/sec (4X EDR)", gids=roce_gids())
    return ns
