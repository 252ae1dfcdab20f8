"""Checkpoints: atomic commit, verification, fallback, and a writer killed mid-checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hwtui.engine.training import checkpoint  # noqa: E402

MANIFEST = {"round": 1, "next_chunk": 20, "model": {"d_model": 4}, "workers": [{"rank": 0, "device": "cpu:0", "vendor": "CPU"}]}


def tensors(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((64, 64), value), "positions": torch.arange(8, dtype=torch.int64)}


def test_save_load_latest_and_fallback(tmp_path: Path):
    checkpoint.save(tmp_path, 10, tensors(1.0), {"w/exp_avg": torch.zeros(3)}, MANIFEST)
    p20 = checkpoint.save(tmp_path, 20, tensors(2.0), None, MANIFEST)
    path, doc = checkpoint.latest(tmp_path)
    assert path == p20 and doc["step"] == 20 and doc["workers"][0]["vendor"] == "CPU"
    model, opt = checkpoint.load_tensors(path)
    assert torch.equal(model["w"], torch.full((64, 64), 2.0)) and model["positions"].dtype == torch.int64
    assert opt is None
    # Corrupt the newest: latest() must fall back to the one that still verifies.
    with open(p20 / checkpoint.MODEL_FILE, "r+b") as fh:
        fh.seek(-4, os.SEEK_END)
        fh.write(b"\0\0\0\0")
    path, doc = checkpoint.latest(tmp_path)
    assert doc["step"] == 10 and checkpoint.load_tensors(path)[1] is not None


def test_keep_prunes_old_checkpoints(tmp_path: Path):
    for step in (1, 2, 3, 4):
        checkpoint.save(tmp_path, step, tensors(step), None, MANIFEST, keep=2)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-00000003", "ckpt-00000004"]


_WRITER = """
import sys, torch
from hwtui.engine.training import checkpoint
checkpoint.save(sys.argv[1], 20, {"w": torch.full((256, 256), 2.0)}, None, {"round": 2})
"""


@pytest.mark.timeout(60)
def test_kill_during_checkpoint_write_keeps_the_previous_one(tmp_path: Path):
    first = checkpoint.save(tmp_path, 10, tensors(1.0), None, MANIFEST)
    env = dict(os.environ, HWTUI_TEST_CHECKPOINT_DELAY="30")
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 45
        # Wait until the writer has put the tensors in its temporary directory, then kill it there.
        while not any(p.name == checkpoint.MODEL_FILE for t in tmp_path.glob(".tmp-*") for p in t.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "writer never reached the data file"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads((tmp_path / checkpoint.LATEST).read_text())["dir"] == first.name
    path, doc = checkpoint.latest(tmp_path)
    assert path == first and doc["step"] == 10
    assert not (tmp_path / "ckpt-00000020").exists()
    assert torch.equal(checkpoint.load_tensors(path)[0]["w"], torch.full((64, 64), 1.0))
