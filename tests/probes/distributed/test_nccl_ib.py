"""NCCL/RCCL and RDMA checks on recorded /sys/class/net and /sys/class/infiniband trees."""

from __future__ import annotations

import pytest

from hwtui.probes.host import FsHost
from tests.probes.distributed.netsys import basic_node, findings, nvidia_ib_node, roce_gids, status

MULTI = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "RANK": "9", "LOCAL_RANK": "1"}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    ns = nvidia_ib_node(tmp_path_factory.mktemp("ibnode"), gpus=2)
    ns.file("/opt/mesh/libnccl-net-mesh.so", "")
    ns.file("/opt/mesh/libnccl-net.so", "")
    ns.file("/usr/lib/x86_64-linux-gnu/libnccl-net-aws-ofi.so", "")
    ns.file("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    ns.file("/etc/ld.so.conf.d/cuda.conf", "/usr/local/cuda/lib64\n/opt/ldconf\n")
    ns.file("/opt/ldconf/libnccl-net-ldplug.so", "")
    return ns


def run(ns, **env):
    return findings(FsHost(ns.root, env))


@pytest.mark.parametrize(("value", "want", "text"), [
    ("eth", "pass", "selects eth0"),
    ("=eth0", "pass", "selects eth0"),
    ("^docker,lo", "pass", "selects eth0"),
    ("eth1", "fail", "matches no interface that is up"),
    ("ib", "fail", "matches no interface that is up"),
    ("docker0", "warn", "selects docker0 in a multi-node job"),
    ("lo", "warn", "selects lo in a multi-node job"),
    ("eth0,^lo", "fail", "only counts at the start"),
])
def test_socket_ifname(node, value, want, text):
    f = run(node, **MULTI, NCCL_SOCKET_IFNAME=value)
    assert status(f, "nccl.socket_ifname") == want
    assert text in f["nccl.socket_ifname"].title


def test_socket_ifname_single_node_loopback_is_fine(node):
    f = run(node, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", RANK="0", NCCL_SOCKET_IFNAME="lo")
    assert status(f, "nccl.socket_ifname") == "pass"


def test_socket_ifname_unset(node, tmp_path):
    # docker0 is up but NCCL's default excludes docker* and lo; eth1 is down: eth0 is the only pick.
    f = run(node, **MULTI)
    assert status(f, "nccl.socket_ifname") == "pass" and "eth0" in f["nccl.socket_ifname"].detail
    ns = basic_node(tmp_path)
    ns.netif("ens5", mac="02:00:00:00:00:05")
    f = findings(FsHost(ns.root, MULTI))
    s = f["nccl.socket_ifname"]
    assert s.status.value == "warn" and "2 candidate" in s.title
    assert s.remedy == "export NCCL_SOCKET_IFNAME=eth0"


def test_gloo_socket_ifname_is_exact(node):
    f = run(node, **MULTI, GLOO_SOCKET_IFNAME="eth")
    assert status(f, "gloo.socket_ifname") == "fail"
    f = run(node, **MULTI, GLOO_SOCKET_IFNAME="eth0")
    assert status(f, "gloo.socket_ifname") == "pass"


@pytest.mark.parametrize(("value", "want", "text"), [
    ("mlx5_0", "pass", "selects 1 active port"),
    ("=mlx5_0:1,mlx5_1:1", "pass", "selects 2 active port"),
    ("mlx5_1", "warn", "mlx5_1 also matches mlx5_10"),
    ("=mlx5_10", "fail", "selects only inactive ports"),
    ("mlx4_0", "fail", "matches no RDMA port"),
    ("mlx5_0:2", "fail", "matches no RDMA port"),
    ("^mlx5_2", "pass", "selects 2 active port"),
    ("mlx5_0,mlx5_2", "warn", "mixes InfiniBand and RoCE"),
    ("mlx5_0:x", "fail", "port in 'mlx5_0:x'"),
])
def test_ib_hca(node, value, want, text):
    f = run(node, NCCL_IB_HCA=value)
    assert status(f, "ib.hca") == want
    assert text in f["ib.hca"].title
    if want != "pass":
        assert f["ib.hca"].remedy


def test_ib_hca_unset_lists_active_ports(node):
    f = run(node)
    assert status(f, "ib.hca") == "pass" and "all 3 active" in f["ib.hca"].title


def test_ib_hca_from_nccl_conf(tmp_path):
    ns = nvidia_ib_node(tmp_path, gpus=1)
    ns.file("/etc/nccl.conf", "NCCL_IB_HCA=mlx4\n")
    f = findings(FsHost(ns.root, {}))
    assert status(f, "ib.hca") == "fail"
    f = findings(FsHost(ns.root, {"NCCL_IB_HCA": "mlx5_0"}))  # the environment wins over the file
    assert status(f, "ib.hca") == "pass"
    assert "environment overrides NCCL_IB_HCA" in f["nccl.conf"].detail


@pytest.mark.parametrize(("hca", "index", "want", "text"), [
    ("=mlx5_2", "3", "pass", "valid on every selected port"),
    ("=mlx5_2", "2", "warn", "RoCE v1 does not cross subnets"),
    ("=mlx5_2", "7", "fail", "no GID at index 7"),
    ("=mlx5_2", "-1", "pass", "automatic"),
    ("=mlx5_2", "three", "fail", "not an integer"),
])
def test_gid_index(node, hca, index, want, text):
    f = run(node, NCCL_IB_HCA=hca, NCCL_IB_GID_INDEX=index)
    g = f["ib.gid_index"]
    assert g.status.value == want and text in g.title
    if want in ("warn", "fail") and index.isdigit():
        assert g.remedy == "export NCCL_IB_GID_INDEX=3"


def test_mesh_gid_index(node):
    f = run(node, NCCL_IB_HCA="=mlx5_2", NCCL_MESH_GID_INDEX="5")
    assert status(f, "ib.mesh_gid_index") == "fail"
    assert f["ib.mesh_gid_index"].remedy == "export NCCL_MESH_GID_INDEX=3"


def test_gid_unset_on_roce_names_best_index(node):
    f = run(node, NCCL_IB_HCA="=mlx5_2")
    assert status(f, "ib.gid_index") == "pass"
    assert "mlx5_2:1 -> 3 (RoCE v2, 192.168.100.1)" in f["ib.gid_index"].detail


@pytest.mark.parametrize(("env", "want", "text"), [
    ({}, "pass", "built-in"),
    ({"NCCL_NET_PLUGIN": "mesh", "LD_LIBRARY_PATH": "/opt/mesh"}, "pass", "/opt/mesh/libnccl-net-mesh.so"),
    ({"NCCL_NET_PLUGIN": "mesh"}, "fail", "not found on this node"),
    ({"NCCL_NET_PLUGIN": "aws-ofi"}, "pass", "/usr/lib/x86_64-linux-gnu/libnccl-net-aws-ofi.so"),
    ({"NCCL_NET_PLUGIN": "ldplug"}, "pass", "/opt/ldconf/libnccl-net-ldplug.so"),
    ({"NCCL_NET_PLUGIN": "/opt/mesh/libnccl-net.so"}, "pass", "resolves to /opt/mesh/libnccl-net.so"),
    ({"NCCL_NET_PLUGIN": "/nowhere/libnccl-net.so"}, "fail", "not found"),
    ({"NCCL_NET_PLUGIN": "none"}, "pass", "disabled"),
    ({"LD_LIBRARY_PATH": "/opt/mesh"}, "pass", "default net plugin found: /opt/mesh/libnccl-net.so"),
])
def test_net_plugin(node, env, want, text):
    f = run(node, **env)
    assert status(f, "nccl.net_plugin") == want
    assert text in f["nccl.net_plugin"].title


def test_debug_and_switches(node):
    f = run(node, NCCL_DEBUG="verbose", NCCL_DEBUG_SUBSYS="INIT,NETT", NCCL_IB_DISABLE="1", NCCL_P2P_DISABLE="0",
            NCCL_SHM_DISABLE="yes")
    assert status(f, "nccl.debug") == "warn"
    assert status(f, "nccl.debug_subsys") == "warn" and "'NETT'" in f["nccl.debug_subsys"].title
    ib = f["nccl.switch[NCCL_IB_DISABLE]"]
    assert ib.status.value == "warn" and "while 3 RDMA port(s) are active" in ib.title
    assert ib.remedy == "unset NCCL_IB_DISABLE"
    assert status(f, "nccl.switch[NCCL_P2P_DISABLE]") == "pass"
    assert status(f, "nccl.switch[NCCL_SHM_DISABLE]") == "warn"
    f = run(node, NCCL_DEBUG="WARN", NCCL_DEBUG_SUBSYS="INIT")
    assert status(f, "nccl.debug") == "pass"
    assert "NCCL_DEBUG is WARN" in f["nccl.debug_subsys"].title


def test_conf_files(tmp_path):
    ns = basic_node(tmp_path)
    ns.file("/home/alice/.nccl.conf", "NCCL_DEBUG=INFO\n")
    ns.file("/etc/nccl.conf", "NCCL_DEBUG=WARN\nNCCL_P2P_DISABLE=1\nnot a setting\n")
    f = findings(FsHost(ns.root, {"HOME": "/home/alice"}))
    # The user's file wins over the system file; the system file still adds what the user's lacks.
    assert status(f, "nccl.debug") == "pass" and "NCCL_DEBUG=INFO (from /home/alice/.nccl.conf)" in f["nccl.debug"].title
    sw = f["nccl.switch[NCCL_P2P_DISABLE]"]
    assert sw.status.value == "warn" and sw.remedy == "remove NCCL_P2P_DISABLE from /etc/nccl.conf"
    syntax = f["nccl.conf_syntax[/etc/nccl.conf]"]
    assert syntax.status.value == "warn" and "'not a setting'" in syntax.title
    f = findings(FsHost(ns.root, {"NCCL_CONF_FILE": "/missing.conf"}))
    assert status(f, "nccl.conf") == "fail"


def test_peermem(tmp_path):
    ns = nvidia_ib_node(tmp_path, gpus=1)
    f = findings(FsHost(ns.root, {}))
    assert status(f, "nccl.peermem") == "warn" and "modprobe nvidia-peermem" in f["nccl.peermem"].remedy
    ns.module("nvidia_peermem", "570.124.04")
    assert status(findings(FsHost(ns.root, {})), "nccl.peermem") == "pass"


def test_no_rdma_hca_set(tmp_path):
    ns = basic_node(tmp_path)
    f = findings(FsHost(ns.root, {"NCCL_IB_HCA": "mlx5_0"}))
    assert status(f, "ib.hca") == "fail" and "no RDMA device" in f["ib.hca"].title
    assert "nccl.peermem" not in f


def test_roce_gid_builder_layout(tmp_path):
    # The builder must produce what the probe reads: index 3 is the IPv4-mapped RoCE v2 GID.
    assert roce_gids("10.1.2.3")[3] == ("0000:0000:0000:0000:0000:ffff:0a01:0203", "RoCE v2")
