"""The live cluster view (``hwtui --agents a:port,b:port``): every node's devices, samples and versions.

One asyncio task per node polls its agent (hwtui.app.agent.client.Poller) on Textual's own event
loop, so nothing here blocks the UI; the table repaints once per refresh interval, which adapts to
the number of nodes. A node that is slow or dead is shown STALE with the age of its last answer and
never holds the others up. What the agents send is read only through the checked form
(``engine.agent.summary``): a bad field shows ``?``, never a crash of the view.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Static

from hwtui.app.agent.client import Poller, Target
from hwtui.engine.agent.summary import NodeStatus
from hwtui.widgets.cluster_nodes import ClusterNodes


class NodesScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
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
