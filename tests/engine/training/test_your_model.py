"""``hwtui train --model / --data / --save-hf`` (issue 24): your model, your text, a model people can use.

Real worker processes over gloo on loopback; transformers builds the Hugging Face model from a
local config directory (``HF_HUB_OFFLINE=1``: nothing is ever downloaded).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwtui.app.cli import main
from tests import cli_proc

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[3]
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
       "TRANSFORMERS_VERBOSITY": "error"}
os.environ.update(ENV)  # the in-process CLI calls too
GPT2 = {"model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128,
        "architectures": ["GPT2LMHeadModel"]}
WORDS = ("the quick brown fox jumps over a lazy dog while seven cats sing old songs about rivers and hills "
         "under grey skies").split()


def write_text(path: Path, lines: int = 600) -> Path:
    import random

    rng = random.Random(1)
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(lines)) + "\n")
    return path


def model_dir(path: Path, **config) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**GPT2, **config}))
    return path


def hwtui(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return cli_proc.run([sys.executable, "-m", "hwtui.app", *args], cwd=REPO, env={**os.environ, **ENV},
                        capture_output=True, text=True, timeout=timeout)


def heldout_loss(model, text: bytes, context: int = 64) -> float:
    """Mean next-byte loss over the non-overlapping windows of the last tenth (the held-out split)."""
    import torch
    import torch.nn.functional as F

    held = torch.frombuffer(bytearray(text[len(text) - len(text) // 10:]), dtype=torch.uint8).long()
    starts = torch.arange(0, held.numel() - context - 1, context)
    seq = held[starts[:, None] + torch.arange(context + 1)[None, :]]
    with torch.no_grad():
        logits = model(input_ids=seq[:, :-1]).logits.float()
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1)))


# -- the must-show run: a GPT-2 config, plain text, two CPU workers, --save-hf ---------------------

@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2")
    cfg_dir, text = model_dir(root / "gpt2"), write_text(root / "text.txt")
    out, ck, report = root / "out", root / "ck", root / "report.json"
    proc = hwtui("train", "--model", str(cfg_dir), "--data", str(text), "--gpu-ids", "cpu:0,cpu:1", "--steps", "60",
                 "--save-hf", str(out), "--checkpoint-dir", str(ck), "--report", str(report), "--group-timeout", "60")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {"dir": cfg_dir, "text": text, "out": out, "ck": ck, "report": json.loads(report.read_text()), "proc": proc}


def test_save_hf_loads_with_transformers_and_beats_the_untrained_model(gpt2_run):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = gpt2_run["out"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    trained = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, use_safetensors=True).eval()
    torch.manual_seed(0)  # the run's --seed: the same random init the workers started from
    untrained = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(gpt2_run["dir"])).eval()
    text = gpt2_run["text"].read_bytes()
    before, after = heldout_loss(untrained, text), heldout_loss(trained, text)
    assert after <= 0.8 * before, (before, after)
    assert gpt2_run["report"]["save_hf"] == {"path": str(out), "ok": True, "error": None}
    assert gpt2_run["report"]["config"]["model_source"] == str(gpt2_run["dir"])
    assert not list(out.parent.glob(".tmp-*"))  # the temporary directory became OUT


def test_checkpoint_holds_the_merged_model_under_its_own_names(gpt2_run):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ck = json.loads((gpt2_run["ck"] / "latest.json").read_text())["dir"]
    saved = load_file(str(gpt2_run["ck"] / ck / "model.safetensors"))
    exported = AutoModelForCausalLM.from_pretrained(gpt2_run["out"], local_files_only=True).state_dict()
    assert set(exported) <= set(saved)
    for name, tensor in exported.items():
        assert saved[name].equal(tensor), name
    manifest = json.loads((gpt2_run["ck"] / ck / "manifest.json").read_text())
    assert manifest["model_source"] == str(gpt2_run["dir"]) and manifest["step"] == 60


def test_eval_and_sample_take_the_saved_model(gpt2_run, capsys):
    from transformers import AutoModelForCausalLM

    assert main(["eval", "--model", str(gpt2_run["out"]), "--data", str(gpt2_run["text"]), "--json",
                 "--threads", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    model = AutoModelForCausalLM.from_pretrained(gpt2_run["out"], local_files_only=True).eval()
    assert doc["loss"] == pytest.approx(heldout_loss(model, gpt2_run["text"].read_bytes()), rel=1e-4)
    assert doc["loss"] == pytest.approx(gpt2_run["report"]["final_loss"], abs=0.15)  # 256 sampled windows vs all
    assert main(["sample", "--model", str(gpt2_run["out"]), "--prompt", "the ", "--length", "40",
                 "--temperature", "0", "--threads", "1"]) == 0
    sampled = capsys.readouterr().out
    assert sampled.startswith("the ") and len(sampled.encode()) >= 40


def test_eval_of_a_checkpoint_of_another_model_points_to_save_hf(gpt2_run, capsys):
    assert main(["eval", "--checkpoint-dir", str(gpt2_run["ck"])]) == 2
    err = capsys.readouterr().err.strip()
    assert "trained with --model" in err and "--save-hf" in err and len(err.splitlines()) == 1


def test_resume_refuses_another_model(gpt2_run, capsys):
    code = main(["train", "--gpu-ids", "cpu:0", "--steps", "80", "--checkpoint-dir", str(gpt2_run["ck"]), "--resume"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "holds --model" in err and len(err.splitlines()) == 1


# -- package.module:function ----------------------------------------------------------------------

def test_a_function_returning_a_module_trains_merges_and_checkpoints_by_name(tmp_path):
    from safetensors.torch import load_file

    ck, report = tmp_path / "ck", tmp_path / "report.json"
    proc = hwtui("train", "--model", "tests.engine.training._models:tiny", "--data", str(write_text(tmp_path / "t.txt")),
                 "--gpu-ids", "cpu:0,cpu:1", "--steps", "20", "--merge-every", "10", "--checkpoint-dir", str(ck),
                 "--report", str(report), "--group-timeout", "60")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(report.read_text())
    assert doc["step"] == 20 and doc["config"]["params"] == 256 * 16 + 16 * 16 + 16 + 16 * 256 + 256
    assert doc["final_loss"] < 5.0  # ln 256 = 5.55 at random
    ckpt = json.loads((ck / "latest.json").read_text())["dir"]
    assert sorted(load_file(str(ck / ckpt / "model.safetensors"))) == ["emb.weight", "head.bias", "head.weight",
                                                                       "mix.bias", "mix.weight"]


@pytest.mark.parametrize("target, needle", [
    ("tests.engine.training._models:raises", "raised RuntimeError: no model today"),
    ("tests.engine.training._models:not_a_module", "returned dict, not a torch nn.Module"),
    ("tests.engine.training._models:nowhere", "cannot import it"),
    ("tests.engine.training._models:small_vocab", "vocabulary holds 100 ids; bytes need 256"),
])
def test_a_bad_function_is_one_line_exit_2_before_training(tmp_path, capsys, target, needle):
    # In-process, as test_bad_model_and_data_... below: the check runs in the launcher before any
    # worker, and a CLI process per case cost the suite an `import torch` each.
    ck, report = tmp_path / "ck", tmp_path / "report.json"
    code = main(["train", "--model", target, "--gpu-ids", "cpu:0", "--steps", "5", "--checkpoint-dir", str(ck),
                 "--report", str(report)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err[-2000:]
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err, err[-2000:]
    assert not ck.exists() and not report.exists()


# -- bad --model / --data / --save-hf: one line, exit 2, nothing written (checked before any worker) --

def _tokenizer_dir(path: Path, tokens: int) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(tokens - 1)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    return path


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    text = write_text(tmp / "ok.txt")
    gpt = model_dir(tmp / "gpt")
    empty = tmp / "empty.txt"
    empty.write_text("  \n")
    nul = tmp / "nul.txt"
    nul.write_bytes(b"some text\0more")
    latin = tmp / "latin.txt"
    latin.write_bytes("caf\xe9".encode("latin-1") * 100)
    fifo = tmp / "fifo.txt"
    os.mkfifo(fifo)
    bad_jsonl = tmp / "bad.jsonl"
    bad_jsonl.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    no_txt = tmp / "no_txt"
    no_txt.mkdir()
    (no_txt / "a.md").write_text("not picked")
    no_config = tmp / "no_config"
    no_config.mkdir()
    pickle = model_dir(tmp / "pickle")
    (pickle / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    big_tok = _tokenizer_dir(model_dir(tmp / "big_tok"), 300)
    m = ["--model", str(gpt)]
    return {
        "no config.json": (["--model", str(no_config), "--data", str(text)], "no config.json"),
        "unknown architecture": (["--model", str(model_dir(tmp / "arch", model_type="no-such-arch")),
                                  "--data", str(text)], "unknown or unusable architecture"),
        "pickle only": (["--model", str(pickle)], "pickle, never loaded"),
        "no such model": (["--model", str(tmp / "nowhere")], "nothing is downloaded"),
        "tokenizer larger than the vocabulary": (["--model", str(big_tok), "--data", str(text)],
                                                 "tokenizer has 300 tokens but the model's vocabulary only 256"),
        "bytes need 256": (["--model", str(model_dir(tmp / "v100", vocab_size=100)), "--data", str(text)],
                           "bytes need 256"),
        "context beyond positions": ([*m, "--context", "200"], "at most 128 positions"),
        "empty data": ([*m, "--data", str(empty)], "empty"),
        "binary data": ([*m, "--data", str(nul)], "binary data"),
        "not UTF-8": ([*m, "--data", str(latin)], "not UTF-8"),
        "unreadable data": ([*m, "--data", str(fifo)], "cannot read it"),
        "missing data": ([*m, "--data", str(tmp / "none.txt")], "no such file"),
        "bad jsonl": ([*m, "--data", str(bad_jsonl)], 'line 2 has no "text" string'),
        "no .txt in a directory": ([*m, "--data", str(no_txt)], "no .txt files"),
        "too little text": ([*m, "--data", str(write_text(tmp / "short.txt", lines=3))], "too little"),
        "save-hf without a model dir": (["--save-hf", str(tmp / "new")], "needs --model DIR"),
        "save-hf exists": ([*m, "--save-hf", str(text)], "already exists"),
    }


def test_bad_model_and_data_are_one_line_exit_2_nothing_written(tmp_path, capsys):
    cases = _bad_inputs(tmp_path)
    for name, (argv, needle) in cases.items():
        ck, report = tmp_path / f"ck-{len(name)}", tmp_path / f"r-{len(name)}.json"
        code = main(["train", "--gpu-ids", "cpu:0", "--steps", "5", *argv, "--checkpoint-dir", str(ck),
                     "--report", str(report)])
        err = capsys.readouterr().err.strip()
        assert code == 2, (name, err)
        assert needle in err and len(err.splitlines()) == 1, (name, err)
        assert not ck.exists() and not report.exists(), name
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".tmp-*"))


def test_jsonl_and_a_directory_of_txt_read_in_a_fixed_order(tmp_path):
    from hwtui.engine.training import textdata

    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_text("second")
    (tmp_path / "d" / "a.txt").write_text("first")
    (tmp_path / "d" / "sub" / "c.txt").write_text("third")
    (tmp_path / "d" / "skip.md").write_text("no")
    assert textdata.read_documents(str(tmp_path / "d")).texts == ("first", "second", "third")
    jl = tmp_path / "x.jsonl"
    jl.write_text('{"text": "one"}\n\n{"text": "two", "meta": 1}\n')
    assert textdata.read_documents(str(jl)).texts == ("one", "two")


def test_resume_of_a_hugging_face_model_is_exact(tmp_path, capsys):
    """A run stopped after round 1 and resumed writes round 2's checkpoint bit for bit as the
    uninterrupted run did: weights, AdamW state (fused: its step counts too) and outer momentum."""
    gpt, text = model_dir(tmp_path / "gpt"), write_text(tmp_path / "t.txt")
    common = ["--model", str(gpt), "--data", str(text), "--gpu-ids", "cpu:0", "--steps", "20", "--merge-every", "10",
              "--batch-size", "4", "--keep-checkpoints", "5", "--eval-windows", "8"]
    # In-process (the worker forked from this process): the CLI's own start is the gpt2_run's
    # business; two more of them cost the suite `import torch, transformers` twice.
    assert main(["train", *common, "--checkpoint-dir", str(tmp_path / "a")]) == 0, capsys.readouterr().err[-2000:]
    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "ckpt-00000020")
    (tmp_path / "b" / "latest.json").write_text(json.dumps({"dir": "ckpt-00000010", "step": 10}))
    assert main(["train", *common, "--checkpoint-dir", str(tmp_path / "b"), "--resume"]) == 0, \
        capsys.readouterr().err[-2000:]
    for name in ("model.safetensors", "optimizer.safetensors", "outer.safetensors"):
        a = (tmp_path / "a" / "ckpt-00000020" / name).read_bytes()
        assert a == (tmp_path / "b" / "ckpt-00000020" / name).read_bytes(), name


def test_a_directory_with_weights_starts_from_them(gpt2_run):
    """--model OUT (a directory with model.safetensors) builds the saved weights, not a random init."""
    from transformers import AutoModelForCausalLM

    from hwtui.engine.training import models
    from hwtui.engine.training.config import ModelConfig
    from hwtui.engine.training.modelspec import parse

    spec = parse(str(gpt2_run["out"]))
    assert spec.has_weights and not spec.has_tokenizer
    built = models.build(spec, ModelConfig(), seed=123).module.state_dict()
    saved = AutoModelForCausalLM.from_pretrained(gpt2_run["out"], local_files_only=True).state_dict()
    assert set(built) == set(saved) and all(built[k].equal(saved[k]) for k in saved)


@pytest.mark.parametrize("config", [
    {"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
     "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 128},
    {"model_type": "gpt_neox", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
     "num_attention_heads": 2, "max_position_embeddings": 128},
])
def test_other_causal_architectures_build_seeded_and_give_a_loss(tmp_path, config):
    import torch

    from hwtui.engine.training import models
    from hwtui.engine.training.config import ModelConfig
    from hwtui.engine.training.modelspec import parse

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    spec = parse(str(tmp_path / "m"))
    assert models.hf_facts(spec) == models.HfFacts(256, 128)
    a, b = (models.build(spec, ModelConfig(), seed=7) for _ in range(2))
    assert all(x.equal(y) for x, y in zip(a.module.state_dict().values(), b.module.state_dict().values(), strict=True))
    x = torch.randint(0, 256, (2, 16))
    loss = a.loss(x, torch.roll(x, -1, 1))
    assert loss.dim() == 0 and 4.0 < float(loss.detach()) < 7.0 and a.vocab() == 256  # about ln 256 untrained
