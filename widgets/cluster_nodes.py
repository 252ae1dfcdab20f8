"""Every node of a live cluster view: one row per device, a STALE row for a node with no fresh answer.

Columns: node, state (ok / STALE with the age of its last answer), device, utilisation, memory,
temperature, power, the weight version each device serves (a node commits all-or-nothing, so its
devices serve the node's version) and the progress of a push in flight.
Verdicts are words, never colour alone, so the view reads the same with NO_COLOR.

Rows are drawn from ``engine.agent.summary.NodeStatus``, the checked form of an agent's answer:
a field the agent sent invalid shows ``?`` (``-``: not reported), and every string is already
free of terminal controls. Cells are ``rich.text.Text``, never markup, so a node named
``[red]x`` shows those characters.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from hwtui.engine.agent.summary import Device, NodeStatus
from hwtui.widgets._draw import bar

COLUMNS = (("NODE", "node"), ("STATE", "state"), ("DEVICE", "device"), ("UTIL", "util"), ("MEM", "mem"),
           ("TEMP", "temp"), ("POWER", "power"), ("VERSION", "version"), ("PUSH", "push"))


def _figure(d: Device, key: str, value: float | None, unit: str) -> str:
    if key in d.unknown:
        return "?"
    return "-" if value is None else f"{value:.0f}{unit}"


def _mem(d: Device) -> str:
    if "mem_used" in d.unknown or "mem_total" in d.unknown:
        return "?"
    if not d.mem_total:
        return "-"
    used = "?" if d.mem_used is None else f"{d.mem_used / 2**30:.1f}G"
    return f"{used}/{d.mem_total / 2**30:.1f}G"


def _util(d: Device) -> str:
    if "util" in d.unknown:
        return "?"
    return "-" if d.util is None else f"{bar(d.util / 100, 5)} {d.util:3.0f}%"


def node_rows(node: NodeStatus) -> list[dict[str, Text]]:
    """The rows of one node, as cells by column key."""
    rep = node.replication
    flight = rep.in_flight
    version = Text("?" if "replication.serving" in node.unknown else (rep.serving or "-"))
    push = Text("-")
    if flight is not None:
        p = flight.progress
        push = Text(f"{flight.version or '?'} " + ("?" if p is None else f"{bar(p, 6)} {p * 100:3.0f}%"))
    if node.stale:
        age = node.age_s
        state = Text("STALE" + ("" if age is None else f" {age:.0f}s"), style="bold red")
        why = Text(node.error or "no fresh answer", style="red")
        return [{"node": Text(node.node), "state": state, "device": why, "util": Text(""), "mem": Text(""),
                 "temp": Text(""), "power": Text(""), "version": version, "push": push}]
    rows = []
    devices = [d for d in node.devices if not d.is_cpu] or list(node.devices)
    if not devices and "devices" in node.unknown:
        devices = [Device(unknown=("device",))]  # a device list that was no list: one row of unknowns
    for i, d in enumerate(devices):
        whole = "device" in d.unknown and d.device is None  # an entry that was not an object
        rows.append({
            "node": Text(node.node if i == 0 else ""),
            "state": Text("ok" if i == 0 else ""),
            "device": Text(d.device or "?"),
            "util": Text("?" if whole else _util(d)),
            "mem": Text("?" if whole else _mem(d)),
            "temp": Text("?" if whole else _figure(d, "temp_c", d.temp_c, "C")),
            "power": Text("?" if whole else _figure(d, "power_w", d.power_w, "W")),
            # Every rank of a node serves the version its all-or-nothing commit switched to.
            "version": version,
            "push": push if i == 0 else Text(""),
        })
    if not rows:  # an answer with no devices at all still shows the node as alive
        rows.append({"node": Text(node.node), "state": Text("ok"), "device": Text("-"), "util": Text("-"),
                     "mem": Text("-"), "temp": Text("-"), "power": Text("-"), "version": version, "push": push})
    return rows


class ClusterNodes(DataTable):
    DEFAULT_CSS = "ClusterNodes { height: 1fr; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.stale_nodes: list[str] = []

    def on_mount(self) -> None:
        for label, key in COLUMNS:
            self.add_column(label, key=key)

    def show(self, nodes: list[NodeStatus]) -> None:
        """Replace the rows with ``nodes`` (cheap: a few hundred cells at most per refresh)."""
        self.stale_nodes = [n.node for n in nodes if n.stale]
        self.clear()
        for n in nodes:
            for i, row in enumerate(node_rows(n)):
                self.add_row(*(row[key] for _, key in COLUMNS), key=f"{n.url}#{i}")
