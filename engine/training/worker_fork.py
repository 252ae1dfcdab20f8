"""Which training workers fork from the ``hwtui train`` launcher, and what it imports for them first.

A worker is ``python -m hwtui.engine.training.worker``; as a fresh interpreter it spends about a
second of CPU importing torch (and, for a ``--model`` directory, 1.3-1.5 s more in transformers'
modeling code) before it trains anything. The launcher instead imports what every CPU worker
imports anyway, once, while it is single-threaded (before the TCPStore's thread starts), and
forks its CPU workers from itself (:mod:`hwtui.core.forking`, :mod:`hwtui.engine.rank_fork`).

A worker is exec'd as before, and ``-v`` says why, when:

* it is not a CPU worker: no device runtime is ever near a fork (a CUDA/HIP/XPU/HPU worker's start
  is dominated by creating its context anyway);
* its interpreter is not ours: ``HWTUI_PYTHON_CPU`` or the environment ``hwtui setup`` recorded
  names another Python, whose torch is the one that worker must run (paths are compared as given,
  not resolved: a venv's ``bin/python`` links to the same base interpreter as ours);
* ``HWTUI_FORK_RANKS=0``, the launcher has a thread, an import-time variable differs, a device
  runtime is initialised in the launcher (the checks of :func:`hwtui.core.forking.refusal`).

transformers is preloaded only for a ``--model`` directory: the launcher has imported it already
to check the model's config and tokenizer, and the worker's share is the architecture's modeling
module (imported here by resolving the config's class, as the worker's build will). The char model
needs neither, and a ``package.module:function`` model is user code that is imported only in the
worker, after the fork, as before.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hwtui.core import forking
from hwtui.engine.rank_fork import RANK_MODULES, preload_for_ranks
from hwtui.probes.vendor_envs import interpreter_for

# What every CPU worker imports before its first batch (worker.py imports most of these lazily).
# Not the worker module itself: it runs as ``__main__``, and runpy warns of (and would run beside)
# a copy already imported under its own name.
WORKER_MODULES = (*RANK_MODULES, "hwtui.engine.training.channel", "hwtui.engine.training.models",
                  "hwtui.engine.training.model", "hwtui.engine.training.data", "hwtui.engine.training.merge",
                  "hwtui.engine.training.checkpoint", "hwtui.engine.training.backend", "hwtui.engine.training.health",
                  "hwtui.engine.training.memory", "hwtui.engine.training.textdata", "safetensors.torch")
# Read by huggingface_hub / transformers / tokenizers when imported: a worker whose values differ
# from the launcher's (HF_HUB_OFFLINE forced to 1, say, where the user set 0) must import them itself.
HF_ENV_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_")


def prepare(cfg: Any) -> str | None:
    """Preload for the run's CPU workers; why none of them forks (None: they may).

    Nothing is imported when no worker could fork (no CPU worker, each one's interpreter another
    Python, ``HWTUI_FORK_RANKS=0``): the preload would only cost the launcher time."""
    if not forking.enabled_by_env():
        return f"{forking.ENV_SWITCH}=0"
    if not any(exec_reason(ref, interpreter_for(ref.backend), None) is None for ref in cfg.devices):
        return "no worker can fork"
    modules: list[str] = list(WORKER_MODULES)
    prefixes: tuple[str, ...] = ()
    if (modeling := _hf_modeling_module(cfg.model_source)) is not None:
        modules.append(modeling)
        prefixes = HF_ENV_PREFIXES
    return preload_for_ranks("cpu", modules=modules, more_env_prefixes=prefixes)


def _hf_modeling_module(model_source: str) -> str | None:
    """For a --model directory, the module that holds its causal-LM class (imported on the way)."""
    from hwtui.engine.training import modelspec

    try:
        spec = modelspec.parse(model_source)
    except ValueError:
        return None
    if spec.kind != "hf" or "transformers" not in sys.modules:
        return None  # the CLI's check imports transformers for a directory: without it, not ours to start
    try:
        from hwtui.engine.training import models

        return models.hf_modeling_module(spec)
    except Exception:  # noqa: BLE001 - the worker reports an unusable model itself, in one line
        return None


def exec_reason(ref: Any, python: str, launcher_refusal: str | None) -> str | None:
    """Why this worker is exec'd whatever the launcher preloaded (None: ask for a fork)."""
    if ref.backend != "cpu":
        return f"{ref.spec} workers are exec'd (no device runtime near a fork)"
    if os.path.abspath(python) != os.path.abspath(sys.executable):
        return f"its interpreter is {python} (HWTUI_PYTHON_CPU or `hwtui setup`), not this one ({sys.executable})"
    return launcher_refusal
