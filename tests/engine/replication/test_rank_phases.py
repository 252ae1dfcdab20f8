"""repl.ranks: every rank reports its own start-up phases; the launcher counts them, in order, up to the world."""

from __future__ import annotations

import io
import os

import pytest
import torch
from safetensors.torch import save_file

from hwtui.engine.replication.events import RANK_PHASES, ReplRanks
from hwtui.engine.replication.launcher import ReplicationOptions, run_replication
from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]


@pytest.fixture
def plan(tmp_path):
    g = torch.Generator().manual_seed(3)
    save_file({f"w{i}": torch.randn(2000 + i, generator=g) for i in range(6)}, str(tmp_path / "m.safetensors"))
    write_json_atomic(tmp_path / "p.json", build_plan_from_files([str(tmp_path / "m.safetensors")], model="m",
                                                                 version="r1", bucket_bytes=16 << 10))
    return tmp_path / "p.json"


def test_rank_phases_arrive_in_order_and_reach_the_world(plan):
    env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
    events: list = []
    result = run_replication(ReplicationOptions(plan=str(plan), nproc=3, env=env), on_event=events.append)
    assert result.ok, result.error
    ranks = [e for e in events if isinstance(e, ReplRanks)]
    # One event per rank per phase: each rank moves on once through every phase.
    assert len(ranks) == 3 * len(RANK_PHASES)
    assert all(e.world_size == 3 and set(e.counts) == set(RANK_PHASES) for e in ranks)
    for before, after in zip(ranks, ranks[1:], strict=False):
        # Counts only grow, one rank-phase at a time, and a rank past a phase counts for it.
        assert sum(after.counts.values()) == sum(before.counts.values()) + 1
        assert all(after.counts[p] >= before.counts[p] for p in RANK_PHASES)
    for e in ranks:
        assert [e.counts[p] for p in RANK_PHASES] == sorted((e.counts[p] for p in RANK_PHASES), reverse=True)
        assert e.ready == e.counts["ready"]
        # ``phase`` is the furthest phase the whole world has reached.
        whole = [p for p in RANK_PHASES if e.counts[p] == 3]
        assert e.phase == (whole[-1] if whole else RANK_PHASES[0])
    # The world reaches the phases in their order, ending with every rank ready.
    firsts = [next(i for i, e in enumerate(ranks) if e.counts[p] == 3) for p in RANK_PHASES]
    assert firsts == sorted(firsts)
    assert ranks[-1].phase == "ready" and ranks[-1].ready == 3

    from hwtui.app.commands.replicate import Printer

    out = io.StringIO()
    printer = Printer(out, verbose=False)
    for e in events:
        printer(e)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("ranks:")]
    assert lines == ["ranks: 3/3 started (ready 0/3)", "ranks: 3/3 plan loaded (ready 0/3)",
                     lines[2], "ranks: 3/3 ready"]
    assert lines[2].startswith("ranks: 3/3 world joined (ready ")
