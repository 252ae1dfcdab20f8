"""``hwtui sample``: generate text with a trained checkpoint (the byte-level model of hwtui train)."""

from __future__ import annotations

import argparse
import sys

from hwtui.app.commands._checkpoint import add_checkpoint_arguments, load_checkpoint

HELP = "generate text with a trained checkpoint (hwtui train --checkpoint-dir) or model directory (--save-hf)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser)
    parser.add_argument("--prompt", default="def ", help="text to continue (default 'def ')")
    parser.add_argument("--length", type=int, default=200, metavar="BYTES", help="bytes (tokens, with a tokenizer) to generate (default 200)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = always the likeliest byte (default 0.8)")
    parser.add_argument("--top-k", type=int, default=0, metavar="K", help="sample among the K likeliest bytes (0 = all)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    import math

    from hwtui.core.errors import HwtuiError

    if not 1 <= args.length <= 1_000_000:
        raise HwtuiError(f"--length must be between 1 and 1000000 (got {args.length})")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise HwtuiError(f"--temperature must be a finite number >= 0 (got {args.temperature})")
    if args.top_k < 0:
        raise HwtuiError(f"--top-k must be >= 0 (got {args.top_k})")
    loaded, tokenizer = load_checkpoint(args)
    from hwtui.engine.training.evaluate import generate, generate_ids

    if tokenizer is None:
        vocab = loaded.manifest.get("vocab")
        if isinstance(vocab, int) and vocab < 256:
            raise HwtuiError(f"--model {args.model}: a vocabulary of {vocab} ids and no tokenizer; bytes need 256")
        prompt = args.prompt.encode("utf-8", "surrogateescape")
        out = generate(loaded.model, prompt, args.length, args.temperature, args.top_k, args.seed)
        sys.stdout.buffer.write(prompt + out + b"\n")
    else:  # --length counts tokens then
        ids = tokenizer(args.prompt, add_special_tokens=False)["input_ids"] or [tokenizer.eos_token_id or 0]
        new = generate_ids(loaded.model, list(ids), args.length, args.temperature, args.top_k, args.seed)
        sys.stdout.write(tokenizer.decode(list(ids) + new) + "\n")
    sys.stdout.flush()
    return 0
