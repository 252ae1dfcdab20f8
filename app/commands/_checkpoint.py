"""What `hwtui eval` and `hwtui sample` share: the checkpoint and thread options, and loading."""

from __future__ import annotations

import argparse
from typing import Any


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint-dir", metavar="DIR", required=True,
                        help="a --checkpoint-dir of hwtui train (its newest good checkpoint) or one ckpt-* directory")
    parser.add_argument("--threads", type=int, default=0, metavar="N",
                        help="torch CPU threads (default 0: torch's own choice; 1 is far faster on a busy machine)")


def load_checkpoint(args: argparse.Namespace) -> Any:
    """Apply --threads, then load the newest checkpoint that verifies; a problem is one HwtuiError."""
    from hwtui.core.errors import HwtuiError

    if args.threads < 0:
        raise HwtuiError(f"--threads must be >= 0 (got {args.threads})")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from hwtui.engine.training.evaluate import EvalError, load

    try:
        return load(args.checkpoint_dir)
    except EvalError as exc:
        raise HwtuiError(str(exc)) from None
