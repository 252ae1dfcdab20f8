"""Cross-node comparison rules on recorded rank reports (no cluster needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hwtui.core.finding import Status
from hwtui.engine.cluster.compare import compare, expected_nodes
from hwtui.engine.cluster.smoke import missing_findings
from hwtui.engine.cluster.spec import ClusterSpec, Node

FIXTURES = Path(__file__).parent / "fixtures"


def _ranks(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())["ranks"]


def _by_id(findings) -> dict:
    return {f.id: f for f in findings}


def test_recorded_healthy_cluster_has_no_problem():
    findings = compare(_ranks("veth_3node_cpu.json"))
    assert findings, "the comparison must say what it compared"
    assert all(f.status == Status.PASS for f in findings), [f.to_dict() for f in findings if f.status != Status.PASS]
    ids = _by_id(findings)
    assert {"cluster.torch", "cluster.torch_build", "cluster.python", "cluster.env"} <= set(ids)
    assert {f"cluster.interface[{n}]" for n in "abc"} <= set(ids)


def test_torch_version_drift_names_the_odd_node_and_the_fix():
    ranks = _ranks("veth_3node_cpu.json")
    ranks[1]["torch"]["version"] = "2.4.1+cpu"
    f = _by_id(compare(ranks))["cluster.torch"]
    assert f.status == Status.FAIL
    assert f.data["nodes"] == ["b"]
    assert "b: 2.4.1+cpu" in f.detail and "a: 2.13.0+cpu" in f.detail
    assert "torch==2.13.0" in f.remedy and "whl/cpu" in f.remedy


def test_drifted_gpu_node_every_difference_reported():
    ids = _by_id(compare(_ranks("gpu_3node_drifted.json")))
    expect = {
        "cluster.torch": Status.FAIL,
        "cluster.torch_build": Status.FAIL,
        "cluster.nccl": Status.FAIL,
        "cluster.driver[nvidia]": Status.WARN,
        "cluster.python": Status.WARN,
        "cluster.interface[c]": Status.FAIL,
        "cluster.interface[a]": Status.PASS,
        "cluster.env[NCCL_IB_HCA]": Status.FAIL,
        "cluster.env[NCCL_DEBUG]": Status.WARN,
        "cluster.plugin[c]": Status.FAIL,
        "cluster.plugin[a]": Status.PASS,
        "cluster.node_check[c]": Status.FAIL,
        "cluster.node_check[b]": Status.PASS,
    }
    got = {k: ids[k].status for k in expect if k in ids}
    assert got == expect
    assert ids["cluster.torch_build"].remedy.endswith("--index-url https://download.pytorch.org/whl/cu124")
    assert "nvidia-nccl-cu12==2.21.5" in ids["cluster.nccl"].remedy
    iface = ids["cluster.interface[c]"]
    assert "NCCL_SOCKET_IFNAME=enP7s7" in iface.title and "enp1s0" in iface.detail
    assert "--node-interface c=enp1s0" in iface.remedy
    assert "export NCCL_IB_HCA=rocep1s0f0 on c" in ids["cluster.env[NCCL_IB_HCA]"].remedy
    assert "nvidia.persistence[0000:01:00.0]" in ids["cluster.node_check[c]"].detail
    # Only c is odd everywhere: the majority (a, b) is the reference.
    assert all(ids[k].data.get("nodes", ["c"]) == ["c"] for k in ("cluster.torch", "cluster.nccl", "cluster.python"))


def test_mixed_vendor_builds_warn_instead_of_fail():
    ranks = _ranks("gpu_3node_drifted.json")[:2]
    ranks[1]["torch"].update(version=ranks[0]["torch"]["version"], cuda=None, hip="6.2.41133", nccl=None)
    f = _by_id(compare(ranks))["cluster.torch_build"]
    assert f.status == Status.WARN and "gloo" in f.remedy


def test_interfaces_named_differently_without_pinning_warn():
    ranks = _ranks("veth_3node_cpu.json")
    for rep in ranks:
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            rep["env"].pop(var, None)
    ranks[2]["interfaces"] = {"ens5": ranks[2]["interfaces"].pop("eth0"), "lo": ranks[2]["interfaces"]["lo"]}
    ranks[2]["route"]["interface"] = "ens5"
    f = _by_id(compare(ranks))["cluster.interfaces"]
    assert f.status == Status.WARN and "c: ens5" in f.title and "a: eth0" in f.title


def test_nccl_ifname_prefix_and_exclude_semantics():
    ranks = _ranks("veth_3node_cpu.json")
    for rep in ranks:
        rep["env"]["NCCL_SOCKET_IFNAME"] = "eth"  # a prefix, as NCCL reads it
        rep["env"].pop("GLOO_SOCKET_IFNAME")
    assert all(f.status == Status.PASS for f in compare(ranks) if f.id.startswith("cluster.interface"))
    ranks[0]["env"]["NCCL_SOCKET_IFNAME"] = "=eth"  # exact: no interface is called "eth"
    assert _by_id(compare(ranks))["cluster.interface[a]"].status == Status.FAIL


def test_master_mismatch_is_a_failure_but_debug_level_only_a_warning():
    ranks = _ranks("veth_3node_cpu.json")
    ranks[2]["env"]["MASTER_PORT"] = "1234"
    ranks[1]["env"]["NCCL_DEBUG"] = "INFO"
    ids = _by_id(compare(ranks))
    assert ids["cluster.env[MASTER_PORT]"].status == Status.FAIL
    assert ids["cluster.env[NCCL_DEBUG]"].status == Status.WARN
    assert "unset NCCL_DEBUG on b" in ids["cluster.env[NCCL_DEBUG]"].remedy


def test_ranks_of_one_node_count_once():
    ranks = _ranks("veth_3node_cpu.json")
    extra = copy.deepcopy(ranks[0])
    extra.update(rank=3, local_rank=1)
    extra["torch"]["version"] = "9.9"  # a node's facts come from its lowest rank
    assert _by_id(compare([*ranks, extra]))["cluster.torch"].status == Status.PASS


def test_expected_nodes_missing_and_unknown():
    findings = _by_id(expected_nodes(["a", "vm"], ["a", "b"], 20, {"a": "10.0.0.1", "b": "10.0.0.2"}))
    assert findings["cluster.join[a]"].status == Status.PASS
    assert findings["cluster.join[b]"].status == Status.FAIL
    assert findings["cluster.join[b]"].title == "node b (10.0.0.2) never joined within 20 s"
    assert findings["cluster.join[vm]"].status == Status.WARN
    # An absent node whose launch script left its reason in the store is named with it.
    said = _by_id(expected_nodes(["a"], ["a", "b"], 20, {"b": "10.0.0.2"}, {"b": "no GPU; fix: reboot"}))
    assert said["cluster.join[b]"].title == "node b (10.0.0.2) never joined: it said: no GPU; fix: reboot"


@pytest.mark.parametrize("layout_node,title", [
    ({"rank": 2, "node": "c", "address": "10.77.0.3"}, "rank 2 (node c, 10.77.0.3) never joined within 5 s"),
    ({"rank": 2, "node": None, "address": None}, "rank 2 (no rank came from node c) never joined within 5 s"),
])
def test_missing_rank_named_by_layout_or_by_absence(layout_node, title):
    spec = ClusterSpec([Node("a", "10.77.0.1"), Node("b", "10.77.0.2"), Node("c", "10.77.0.3")])
    verdict = {"missing": [layout_node], "joined": {"0": {"node": "a"}, "1": {"node": "b"}}, "join_timeout": 5.0}
    [f] = missing_findings(verdict, spec)
    assert f.status == Status.FAIL and f.title == title and f.id == "cluster.join[rank 2]"
    assert "c" in f.remedy


def test_replication_knobs_are_gathered_and_a_difference_fails():
    """HOTWEIGHTS_* (and HWTUI_BUCKET_MB) change what `hwtui replicate` does on each rank, and its
    ranks refuse to start when their settings differ: `cluster test` compares them across nodes."""
    from hwtui.engine.cluster.local import env_of_interest

    seen = env_of_interest({"HOTWEIGHTS_BCAST_CHUNK_MB": "4", "HWTUI_BUCKET_MB": "64", "HOME": "/root"})
    assert seen == {"HOTWEIGHTS_BCAST_CHUNK_MB": "4", "HWTUI_BUCKET_MB": "64"}
    ranks = _ranks("veth_3node_cpu.json")
    for rank in ranks:
        rank["env"]["HOTWEIGHTS_BCAST_CHUNK_MB"] = "8" if rank["node"] == "c" else "4"
    f = _by_id(compare(ranks))["cluster.env[HOTWEIGHTS_BCAST_CHUNK_MB]"]
    assert f.status == Status.FAIL and f.data["nodes"] == ["c"]
    assert f.remedy.startswith("export HOTWEIGHTS_BCAST_CHUNK_MB=4 on c")
    assert "refuses to start" in f.detail
