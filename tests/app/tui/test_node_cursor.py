"""The cluster view's cursor and a node's detail screen (issue 25): the cursor survives every refresh,
Enter opens the highlighted node, every key bound on the detail screen works and Escape comes back
with the poller still running. Fixed nodes (tests/app/tui/test_nodes_snapshots.py's poller)."""

from __future__ import annotations

import pytest
from textual.app import App

from hwtui.engine.resident.summary import NodeStatus, parse_summary
from hwtui.widgets.cluster_nodes import ClusterNodes, age_text, node_rows
from tests.app.tui.conftest import wait_for
from tests.app.tui.test_nodes_snapshots import FixedPoller

pytestmark = pytest.mark.timeout(120)


def _node(name: str, gpus: int, stale: bool = False, answered: bool = True) -> NodeStatus:
    devices = [{"device": f"cuda:{i}", "util": 10.0} for i in range(gpus)] + [{"device": "cpu", "util": 5.0}]
    return NodeStatus(agent=f"{name}:1", url=f"http://{name}:1", stale=stale or not answered,
                      age_s=(3.0 if stale else 0.1) if answered else None, tried_s=9.0,
                      summary=parse_summary({"node": name, "devices": devices}) if answered else None)


def test_age_text():
    assert [age_text(s) for s in (None, 0.4, 42, 185, 7380, 3 * 86400 + 7200)] == ["?", "0s", "42s", "3m05s", "2h03m", "3d02h"]


def test_rows_of_a_stale_a_fresh_and_a_never_answered_node():
    fresh = node_rows(_node("a", 2))
    assert [str(r["device"]) for r in fresh] == ["cuda:0", "cuda:1", "host"] and str(fresh[0]["state"]) == "ok"
    stale = node_rows(_node("b", 1, stale=True))
    assert str(stale[0]["state"]) == "STALE 3s ago" and [str(r["device"]) for r in stale] == ["cuda:0", "host"]
    assert all(str(r["util"].style) == "dim" for r in stale) and "10%" in str(stale[0]["util"])
    never = node_rows(_node("c", 1, answered=False))
    assert len(never) == 1 and str(never[0]["state"]) == "never answered" and str(never[0]["device"]) == "tried for 9s"
    # NO_COLOR: red would turn into a near-invisible dark grey; the verdict is bold text instead.
    assert str(stale[0]["state"].style) == "bold red" and str(node_rows(_node("b", 1, stale=True), True)[0]["state"].style) == "bold"


class _Table(App[None]):
    def compose(self):
        yield ClusterNodes()


async def test_the_cursor_stays_on_its_row_across_refreshes():
    app = _Table()
    async with app.run_test(size=(160, 20)) as pilot:
        table = app.query_one(ClusterNodes)
        nodes = [_node("a", 2), _node("b", 2), _node("c", 1, answered=False)]
        table.show(nodes)
        await pilot.pause()
        table.move_cursor(row=4)  # b's cuda:1
        await pilot.pause()
        for _ in range(3):  # refresh after refresh, the same rows: the cursor stays
            table.show([_node("a", 2), _node("b", 2, stale=True), _node("c", 1, answered=False)])
            await pilot.pause()
            assert table.cursor_row == 4 and table.url_at_cursor() == "http://b:1"
        # c answers (one row becomes two) and a loses a device: the cursor follows b's row.
        table.show([_node("a", 1), _node("b", 2), _node("c", 1)])
        await pilot.pause()
        assert table.url_at_cursor() == "http://b:1" and table.cursor_row == 3
        # b's row disappears (one device fewer): the cursor stays on b.
        table.show([_node("a", 1), _node("b", 0), _node("c", 1)])
        await pilot.pause()
        assert table.url_at_cursor() == "http://b:1"


def _app(snapshots):
    import json

    from hwtui.app.tui.app import HwtuiApp
    from hwtui.app.tui.config import TuiConfig, config_path
    from hwtui.app.tui.screens.nodes import NodesScreen
    from hwtui.probes.host import ReplayHost
    from tests.app.tui.test_nodes_snapshots import ConstantSampler

    nodes = NodesScreen([])
    nodes.poller = FixedPoller()
    host = ReplayHost(json.loads(snapshots["h100_x8"].read_text()), origin="h100_x8.json")
    return HwtuiApp(host, TuiConfig(interval=3600.0), config_file=config_path(), sampler_factory=ConstantSampler,
                    nodes_screen=nodes), nodes


async def test_every_key_on_a_node_detail_and_back(snapshots):
    from hwtui.app.tui.screens.help import HelpScreen
    from hwtui.app.tui.screens.nodes import NodeDetailScreen
    from tests.app.tui.test_every_key import QUIT_KEYS

    app, nodes = _app(snapshots)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.screen is nodes and nodes.query_one(ClusterNodes).row_count >= 9)
        table = nodes.query_one(ClusterNodes)
        table.move_cursor(row=5)  # beta, stale
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, NodeDetailScreen))
        detail = app.screen
        assert detail.url == "http://beta:9477" and nodes.poller.detail == "http://beta:9477"
        keys = sorted({k for k, a in detail.active_bindings.items()
                       if k not in QUIT_KEYS and a.binding.action not in ("quit", "app.quit")} - {"escape", "b"})
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
            assert app.is_running and app.return_code is None, f"{key!r} on the node detail ended the app"
            while app.screen is not detail:  # a help or palette screen opened by the key: close it
                assert isinstance(app.screen, HelpScreen) or app.screen.is_modal, type(app.screen)
                await pilot.press("escape")
                await pilot.pause()
        for back in ("escape", "b"):
            await pilot.press(back)
            await wait_for(pilot, lambda: app.screen is nodes)
            assert nodes.poller.detail is None and not nodes._task.done()
            assert table.cursor_row == 5, "back on the row it opened"
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, NodeDetailScreen))
            detail = app.screen
        assert "question_mark" in keys, keys


class _MarkupPoller(FixedPoller):
    """A node that names itself (and its process) in Rich/Textual markup: shown as those characters."""

    def statuses(self):
        from hwtui.engine.resident.summary import parse_processes

        name = "[/]ev[b]il[link=x]"
        summary = parse_summary({"node": name, "devices": [{"device": "cuda:0", "name": "[red]gpu"},
                                                           {"device": "cpu", "name": "[/]cpu"}]})
        procs = parse_processes({"processes": [{"pid": 1, "name": "[/]p[i]", "devices": ["/dev/[b]x"]}]})
        return [NodeStatus(agent="m:1", url="http://m:1", stale=False, age_s=0.1, summary=summary, processes=procs)]


async def test_a_node_named_in_markup_shows_those_characters(snapshots):
    from hwtui.app.tui.screens.nodes import NodeDetailScreen
    from hwtui.widgets.node_detail import NodeDetail

    app, nodes = _app(snapshots)
    nodes.poller = _MarkupPoller()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.screen is nodes and nodes.query_one(ClusterNodes).row_count >= 2)
        assert str(nodes.query_one(ClusterNodes).get_row_at(0)[0]) == "[/]ev[b]il[link=x]"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, NodeDetailScreen))
        detail = app.screen.query_one(NodeDetail)
        await wait_for(pilot, lambda: detail.shown is not None)
        await pilot.pause()
        from textual.content import Content

        # Textual keeps a title as markup: the node's brackets are escaped, drawn as themselves.
        assert Content.from_markup(str(detail.border_title)).plain == "node [/]ev[b]il[link=x]"
        assert str(detail.query_one("#node-headline").render()).startswith("[/]ev[b]il[link=x]")
        procs = detail.query_one("#node-procs")
        assert [str(c) for c in procs.get_row_at(0)] == ["1", "[/]p[i]", "[b]x"]
        assert app.is_running
