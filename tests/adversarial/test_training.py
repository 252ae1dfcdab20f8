"""Training under hostile settings and diverging models (issue 12, item 4), and the checkpoint
manifest as hostile input (item 7).

* non-finite settings are a usage error (exit 2, one line), before any process starts;
* a model that goes non-finite stops the run with exit 1, names the worker, its step and the
  round, never commits that round's checkpoint (latest.json keeps naming the last good one), and
  every line of --events and the --report are strict JSON (no bare NaN);
* ``checkpoint.verify`` / ``checkpoint.latest`` on any bytes: a clean CheckpointError / None,
  never another exception, never a file outside the checkpoint read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtui.app.cli import main

REPO = Path(__file__).resolve().parents[2]


def _strict(text: str) -> object:
    """json.loads that refuses NaN / Infinity, which Python's json would otherwise accept."""
    def refuse(name: str) -> object:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("argv", [
    ["--lr", "nan"], ["--lr", "inf"], ["--lr", "1e999"], ["--lr=-inf"], ["--lr", "NaN"],
    ["--heartbeat-timeout", "nan"], ["--stall-timeout", "inf"], ["--group-timeout", "1e400"],
])
def test_non_finite_settings_are_exit_2_in_one_line(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--gpu-ids", "cpu:0", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must be a finite number" in err and argv[0].split("=")[0] in err


@pytest.mark.torch
@pytest.mark.timeout(200)
def test_a_diverged_worker_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    # Rank 1 writes NaN into its weights on entering merge round 2: round 1 (step 5) is committed
    # and checkpointed, round 2 must be neither.
    p = subprocess.run(
        [sys.executable, "-m", "hwtui.app", "train", "--gpu-ids", "cpu:0,cpu:1", "--steps", "20", "--batch-size", "4",
         "--merge-every", "5", "--eval-every", "100", "--checkpoint-dir", str(ckpt), "--events", str(tmp_path / "ev.jsonl"),
         "--report", str(tmp_path / "r.json")],
        cwd=REPO, env={**os.environ, "HWTUI_TEST_FAULT": "1:nan:merge=2"}, capture_output=True, text=True, timeout=180)
    assert p.returncode == 1, p.stderr
    errors = [line for line in p.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "worker 1 (cpu:1) diverged" in errors[0], p.stdout
    assert "round 2" in errors[0] and "at its step" in errors[0] and "merged model at step 5" in errors[0]
    assert "ckpt-00000005" in errors[0]  # names the checkpoint that stays the good one
    assert "Traceback" not in p.stderr
    assert json.loads((ckpt / "latest.json").read_text())["dir"] == "ckpt-00000005"
    assert sorted(d.name for d in ckpt.iterdir() if d.name.startswith("ckpt-")) == ["ckpt-00000005"]
    from hwtui.engine.training import checkpoint

    path, doc = checkpoint.latest(ckpt)
    assert doc["step"] == 5
    import torch

    model, _opt = checkpoint.load_tensors(path)
    assert all(bool(torch.isfinite(t).all()) for t in model.values() if t.is_floating_point())
    events = [_strict(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["kind"] == "train.checkpoint"] == [5]
    assert [e["step"] for e in events if e["kind"] == "train.merge"] == [5]
    assert events[-1]["kind"] == "train.done" and events[-1]["ok"] is False
    report = _strict((tmp_path / "r.json").read_text())
    assert report["step"] == 5 and "diverged" in report["failure"] and report["ok"] is False


def test_checkpoint_save_refuses_non_finite_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    from hwtui.engine.training import checkpoint

    good = checkpoint.save(tmp_path, 1, {"w": torch.ones(3)}, None, {"round": 1})
    with pytest.raises(checkpoint.CheckpointError, match="NaN or infinity"):
        checkpoint.save(tmp_path, 2, {"w": torch.tensor([1.0, float("inf")])}, None, {"round": 2})
    with pytest.raises(checkpoint.CheckpointError, match="exp_avg"):
        checkpoint.save(tmp_path, 2, {"w": torch.ones(3)}, {"w/exp_avg": torch.tensor([float("nan")])}, {"round": 2})
    assert checkpoint.latest(tmp_path)[0] == good and not (tmp_path / "ckpt-00000002").exists()


# -- the checkpoint manifest as hostile input -------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
                     max_leaves=20)
_manifest_like = st.fixed_dictionaries(
    {"schema": st.sampled_from(["hwtui.train-checkpoint/1", "other", 3])},
    optional={"step": _json | st.integers(-5, 10**30), "round": _json, "next_chunk": _json,
              "files": _json | st.dictionaries(st.sampled_from(["model.safetensors", "optimizer.safetensors",
                                                                "../secret", "/etc/passwd", "x"]), _json, max_size=3)},
)
_bytes = st.one_of(
    st.binary(max_size=200),
    _json.map(lambda v: json.dumps(v).encode()),
    _manifest_like.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
    st.just(b"[" * 100_000),  # deeper than the parser's recursion limit
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(manifest=_bytes, pointer=_bytes)
def test_manifest_and_latest_pointer_never_raise_anything_but_a_clean_error(tmp_path_factory, manifest, pointer):
    from hwtui.engine.training import checkpoint

    root = tmp_path_factory.mktemp("ck")
    (root / "secret").write_text("not a checkpoint file")
    d = root / "ckpt-00000007"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"\0" * 8)
    (d / "manifest.json").write_bytes(manifest)
    (root / "latest.json").write_bytes(pointer)
    try:
        checkpoint.verify(d)
    except checkpoint.CheckpointError as exc:
        assert "\n" not in str(exc)
    found = checkpoint.latest(root)  # may only ever return a checkpoint that verified
    assert found is None or (found[0] == d and found[1]["schema"] == checkpoint.SCHEMA)


def test_latest_pointer_cannot_point_outside_the_checkpoint_dir(tmp_path):
    torch = pytest.importorskip("torch")
    from hwtui.engine.training import checkpoint

    elsewhere = tmp_path / "elsewhere"
    good_elsewhere = checkpoint.save(elsewhere, 9, {"w": torch.ones(2)}, None, {"round": 1})
    root = tmp_path / "root"
    mine = checkpoint.save(root, 3, {"w": torch.ones(2)}, None, {"round": 1})
    (root / "latest.json").write_text(json.dumps({"dir": f"../elsewhere/{good_elsewhere.name}"}))
    assert checkpoint.latest(root)[0] == mine
    (root / "ckpt-00000004").mkdir()
    (root / "ckpt-00000004" / "manifest.json").write_text(json.dumps(
        {"schema": checkpoint.SCHEMA, "step": 4, "files": {"../../elsewhere/ckpt-00000009/model.safetensors": "x"}}))
    assert checkpoint.latest(root)[0] == mine  # the hostile manifest does not verify
