"""The Run screen with ``--agents``: every node beside the engine's panels, from the nodes screen's poller.

Real agents over HTTP on loopback (tests/agent/helpers.py), a dead port for a stale node; the
engine is a recorded stream. Nothing here waits on time: every wait is on state, bounded.
"""

from __future__ import annotations

import pytest

from hwtui.app.node_api.client import parse_agents
from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.app.tui.screens.nodes import NodesScreen
from hwtui.probes.host import ReplayHost
from hwtui.widgets.cluster_nodes import ClusterNodes
from tests.agent.helpers import dead_port, start_agent, stop_agent
from tests.app.tui.conftest import FixedSampler, RecordedEngine, to_engine_step, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
async def test_run_screen_shows_every_node_and_marks_the_stale_one(snapshots, tmp_path, size):
    live = start_agent("alpha", 3, replication=lambda: {"serving": "v7", "in_flight": {"version": "v8", "progress": 0.5}})
    dead = dead_port()
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    try:
        nodes = NodesScreen(parse_agents(f"127.0.0.1:{live.port},127.0.0.1:{dead}"))
        # Polled every 10 s (stale past 20 s), each poll given 10 s to answer: the live node
        # answers its first poll and stays fresh while the test reads the table; the dead one is
        # stale from its first refusal (it never answered). The agent here is a thread of this
        # process, sharing its core's slice with the 200x60 screen's rendering: on a box loaded
        # by six shards every poll of it missed the 1 s answer deadline the poller had derived
        # from its default interval (min(interval, 5 s), fixed when it was made), and the live
        # node stayed stale for the whole wait. The test needs states, not a poll cadence.
        nodes.poller.interval = 10.0
        nodes.poller.request_timeout = 10.0
        app = HwtuiApp(ReplayHost.load(snapshots["h100_x8"]), TuiConfig.load(), config_file=config_path(),
                       engine_stages=RecordedEngine("replicate_ok.jsonl"), sampler_factory=FixedSampler,
                       nodes_screen=nodes)
        async with app.run_test(size=size) as pilot:
            assert app.screen is nodes, "--agents opens on the cluster view"
            await pilot.press("w")  # to the wizard; the poller keeps running
            await wait_for(pilot, lambda: app.devices)
            await to_engine_step(pilot)
            app.screen.query_one("#in-plan").value = str(plan)
            app.screen.query_one("#in-device").value = "cpu"
            await pilot.press("ctrl+s")
            run = app.screen
            assert run.has_class("-agents")
            table = run.query_one(ClusterNodes)

            def both_shown() -> bool:
                return table.row_count >= 2 and table.stale_nodes == [f"127.0.0.1:{dead}"]

            try:
                await wait_for(pilot, both_shown, timeout=60.0)
            except AssertionError:
                views = {url: (v.polls, v.failures, v.error) for url, v in nodes.poller.views.items()}
                raise AssertionError(f"rows {table.row_count}, stale {table.stale_nodes}, polls {views}") from None
            await wait_for(pilot, lambda: run.state.finished)
            cells = [str(c) for c in table.get_row_at(0)]
            assert cells[0] == "alpha" and cells[1] == "ok" and cells[2] == "cuda:0"
            assert cells[7] == "v7" and "v8" in cells[8] and "50%" in cells[8]
            assert [str(c) for c in table.get_row_at(1)][2] == "host", "the node's host CPU and memory"
            stale = [str(c) for c in table.get_row_at(table.row_count - 1)]
            assert stale[1] == "never answered" and stale[2].startswith("tried for ")
            assert "1 STALE" in str(run.query_one("#nodes-box").border_title)
            # The nodes on screen, once the layout has settled: a loaded fresh-clone suite once
            # caught the 80x24 box at 2 lines (its borders and one row) between two layouts.
            await wait_for(pilot, lambda: table.region.height > 0 and run.query_one("#nodes-box").region.height >= 3)
            assert run.state.done_ok, "the engine's panels still run beside the nodes"
    finally:
        stop_agent(live)
