"""One node of the cluster view in full: its state, host CPU and memory, every device, its processes.

Drawn from ``engine.resident.summary.NodeStatus`` (the checked form of the agent's answers, strings
already free of terminal controls) into ``rich.text.Text`` cells, never markup. A stale node keeps
its last values, greyed, under a line that says STALE and the age of its last answer. The
processes are the agent's ``/v1/processes`` (polled only while this view is open): ``?`` for a
field the agent sent invalid.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from hwtui.engine.resident.summary import Device, NodeStatus, Process
from hwtui.widgets.cluster_nodes import STALE_STYLE, age_text, mem_text, tried_text, util_text, verdict_styles

DEVICE_COLUMNS = (("DEVICE", "device"), ("NAME", "name"), ("UTIL", "util"), ("MEM", "mem"), ("TEMP", "temp"),
                  ("POWER", "power"))
PROCESS_COLUMNS = (("PID", "pid"), ("NAME", "name"), ("DEVICES", "devices"))


def headline(node: NodeStatus, no_color: bool = False) -> Text:
    """``alpha (10.0.0.1:9477): ok, answered in 3 ms`` / ``STALE: last answer 12s ago, <why>`` /
    ``never answered, tried for 42s: <why>``."""
    verdict, _ = verdict_styles(no_color)
    out = Text(node.node, style="bold")
    if node.node != node.agent:
        out.append(f" ({node.agent})")
    out.append(": ")
    if not node.stale:
        lat = "" if node.latency_s is None else f", answered in {node.latency_s * 1000:.0f} ms"
        out.append(f"ok{lat}")
    elif node.age_s is None:
        out.append("never answered", style=verdict)
        out.append(f", {tried_text(node)}: {node.error or 'no answer yet'}")
    else:
        out.append("STALE", style=verdict)
        out.append(f": last answer {age_text(node.age_s)} ago, {node.error or 'no fresh answer'}"
                   " (the figures below are from then)")
    return out


def host_line(node: NodeStatus) -> Text:
    host = node.host
    if not node.answered:
        return Text("host CPU -  memory -")
    if host is None:
        return Text("host CPU ?  memory ? (the agent sent no valid host entry)")
    cpu = "?" if "util" in host.unknown else ("-" if host.util is None else f"{host.util:.0f}%")
    line = Text(f"host CPU {cpu}  memory {mem_text(host)}", style=STALE_STYLE if node.stale else "")
    if host.name:
        line.append(f"  {host.name}", style="dim")
    return line


def device_row(d: Device) -> list[str]:
    if "device" in d.unknown and d.device is None:
        return ["?"] * len(DEVICE_COLUMNS)
    temp = "?" if "temp_c" in d.unknown else ("-" if d.temp_c is None else f"{d.temp_c:.0f}C")
    power = "?" if "power_w" in d.unknown else ("-" if d.power_w is None else f"{d.power_w:.0f}W")
    if d.power_limit_w is not None and "power_w" not in d.unknown:
        power += f"/{d.power_limit_w:.0f}W"
    label = "host" if d.is_cpu else (d.device or "?")
    return [label, d.name or ("?" if "name" in d.unknown else "-"), util_text(d), mem_text(d), temp, power]


def process_row(p: Process) -> list[str]:
    if "process" in p.unknown:
        return ["?", "?", "?"]
    pid = "?" if "pid" in p.unknown else ("-" if p.pid is None else str(p.pid))
    name = "?" if "name" in p.unknown else (p.name or "-")
    devices = "?" if "devices" in p.unknown else (", ".join(d.removeprefix("/dev/") for d in p.devices) or "-")
    return [pid, name, devices]


def processes_line(node: NodeStatus) -> Text:
    procs = node.processes
    if node.processes_error and procs is None:
        return Text(f"processes unknown: {node.processes_error}", style="bold")
    if procs is None:
        if node.stale:
            return Text("processes unknown: the node does not answer")
        return Text("processes: waiting for the node's answer")
    if "processes" in procs.unknown:
        return Text("processes ? (the agent sent an invalid list)")
    age = "" if procs.age_s is None else f", scanned {age_text(procs.age_s)} ago"
    more = f", {procs.more} more not shown" if procs.more else ""
    stale = f" (last answer; now: {node.processes_error})" if node.processes_error else (
        " (last answer, before the node went quiet)" if node.stale else "")
    return Text(f"{len(procs.items)} process(es) holding a device{age}{more}{stale}")


class NodeDetail(Vertical):
    """The node's headline, host line, devices table and processes table; ``show`` repaints."""

    DEFAULT_CSS = """
    NodeDetail { height: 1fr; }
    NodeDetail #node-headline, NodeDetail #node-host, NodeDetail #node-procs-title { height: auto; }
    NodeDetail #node-devices { height: auto; max-height: 50%; }
    NodeDetail #node-procs { height: 1fr; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shown: NodeStatus | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="node-headline")
        yield Static(id="node-host")
        yield DataTable(id="node-devices", cursor_type="row", zebra_stripes=True)
        yield Static(id="node-procs-title")
        yield DataTable(id="node-procs", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        for table_id, columns in (("#node-devices", DEVICE_COLUMNS), ("#node-procs", PROCESS_COLUMNS)):
            table = self.query_one(table_id, DataTable)
            for label, key in columns:
                table.add_column(label, key=key)

    def show(self, node: NodeStatus) -> None:
        self.shown = node
        style = STALE_STYLE if node.stale else ""
        self.query_one("#node-headline", Static).update(headline(node, self.app.no_color))
        self.query_one("#node-host", Static).update(host_line(node))
        self._fill("#node-devices", [device_row(d) for d in node.devices], style)
        self.query_one("#node-procs-title", Static).update(processes_line(node))
        procs = node.processes.items if node.processes is not None else ()
        self._fill("#node-procs", [process_row(p) for p in procs], style)

    def _fill(self, table_id: str, rows: list[list[str]], style: str) -> None:
        table = self.query_one(table_id, DataTable)
        cursor = table.cursor_row
        table.clear()
        for row in rows:
            table.add_row(*(Text(c, style=style) for c in row))
        if rows and 0 < cursor < len(rows):
            table.move_cursor(row=cursor, animate=False)
