"""Every node of a live cluster view: one row per device, a STALE row for a node with no fresh answer.

Columns: node, state (ok / STALE with the age of its last answer), device, utilisation, memory,
temperature, power, the weight version each device serves (a node commits all-or-nothing, so its
devices serve the node's version) and the progress of a push in flight.
Verdicts are words, never colour alone, so the view reads the same with NO_COLOR.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from hwtui.widgets._draw import bar, gib

COLUMNS = (("NODE", "node"), ("STATE", "state"), ("DEVICE", "device"), ("UTIL", "util"), ("MEM", "mem"),
           ("TEMP", "temp"), ("POWER", "power"), ("VERSION", "version"), ("PUSH", "push"))


def node_rows(node: dict[str, Any]) -> list[dict[str, Text]]:
    """The rows of one node (a node view as ``Poller.snapshot`` gives it), as cells by column key."""
    rep = node.get("replication") or {}
    flight = rep.get("in_flight") or {}
    version = Text(str(rep.get("serving") or "-"))
    push = Text("-")
    if flight:
        p = float(flight.get("progress") or 0.0)
        push = Text(f"{flight.get('version')} {bar(p, 6)} {p * 100:3.0f}%")
    if node.get("stale"):
        age = node.get("age_s")
        state = Text("STALE" + ("" if age is None else f" {age:.0f}s"), style="bold red")
        why = Text(str(node.get("error") or "no fresh answer"), style="red")
        return [{"node": Text(str(node["node"])), "state": state, "device": why, "util": Text(""), "mem": Text(""),
                 "temp": Text(""), "power": Text(""), "version": version, "push": push}]
    rows = []
    devices = [d for d in node.get("devices") or [] if d.get("device") != "cpu"] or list(node.get("devices") or [])
    for i, d in enumerate(devices):
        util = d.get("util")
        rows.append({
            "node": Text(str(node["node"]) if i == 0 else ""),
            "state": Text("ok" if i == 0 else ""),
            "device": Text(str(d.get("device"))),
            "util": Text("-" if util is None else f"{bar(float(util) / 100, 5)} {float(util):3.0f}%"),
            "mem": Text(f"{gib(d.get('mem_used'))}/{gib(d.get('mem_total'))}" if d.get("mem_total") else "-"),
            "temp": Text("-" if d.get("temp_c") is None else f"{float(d['temp_c']):.0f}C"),
            "power": Text("-" if d.get("power_w") is None else f"{float(d['power_w']):.0f}W"),
            # Every rank of a node serves the version its all-or-nothing commit switched to.
            "version": version,
            "push": push if i == 0 else Text(""),
        })
    return rows


class ClusterNodes(DataTable):
    DEFAULT_CSS = "ClusterNodes { height: 1fr; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.stale_nodes: list[str] = []

    def on_mount(self) -> None:
        for label, key in COLUMNS:
            self.add_column(label, key=key)

    def show(self, nodes: list[dict[str, Any]]) -> None:
        """Replace the rows with ``nodes`` (cheap: a few hundred cells at most per refresh)."""
        self.stale_nodes = [str(n["node"]) for n in nodes if n.get("stale")]
        self.clear()
        for n in nodes:
            for i, row in enumerate(node_rows(n)):
                self.add_row(*(row[key] for _, key in COLUMNS), key=f"{n.get('url', n['node'])}#{i}")
