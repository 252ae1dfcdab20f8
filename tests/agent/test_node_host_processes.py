"""A node's host CPU and memory and its processes, read through the agents' one typed parser (issue 25).

An agent is untrusted: a host entry or a process list it sends malformed is unknown (``?``), never a
crash and never a control sequence on the terminal.
"""

from __future__ import annotations

import asyncio
import time

from hwtui.app.node_api.client import Poller, parse_agents
from hwtui.engine.resident.summary import MAX_PROCESSES, NodeStatus, parse_processes, parse_summary
from tests.agent.helpers import TOKEN, start_agent, stop_agent


def test_host_is_the_checked_cpu_entry_and_unknown_when_missing_or_malformed():
    good = parse_summary({"devices": [{"device": "cuda:0"}, {"device": "cpu", "util": 12.5, "mem_used": 2**30,
                                                              "mem_total": 4 * 2**30}]})
    assert good.host is not None and good.host.util == 12.5 and good.host.mem_total == 4 * 2**30
    assert parse_summary({"devices": [{"device": "cuda:0"}]}).host is None  # none sent
    assert parse_summary({"devices": "cpu"}).host is None  # no list at all
    bad = parse_summary({"devices": [{"device": "cpu", "util": float("nan"), "mem_used": -1, "mem_total": "64G"}]})
    assert bad.host is not None and bad.host.util is None and {"util", "mem_used", "mem_total"} <= set(bad.host.unknown)
    assert "devices[0].util" in bad.unknown
    status = NodeStatus(agent="n:1", url="http://n:1", stale=False, summary=good, tried_s=3.0)
    doc = status.to_dict()
    assert doc["host"]["util"] == 12.5 and doc["tried_s"] == 3.0


def test_the_view_and_the_cli_show_an_unknown_host_as_question_marks():
    from hwtui.app.commands.agents import _line
    from hwtui.widgets.cluster_nodes import node_rows

    for devices in ([{"device": "cuda:0", "util": 5.0}], [{"device": "cuda:0"}, {"device": "cpu", "util": True,
                                                                                 "mem_used": 1e300, "mem_total": 2}]):
        n = NodeStatus(agent="n:1", url="http://n:1", stale=False, age_s=0.1, summary=parse_summary({"devices": devices}))
        host = [r for r in node_rows(n) if str(r["device"]) == "host"]
        assert len(host) == 1 and str(host[0]["util"]) == "?" and str(host[0]["mem"]) == "?"
        assert "host cpu ? mem ?" in _line(n)


def test_processes_are_checked_capped_and_cleaned():
    p = parse_processes({"processes": [{"pid": 12, "name": "python", "devices": ["/dev/nvidia0"]},
                                       {"pid": 1.5, "name": "\x1b]0;pwned\x07x", "devices": "all"},
                                       {"pid": -3, "name": ["x"]}, "junk", {"pid": True}],
                         "age_s": 1.25})
    assert p.age_s == 1.25 and len(p.items) == 5
    first, second, third, fourth, fifth = p.items
    assert (first.pid, first.name, first.devices) == (12, "python", ("/dev/nvidia0",))
    assert second.pid is None and "pid" in second.unknown and "\x1b" not in (second.name or "") and "devices" in second.unknown
    assert "pid" in third.unknown and "name" in third.unknown
    assert fourth.unknown == ("process",) and "pid" in fifth.unknown
    many = parse_processes({"processes": [{"pid": i} for i in range(MAX_PROCESSES + 5)]})
    assert len(many.items) == MAX_PROCESSES and many.more == 5
    assert parse_processes({"processes": {"a": 1}}).unknown == ("processes",)
    assert parse_processes([1, 2]).unknown == ("processes",)


def test_processes_are_polled_only_for_the_open_node():
    procs = [{"pid": 7, "name": "trainer", "devices": ["/dev/nvidia0"]}]
    a = start_agent("a", 0, processes=lambda: procs)
    b = start_agent("b", 1, processes=lambda: procs)
    try:
        async def main():
            targets = parse_agents(f"127.0.0.1:{a.port},127.0.0.1:{b.port}")
            async with Poller(targets, token=TOKEN, interval=0.5) as poller:
                url_a = targets[0].url
                poller.detail = url_a
                end = time.monotonic() + 20
                while True:  # the agent's first process scan may not be in yet: wait on it, bounded
                    await poller.round()
                    got = poller.statuses()
                    if got[0].processes is not None and got[0].processes.items:
                        break
                    assert time.monotonic() < end
                assert got[1].processes is None, "only the open node's processes are asked for"
                poller.detail = None
                closed = poller.statuses()[0]
                poller.detail = "http://not-a-target:1"
                return got, closed, poller.detail

        got, closed, unknown_target = asyncio.run(main())
        assert [(p.pid, p.name) for p in got[0].processes.items] == [(7, "trainer")]
        assert closed.processes is None, "closing the detail forgets its processes"
        assert unknown_target is None
    finally:
        stop_agent(a)
        stop_agent(b)


def test_a_node_whose_processes_never_come_stays_fresh_while_its_detail_is_open():
    """The processes are asked after the summary, in the same poll: a node that drip-feeds them is
    cut at half the poll's deadline, so its summary is still asked every interval (never STALE)."""
    from tests.agent.hostile import HostileAgent, answer, summary_bytes

    summary = answer(summary_bytes("slowprocs", [{"device": "cpu", "util": 3.0}]))
    endless = answer(b"{" + b" " * 200_000 + b"}")
    agent = HostileAgent(lambda path: endless if path.startswith("/v1/processes") else summary,
                         drip_s=0.5, drip_from=len(summary))
    try:
        async def main():
            targets = parse_agents(f"127.0.0.1:{agent.port}")
            async with Poller(targets, interval=1.5) as poller:
                poller.detail = targets[0].url
                view = poller.views[targets[0].url]
                stop = asyncio.Event()
                task = asyncio.ensure_future(poller.run(stop))
                seen_stale = []
                end = time.monotonic() + 60
                while view.polls < 5 or view.processes_error is None:  # state: polls made, bounded
                    assert time.monotonic() < end
                    if view.last_ok is not None:
                        seen_stale.append(poller.statuses()[0].stale)
                    await asyncio.sleep(0.05)
                stop.set()
                await asyncio.wait_for(task, 10)
                return seen_stale, view

        seen_stale, view = asyncio.run(main())
        assert seen_stale and not any(seen_stale), "fresh throughout"
        assert view.processes_error == "no answer in time" and view.processes is None
    finally:
        agent.close()
