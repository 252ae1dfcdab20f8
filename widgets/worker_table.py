"""Training workers: device, step, samples/s, share of the work, loss, memory."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from hwtui.widgets._draw import bar, gib


class WorkerTable(DataTable):
    DEFAULT_CSS = "WorkerTable { height: auto; max-height: 10; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="none", show_cursor=False, **kwargs)
        self._keys: set[int] = set()

    def on_mount(self) -> None:
        for label, key in (("RANK", "rank"), ("DEVICE", "device"), ("STEP", "step"), ("SAMPLES/S", "sps"),
                           ("SHARE", "share"), ("LOSS", "loss"), ("MEM", "mem")):
            self.add_column(label, key=key)

    def show(self, train: Any) -> None:
        shares = train.shares()
        for rank in sorted(train.workers):
            w = train.workers[rank]
            share = shares.get(rank, 0.0)
            loss = w.get("loss")
            cells = {
                "rank": str(rank),
                "device": Text(f"{w.get('device', '?')}" + (" LOST" if w.get("lost") else ""),
                               style="bold red" if w.get("lost") else ""),
                "step": str(w.get("step", 0)),
                "sps": f"{float(w.get('samples_per_s') or 0):8.1f}",
                "share": f"{bar(share, 8)} {share * 100:3.0f}%",
                "loss": "-" if loss is None else f"{float(loss):.4f}",
                "mem": f"{gib(w.get('mem_used'))}/{gib(w.get('mem_total'))}" if w.get("mem_total") else "-",
            }
            cells = {k: v if isinstance(v, Text) else Text(v) for k, v in cells.items()}
            if rank not in self._keys:
                self.add_row(*cells.values(), key=str(rank))
                self._keys.add(rank)
            else:
                for col, value in cells.items():
                    self.update_cell(str(rank), col, value)
