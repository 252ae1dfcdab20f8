"""The cluster smoke test: nodes that reported, mismatches, all-reduce correctness, bandwidth."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget


class ClusterSummary(Widget):
    DEFAULT_CSS = "ClusterSummary { height: auto; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cluster: Any = None

    def show(self, cluster: Any) -> None:
        self.cluster = cluster
        self.refresh(layout=True)

    def render(self) -> Text:
        c = self.cluster
        if c is None:
            return Text("cluster test: waiting", style="dim")
        text = Text.assemble(("cluster ", "bold"), f"{len(c.nodes)} ranks reported, {len(c.mismatches)} mismatches")
        for rank in sorted(c.nodes)[:8]:
            n = c.nodes[rank]
            text.append(f"\n  rank {rank} {n.get('node', '?')}: {'ok  ' if n.get('ok') else 'FAIL'} {n.get('summary', '')}")
        if c.correctness is not None:
            ok = c.correctness.get("ok")
            text.append(f"\ncorrectness {'ok' if ok else 'FAILED'}", style="" if ok else "bold red")
        for b in c.bandwidth[-4:]:
            text.append(f"\n{b.get('op', '?')} {int(b.get('size_bytes') or 0) / 1e6:.0f} MB  algbw "
                        f"{float(b.get('algbw') or 0):.2f} GB/s  busbw {float(b.get('busbw') or 0):.2f} GB/s")
        if c.done is not None:
            text.append(f"\ncluster test {'passed' if c.done.get('ok') else 'FAILED'}", style="bold")
        return text
