"""Training workers: device, chunks trained, samples/s, share of the work, loss, memory.

CHUNKS is the worker's own count of optimizer steps (one per chunk); with dynamic balance a fast
worker takes more than the run's steps, so it is not labelled STEP (the run's step is the header's).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from hwtui.engine.training.views import TrainingView
from hwtui.widgets._draw import bar, gib


class WorkerTable(DataTable):
    DEFAULT_CSS = "WorkerTable { height: auto; max-height: 10; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="none", show_cursor=False, **kwargs)
        self._keys: set[int] = set()

    def on_mount(self) -> None:
        for label, key in (("RANK", "rank"), ("DEVICE", "device"), ("CHUNKS", "step"), ("SAMPLES/S", "sps"),
                           ("SHARE", "share"), ("LOSS", "loss"), ("MEM", "mem")):
            self.add_column(label, key=key)

    def show(self, train: TrainingView) -> None:
        shares = train.shares()
        for rank in sorted(train.workers):
            w = train.workers[rank]
            share = shares.get(rank, 0.0)
            cells: dict[str, str | Text] = {
                "rank": str(rank),
                "device": Text(w.device + (" LOST" if w.lost else ""), style="bold red" if w.lost else ""),
                "step": str(w.step),
                "sps": f"{w.samples_per_s:8.1f}",
                "share": f"{bar(share, 8)} {share * 100:3.0f}%",
                "loss": "-" if w.loss is None else f"{w.loss:.4f}",
                "mem": f"{gib(w.mem_used)}/{gib(w.mem_total)}" if w.mem_total else "-",
            }
            texts = {k: v if isinstance(v, Text) else Text(v) for k, v in cells.items()}
            if rank not in self._keys:
                self.add_row(*texts.values(), key=str(rank))
                self._keys.add(rank)
            else:
                # update_width: the first row may have been added before the first loss and memory
                # figures arrived ("-"), and a column never widens on its own: "0.2262" showed as "0.22".
                for col, value in texts.items():
                    self.update_cell(str(rank), col, value, update_width=True)
