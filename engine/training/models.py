"""Build the model ``--model`` names (see ``modelspec``), seeded, and train any of them the same way.

Every worker builds its copy with the same seed on the CPU (then moves it), so the copies start
bit-identical: merging averages tensors by name, and the outer optimizer's anchor is each worker's
own start, so copies that began apart would stay apart.

:class:`Trainable` is what the worker, the evaluation and sampling use: ``logits(ids)`` and
``loss(x, y)`` whatever the model is. The module itself (``.module``) is what merges, checkpoints
and ``--save-hf`` see, under its own parameter names (a Hugging Face model keeps its names, so a
checkpoint's tensors are the names ``from_pretrained`` expects).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hwtui.engine.training.config import ModelConfig
from hwtui.engine.training.modelspec import ModelSpec, ModelSpecError, check_directory

# Transformers must never reach for a hub, nor print progress bars into a user's terminal.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


@dataclass(frozen=True)
class HfFacts:
    vocab: int
    positions: int | None  # the longest sequence it takes (None: no limit stated)


def _hf_config(spec: ModelSpec) -> Any:
    check_directory(spec)
    try:
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    except ImportError:
        raise ModelSpecError(f"--model {spec.value}: needs the transformers package (pip install transformers)") from None
    try:
        config = AutoConfig.from_pretrained(spec.value, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # an unknown model_type, remote code, a malformed field
        raise ModelSpecError(f"--model {spec.value}: unknown or unusable architecture ({_one_line(exc)})") from None
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelSpecError(f"--model {spec.value}: {config.model_type} is not a causal language model "
                             f"architecture (AutoModelForCausalLM has none for it)")
    return config


def hf_facts(spec: ModelSpec) -> HfFacts:
    """Vocabulary and longest sequence of a model directory, from its config (nothing built)."""
    config = _hf_config(spec)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise ModelSpecError(f"--model {spec.value}: config.json states no vocab_size")
    positions = next((v for k in ("n_positions", "max_position_embeddings", "n_ctx")
                      if isinstance(v := getattr(text, k, None), int) and v > 0), None)
    return HfFacts(vocab, positions)


def hf_modeling_module(spec: ModelSpec) -> str:
    """The module that holds a model directory's causal-LM class (imported on the way: the
    launcher preloads it for the workers it forks, see worker_fork)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return str(MODEL_FOR_CAUSAL_LM_MAPPING[type(_hf_config(spec))].__module__)


def load_tokenizer(spec: ModelSpec) -> Any:
    """The directory's own tokenizer, or None (bytes then). Never downloaded, never remote code."""
    if not spec.has_tokenizer:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(spec.value, local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise ModelSpecError(f"--model {spec.value}: its tokenizer does not load ({_one_line(exc)})") from None


class Trainable:
    """One interface over the three kinds of model: logits from ids, a loss from a batch."""

    def __init__(self, module: nn.Module, kind: str, context: int):
        self.module, self.kind, self.context = module, kind, context
        custom_loss = getattr(module, "loss", None)
        self._custom_loss = custom_loss if kind == "callable" and callable(custom_loss) else None

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        if self.kind == "hf":
            hf_logits: torch.Tensor = self.module(input_ids=idx, use_cache=False).logits
            return hf_logits
        out = self.module(idx)
        logits = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
            raise TypeError("the model's forward must return logits [B, T, V] (or an object with .logits)")
        return logits

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.kind == "char":
            char_loss: torch.Tensor = self.module.loss(x, y)  # type: ignore[operator]
            return char_loss
        if self._custom_loss is not None:
            custom: torch.Tensor = self._custom_loss(x, y)
            return custom
        logits = self.logits(x)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))

    def vocab(self) -> int | None:
        """How many token ids the model takes (None if it cannot be told: a loss-only module)."""
        if self.kind == "char":
            return int(self.module.cfg.vocab)  # type: ignore[union-attr,arg-type]
        config = getattr(self.module, "config", None)
        size = getattr(config, "vocab_size", None) or getattr(self.module, "vocab_size", None)
        if isinstance(size, int):
            return size
        if self._custom_loss is not None:
            return None
        with torch.no_grad():
            return int(self.logits(torch.zeros(1, 2, dtype=torch.long, device=_device_of(self.module))).shape[-1])


def _device_of(module: nn.Module) -> torch.device:
    return next((p.device for p in module.parameters()), torch.device("cpu"))


def _seeded(seed: int, make: Any) -> Any:
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return make()
    finally:
        torch.random.set_rng_state(state)


def _build_hf(spec: ModelSpec, seed: int, checkpointing: bool) -> nn.Module:
    from transformers import AutoModelForCausalLM

    config = _hf_config(spec)
    try:
        if spec.has_weights:  # safetensors only: use_safetensors=True never falls back to a pickle
            model = AutoModelForCausalLM.from_pretrained(spec.value, local_files_only=True, use_safetensors=True,
                                                         trust_remote_code=False, dtype=torch.float32)
        else:
            model = _seeded(seed, lambda: AutoModelForCausalLM.from_config(config, dtype=torch.float32))
    except Exception as exc:
        raise ModelSpecError(f"--model {spec.value}: cannot build it ({_one_line(exc)})") from None
    if checkpointing and getattr(model, "supports_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not isinstance(model, nn.Module):  # what the Auto class resolved to is the model's config's choice
        raise ModelSpecError(f"--model {spec.value}: its class {type(model).__name__} is not a torch module")
    return model


def _build_callable(spec: ModelSpec, seed: int) -> nn.Module:
    modname, _, fname = spec.value.partition(":")
    try:
        fn = getattr(importlib.import_module(modname), fname)
    except Exception as exc:
        raise ModelSpecError(f"--model {spec.value}: cannot import it ({_one_line(exc)})") from None
    if not callable(fn):
        raise ModelSpecError(f"--model {spec.value}: {fname} is not a function")
    try:
        module = _seeded(seed, fn)
    except Exception as exc:
        raise ModelSpecError(f"--model {spec.value} raised {_one_line(exc)}") from None
    if not isinstance(module, nn.Module):
        raise ModelSpecError(f"--model {spec.value} returned {type(module).__name__}, not a torch nn.Module")
    if not any(p.requires_grad for p in module.parameters()):
        raise ModelSpecError(f"--model {spec.value} returned a module with no trainable parameters")
    return module.float()


def build(spec: ModelSpec, mcfg: ModelConfig, seed: int, checkpointing: bool = False) -> Trainable:
    """The model ``spec`` names, on the CPU, identical for every caller with the same seed."""
    if spec.is_char:
        from hwtui.engine.training.model import build_model

        return Trainable(build_model(mcfg, seed, checkpointing), "char", mcfg.context)
    if spec.kind == "hf":
        return Trainable(_build_hf(spec, seed, checkpointing), "hf", mcfg.context)
    return Trainable(_build_callable(spec, seed), "callable", mcfg.context)


def load_pretrained(directory: str, context: int) -> Trainable:
    """A ``--save-hf`` (or any local Hugging Face) directory for ``hwtui eval`` / ``sample``."""
    spec = ModelSpec("hf", directory)
    module = _build_hf(spec, 0, False)
    module.eval()
    return Trainable(module, "hf", context)
