"""Every node of a live cluster view: one row per device and one for the host, stale nodes greyed.

Columns: node, state, device, utilisation, memory, temperature, power, the weight version each
device serves (a node commits all-or-nothing, so its devices serve the node's version), the
progress of a push in flight, and a note (why a node is stale, how many fields it sent invalid).

Each node's last row is its ``host``: CPU use in UTIL, host memory in MEM (the agent's ``cpu``
entry, checked like every device; ``?`` when the agent sent none or sent it invalid).

A node that stops answering keeps its last values, greyed (dim), with ``STALE`` and the age of its
last answer in STATE: a person sees what the node was doing when it went quiet. A node that never
answered says so, with how long it has been tried. Verdicts are words, never colour alone, so the
view reads the same with NO_COLOR.

Rows are drawn from ``engine.resident.summary.NodeStatus``, the checked form of an agent's answer:
a field the agent sent invalid shows ``?`` (``-``: not reported), and every string is already
free of terminal controls. Cells are ``rich.text.Text``, never markup, so a node named
``[red]x`` shows those characters.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from hwtui.core.units import duration_text
from hwtui.engine.resident.summary import Device, NodeStatus
from hwtui.widgets._draw import bar

COLUMNS = (("NODE", "node"), ("STATE", "state"), ("DEVICE", "device"), ("UTIL", "util"), ("MEM", "mem"),
           ("TEMP", "temp"), ("POWER", "power"), ("VERSION", "version"), ("PUSH", "push"), ("NOTE", "note"))
STALE_STYLE = "dim"  # a stale node's last values: still readable, plainly not current
VERDICT_STYLE = "bold red"
# NO_COLOR turns red into a dark grey (its luminance) that all but vanishes: there the verdict is
# bold in the text colour, and the note plain.
MONO_VERDICT_STYLE = "bold"


def verdict_styles(no_color: bool) -> tuple[str, str]:
    """(the verdict's style, the reason's style) with or without colour."""
    return (MONO_VERDICT_STYLE, "") if no_color else (VERDICT_STYLE, "red")


def age_text(seconds: float | None) -> str:
    """A short age: ``42s``, ``3m05s``, ``2h03m``, ``4d02h``; ``?`` when unknown (core.units)."""
    return duration_text(seconds)


def state_text(node: NodeStatus) -> str:
    """``ok``, ``STALE 12s ago`` (the age of the last answer) or ``never answered``."""
    if not node.stale:
        return "ok"
    if node.age_s is None:
        return "never answered"
    return f"STALE {age_text(node.age_s)} ago"


def tried_text(node: NodeStatus) -> str:
    """Since when a node that never answered has been tried: ``tried for 42s``."""
    return "not tried yet" if node.tried_s is None else f"tried for {age_text(node.tried_s)}"


def _figure(d: Device, key: str, value: float | None, unit: str) -> str:
    if key in d.unknown:
        return "?"
    return "-" if value is None else f"{value:.0f}{unit}"


def mem_text(d: Device) -> str:
    if "mem_used" in d.unknown or "mem_total" in d.unknown:
        return "?"
    if not d.mem_total:
        return "-"
    used = "?" if d.mem_used is None else f"{d.mem_used / 2**30:.1f}G"
    return f"{used}/{d.mem_total / 2**30:.1f}G"


def util_text(d: Device) -> str:
    if "util" in d.unknown:
        return "?"
    return "-" if d.util is None else f"{bar(d.util / 100, 5)} {d.util:3.0f}%"


def _device_cells(d: Device) -> dict[str, str]:
    whole = "device" in d.unknown and d.device is None  # an entry that was not an object
    if whole:
        return {"device": "?", "util": "?", "mem": "?", "temp": "?", "power": "?"}
    return {"device": d.device or "?", "util": util_text(d), "mem": mem_text(d),
            "temp": _figure(d, "temp_c", d.temp_c, "C"), "power": _figure(d, "power_w", d.power_w, "W")}


def _host_cells(node: NodeStatus) -> dict[str, str]:
    host = node.host
    if host is None:  # no cpu entry, or not an object: the host's figures are unknown
        return {"device": "host", "util": "?", "mem": "?", "temp": "", "power": ""}
    return {"device": "host", "util": util_text(host), "mem": mem_text(host), "temp": "", "power": ""}


def held_text(node: NodeStatus) -> str:
    """`` [2 held: v5]`` after the version of a GPU-resident node whose slots serving processes hold
    (a push that would land in a held slot is refused there); ``""`` when none does or the node
    serves from host memory."""
    d = node.replication.device
    if "replication.device.holds" in node.unknown:
        return " [? held]"
    return f" [{d.holds} held: {', '.join(d.held)}]" if d is not None and d.holds else ""


def disk_text(node: NodeStatus) -> str:
    """`` [disk: writing]`` / `` [disk: FAILED]`` / `` [disk: behind]`` after the version of a
    GPU-resident node whose disk copy of it is still being written after the commit, could not be,
    or was stopped for a newer push (``--persist after-commit``);
    ``""`` otherwise (and for a node serving from host memory, as `hwtui agents` does)."""
    if node.replication.device is None:
        return ""
    if "replication.persist.state" in node.unknown:
        return " [disk: ?]"
    return {"writing": " [disk: writing]", "failed": " [disk: FAILED]",
            "superseded": " [disk: behind]"}.get(node.replication.disk_pending or "", "")


def note_text(node: NodeStatus) -> str:
    """The first row's note of an answering node: why it is stale, how many fields it sent
    invalid, its device error, or why its disk copy could not be written; ``""`` for none."""
    rep = node.replication
    if node.stale:
        return node.error or "no fresh answer"
    if node.unknown:
        return f"{len(node.unknown)} invalid field(s)"
    if rep.device is not None and rep.device.error:
        return f"device: {rep.device.error}"
    if rep.device is not None and rep.disk_pending == "failed" and rep.persist is not None:
        return f"disk: {rep.persist.error or '?'}"
    return ""


def node_rows(node: NodeStatus, no_color: bool = False) -> list[dict[str, Text]]:
    """The rows of one node, as cells by column key."""
    verdict, reason = verdict_styles(no_color)
    blank = {key: "" for _, key in COLUMNS}
    if not node.answered:
        # Nothing to show but that: since when it has been tried, and why it does not answer.
        row = {k: Text(v) for k, v in blank.items()}
        row["node"] = Text(node.node)
        row["state"] = Text(state_text(node), style=verdict)
        if node.age_s is None:
            row["device"] = Text(tried_text(node))
        row["note"] = Text(node.error or "no answer yet", style=reason)
        return [row]

    rep = node.replication
    flight = rep.in_flight
    version = ("?" if "replication.serving" in node.unknown else (rep.serving or "-")) + held_text(node) + disk_text(node)
    push = "-"
    if flight is not None:
        p = flight.progress
        push = f"{flight.version or '?'} " + ("?" if p is None else f"{bar(p, 6)} {p * 100:3.0f}%")
    cells: list[dict[str, str]] = []
    accelerators = [d for d in node.devices if not d.is_cpu]
    if not accelerators and "devices" in node.unknown:
        accelerators = [Device(unknown=("device",))]  # a device list that was no list: one row of unknowns
    for d in accelerators:
        # Every rank of a node serves the version its all-or-nothing commit switched to.
        cells.append({**blank, **_device_cells(d), "version": version})
    # The host: CPU and memory. On a node without accelerators it is what serves the version.
    cells.append({**blank, **_host_cells(node), "version": "" if accelerators else version})
    first = cells[0]
    first["node"], first["push"] = node.node, push
    first["note"] = note_text(node)
    style = STALE_STYLE if node.stale else ""
    rows = [{k: Text(v, style=style) for k, v in c.items()} for c in cells]
    rows[0]["state"] = Text(state_text(node), style=verdict if node.stale else "")
    if node.stale:
        rows[0]["note"] = Text(first["note"], style=reason)
    return rows


class ClusterNodes(DataTable):
    """The nodes' rows, with a row cursor: the highlighted row's node is ``url_at_cursor()``."""

    DEFAULT_CSS = "ClusterNodes { height: 1fr; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.stale_nodes: list[str] = []
        self._keys: list[str] = []
        self._cells: list[list[Text]] = []

    def on_mount(self) -> None:
        for label, key in COLUMNS:
            self.add_column(label, key=key)

    @staticmethod
    def url_of(row_key: str) -> str:
        return row_key.rsplit("#", 1)[0]

    def url_at_cursor(self) -> str | None:
        if not self._keys or not 0 <= self.cursor_row < len(self._keys):
            return None
        return self.url_of(self._keys[self.cursor_row])

    def show(self, nodes: list[NodeStatus]) -> None:
        """Show ``nodes`` (cheap: a few hundred cells at most per refresh). The cursor stays on its
        row: when the rows are the same ones, only the cells that changed are updated; else the
        cursor follows its row's key (or its node) into the new rows."""
        self.stale_nodes = [n.node for n in nodes if n.stale]
        keys: list[str] = []
        cells: list[list[Text]] = []
        no_color = self.app.no_color
        for n in nodes:
            for i, row in enumerate(node_rows(n, no_color)):
                keys.append(f"{n.url}#{i}")
                cells.append([row[key] for _, key in COLUMNS])
        if keys == self._keys:
            for key, old, new in zip(keys, self._cells, cells, strict=True):
                for (_, column), was, now in zip(COLUMNS, old, new, strict=True):
                    if (was.plain, str(was.style)) != (now.plain, str(now.style)):  # Text's == ignores its style
                        self.update_cell(key, column, now, update_width=True)
            self._cells = cells
            return
        before = self._keys[self.cursor_row] if self._keys and 0 <= self.cursor_row < len(self._keys) else None
        self.clear()
        for key, line in zip(keys, cells, strict=True):
            self.add_row(*line, key=key)
        self._keys, self._cells = keys, cells
        if before is not None:
            target = before if before in keys else next((k for k in keys if self.url_of(k) == self.url_of(before)), None)
            if target is not None:
                self.move_cursor(row=keys.index(target), animate=False)
