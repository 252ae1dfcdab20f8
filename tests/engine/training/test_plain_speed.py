"""What takes per-step overhead off the critical path (issue 24): several units granted per claim
when chunks are short, fused AdamW, evaluations sized to the work. Coordinator decisions are
checked on a Coordinator that runs no processes (its replies are captured); no timing asserted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hwtui.engine.training.config import TrainConfig
from hwtui.engine.training.launcher import Coordinator, Phase
from hwtui.engine.training.worker import AHEAD_SECONDS, ahead_depth
from hwtui.engine.training.workers import MAX_AHEAD, WorkerState


def cpu(i: int) -> SimpleNamespace:
    return SimpleNamespace(backend="cpu", index=i, spec=f"cpu:{i}", vendor="cpu", name="CPU")


def coordinator(n: int, **cfg) -> tuple[Coordinator, list[list[dict]]]:
    coord = Coordinator(TrainConfig(devices=tuple(cpu(i) for i in range(n)), **cfg), lambda ev: None)
    sent: list[list[dict]] = []
    for rank in range(n):
        w = WorkerState(rank, cpu(rank), child=SimpleNamespace(proc=None))
        w.hello = {"fingerprint": "x"}
        box: list[dict] = []
        w.send = box.append  # type: ignore[method-assign]  # capture what the worker would be sent
        sent.append(box)
        coord.workers.append(w)
        coord.live.add(rank)
    coord.phase = Phase.TRAINING
    coord._next_round()
    for w in coord.workers:
        w.gen = coord.gen
    return coord, sent


def test_ahead_depth_is_one_chunk_unless_chunks_are_short():
    assert ahead_depth(None) == 1 and ahead_depth(0.0) == 1
    assert ahead_depth(0.050) == 1 and ahead_depth(AHEAD_SECONDS) == 1
    assert ahead_depth(AHEAD_SECONDS / 5) == 5
    assert ahead_depth(1e-6) == MAX_AHEAD


def test_a_claim_for_several_units_is_answered_with_them_in_one_message():
    coord, sent = coordinator(1, steps=20, merge_every=20)
    w = coord.workers[0]
    w.pending = {"kind": "claim", "done": None, "ahead": 4}
    coord._advance()
    assert len(sent[0]) == 1 and sent[0][0]["kind"] == "chunks"
    assert [u["chunk"] for u in sent[0][0]["units"]] == [0, 1, 2, 3, 4]  # the one to train + 4 ahead
    assert w.held == [0, 1, 2, 3, 4] and w.chunks_claimed == 5 and w.pending is None


@pytest.mark.parametrize("claim", [{}, {"ahead": 1}])
def test_one_chunk_ahead_is_one_chunk_per_claim_as_before(claim):
    coord, sent = coordinator(1, steps=20, merge_every=20)
    coord.workers[0].pending = {"kind": "claim", "done": None, **claim}
    coord._advance()
    assert sent[0] == [{"kind": "chunk", "chunk": 0}]


def test_a_claim_never_takes_more_than_the_round_holds():
    coord, sent = coordinator(1, steps=3, merge_every=3)
    coord.workers[0].pending = {"kind": "claim", "done": None, "ahead": MAX_AHEAD + 50}
    coord._advance()
    assert [u["chunk"] for u in sent[0][0]["units"]] == [0, 1, 2]


@pytest.mark.parametrize("devices, last, local, windows", [
    (1, False, False, 40),   # solo: no pre-merge copy to compare; before the last round, one round's windows
    (1, True, False, 256),   # the last round: every --eval-windows
    (2, False, True, 40),
    (2, True, True, 256),
])
def test_evaluations_are_sized_to_the_work(devices, last, local, windows):
    steps = 10 if last else 40
    coord, sent = coordinator(devices, steps=steps, merge_every=10, batch_size=4, eval_every=1)
    for w in coord.workers:  # every chunk of the round trained
        while (unit := coord.queue.claim(w.rank)) is not None:
            coord.queue.complete(w.rank, unit)
    for w in coord.workers:
        w.pending = {"kind": "reduced"}
    coord._commit(coord.workers)
    commit = sent[0][-1]
    assert commit["kind"] == "commit" and commit["evaluate"] is True
    assert commit["evaluate_local"] is local and commit["eval_windows"] == windows
    assert coord.awaiting == ({0, 1} if local else {0})


def test_the_optimizer_is_fused_where_torch_has_the_kernel_and_merges_the_same_names():
    import torch

    from hwtui.engine.training import merge
    from hwtui.engine.training.worker import make_optimizer

    model = torch.nn.Linear(3, 2)
    opt = make_optimizer(model, 1e-3)
    assert opt.param_groups[0]["fused"] is True  # torch >= 2.4 has a fused AdamW for CPU
    merge.ensure_optimizer_state(opt)
    names = merge.optimizer_tensors(opt, model)
    assert sorted(names) == ["bias/exp_avg", "bias/exp_avg_sq", "bias/step", "weight/exp_avg", "weight/exp_avg_sq",
                             "weight/step"]
    model(torch.randn(4, 3)).sum().backward()
    opt.step()  # the step counts the fused kernel reads sit where it reads them
    merge.load_optimizer_tensors(opt, model, {k: v.clone() for k, v in merge.optimizer_tensors(opt, model).items()})
    opt.step()
    assert float(opt.state[model.weight]["step"]) == 2.0
