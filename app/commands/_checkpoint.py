"""What `hwtui eval` and `hwtui sample` share: which model (a checkpoint or a model directory), the
thread option, and loading."""

from __future__ import annotations

import argparse
from typing import Any


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint-dir", metavar="DIR",
                       help="a --checkpoint-dir of hwtui train (its newest good checkpoint) or one ckpt-* directory")
    which.add_argument("--model", metavar="DIR",
                       help="a Hugging Face model directory (hwtui train --save-hf DIR, or any local one; "
                            "its tokenizer when it has one, else bytes)")
    parser.add_argument("--context", type=int, default=64, metavar="N",
                        help="with --model: tokens the model sees at once (default 64, as hwtui train)")
    parser.add_argument("--threads", type=int, default=0, metavar="N",
                        help="torch CPU threads (default 0: torch's own choice; 1 is far faster on a busy machine)")


def load_checkpoint(args: argparse.Namespace) -> tuple[Any, Any]:
    """Apply --threads, then load the model: (Loaded, its tokenizer or None); a problem is one HwtuiError."""
    from hwtui.core.errors import HwtuiError

    if args.threads < 0:
        raise HwtuiError(f"--threads must be >= 0 (got {args.threads})")
    if args.context < 1:
        raise HwtuiError(f"--context must be at least 1 (got {args.context})")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from hwtui.engine.training.evaluate import EvalError, load, load_model_dir

    try:
        if args.model is not None:
            return load_model_dir(args.model, args.context)
        return load(args.checkpoint_dir), None
    except EvalError as exc:
        raise HwtuiError(str(exc)) from None
