"""``hwtui eval`` and ``hwtui sample`` on a checkpoint (in-process, a tiny model)."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")

from hwtui.app.cli import main  # noqa: E402
from hwtui.engine.training import checkpoint  # noqa: E402
from hwtui.engine.training.data import load_corpus  # noqa: E402
from hwtui.engine.training.evaluate import heldout_loss, load  # noqa: E402
from hwtui.engine.training.model import ModelConfig, build_model  # noqa: E402

TINY = ModelConfig(context=16, d_model=8, layers=1, heads=2)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: on a shared 2-core box torch's default threads make evaluation 10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory, one_thread):
    """A tiny model trained for a few steps, so its loss is well below uniform (ln 256 = 5.55)."""
    root = tmp_path_factory.mktemp("ck")
    model = build_model(TINY, seed=3)
    corpus = load_corpus()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    from hwtui.engine.training.data import chunk_batch

    for i in range(30):
        x, y = chunk_batch(corpus, i, 32, TINY.context, 0)
        opt.zero_grad()
        model.loss(x, y).backward()
        opt.step()
    checkpoint.save(root, 30, dict(model.state_dict()), None, {"round": 1, "model": TINY.to_dict()})
    return root


def test_eval_default_is_the_whole_heldout_set_and_repeats_exactly(ckpt_dir, capsys):
    assert main(["eval", "--checkpoint-dir", str(ckpt_dir), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["eval", "--checkpoint-dir", str(ckpt_dir), "--json", "--threads", "1"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert first == second and first["whole_heldout_set"] is True and first["stderr"] == 0.0
    corpus = load_corpus()
    assert first["windows"] == len(range(0, corpus.heldout.numel() - TINY.context - 1, TINY.context))
    assert 1.0 < first["loss"] < 5.0 and first["step"] == 30
    # The same figure computed directly, and a sampled estimate that agrees within its error.
    model = load(ckpt_dir).model
    assert heldout_loss(model).loss == pytest.approx(first["loss"], abs=1e-9)
    sampled = heldout_loss(model, 1000, seed=5)
    assert not sampled.complete and abs(sampled.loss - first["loss"]) < 5 * sampled.stderr
    assert main(["eval", "--checkpoint-dir", str(ckpt_dir), "--windows", "300"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("held-out loss ") and "300 windows (+-" in out and "step 30" in out


def test_sample_continues_the_prompt(ckpt_dir, capsysbinary):
    assert main(["sample", "--checkpoint-dir", str(ckpt_dir), "--prompt", "import ", "--length", "50", "--seed", "1"]) == 0
    out = capsysbinary.readouterr().out
    assert out.startswith(b"import ") and len(out) == len(b"import ") + 50 + 1
    assert main(["sample", "--checkpoint-dir", str(ckpt_dir), "--prompt", "import ", "--length", "50", "--seed", "1"]) == 0
    assert capsysbinary.readouterr().out == out  # a seed makes it repeatable
    assert main(["sample", "--checkpoint-dir", str(ckpt_dir), "--length", "20", "--temperature", "0"]) == 0


@pytest.mark.parametrize("argv, needle", [
    (["eval", "--checkpoint-dir", "{missing}"], "not a directory"),
    (["eval", "--checkpoint-dir", "{empty}"], "no complete checkpoint"),
    (["eval", "--checkpoint-dir", "{corrupt}"], "no complete checkpoint"),
    (["eval", "--checkpoint-dir", "{ck}", "--windows", "1"], "--windows must be between"),
    (["sample", "--checkpoint-dir", "{ck}", "--temperature", "nan"], "--temperature must be a finite"),
    (["sample", "--checkpoint-dir", "{ck}", "--length", "0"], "--length must be between"),
])
def test_bad_input_is_one_line_exit_2(ckpt_dir, tmp_path, capsys, argv, needle):
    (tmp_path / "empty").mkdir()
    corrupt = tmp_path / "corrupt"
    shutil.copytree(ckpt_dir, corrupt)
    for model_file in corrupt.glob("ckpt-*/model.safetensors"):
        model_file.write_bytes(b"\0" * 16)
    paths = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "corrupt": corrupt, "ck": ckpt_dir}
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hwtui: error: ") and needle in err and err.count("\n") == 1
