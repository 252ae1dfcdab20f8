"""Tables whose cells grow after the first row: a column must widen, never cut a figure.

CI caught it: the worker table's first row could be added before the first loss and memory
figures arrived ("-"), and ``update_cell`` without ``update_width`` kept the column 1 cell wide,
so "0.2262" drew as "0.22" and "0.2G/8.0G" as "0.2" depending on how fast the first paint came.
"""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from hwtui.app.tui.run_state import Training, WorkerRow
from hwtui.widgets.process_table import ProcessTable
from hwtui.widgets.worker_table import WorkerTable

pytestmark = pytest.mark.timeout(60)


class _One(App):
    def __init__(self, widget):
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        yield self.widget


def _drawn(table) -> str:
    return "\n".join(strip.text for strip in (table.render_line(y) for y in range(table.size.height)))


async def test_worker_table_widens_when_the_first_figures_arrive():
    table = WorkerTable()
    async with _One(table).run_test(size=(100, 10)) as pilot:
        train = Training()
        train.workers[0] = WorkerRow(rank=0, device="cpu:0")  # no loss, no memory yet: "-"
        table.show(train)
        await pilot.pause()
        w = train.workers[0]
        w.step, w.samples_per_s, w.loss, w.mem_used, w.mem_total = 40, 320.0, 0.2262, 210763776, 8589934592
        table.show(train)
        await pilot.pause()
        drawn = _drawn(table)
        assert "0.2262" in drawn and "0.2G/8.0G" in drawn, drawn


class _Proc:
    def __init__(self, pid, mem, command):
        self.device, self.pid, self.user, self.mem_bytes, self.command = "cuda:0", pid, "root", mem, command

    def __eq__(self, other):
        return vars(self) == vars(other)


async def test_process_table_widens_when_memory_or_command_grows():
    table = ProcessTable()
    async with _One(table).run_test(size=(120, 10)) as pilot:
        table.show([_Proc(7, 5 * 2**20, "python")])
        await pilot.pause()
        table.show([_Proc(7, 123_456 * 2**20, "python train.py --config big.yaml")])
        await pilot.pause()
        drawn = _drawn(table)
        assert "120.6G" in drawn and "train.py --config big.yaml" in drawn, drawn  # "0.00G" -> "120.6G"
