"""Agents are untrusted (issue 22, F6): hostile fake agents on loopback against `hwtui agents`, the
poller and the TUI's cluster view. Every bad field shows as unknown, no control character reaches
the terminal, and a drip-feeding agent is cut at the poll's deadline while the others update."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from hwtui.app.node_api.client import Poller, parse_agents
from hwtui.core.terminal_text import is_clean
from tests import cli_proc
from tests.agent.helpers import TOKEN, start_agent, stop_agent
from tests.agent.hostile import HostileAgent, answer, summary_bytes

pytestmark = pytest.mark.timeout(180)

MAX_SUMMARY = 1 << 20  # the client's cap on a summary (app/node_api/client.py)
EVIL = "evil\x1b]0;PWNED\x07\x1b[2J"
BIDI = "good\u202egnp.exe\u2066x\u2069\x9b31m\x00\x7f"

# One node per bad field: (label, summary bytes). Each is valid JSON carrying one invalid value.
BAD_FIELDS = {
    "temp-hot": summary_bytes("temp-hot", [{"device": "cuda:0", "util": 5, "temp_c": "hot"}]),
    "util-nan": summary_bytes("util-nan", [{"device": "cuda:0", "util": float("nan"), "temp_c": 40}]),
    "mem-negative": summary_bytes("mem-negative", [{"device": "cuda:0", "mem_used": -1, "mem_total": -5}]),
    "power-inf": summary_bytes("power-inf", [{"device": "cuda:0", "power_w": float("inf"), "util": 10**400}]),
    "devices-not-objects": summary_bytes("devices-not-objects", [1, "x", None, [2]]),
    "devices-huge": summary_bytes("devices-huge", [{}] * 20000),
    "devices-a-string": summary_bytes("devices-a-string", "cuda:0"),
    "replication-odd": summary_bytes("replication-odd", [{"device": "cuda:0"}],
                                     {"serving": ["v1"], "in_flight": {"version": 7, "progress": "half"}}),
    "util-bool": summary_bytes("util-bool", [{"device": "cuda:0", "util": True, "temp_c": 1e308}]),
}


def _agent_args(*ports: int) -> str:
    return ",".join(f"127.0.0.1:{p}" for p in ports)


def _assert_clean(text: str) -> None:
    for line in text.splitlines():
        assert is_clean(line), repr(line)


def test_hwtui_agents_strips_controls_and_returns_by_the_deadline_whatever_the_agents_send(tmp_path):
    """`hwtui agents` against a good agent and hostile ones: escape and bidi names, answers that
    drip (body, and head too), an answer past the size cap, one whose Content-Length lies, one
    that is not JSON. Before the fix a drip-feeding agent held the command for minutes: the
    bounded subprocess wait below is what proves the deadline (no timing assertion)."""
    good = start_agent("good", 1)
    padded = summary_bytes("dripper", [{"device": "cuda:0"}], pad="x" * 4000)
    hostile = [
        HostileAgent(answer(summary_bytes(EVIL, [{"device": EVIL, "name": BIDI, "util": 10}],
                                          {"serving": EVIL, "in_flight": {"version": BIDI, "progress": 0.5}}))),
        HostileAgent(answer(summary_bytes(BIDI, [{"device": "cuda:0"}]))),
        HostileAgent(answer(padded), drip_s=0.05, drip_from=90),  # head at once, body a byte at a time
        HostileAgent(answer(padded), drip_s=0.05),  # the status line and headers too
        HostileAgent(answer(b"[" * 10 + b"x" * (MAX_SUMMARY + 10))),
        HostileAgent(answer(b"{}", content_length=1 << 40)),
        HostileAgent(answer(b" " * (MAX_SUMMARY + 10) + b"{}", content_length=-1)),  # no length: read to the cap
        HostileAgent(answer(b"\x1b]0;PWNED\x07 not json")),
        HostileAgent(answer(b"\x1b[2J", status="500 \x1b]0;PWNED\x07")),
    ]
    try:
        spec = _agent_args(good.port, *(h.port for h in hostile))
        env = {**os.environ, "HWTUI_AGENT_TOKEN": TOKEN, "NO_COLOR": "1"}
        # The bound: the drip alone would take 200 s per dripping agent; the deadline is 5 s.
        out = cli_proc.run([sys.executable, "-m", "hwtui", "agents", "--agents", spec, "--interval", "5"],
                           capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path)
        _assert_clean(out.stdout)
        _assert_clean(out.stderr)
        assert "PWNED" not in out.stdout + out.stderr
        assert out.returncode == 1, out.stderr  # stale nodes: exit 1, never a crash
        lines = out.stdout.splitlines()
        assert len(lines) == 1 + len(hostile), out.stdout
        by_port = {}
        for line, port in zip(lines, [good.port, *(h.port for h in hostile)], strict=True):
            by_port[port] = line
        assert " ok " in by_port[good.port] and "1 device(s)" in by_port[good.port]
        assert by_port[hostile[0].port].startswith("evil ") and " ok " in by_port[hostile[0].port]
        assert by_port[hostile[1].port].startswith("goodgnp.exex")
        for h in hostile[2:4]:
            assert "STALE" in by_port[h.port] and "no answer in time" in by_port[h.port]
        assert "answer too large" in by_port[hostile[4].port]
        assert "answer too large" in by_port[hostile[5].port]
        assert "answer too large" in by_port[hostile[6].port]
        assert "not JSON" in by_port[hostile[7].port] and "HTTP 500" in by_port[hostile[8].port]
    finally:
        for h in hostile:
            h.close()
        stop_agent(good)


def test_the_json_output_names_every_bad_field_unknown(tmp_path):
    hostile = {label: HostileAgent(answer(body)) for label, body in BAD_FIELDS.items()}
    try:
        env = {**os.environ, "HWTUI_AGENT_TOKEN": TOKEN}
        out = cli_proc.run([sys.executable, "-m", "hwtui", "agents", "--json", "--interval", "5",
                            "--agents", _agent_args(*(h.port for h in hostile.values()))],
                           capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        by = {n["node"]: n for n in doc["nodes"]}
        assert set(by) == set(BAD_FIELDS)
        assert by["temp-hot"]["devices"][0]["temp_c"] is None and "devices[0].temp_c" in by["temp-hot"]["unknown"]
        assert by["util-nan"]["devices"][0]["util"] is None and by["util-nan"]["devices"][0]["temp_c"] == 40
        assert {"devices[0].mem_used", "devices[0].mem_total"} <= set(by["mem-negative"]["unknown"])
        assert {"devices[0].power_w", "devices[0].util"} <= set(by["power-inf"]["unknown"])
        assert by["devices-not-objects"]["unknown"] == [f"devices[{i}]" for i in range(4)]
        assert by["devices-huge"]["devices"] == [] and by["devices-huge"]["unknown"] == ["devices"]
        assert by["devices-a-string"]["unknown"] == ["devices"]
        rep = by["replication-odd"]
        assert rep["replication"] == {"serving": None, "in_flight": {"version": None, "progress": None}, "device": None,
                                      "persist": None}
        assert set(rep["unknown"]) == {"replication.serving", "replication.in_flight.version",
                                       "replication.in_flight.progress"}
        assert {"devices[0].util", "devices[0].temp_c"} <= set(by["util-bool"]["unknown"])
    finally:
        for h in hostile.values():
            h.close()


def test_a_drip_feeding_agent_is_cut_at_the_deadline_and_the_others_keep_updating():
    """The poller's view over several rounds: the dripping node is stale (never answers inside a
    poll), the good one fresh every time."""
    good = start_agent("good", 2)
    drip = HostileAgent(answer(summary_bytes("drip", pad="x" * 4000)), drip_s=0.05, drip_from=90)
    try:
        async def main():
            async with Poller(parse_agents(_agent_args(good.port, drip.port)), token=TOKEN, interval=3.0) as poller:
                seen = []
                for _ in range(3):
                    # round() returns only when every node's poll ended: bounded by the deadline.
                    await asyncio.wait_for(poller.round(), 60)
                    seen.append({s.agent: s for s in poller.statuses()})
                return seen

        for snap in asyncio.run(main()):
            g, d = snap[f"127.0.0.1:{good.port}"], snap[f"127.0.0.1:{drip.port}"]
            assert not g.stale and g.node == "good"
            assert d.stale and d.error == "no answer in time" and d.summary is None
        assert drip.requests >= 1
    finally:
        drip.close()
        stop_agent(good)


async def test_the_tui_cluster_view_survives_every_bad_field_and_shows_unknown():
    from textual.app import App

    from hwtui.app.tui.screens.nodes import NodesScreen
    from hwtui.widgets.cluster_nodes import ClusterNodes
    from tests.app.tui.conftest import wait_for

    bodies = {**BAD_FIELDS,
              "escape": summary_bytes(EVIL, [{"device": BIDI, "util": 1}], {"serving": EVIL, "in_flight": None}),
              "markup": summary_bytes("[red]x[/red][link=http://e]y", [{"device": "[b]cuda:0"}])}
    hostile = {label: HostileAgent(answer(body)) for label, body in bodies.items()}
    # And one that drip-feeds: cut at each poll's deadline, shown STALE, never holding the others.
    hostile["drip"] = HostileAgent(answer(summary_bytes("drip", pad="x" * 4000)), drip_s=0.05, drip_from=90)
    try:
        screen = NodesScreen(parse_agents(_agent_args(*(h.port for h in hostile.values()))))
        screen.poller.interval = 4.0
        screen.poller.request_timeout = 4.0

        class Host(App[None]):
            def on_mount(self) -> None:
                self.push_screen(screen)

        async with Host().run_test(size=(160, 60)) as pilot:
            table = screen.query_one(ClusterNodes)

            def rows() -> dict[str, list[list[str]]]:
                out: dict[str, list[list[str]]] = {}
                for i in range(table.row_count):
                    cells = [str(c) for c in table.get_row_at(i)]
                    key = str(table.coordinate_to_cell_key((i, 0)).row_key.value).rsplit("#", 1)[0]
                    out.setdefault(key, []).append(cells)
                return out

            urls = {label: f"http://127.0.0.1:{h.port}" for label, h in hostile.items()}

            drip_url = urls.pop("drip")

            def all_in() -> bool:
                got = rows()
                return (all(u in got and got[u][0][1] == "ok" for u in urls.values())
                        and drip_url in got and got[drip_url][0][9] == "no answer in time")

            await wait_for(pilot, all_in, timeout=60)
            got = {label: rows()[u] for label, u in urls.items()}
            assert pilot.app.is_running and rows()[drip_url][0][1] == "never answered"
            for cells_list in got.values():
                for cells in cells_list:
                    for c in cells:
                        assert is_clean(c), repr(c)
            # COLUMNS: node, state, device, util, mem, temp, power, version, push, note; each node's
            # last row is its host (CPU and memory: `?` where the agent sent no valid `cpu` entry).
            assert got["temp-hot"][0][5] == "?" and got["temp-hot"][0][3].endswith("5%")
            assert got["util-nan"][0][3] == "?" and got["util-nan"][0][5] == "40C"
            assert got["mem-negative"][0][4] == "?"
            assert got["power-inf"][0][6] == "?" and got["power-inf"][0][3] == "?"
            assert [r[2] for r in got["devices-not-objects"]] == ["?"] * 4 + ["host"]
            assert got["devices-not-objects"][-1][3:5] == ["?", "?"]
            assert got["devices-huge"][0][2] == "?" and got["devices-a-string"][0][2] == "?"
            assert got["replication-odd"][0][7] == "?" and got["replication-odd"][0][8] == "? ?"
            assert got["util-bool"][0][3] == "?" and got["util-bool"][0][5] == "?"
            assert got["escape"][0][0] == "evil" and got["escape"][0][7] == "evil"
            assert got["escape"][0][2] == "goodgnp.exex"
            # Markup is shown as the characters it is made of, never interpreted.
            assert got["markup"][0][0] == "[red]x[/red][link=http://e]y" and got["markup"][0][2] == "[b]cuda:0"
    finally:
        for h in hostile.values():
            h.close()
