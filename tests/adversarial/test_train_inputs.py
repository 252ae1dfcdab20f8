"""Extreme numbers given to `hwtui train` (issue 22 F8): one line, exit 2, before any worker starts.

`--group-timeout 1e308` was an OverflowError in the TCPStore (exit 3), `--group-timeout 1e-308` a
DistNetworkError traceback, `--stall-timeout 1e308` a worker deadline past time_t, `--eval-windows
1e14` a worker that died allocating, `--seed 1e23` an overflow inside the worker and
`--keep-checkpoints 0` a run that keeps no checkpoint at all.
"""

from __future__ import annotations

import pytest

from hwtui.app.cli import main

BIG = "9" * 400

CASES = [
    ("--group-timeout", "1e308"), ("--group-timeout", "1e-308"), ("--group-timeout", "0.5"), ("--group-timeout", "-1"),
    ("--heartbeat-timeout", "1e308"), ("--heartbeat-timeout", "0.001"), ("--stall-timeout", "1e308"),
    ("--stall-timeout", "1e-9"), ("--group-timeout", "inf"), ("--stall-timeout", "nan"), ("--lr", "1e999"),
    ("--outer-momentum", "1"), ("--outer-lr", "-0.0"),
    ("--steps", BIG), ("--steps", "1000000001"), ("--batch-size", BIG), ("--merge-every", BIG), ("--eval-every", BIG),
    ("--checkpoint-every", BIG), ("--eval-windows", "99999999999999"), ("--context", BIG), ("--d-model", BIG),
    ("--layers", BIG), ("--heads", BIG), ("--keep-checkpoints", "0"), ("--keep-checkpoints", "-5"),
    ("--keep-checkpoints", BIG), ("--seed", "99999999999999999999999"), ("--seed", "-" + BIG), ("--steps", "0"),
    ("--steps", "1e3"), ("--batch-size", "-1"),
]


@pytest.mark.parametrize(("flag", "value"), CASES, ids=[f"{f}={v[:12]}" for f, v in CASES])
def test_extreme_train_numbers_are_one_line_exit_2(capsys, flag, value):
    try:
        code = main(["train", "--gpu-ids", "cpu:0", flag, value])
    except SystemExit as exc:  # argparse's own refusal (a type error): also one line, exit 2
        code = exc.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and len(lines[0]) < 300 and flag.lstrip("-").split("-")[0] in lines[0], err
    assert "Traceback" not in err


def test_the_bounds_themselves_are_accepted(capsys):
    """The edges are valid input: only the validation runs here (an unknown device stops it after)."""
    code = main(["train", "--gpu-ids", "nosuch:0", "--group-timeout", "604800", "--heartbeat-timeout", "2",
                 "--stall-timeout", "1", "--steps", "1000000000", "--eval-windows", str(1 << 20), "--seed", str(2**63 - 1)])
    err = capsys.readouterr().err
    assert code == 2 and "nosuch" in err, err


def test_the_coordinator_refuses_an_unrepresentable_group_timeout_in_one_line():
    """A TrainConfig built without the CLI (the TUI, a script) meets the same bound at the store."""
    pytest.importorskip("torch")
    from hwtui.core.events import Fanout
    from hwtui.engine.training.config import TrainConfig, TrainingError
    from hwtui.engine.training.launcher import Coordinator
    from hwtui.probes.gpu_ids import parse_gpu_ids

    refs = parse_gpu_ids("cpu:0", [])
    events: list = []
    coord = Coordinator(TrainConfig(devices=tuple(refs), group_timeout=1e308), Fanout(events.append))
    with pytest.raises(TrainingError, match="group timeout 1e\\+308 s is beyond what the store takes"):
        coord.run()
