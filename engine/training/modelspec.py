"""What ``--model`` names, checked before any worker starts (no torch imported here).

Three forms:

* ``char`` -- the built-in byte-level transformer (``model.py``), shaped by ``--d-model`` etc.
* a local Hugging Face model directory -- ``config.json`` (any architecture
  ``AutoModelForCausalLM`` knows), its weights when the directory holds ``model.safetensors``
  (never a pickle: a directory with only ``pytorch_model.bin`` is refused), else a seeded random
  initialisation; its tokenizer when it has one.
* ``package.module:function`` -- a function called with no arguments that returns an
  ``nn.Module`` (the contract is in docs/training.md).

Nothing is ever downloaded: a name that is not an existing directory and has no ``:`` is refused
rather than looked up on a hub.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from hwtui.core.bounded_read import read_bounded

CHAR = "char"
CALLABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
MAX_CONFIG_BYTES = 1 << 20


class ModelSpecError(ValueError):
    """``--model`` cannot be used: one line for the user."""


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "char" | "hf" | "callable"
    value: str  # "char", an absolute directory, or "package.module:function"

    @property
    def is_char(self) -> bool:
        return self.kind == CHAR

    @property
    def has_tokenizer(self) -> bool:
        return self.kind == "hf" and any((Path(self.value) / f).is_file() for f in TOKENIZER_FILES)

    @property
    def has_weights(self) -> bool:
        return self.kind == "hf" and any((Path(self.value) / f).is_file() for f in SAFE_WEIGHTS)


def parse(text: str) -> ModelSpec:
    """The spec ``--model`` names; ModelSpecError for anything that cannot be one."""
    if text == CHAR:
        return ModelSpec(CHAR, CHAR)
    path = Path(text).expanduser()
    if path.is_dir():
        return ModelSpec("hf", str(path.resolve()))
    if CALLABLE.fullmatch(text):
        return ModelSpec("callable", text)
    if path.exists():
        raise ModelSpecError(f"--model {text}: not a directory (give a Hugging Face model directory, "
                             f"package.module:function or char)")
    raise ModelSpecError(f"--model {text}: no such directory, and not package.module:function "
                         f"(nothing is downloaded: give a local model directory)")


def read_config(spec: ModelSpec) -> dict:
    """The directory's ``config.json`` as a JSON object (bounded read); ModelSpecError otherwise."""
    path = Path(spec.value) / "config.json"
    try:
        if not path.is_file():
            raise ModelSpecError(f"--model {spec.value}: no config.json (not a Hugging Face model directory)")
        raw, more = read_bounded(path, MAX_CONFIG_BYTES)  # a regular file only, opened without blocking
        if more:
            raise ModelSpecError(f"--model {spec.value}: config.json larger than {MAX_CONFIG_BYTES} bytes")
        doc = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, ModelSpecError):
            raise
        raise ModelSpecError(f"--model {spec.value}: config.json is not readable JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise ModelSpecError(f"--model {spec.value}: config.json is not a JSON object")
    return doc


def check_directory(spec: ModelSpec) -> None:
    """The cheap checks of a model directory (no transformers import): config.json, no pickles."""
    doc = read_config(spec)
    if not isinstance(doc.get("model_type"), str):
        raise ModelSpecError(f"--model {spec.value}: config.json names no model_type")
    if not spec.has_weights and any((Path(spec.value) / f).is_file() for f in PICKLE_WEIGHTS):
        raise ModelSpecError(f"--model {spec.value}: weights only as pytorch_model.bin (pickle, never loaded); "
                             f"convert them to model.safetensors")
