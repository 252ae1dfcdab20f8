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


def _p(pid, ppid, device="cuda:0", command="python", user="alice", mem=None):
    from hwtui.probes.processes import DeviceProcess

    return DeviceProcess(device, pid, user, mem, command, ppid=ppid)


def test_tree_order_puts_children_under_parents_and_survives_a_cycle():
    from hwtui.widgets.process_table import tree_order

    rows = [_p(10, 1), _p(11, 10), _p(12, 10), _p(13, 12), _p(20, 1), _p(10, 1, device="cuda:1")]
    got = [(p.pid, p.device, prefix) for p, prefix in tree_order(rows)]
    assert got == [(10, "cuda:0", ""), (11, "cuda:0", "├─ "), (12, "cuda:0", "└─ "), (13, "cuda:0", "   └─ "),
                   (20, "cuda:0", ""), (10, "cuda:1", "")], "a pid on two devices is one node, its other row a root"
    cycle = [_p(1, 2), _p(2, 1)]  # pids reused mid-read: each the other's parent
    assert sorted(p.pid for p, _ in tree_order(cycle)) == [1, 2], "every process drawn once, no loop"
    chain = [_p(i, i - 1) for i in range(1, 5001)]  # 5000 nested processes: no recursion limit
    assert [p.pid for p, _ in tree_order(chain)] == list(range(1, 5001))


def test_filter_matches_command_user_or_the_start_of_a_pid():
    from hwtui.widgets.process_table import matches

    p = _p(4242, 1, command="python train.py --lr 3e-4", user="Bob")
    assert matches(p, "TRAIN") and matches(p, "bob") and matches(p, "42") and matches(p, "  ")
    assert not matches(p, "242") and not matches(p, "vllm")
