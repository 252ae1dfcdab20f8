"""The outer Nesterov merge, the typed worker config, --resume's hyper-parameter guard and the
recorded chunk assignment: in-process units, plus one pair of real runs proving that a recorded
assignment reproduces a dynamic-balance run bit for bit."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli_proc

torch = pytest.importorskip("torch")

from hwtui.app.cli import main  # noqa: E402
from hwtui.engine.training import checkpoint, resume  # noqa: E402
from hwtui.engine.training.config import (  # noqa: E402
    CONFIG_VERSION,
    ConfigError,
    ModelConfig,
    TrainConfig,
    TrainingError,
    WorkerConfig,
)
from hwtui.engine.training.merge import OuterNesterov  # noqa: E402
from hwtui.engine.training.queue import ChunkQueue  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
        self.register_buffer("count", torch.tensor([7], dtype=torch.int64))


def test_outer_nesterov_steps_on_the_averaged_delta_with_momentum():
    model = Tiny()
    outer = OuterNesterov(model, lr=0.7, momentum=0.9)
    a0 = torch.tensor([1.0, 2.0, 3.0])
    d1 = torch.tensor([0.1, -0.2, 0.0])
    out = outer.propose({"w": a0 - d1, "count": torch.tensor([9])})
    # m = d1; anchor - lr * (d1 + 0.9 * m) = anchor - 0.7 * 1.9 * d1
    assert torch.allclose(out["w"], a0 - 0.7 * 1.9 * d1) and out["count"].item() == 9  # integers keep the plain merge
    outer.reject()  # an aborted round leaves the state as it was
    assert torch.equal(outer.anchor["w"], a0) and torch.equal(outer.buf["w"], torch.zeros(3))
    out = outer.propose({"w": a0 - d1, "count": torch.tensor([9])})
    outer.accept()
    a1 = a0 - 0.7 * 1.9 * d1
    assert torch.allclose(outer.anchor["w"], a1)
    d2 = torch.tensor([0.05, 0.05, 0.05])
    m2 = 0.9 * d1 + d2
    out = outer.propose({"w": a1 - d2, "count": torch.tensor([9])})
    assert torch.allclose(out["w"], a1 - 0.7 * (d2 + 0.9 * m2))
    outer.accept()
    # The momentum is the state a checkpoint carries, and a new outer optimizer resumes from it.
    again = OuterNesterov(Tiny(), 0.7, 0.9, state=outer.state())
    assert torch.allclose(again.buf["w"], m2)


def test_outer_step_with_lr_1_and_no_momentum_is_plain_averaging():
    outer = OuterNesterov(Tiny(), lr=1.0, momentum=0.0)
    merged = {"w": torch.tensor([0.5, 0.25, 4.0]), "count": torch.tensor([7])}
    assert torch.allclose(outer.propose(merged)["w"], merged["w"])


def test_worker_config_crosses_once_as_json_and_refuses_another_version():
    ref = type("Ref", (), {"backend": "cpu", "index": 1})()
    cfg = TrainConfig(devices=(ref, ref), merge="outer-nesterov", outer_lr=0.5)
    wc = WorkerConfig.for_rank(cfg, 1, ref, 1234, None)
    wire = json.loads(json.dumps(wc.to_message()))
    assert WorkerConfig.from_message(wire) == wc and wc.cpu_workers == 2 and wc.outer_lr == 0.5
    with pytest.raises(ConfigError, match="different hwtui versions"):
        WorkerConfig.from_message({**wire, "version": CONFIG_VERSION + 1})
    with pytest.raises(ConfigError, match="missing"):
        WorkerConfig.from_message({**wire, "config": {k: v for k, v in wire["config"].items() if k != "lr"}})
    with pytest.raises(AttributeError):
        wc.lr = 1.0  # type: ignore[misc]  # frozen


@pytest.mark.parametrize("kw, needle", [
    ({"lr": float("nan")}, "lr must be a finite"), ({"outer_lr": float("inf")}, "outer_lr must be a finite"),
    ({"outer_momentum": 1.0}, "outer_momentum must be in"), ({"merge": "median"}, "merge 'median'"),
    ({"steps": 0}, "steps must be"), ({"overrides": frozenset({"heartbeat_timeout"})}, "not a hyper-parameter"),
])
def test_train_config_refuses_what_cannot_work(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        TrainConfig(devices=(), **kw)


def _checkpoint_dir(tmp_path: Path, **hyper) -> Path:
    cfg = TrainConfig(devices=(), **hyper)
    manifest = {"round": 2, "next_chunk": 40, "samples": 640, "model": cfg.model.to_dict(),
                "hyperparameters": cfg.hyperparameters()}
    checkpoint.save(tmp_path, 20, {"w": torch.ones(2)}, None, manifest)
    resume.write_assignments(tmp_path, 0, {1: {0: (0, 2), 1: (1, 3)}, 2: {0: (4,), 1: (5, 6, 7)},
                                           3: {0: (8, (11, 1, 2)), 1: (9, 10, (11, 0, 2))}})
    return tmp_path


def test_resume_refuses_changed_hyperparameters_unless_overridden(tmp_path):
    d = str(_checkpoint_dir(tmp_path, lr=3e-3, merge="outer-nesterov"))
    with pytest.raises(TrainingError, match=r"lr 0.003 -> 0.01.*--override lr"):
        resume.load(TrainConfig(devices=(), checkpoint_dir=d, resume=True, lr=0.01, merge="outer-nesterov"))
    with pytest.raises(TrainingError, match=r"merge 'outer-nesterov' -> 'average'"):
        resume.load(TrainConfig(devices=(), checkpoint_dir=d, resume=True, merge="average"))
    point = resume.load(TrainConfig(devices=(), checkpoint_dir=d, resume=True, lr=0.01, merge="outer-nesterov",
                                    overrides=frozenset({"lr"})))
    assert (point.step, point.round, point.next_chunk, point.samples) == (20, 2, 40, 640)
    assert point.replay == {3: {0: (8, (11, 1, 2)), 1: (9, 10, (11, 0, 2))}}  # rounds after the checkpoint, halves too
    assert json.loads((tmp_path / resume.ASSIGNMENTS).read_text())["rounds"]["3"]["0"] == [8, "11:1/2"]
    with pytest.raises(TrainingError, match="holds a model"):
        resume.load(TrainConfig(devices=(), checkpoint_dir=d, resume=True, merge="outer-nesterov",
                                model=ModelConfig(d_model=32)))


def test_queue_replays_a_recorded_assignment_and_ignores_one_that_does_not_fit():
    q = ChunkQueue("dynamic", next_chunk=8)
    assert q.start_round(3, 4, [0, 1], assignment={0: (8, 9, 11), 1: (10,)})
    assert [q.claim(1), q.claim(1), q.claim(0), q.claim(0), q.claim(0), q.claim(0)] == [10, None, 8, 9, 11, None]
    for cid, rank in ((8, 0), (9, 0), (10, 1), (11, 0)):
        q.complete(rank, cid)
    assert q.assignment() == {0: (8, 9, 11), 1: (10,)} and q.round_record(4)["assignment"] == {"0": [8, 9, 11], "1": [10]}
    assert not q.start_round(4, 4, [0, 1], assignment={0: (1, 2), 1: (3, 4)})  # other chunks: not used
    assert {c.owner for c in q.chunks.values()} == {None}


def test_read_assignments_refuses_what_is_not_one(tmp_path):
    bad = tmp_path / "x.json"
    for text in ("[1, 2", '{"rounds": {"1": {"0": [1, "2:2/2"]}}}', '{"rounds": {"1": {"0": [1.5]}}}'):
        bad.write_text(text)
        with pytest.raises(TrainingError, match="not a chunk assignment record"):
            resume.read_assignments(bad)
    assert resume.read_assignments(tmp_path / "absent.json") == {}


# -- real runs: a recorded assignment reproduces a dynamic run bit for bit ---------------------------

# HWTUI_TEST_HALVES: every round's last chunk goes out in two halves (the finer tail), so the
# recorded assignment surely holds pieces, whatever this machine's timing makes of the tail.
KNOBS = {"HWTUI_TEST_SLOWDOWN": "1:2", "HWTUI_TEST_HALVES": "1"}


def _train_argv(tmp: Path, name: str, *extra: str) -> list[str]:
    return ["train", "--gpu-ids", "cpu:0,cpu:1", "--steps", "10", "--batch-size", "5", "--merge-every", "5",
            "--eval-every", "100", "--merge", "outer-nesterov", "--context", "32", "--d-model", "32",
            "--checkpoint-dir", str(tmp / name), "--report", str(tmp / f"{name}.json"), *extra]


def _train(tmp: Path, name: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return cli_proc.run([sys.executable, "-m", "hwtui.app", *_train_argv(tmp, name, *extra)],
                        cwd=REPO, env={**os.environ, **KNOBS, **(env or {})}, capture_output=True, text=True, timeout=170)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _every_sample_once(rep: dict, batch: int) -> None:
    """Each round: its chunks covered exactly once (whole, or each half once), the samples exact."""
    from hwtui.engine.training.queue import covering_units, unit_parse, unit_samples

    for rnd in rep["rounds"]:
        lo, hi = rnd["chunks"]
        units = [unit_parse(u) for us in rnd["assignment"].values() for u in us]
        assert covering_units(list(range(lo, hi + 1)), units) is not None, rnd["assignment"]
        by_rank = {r: sum(unit_samples(unit_parse(u), batch) for u in us) for r, us in rnd["assignment"].items()}
        assert by_rank == rnd["samples_by"] and rnd["samples"] == sum(by_rank.values()) == (hi - lo + 1) * batch
        assert sum(rnd["done_by"].values()) == hi - lo + 1
    assert rep["samples"] == sum(r["samples"] for r in rep["rounds"]) == sum(w["samples"] for w in rep["workers"])


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_replayed_assignment_reproduces_the_run_bit_for_bit_and_resume_guards_hyperparameters(tmp_path, monkeypatch, capsys):
    # a's workers are forked from the launcher (the default), b's exec'd (HWTUI_FORK_RANKS=0): -v
    # says which and why, and the bytes below show both start the same training. a is the CLI (a
    # test process may hold a thread another test left, and then forks nothing); b and what follows
    # run in-process with the same command line and knobs (each CLI start costs an `import torch`).
    a = _train(tmp_path, "a", "-v")
    assert a.returncode == 0, a.stderr
    for knob, value in {**KNOBS, "HWTUI_FORK_RANKS": "0"}.items():
        monkeypatch.setenv(knob, value)
    capsys.readouterr()
    assert main(_train_argv(tmp_path, "b", "-v", "--replay-assignment", str(tmp_path / "a.json"))) == 0
    b_out = capsys.readouterr().out
    monkeypatch.delenv("HWTUI_FORK_RANKS")
    for rank in (0, 1):
        assert f"worker {rank} (cpu:{rank}) forked from the launcher (pid " in a.stdout, a.stdout
        assert re.search(rf"worker {rank} \(cpu:{rank}\) exec'd, not forked \(pid \d+\): HWTUI_FORK_RANKS=0\n", b_out), b_out
    rep_a, rep_b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    # Every round ended on a chunk cut in two (batch 5: rows 0-1 and 2-4; the tail rule may cut
    # others too), recorded and replayed.
    assert all(r["pieces"] >= 2 and r["pieces"] % 2 == 0 for r in rep_a["rounds"]), rep_a["rounds"]
    assert [r["assignment"] for r in rep_a["rounds"]] == [r["assignment"] for r in rep_b["rounds"]]
    assert all(r["replayed"] for r in rep_b["rounds"]) and not any(r["replayed"] for r in rep_a["rounds"])
    for rep in (rep_a, rep_b):
        _every_sample_once(rep, 5)
    ck_a, ck_b = tmp_path / "a" / "ckpt-00000010", tmp_path / "b" / "ckpt-00000010"
    for f in (checkpoint.MODEL_FILE, checkpoint.OPTIMIZER_FILE, checkpoint.OUTER_FILE):
        assert _sha(ck_a / f) == _sha(ck_b / f), f  # the outer momentum is checkpointed too
    assert json.loads((tmp_path / "a" / resume.ASSIGNMENTS).read_text())["rounds"]["2"] == rep_a["rounds"][1]["assignment"]
    # --resume from round 1's checkpoint (round 2's is gone) replays round 2 as recorded, halves
    # included, and lands on the same weights as the run that recorded it.
    shutil.copytree(tmp_path / "a", tmp_path / "c")
    shutil.rmtree(tmp_path / "c" / "ckpt-00000010")
    assert main(_train_argv(tmp_path, "c", "--resume")) == 0, capsys.readouterr().err[-2000:]
    rep_c = json.loads((tmp_path / "c.json").read_text())
    assert [r["round"] for r in rep_c["rounds"]] == [2] and rep_c["rounds"][0]["replayed"]
    assert rep_c["rounds"][0]["assignment"] == rep_a["rounds"][1]["assignment"]
    for f in (checkpoint.MODEL_FILE, checkpoint.OPTIMIZER_FILE, checkpoint.OUTER_FILE):
        assert _sha(ck_a / f) == _sha(tmp_path / "c" / "ckpt-00000010" / f), f
    # --resume with another --lr is refused before any worker starts, and says how to allow it.
    capsys.readouterr()
    assert main(_train_argv(tmp_path, "a", "--resume", "--steps", "15", "--lr", "0.01")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--override lr" in err, err


def test_cli_and_engine_agree_on_the_default_merge():
    import argparse

    from hwtui.app.commands.train import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    cfg = TrainConfig(devices=())
    # outer-nesterov 0.7 / 0.5: the setting measured to beat averaging (docs/training.md, Measured)
    assert (args.merge, args.outer_lr, args.outer_momentum) == (cfg.merge, cfg.outer_lr, cfg.outer_momentum) \
        == ("outer-nesterov", 0.7, 0.5)
