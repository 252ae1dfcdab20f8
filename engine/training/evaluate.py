"""Use what was trained: load a checkpoint, measure its held-out loss, generate text with it.

Loading goes through :func:`checkpoint.latest` (hashes verified, the newest good checkpoint when
given a directory) and safetensors: no pickle. The model's shape comes from the manifest.

Held-out loss: the mean next-byte cross-entropy over windows of ``context`` bytes from the
held-out files, which no training chunk ever touches. By default every non-overlapping window of
the held-out text is evaluated (about 8,000 at context 64): the whole held-out set, so the figure
is exact for it and two evaluations agree to the last digit. Sampling fewer windows is much less
precise than it looks: one window's loss varies by about 0.6 around the mean (measured on the
trained char model), so N windows give about +-0.6/sqrt(N) -- 32 windows +-0.1, 1,024 +-0.02 --
and two samples of N = 16,000 would be needed to agree to 0.01 by chance alone. ``--windows N``
exists for quick looks and prints that standard error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hwtui.engine.training import checkpoint
from hwtui.engine.training.config import ModelConfig
from hwtui.engine.training.data import Corpus, load_corpus
from hwtui.engine.training.model import CharTransformer, build_model
from hwtui.engine.training.models import Trainable

EVAL_BATCH = 1024


class EvalError(RuntimeError):
    """The checkpoint cannot be used (missing, corrupt, another model): one line for the user."""


@dataclass(frozen=True)
class Loaded:
    model: CharTransformer | Trainable
    path: Path
    manifest: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.manifest.get("step", 0))


def load_model_dir(directory: str | Path, context: int) -> tuple[Loaded, Any]:
    """A Hugging Face model directory (a ``--save-hf`` output) and its tokenizer (or None)."""
    from hwtui.engine.training import models
    from hwtui.engine.training.modelspec import ModelSpecError, parse

    try:
        spec = parse(str(directory))
        if spec.kind != "hf":
            raise ModelSpecError(f"--model {directory}: not a directory")
        facts = models.hf_facts(spec)
        if facts.positions is not None and context > facts.positions:
            raise ModelSpecError(f"--context {context}: the model takes at most {facts.positions} positions")
        tokenizer = models.load_tokenizer(spec)
        trainable = models.load_pretrained(spec.value, context)
    except ModelSpecError as exc:
        raise EvalError(str(exc)) from None
    return Loaded(trainable, Path(spec.value), {"step": 0, "vocab": facts.vocab}), tokenizer


def load(where: str | Path) -> Loaded:
    """The newest good checkpoint under a ``--checkpoint-dir`` (or that checkpoint directory itself)."""
    where = Path(where)
    if not where.is_dir():
        raise EvalError(f"{where}: not a directory")
    try:
        if (where / checkpoint.MANIFEST).is_file():
            path, doc = where, checkpoint.verify(where)
        else:
            found = checkpoint.latest(where)
            if found is None:
                raise EvalError(f"{where}: no complete checkpoint (nothing that verifies)")
            path, doc = found
    except checkpoint.CheckpointError as exc:
        raise EvalError(str(exc)) from None
    source = doc.get("model_source", "char")
    if source != "char":
        raise EvalError(f"{path} was trained with --model {source}: evaluate its --save-hf directory "
                        f"with --model DIR"[:400])
    raw = doc.get("model")
    try:
        if not isinstance(raw, dict) or not all(isinstance(v, int) and v > 0 for v in raw.values()):
            raise TypeError("not a table of positive integers")
        cfg = ModelConfig(**raw)
        model = build_model(cfg, seed=0)
        tensors, _opt = checkpoint.load_tensors(path)
        missing = set(model.state_dict()) ^ set(tensors)
        if missing:
            raise KeyError(f"tensors {sorted(missing)[:3]} do not match the model")
        model.load_state_dict(tensors)
    except (TypeError, KeyError, ValueError, RuntimeError, OSError) as exc:
        raise EvalError(f"{path}: cannot build the model it describes ({type(exc).__name__}: {exc})"[:400]) from None
    model.eval()
    return Loaded(model, path, doc)


@dataclass(frozen=True)
class HeldoutLoss:
    loss: float
    stderr: float  # of the estimate when windows were sampled; 0.0 for the whole held-out set
    windows: int
    context: int
    complete: bool


def heldout_loss(model: CharTransformer | Trainable, windows: int | None = None, seed: int = 0,
                 corpus: Corpus | None = None) -> HeldoutLoss:
    """Held-out loss: over every non-overlapping window of the held-out text (``windows=None``,
    the default: the whole held-out set, so two evaluations of one model agree exactly), or over
    ``windows`` windows spread evenly over it at a seeded offset, with the standard error of
    that estimate."""
    corpus = corpus or load_corpus()
    forward, context = _forward(model)
    span = corpus.heldout.numel() - context - 1
    if span < 1:
        raise EvalError("the held-out text is shorter than one window")
    complete = windows is None
    if windows is None:
        starts = torch.arange(0, span, context)
    else:
        # Stratified: one window per equal stretch of the held-out text, at a seeded offset in it.
        stride = span / windows
        offset = torch.rand(windows, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * stride
        starts = (torch.arange(windows, dtype=torch.float64) * stride + offset).long().clamp_(0, span - 1)
    windows = len(starts)
    per_window: list[torch.Tensor] = []
    with torch.no_grad():
        for i in range(0, windows, EVAL_BATCH):
            s = starts[i: i + EVAL_BATCH]
            seq = corpus.heldout[s[:, None] + torch.arange(context + 1)[None, :]].long()
            logits = forward(seq[:, :-1]).float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1), reduction="none")
            per_window.append(loss.view(len(s), context).mean(dim=1))
    values = torch.cat(per_window).double()
    mean = float(values.mean())
    stderr = 0.0 if complete else (float(values.std(unbiased=True) / math.sqrt(windows)) if windows > 1 else math.inf)
    return HeldoutLoss(mean, stderr, windows, context, complete)


def _forward(model: CharTransformer | Trainable) -> tuple[Any, int]:
    """(ids -> logits, context) for the built-in model or any --model, switched to eval mode."""
    if isinstance(model, Trainable):
        model.module.eval()
        return model.logits, model.context
    model.eval()
    return model, model.cfg.context


def generate(model: CharTransformer | Trainable, prompt: bytes, length: int, temperature: float = 0.8, top_k: int = 0,
             seed: int = 0) -> bytes:
    """``length`` bytes continuing ``prompt`` (sampling with ``temperature``; 0 = greedy)."""
    return bytes(generate_ids(model, list(prompt or b"\n"), length, temperature, top_k, seed, limit=256))


def generate_ids(model: CharTransformer | Trainable, prompt: list[int], length: int, temperature: float = 0.8,
                 top_k: int = 0, seed: int = 0, limit: int | None = None) -> list[int]:
    """``length`` token ids continuing ``prompt`` (bytes are ids 0-255 for a byte-level model: ``limit``
    256 keeps a model with a larger vocabulary and no tokenizer to bytes)."""
    forward, context = _forward(model)
    gen = torch.Generator().manual_seed(seed)
    seq = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(length):
            idx = torch.tensor([seq[-context:]], dtype=torch.long)
            logits = forward(idx)[0, -1, :limit].float()
            if temperature <= 0:
                nxt = int(logits.argmax())
            else:
                logits = logits / temperature
                if 0 < top_k < logits.numel():
                    cut = torch.topk(logits, top_k).values[-1]
                    logits = logits.masked_fill(logits < cut, float("-inf"))
                nxt = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen))
            seq.append(nxt)
            out.append(nxt)
    return out
