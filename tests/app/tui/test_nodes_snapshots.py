"""SVG snapshots of the cluster view (`hwtui --agents`) with a fresh, a stale and a never-answered node.

Determinism: the poller is fixed (its answers are built here and read through the agents' one
parser, as live ones are), the host is a replay, the sampler constant. Update with ``pytest
tests/app/tui/test_nodes_snapshots.py --snapshot-update`` and look at the pictures before committing.
"""

from __future__ import annotations

import json

import pytest

from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.probes.host import ReplayHost
from tests.app.tui.conftest import settle, wait_for

pytestmark = pytest.mark.timeout(120)
SIZES = [(80, 24), (120, 36), (200, 60)]
IDS = ["80x24", "120x36", "200x60"]


class ConstantSampler:
    def __init__(self, host, devices):
        from hwtui.probes.sampling import DeviceSample as Sample

        self.samples = [Sample("cpu", "CPU", 16 * 2**30, 64 * 2**30, 12.0, None, None, None)]

    def sample(self):
        return list(self.samples)

    def close(self):
        pass


def _gpus(n: int, base: float) -> list[dict]:
    return [{"device": f"cuda:{i}", "name": "NVIDIA H100 80GB HBM3", "util": base + 5 * i, "mem_used": (20 + i) * 2**30,
             "mem_total": 80 * 2**30, "temp_c": 50.0 + i, "power_w": 300.0 + 10 * i, "power_limit_w": 700.0}
            for i in range(n)]


def _host(util: float, used_g: float, total_g: float) -> dict:
    return {"device": "cpu", "name": "AMD EPYC 9654", "util": util, "mem_used": used_g * 2**30,
            "mem_total": total_g * 2**30}


class FixedPoller:
    """alpha answers (4 GPUs, serving v7, pushing v8 at 50 %); beta went quiet 12 s ago (its last
    values stay, greyed); gamma never answered in the 42 s it has been tried."""

    interval = 1.0
    request_timeout = 1.0

    def __init__(self):
        self.targets = ["alpha:9477", "beta:9477", "gamma:9477"]
        self.detail = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None

    async def run(self, stop):
        await stop.wait()

    def statuses(self):
        from hwtui.engine.resident.summary import NodeStatus, parse_processes, parse_summary

        alpha = parse_summary({"node": "alpha", "devices": [*_gpus(4, 40.0), _host(23.0, 180.5, 2015.0)],
                               "replication": {"serving": "v7", "in_flight": {"version": "v8", "progress": 0.5}}})
        beta = parse_summary({"node": "beta", "devices": [*_gpus(2, 90.0), _host(97.0, 1900.0, 2015.0)],
                              "replication": {"serving": "v7"}})
        procs = parse_processes({"processes": [{"pid": 4242, "name": "python3", "devices": ["/dev/nvidia0"]},
                                               {"pid": 4243, "name": "pt_data_worker", "devices": ["/dev/nvidia1"]}],
                                 "age_s": 2.0})
        return [
            NodeStatus(agent="alpha:9477", url="http://alpha:9477", stale=False, age_s=0.4, latency_s=0.003,
                       summary=alpha, tried_s=60.0, processes=procs if self.detail == "http://alpha:9477" else None),
            NodeStatus(agent="beta:9477", url="http://beta:9477", stale=True, age_s=12.0, tried_s=60.0,
                       error="connection refused or unreachable", summary=beta),
            NodeStatus(agent="gamma:9477", url="http://gamma:9477", stale=True, age_s=None, tried_s=42.0,
                       error="no answer in time"),
        ]


@pytest.fixture
def make(snapshots, unbudgeted_charts):
    def build():
        from hwtui.app.tui.screens.nodes import NodesScreen

        nodes = NodesScreen([])
        nodes.poller = FixedPoller()
        host = ReplayHost(json.loads(snapshots["h100_x8"].read_text()), origin="h100_x8.json")
        return HwtuiApp(host, TuiConfig(interval=3600.0), config_file=config_path(), sampler_factory=ConstantSampler,
                        nodes_screen=nodes)

    return build


async def _shown(pilot) -> None:
    from hwtui.widgets.cluster_nodes import ClusterNodes

    await wait_for(pilot, lambda: pilot.app.screen.query(ClusterNodes) and pilot.app.screen.query_one(ClusterNodes).row_count >= 9)
    await settle(pilot)  # the rows measured, not only added (a fixed pause was short under load)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_cluster_view_with_a_stale_node(snap_compare, make, size):
    """A fresh node, a stale one keeping its last values greyed with their age, a never-answered one."""
    assert snap_compare(make(), terminal_size=size, run_before=_shown)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_node_detail(snap_compare, make, size):
    """Enter on a node: its host, devices and processes."""

    async def run_before(pilot):
        from hwtui.widgets.node_detail import NodeDetail

        await _shown(pilot)
        await pilot.press("enter")
        await wait_for(pilot, lambda: pilot.app.screen.query(NodeDetail))
        detail = pilot.app.screen.query_one(NodeDetail)
        detail.screen.repaint()  # the processes arrive with the next poll; here the fixed one has them at once
        await wait_for(pilot, lambda: detail.shown is not None and detail.shown.processes is not None)
        await settle(pilot)

    assert snap_compare(make(), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24)], ids=["80x24"])
def test_stale_node_detail(snap_compare, make, size):
    """A stale node's detail: STALE with the age, its last devices greyed."""

    async def run_before(pilot):
        from hwtui.widgets.node_detail import NodeDetail

        await _shown(pilot)
        await pilot.press("down", "down", "down", "down", "down", "down", "enter")
        await wait_for(pilot, lambda: pilot.app.screen.query(NodeDetail))
        detail = pilot.app.screen.query_one(NodeDetail)
        await wait_for(pilot, lambda: detail.shown is not None and detail.shown.node == "beta")
        await settle(pilot)

    assert snap_compare(make(), terminal_size=size, run_before=run_before)


def test_cluster_view_with_a_stale_node_no_color_120x36(snap_compare, make, monkeypatch):
    """NO_COLOR: the stale node still reads as stale (the word and its age; its values dim, not coloured)."""
    monkeypatch.setenv("NO_COLOR", "1")
    app = make()
    assert app.no_color
    assert snap_compare(app, terminal_size=(120, 36), run_before=_shown)
