"""The live cluster view (``hwtui --agents a:port,b:port``): every node's devices, samples and versions.

One asyncio task per node polls its agent (hwtui.app.node_api.client.Poller) on Textual's own event
loop, so nothing here blocks the UI; the table repaints once per refresh interval, which adapts to
the number of nodes. A node that is slow or dead is shown STALE with the age of its last answer,
its last values kept and greyed, and never holds the others up; one that never answered says how
long it has been tried. The table has a row cursor: Enter opens the highlighted node's devices and
processes (``NodeDetailScreen``; Escape comes back, the poller runs on throughout). What the
agents send is read only through the checked form (``engine.resident.summary``): a bad field shows
``?``, never a crash of the view.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Static

from hwtui.app.node_api.client import Poller, Target
from hwtui.engine.resident.summary import NodeStatus
from hwtui.widgets.cluster_nodes import ClusterNodes
from hwtui.widgets.node_detail import NodeDetail


class NodeDetailScreen(ModalScreen[None]):
    """One node's devices and processes, over the cluster view; Escape (or b) goes back.

    Modal: the cluster view stays installed underneath and its poller keeps polling every node;
    while this is open the poller also asks this node for its processes (``Poller.detail``)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("b", "back", "Back", show=False),
        # A modal screen hides the app's bindings: help and quit work here as on every screen.
        Binding("question_mark", "app.help", "Help", key_display="?"),
        Binding("q", "app.quit", "Quit"),
    ]
    DEFAULT_CSS = """
    NodeDetailScreen { background: $background; }
    NodeDetailScreen NodeDetail { border: round $primary; border-title-style: bold; padding: 0 1; }
    """

    def __init__(self, poller: Any, url: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poller = poller
        self.url = url

    def compose(self) -> ComposeResult:
        yield NodeDetail(id="node-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.poller.detail = self.url
        self.repaint()
        self.set_interval(self.poller.interval, self.repaint)

    def status(self) -> NodeStatus | None:
        return next((n for n in self.poller.statuses() if n.url == self.url), None)

    def repaint(self) -> None:
        node = self.status()
        if node is None:
            return
        detail = self.query_one(NodeDetail)
        # Text, not str: a str border title is parsed as markup, and the node names itself.
        detail.border_title = Text(f"node {node.node}")
        detail.show(node)

    def action_back(self) -> None:
        self.dismiss(None)

    def on_unmount(self) -> None:
        if self.poller.detail == self.url:
            self.poller.detail = None


class NodesScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        # Priority: the table's own Enter would select the row too, but unlisted in the footer.
        Binding("enter", "open_node", "Open node", priority=True),
        Binding("w", "wizard", "Wizard"),
        Binding("m", "monitor", "This machine"),
        Binding("q", "app.quit", "Quit"),
    ]
    DEFAULT_CSS = """
    NodesScreen #nodes-title { height: 1; text-style: bold; padding: 0 1; }
    NodesScreen ClusterNodes { border: round $primary; border-title-style: bold; padding: 0 1; }
    """

    def __init__(self, targets: list[Target], token: str | None = None, verify: Any = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.poller = Poller(targets, token=token, verify=verify)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def compose(self) -> ComposeResult:
        yield Static(self._title([]), id="nodes-title")
        yield ClusterNodes(id="nodes")
        yield Footer()

    def _title(self, nodes: list[NodeStatus]) -> str:
        stale = sum(1 for n in nodes if n.stale)
        return (f"Cluster: {len(self.poller.targets)} node(s), refresh every {self.poller.interval:g} s"
                + (f", {stale} STALE" if stale else ""))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a row: that row's node in full."""
        if not isinstance(event.data_table, ClusterNodes) or event.row_key.value is None:
            return
        event.stop()
        self.open_node(ClusterNodes.url_of(event.row_key.value))

    def open_node(self, url: str) -> None:
        self.app.push_screen(NodeDetailScreen(self.poller, url))

    def action_open_node(self) -> None:
        url = self.query_one(ClusterNodes).url_at_cursor()
        if url is not None:
            self.open_node(url)

    def action_wizard(self) -> None:
        # The poller keeps running (this screen stays installed): the Run screen shows the same nodes.
        self.app.switch_screen("detect")

    def action_monitor(self) -> None:
        self.app.switch_screen("monitor")

    async def on_mount(self) -> None:
        self.query_one(ClusterNodes).border_title = "nodes"
        await self.poller.__aenter__()
        self._task = asyncio.ensure_future(self.poller.run(self._stop))
        self.set_interval(self.poller.interval, self.repaint)
        self.set_timer(min(0.5, self.poller.interval), self.repaint)

    def repaint(self) -> None:
        if not self.is_current:
            return  # another screen shows (the Run screen draws the same poller's nodes itself), or the app is closing
        nodes = self.poller.statuses()
        self.query_one(ClusterNodes).show(nodes)
        # Static parses markup: the title holds only figures, and the nodes go through Text cells.
        self.query_one("#nodes-title", Static).update(self._title(nodes))

    async def on_unmount(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=self.poller.request_timeout + 1)
        await self.poller.__aexit__()
