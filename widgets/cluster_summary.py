"""The cluster smoke test: verdict, nodes that reported, correctness and the bandwidth table.

Bandwidth is laid out as nccl-tests prints it (one row per message size, algbw and busbw per
collective) so figures can be compared with a run of nccl-tests on the same cluster. Verdicts are
words (PASSED / FAILED / ok), never colour alone, so the summary reads the same with NO_COLOR.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from hwtui.core.terminal_text import clean
from hwtui.engine.cluster.events import BandwidthEvent, CorrectnessEvent, DoneEvent, MismatchEvent, NodeEvent
from hwtui.engine.cluster.views import ClusterView

OPS = ("broadcast", "all_reduce")


def size_text(n: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


@dataclass(frozen=True)
class ClusterPicture:
    """The cluster view as it was when :meth:`ClusterSummary.show` was called.

    Why a copy: the app calls ``show`` under its state's lock, but Textual renders later while the
    engine's reader thread goes on adding nodes and bandwidth rows to the same state (iterating a
    dict another thread grows raises "dictionary changed size during iteration")."""

    nodes: dict[int, NodeEvent]
    mismatches: tuple[MismatchEvent, ...]
    correctness: CorrectnessEvent | None
    bandwidth: tuple[BandwidthEvent, ...]
    done: DoneEvent | None

    @classmethod
    def of(cls, cluster: ClusterView) -> ClusterPicture:
        return cls(nodes=dict(cluster.nodes), mismatches=tuple(cluster.mismatches), correctness=cluster.correctness,
                   bandwidth=tuple(cluster.bandwidth), done=cluster.done)


class ClusterSummary(Widget):
    DEFAULT_CSS = "ClusterSummary { height: auto; }"

    def __init__(self, max_nodes: int = 4, max_sizes: int = 9, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cluster: ClusterPicture | None = None
        self.max_nodes = max_nodes
        self.max_sizes = max_sizes  # the largest sizes are kept: they say most about the link
        self.compact = False  # a short terminal: fewer sizes, no table title, so the log still shows

    def show(self, cluster: ClusterView) -> None:
        """Copy ``cluster`` now (the caller holds its lock); draw the copy later."""
        self.cluster = ClusterPicture.of(cluster)
        self.refresh(layout=True)

    def bandwidth_rows(self) -> list[tuple[int, dict[str, BandwidthEvent]]]:
        """``[(size_bytes, {op: event})]`` in size order, the largest ``max_sizes`` of them."""
        by_size: dict[int, dict[str, BandwidthEvent]] = {}
        for b in self.cluster.bandwidth if self.cluster is not None else []:
            by_size.setdefault(b.size_bytes, {})[b.op] = b
        return sorted(by_size.items())[-(min(self.max_sizes, 4) if self.compact else self.max_sizes):]

    def render(self) -> Group | Text:
        c = self.cluster
        if c is None:
            return Text("cluster test: waiting for the first rank", style="dim")
        head = Text.assemble(("cluster test ", "bold"))
        if c.done is not None:
            ok = c.done.ok
            head.append("PASSED" if ok else "FAILED", style="bold" if ok else "bold red")
            head.append(f": {c.done.world_size} rank(s) on {len(c.done.nodes) if isinstance(c.done.nodes, list) else c.done.nodes} node(s)")
        else:
            head.append("running", style="italic")
        if c.done is None:
            head.append(f"  {len(c.nodes)} rank(s) reported")
        head.append(f", {len(c.mismatches)} mismatch(es)")
        parts: list[Any] = [head]
        ranks = sorted(c.nodes)
        for rank in ranks[: self.max_nodes]:
            n = c.nodes[rank]
            # Host names and summaries come from the ranks, on other machines: one clean line each.
            parts.append(Text(f"  rank {rank} {clean(str(n.node), 64)}: {'ok  ' if n.ok else 'FAIL'} "
                              f"{clean(str(n.summary), 300)}",
                              style="" if n.ok else "bold red", overflow="ellipsis", no_wrap=True))
        if len(ranks) > self.max_nodes:
            parts.append(Text(f"  ... {len(ranks) - self.max_nodes} more rank(s) (all in the log)", style="dim"))
        if c.correctness is not None:
            ok = c.correctness.ok
            got = c.correctness.got
            parts.append(Text(f"correctness: all-reduce {'ok' if ok else 'FAILED'} (expected {c.correctness.expected}, "
                              f"got {got})", style="" if ok else "bold red", overflow="ellipsis", no_wrap=True))
        rows = self.bandwidth_rows()
        if rows:
            table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
            table.add_column("GB/s size" if self.compact else "size", justify="right")
            for op in OPS:
                table.add_column(f"{op} algbw", justify="right")
                table.add_column("busbw", justify="right")
            for size, ops in rows:
                cells = [size_text(size)]
                for op in OPS:
                    b = ops.get(op)
                    cells += [f"{b.algbw:.3f}", f"{b.busbw:.3f}"] if b else ["-", "-"]
                table.add_row(*cells)
            if not self.compact:
                parts.append(Text("bandwidth, GB/s (busbw as nccl-tests defines it)", style="bold"))
            parts.append(table)
        return Group(*parts)
