"""The live cluster view: parsing --agents, polling with httpx, stale nodes, the node comparison, the TUI."""

from __future__ import annotations

import asyncio
import time

import pytest

from hwtui.app.commands.agents import compare_agents
from hwtui.app.node_api.client import Poller, adaptive_interval, parse_agents
from hwtui.core.errors import HwtuiError
from tests.agent.helpers import TOKEN, Silent, dead_port, start_agent, stop_agent


def test_parse_agents():
    got = parse_agents("a:1,b,https://c.example:9443,[fe80::1]:7,10.0.0.1")
    assert [t.url for t in got] == ["http://a:1", "http://b:9477", "https://c.example:9443", "http://[fe80::1]:7",
                                    "http://10.0.0.1:9477"]
    for bad in ("", ",", "a:0", "a:99999", "a:x", "ftp://a", "a;b", "a b", "[zz]:1", "a,a", "-a", "a/b:1"):
        with pytest.raises(HwtuiError, match="--agents"):
            parse_agents(bad)


def test_interval_adapts_to_the_number_of_nodes():
    assert adaptive_interval(1) == adaptive_interval(11) == 1.0
    assert adaptive_interval(64) == pytest.approx(2.4) and adaptive_interval(256) == pytest.approx(4.8)


def test_only_https_nodes_load_a_ca_bundle(monkeypatch):
    """64 http:// nodes must not load the CA bundle 64 times (a second of the view's start-up)."""
    import ssl

    loads = []
    real = ssl.SSLContext.load_verify_locations
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations",
                        lambda self, *a, **k: (loads.append(1), real(self, *a, **k))[1])

    async def open_view(agents: str) -> None:
        async with Poller(parse_agents(agents), verify=True):
            pass

    asyncio.run(open_view(",".join(f"127.0.0.1:{p}" for p in range(9000, 9064))))
    assert loads == []
    asyncio.run(open_view("127.0.0.1:9000,https://127.0.0.1:9001"))
    assert len(loads) >= 1


def test_a_dead_and_a_silent_node_are_stale_and_never_stall_the_others():
    live = [start_agent(f"n{i}", i) for i in range(2)]
    silent = Silent()
    try:
        spec = ",".join([*(f"127.0.0.1:{s.port}" for s in live), f"127.0.0.1:{dead_port()}", f"127.0.0.1:{silent.port}"])

        async def main():
            async with Poller(parse_agents(spec), token=TOKEN, interval=0.3) as poller:
                t = time.monotonic()
                await poller.round()
                first = time.monotonic() - t
                stop = asyncio.Event()
                task = asyncio.ensure_future(poller.run(stop))
                await asyncio.sleep(1.5)
                snap = poller.snapshot()
                stop.set()
                await asyncio.wait_for(task, 5)
                return first, snap, poller

        first, snap, poller = asyncio.run(main())
        # One round is bounded by the request timeout (one interval), not by the silent node.
        assert first < poller.request_timeout + 0.5
        by = {n["agent"].rsplit(":", 1)[1]: n for n in snap}
        for s in live:
            n = by[str(s.port)]
            assert not n["stale"] and n["age_s"] <= 2 * poller.interval
            assert n["devices"][0]["device"] == "cuda:0" and n["error"] is None
        stale = [n for n in snap if n["stale"]]
        assert len(stale) == 2 and all(n["age_s"] is None for n in stale)
        assert {n["error"] for n in stale} == {"connection refused or unreachable", "no answer in time"}
    finally:
        silent.close()
        for s in live:
            stop_agent(s)


def test_a_node_that_dies_turns_stale_after_two_intervals():
    a, b = start_agent("a", 0), start_agent("b", 1)
    try:
        async def main():
            async with Poller(parse_agents(f"127.0.0.1:{a.port},127.0.0.1:{b.port}"), interval=0.2) as poller:
                await poller.round()
                assert not any(n["stale"] for n in poller.snapshot())
                stop_agent(b)
                stop = asyncio.Event()
                task = asyncio.ensure_future(poller.run(stop))
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    snap = {n["node"]: n for n in poller.snapshot()}
                    if snap["b"]["stale"]:
                        break
                    await asyncio.sleep(0.05)
                stop.set()
                await asyncio.wait_for(task, 5)
                return snap

        snap = asyncio.run(main())
        assert snap["b"]["stale"] and snap["b"]["age_s"] >= 2 * 0.2 and snap["b"]["devices"][0]["name"] == "GPU1"
        assert not snap["a"]["stale"]
    finally:
        stop_agent(a)


def _facts(torch_version: str, ifname: str = "eth0"):
    return {"schema": "hwtui.cluster.rank/1", "hwtui": "0.1.0", "python": "3.11.7",
            "platform": {"machine": "x86_64", "kernel": "6.8", "os": "Linux"},
            "torch": {"version": torch_version, "cuda": "12.4", "hip": None, "nccl": "2.21.5", "device_count": 8},
            "drivers": {"nvidia": "550.54"}, "interfaces": {"lo": {"addresses": ["127.0.0.1"]}, ifname: {"addresses": []}},
            "route": {"master": None, "local_addr": None, "interface": None},
            "env": {"NCCL_SOCKET_IFNAME": "eth0"}, "plugin": None, "check": {"worst": "pass", "findings": []}}


def test_check_agents_compares_nodes_and_names_the_odd_and_the_unreachable():
    targets = parse_agents("a:1,b:1,c:1,d:1")
    docs = [(targets[0], {"node": "a", "facts": _facts("2.5.1")}, None),
            (targets[1], {"node": "b", "facts": _facts("2.5.1")}, None),
            (targets[2], {"node": "c", "facts": _facts("2.4.0", ifname="ib0")}, None),
            (targets[3], None, "connection refused or unreachable")]
    found = {f.id: f for f in compare_agents(docs)}
    assert found["cluster.agent[d:1]"].status.value == "fail" and "connection refused" in found["cluster.agent[d:1]"].title
    torch = found["cluster.torch"]
    assert torch.status.value in ("fail", "warn") and "c" in torch.title and "2.5.1" in (torch.remedy + torch.detail)
    assert found["cluster.interface[c]"].status.value == "fail"  # NCCL_SOCKET_IFNAME=eth0 matches nothing on c
    assert found["cluster.interface[a]"].status.value == "pass"


def test_check_agents_end_to_end_over_http(capsys):
    from hwtui.app.cli import main

    a = start_agent("a", 0, facts=lambda: {k: v for k, v in _facts("2.5.1").items() if k not in ("platform", "drivers", "check")})
    try:
        deadline = time.monotonic() + 10
        while a.state.facts.view()["value"] is None and time.monotonic() < deadline:
            time.sleep(0.02)
        rc = main(["--check", "--json", "--agents", f"127.0.0.1:{a.port},127.0.0.1:{dead_port()}"])
        import json

        doc = json.loads(capsys.readouterr().out)
        ids = {f["id"]: f["status"] for f in doc["findings"]}
        assert rc == 1 and ids["cluster.torch"] == "pass" and ids["cluster.node_check[a]"] == "pass"
        assert any(i.startswith("cluster.agent[") and s == "fail" for i, s in ids.items())
    finally:
        stop_agent(a)


async def test_the_tui_shows_every_node_and_a_stale_one_as_stale():
    from textual.app import App

    from hwtui.app.tui.screens.nodes import NodesScreen
    from hwtui.widgets.cluster_nodes import ClusterNodes

    live = start_agent("alpha", 3, replication=lambda: {"serving": "v7", "in_flight": {"version": "v8", "progress": 0.5}})
    dead = dead_port()
    try:
        screen = NodesScreen(parse_agents(f"127.0.0.1:{live.port},127.0.0.1:{dead}"))
        # A node that never answered is stale from the start; the live one only once it answered:
        # an interval of 1 s keeps it fresh (age <= 2 s) on a loaded machine.
        screen.poller.interval = 1.0

        class Host(App[None]):
            def on_mount(self) -> None:
                self.push_screen(screen)

        async with Host().run_test(size=(120, 20)) as pilot:
            table = None
            for _ in range(400):
                await pilot.pause(0.05)
                table = screen.query_one(ClusterNodes)
                if (table.row_count >= 3 and table.stale_nodes == [f"127.0.0.1:{dead}"]
                        and "refused" in str(table.get_row_at(2)[9])):
                    break
            assert table is not None and table.stale_nodes == [f"127.0.0.1:{dead}"]
            cells = [str(c) for c in table.get_row_at(0)]
            assert cells[0] == "alpha" and cells[1] == "ok" and cells[2] == "cuda:0" and "30%" in cells[3]
            assert cells[7] == "v7" and "v8" in cells[8] and "50%" in cells[8]
            assert [str(c) for c in table.get_row_at(1)][2] == "host"  # alpha's host CPU and memory
            stale_row = [str(c) for c in table.get_row_at(2)]
            assert stale_row[1] == "never answered" and stale_row[2].startswith("tried for") and "refused" in stale_row[9]
    finally:
        stop_agent(live)


async def test_hwtui_with_agents_opens_on_the_cluster_view(tmp_path, monkeypatch):
    """`hwtui --agents ...` wiring: run_tui builds the nodes screen and the app opens on it."""
    from hwtui.app.tui import app as tui_app
    from hwtui.app.tui import launch
    from hwtui.app.tui.screens.nodes import NodesScreen

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("HWTUI_AGENT_TOKEN", TOKEN)
    # The wiring under test, not the terminal check (pytest's stdin is not a terminal).
    monkeypatch.setattr(launch, "require_terminal", lambda: None)
    live = start_agent("solo", 1)
    seen = {}

    async def run_app(self):  # what App.run would show, headless: the screen it opens on
        async with self.run_test(size=(100, 20)) as pilot:
            for _ in range(100):
                await pilot.pause(0.05)
                if isinstance(self.screen, NodesScreen) and self.screen.query_one("ClusterNodes").row_count:
                    break
            seen["screen"] = self.screen
            seen["rows"] = self.screen.query_one("ClusterNodes").row_count
            # Away to this machine's monitor, and back with `a` (the cluster view kept its rows).
            await pilot.press("m")
            await pilot.pause()
            seen["away"] = type(self.screen).__name__
            await pilot.press("a")
            await pilot.pause()
            seen["back"] = self.screen
        return 0

    try:
        import argparse

        args = argparse.Namespace(interval=None, sysroot=None, replay=None, agents=f"127.0.0.1:{live.port}",
                                  token_file=None, cacert=None)
        captured = {}
        # run_tui builds the app as `hwtui --agents` does; its blocking run() is replaced by capturing it.
        monkeypatch.setattr(tui_app.HwtuiApp, "run", lambda self, *a, **kw: captured.setdefault("app", self) and 0)
        assert launch.run_tui(args) == 0
        app = captured["app"]
        assert isinstance(app.nodes_screen, NodesScreen) and app.nodes_screen.poller._token == TOKEN
        await run_app(app)
        assert isinstance(seen["screen"], NodesScreen) and seen["rows"] >= 1
        assert seen["away"] == "MonitorScreen" and seen["back"] is app.nodes_screen
    finally:
        stop_agent(live)


def test_the_text_view_names_a_node_without_accelerators():
    from hwtui.app.commands.agents import _line
    from hwtui.engine.resident.summary import NodeStatus, parse_summary

    def status(doc):
        return NodeStatus(agent="n:1", url="http://n:1", stale=False, age_s=0.1,
                          summary=parse_summary({"node": "n", "replication": {"serving": "v2"}, **doc}))

    cpu_only = _line(status({"devices": [{"device": "cpu", "util": 7.2}]}))
    assert "no accelerator serving v2" in cpu_only and "cpu 7%" in cpu_only
    gpu = _line(status({"devices": [{"device": "cpu", "util": 7.2},
                                    {"device": "cuda:0", "util": 55.0, "mem_used": 2**30, "mem_total": 8 * 2**30}]}))
    assert "1 device(s) serving v2" in gpu and "cuda:0 55% 1.0/8G" in gpu and "host cpu 7%" in gpu


# --- issue 25: stale nodes keep their last values, never-answered nodes say since when, host
# CPU and memory per node, a cursor and Enter to open a node. Real agents over loopback; a node is
# stopped mid-test and every wait is on state (bounded), never on time.

def _procs():
    return [{"pid": 4242, "name": "python3", "devices": ["/dev/nvidia0"]},
            {"pid": 77, "name": "\x1b[31mevil", "devices": ["/dev/nvidia1", 5]}]


async def test_a_stopped_node_keeps_its_last_values_greyed_with_their_age():
    from textual.app import App

    from hwtui.app.tui.screens.nodes import NodeDetailScreen, NodesScreen
    from hwtui.widgets.cluster_nodes import STALE_STYLE, ClusterNodes
    from hwtui.widgets.node_detail import NodeDetail

    a = start_agent("alpha", 3)
    b = start_agent("beta", 1, processes=_procs)
    dead = dead_port()
    b_stopped = False
    try:
        screen = NodesScreen(parse_agents(f"127.0.0.1:{a.port},127.0.0.1:{b.port},127.0.0.1:{dead}"), token=TOKEN)
        screen.poller.interval = 1.0  # fresh while an answer is under 2 s old: steady on a loaded box

        class Host(App[None]):
            def on_mount(self) -> None:
                self.push_screen(screen)

        async def until(pilot, predicate, what: str, limit: float = 20.0) -> None:
            end = time.monotonic() + limit
            while not predicate():
                assert time.monotonic() < end, f"not within {limit} s: {what}"
                await pilot.pause(0.05)
                if isinstance(pilot.app.screen, NodesScreen):
                    pilot.app.screen.repaint()
                elif isinstance(pilot.app.screen, NodeDetailScreen):
                    pilot.app.screen.repaint()

        def rows(table):
            return [[c for c in table.get_row_at(i)] for i in range(table.row_count)]

        def by_node(table):
            """node name -> its rows (cells as Text)."""
            out, current = {}, None
            for r in rows(table):
                if str(r[0]):
                    current = str(r[0])
                out.setdefault(current, []).append(r)
            return out

        async with Host().run_test(size=(200, 30)) as pilot:
            table = screen.query_one(ClusterNodes)
            await until(pilot, lambda: {"alpha", "beta"} <= set(by_node(table))
                        and str(by_node(table)["beta"][0][1]) == "ok" and str(by_node(table)["alpha"][0][1]) == "ok",
                        "both live nodes answered")
            nodes = by_node(table)
            # Host CPU and memory per node: a `host` row, from the agent's checked `cpu` entry.
            beta = nodes["beta"]
            assert [str(r[2]) for r in beta] == ["cuda:0", "host"]
            assert "10%" in str(beta[0][3]) and "2.0G/80.0G" in str(beta[0][4])
            assert "1%" in str(beta[1][3]) and str(beta[1][4]) == "0.0G/0.0G"
            # The dead port: never answered, and since when it has been tried.
            never = nodes[f"127.0.0.1:{dead}"][0]
            assert str(never[1]) == "never answered" and str(never[2]).startswith("tried for ")
            assert "refused" in str(never[9])

            # Enter on beta's row: its devices and processes (polled only while open); Escape back.
            table.focus()
            table.move_cursor(row=[str(r[0]) for r in rows(table)].index("beta"))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(pilot.app.screen, NodeDetailScreen), "the detail opened")
            detail = pilot.app.screen.query_one(NodeDetail)
            assert screen.poller.detail == f"http://127.0.0.1:{b.port}"
            await until(pilot, lambda: detail.shown is not None and detail.shown.processes is not None, "processes")
            procs = detail.query_one("#node-procs")
            got = [[str(c) for c in procs.get_row_at(i)] for i in range(procs.row_count)]
            assert got[0] == ["4242", "python3", "nvidia0"]
            assert got[1][0] == "77" and "\x1b" not in got[1][1] and got[1][2] == "?"  # cleaned; a bad list is unknown
            devs = detail.query_one("#node-devices")
            assert [str(devs.get_row_at(i)[0]) for i in range(devs.row_count)] == ["cuda:0", "host"]
            assert "host CPU 1%" in str(detail.query_one("#node-host").render())
            await pilot.press("escape")
            await until(pilot, lambda: pilot.app.screen is screen, "back on the cluster view")
            assert screen.poller.detail is None and not screen._task.done(), "the poller kept running"
            polls = screen.poller.views[f"http://127.0.0.1:{a.port}"].polls
            await until(pilot, lambda: screen.poller.views[f"http://127.0.0.1:{a.port}"].polls > polls, "polling on")

            # beta stops answering: its rows stay, greyed, with STALE and the age of its last answer.
            stop_agent(b)
            b_stopped = True
            await until(pilot, lambda: str(by_node(table)["beta"][0][1]).startswith("STALE"), "beta stale")
            beta = by_node(table)["beta"]
            assert str(beta[0][1]).endswith(" ago") and "s" in str(beta[0][1])
            assert [str(r[2]) for r in beta] == ["cuda:0", "host"], "the last values stay"
            assert "10%" in str(beta[0][3]) and "2.0G/80.0G" in str(beta[0][4]) and str(beta[0][5]) == "41C"
            assert all(r[k].style == STALE_STYLE for r in beta for k in (2, 3, 4, 5)), "greyed"
            assert str(beta[0][9]), "why it is stale"
            alpha = by_node(table)["alpha"]
            assert str(alpha[0][1]) == "ok" and not any(str(c.style) == STALE_STYLE for c in alpha[0])
            # The stale node's detail says so, with its last figures.
            table.move_cursor(row=[str(r[0]) for r in rows(table)].index("beta"))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(pilot.app.screen, NodeDetailScreen), "the stale detail opened")
            detail = pilot.app.screen.query_one(NodeDetail)
            await until(pilot, lambda: detail.shown is not None, "shown")
            head = str(detail.query_one("#node-headline").render())
            assert "STALE" in head and "last answer" in head and "ago" in head
            devs = detail.query_one("#node-devices")
            assert str(devs.get_row_at(0)[0]) == "cuda:0" and devs.get_row_at(0)[0].style == STALE_STYLE
            await pilot.press("escape")
    finally:
        stop_agent(a)
        if not b_stopped:
            stop_agent(b)


def test_a_stopped_node_in_hwtui_agents_keeps_its_last_values_and_age():
    """`hwtui agents`' lines and JSON: the stale node's last values with their age; never-answered with since when."""
    from hwtui.app.commands.agents import _line
    from hwtui.app.node_api.client import Cluster

    a, b = start_agent("alpha", 0), start_agent("beta", 1)
    dead = dead_port()
    try:
        async def main():
            targets = parse_agents(f"127.0.0.1:{a.port},127.0.0.1:{b.port},127.0.0.1:{dead}")
            async with Poller(targets, token=TOKEN, interval=0.2) as poller:
                await poller.round()
                assert [n.stale for n in poller.statuses()] == [False, False, True]
                stop_agent(b)
                end = time.monotonic() + 20
                while not poller.statuses()[1].stale:  # state, bounded: each round is bounded too
                    assert time.monotonic() < end
                    await poller.round()
                return poller.statuses(), Cluster(poller.interval, poller.statuses()).to_dict()

        statuses, doc = asyncio.run(main())
        alpha, beta, never = (_line(n) for n in statuses)
        assert " ok " in alpha and "host cpu 1% mem 0.0/0G" in alpha
        assert "STALE" in beta and "last answer" in beta and "s ago" in beta
        assert "cuda:0 10% 2.0/80G" in beta and "host cpu 1%" in beta, "the last values stay"
        assert "never answered, tried for" in never and "refused" in never
        node = doc["nodes"][1]
        # Stale from twice the interval on; the JSON rounds the age to 0.1 s, so exactly 0.4 can be read.
        assert node["stale"] and node["age_s"] >= 0.4 and node["devices"][0]["util"] == 10.0
        assert node["host"]["util"] == 1.0 and doc["nodes"][2]["tried_s"] is not None and doc["nodes"][2]["age_s"] is None
    finally:
        stop_agent(a)


def test_hwtui_agents_cli_names_a_never_answered_node_and_since_when(capsys):
    from hwtui.app.cli import main

    a = start_agent("alpha", 2)
    try:
        import os

        os.environ["HWTUI_AGENT_TOKEN"] = TOKEN
        try:
            rc = main(["agents", "--agents", f"127.0.0.1:{a.port},127.0.0.1:{dead_port()}"])
        finally:
            del os.environ["HWTUI_AGENT_TOKEN"]
        out = capsys.readouterr().out.splitlines()
        assert rc == 1 and len(out) == 2
        assert out[0].startswith("alpha") and "host cpu 1%" in out[0] and "cuda:0 20%" in out[0]
        assert "STALE  never answered, tried for " in out[1]
    finally:
        stop_agent(a)
