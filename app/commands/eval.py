"""``hwtui eval``: the held-out loss of a trained checkpoint.

By default every non-overlapping window of the held-out text is evaluated (the whole held-out
set: exact, and two runs agree to the last digit); ``--windows N`` evaluates N windows spread
evenly over it and prints the standard error of that estimate.
"""

from __future__ import annotations

import argparse
import json

from hwtui.app.commands._checkpoint import add_checkpoint_arguments, load_checkpoint

HELP = "held-out loss of a trained checkpoint (hwtui train --checkpoint-dir) or model directory (--save-hf)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(parser)
    parser.add_argument("--windows", type=int, metavar="N",
                        help="evaluate N windows spread over the held-out text (default: all of it, about 8,000 "
                             "windows of 64 bytes; N windows are only good to about +-0.6/sqrt(N))")
    parser.add_argument("--seed", type=int, default=0, help="with --windows: where in each stretch the window falls")
    parser.add_argument("--data", metavar="PATH", help="held-out text: the last tenth of this text file, directory of .txt "
                                                       "or .jsonl, as hwtui train --data splits it (default: the "
                                                       "standard library's held-out files)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from hwtui.core.errors import HwtuiError

    if args.windows is not None and not 2 <= args.windows <= 1_000_000:
        raise HwtuiError(f"--windows must be between 2 and 1000000 (got {args.windows})")
    loaded, tokenizer = load_checkpoint(args)
    from hwtui.engine.training import textdata
    from hwtui.engine.training.evaluate import EvalError, heldout_loss

    try:
        corpus = None
        vocab = loaded.manifest.get("vocab")
        if args.data is not None or tokenizer is not None:
            context = getattr(loaded.model, "context", None) or loaded.model.cfg.context
            if args.data is not None:
                docs = textdata.read_documents(args.data)
            else:
                from hwtui.engine.training.data import stdlib_dir

                files = sorted(p for p in stdlib_dir().glob("*.py") if p.is_file())
                docs = textdata.Documents(tuple(p.read_text("utf-8", "replace") for p in files), len(files), "stdlib")
            corpus = textdata.tokenize(docs, tokenizer, context, vocab)
        elif isinstance(vocab, int) and vocab < 256:
            raise HwtuiError(f"--model {args.model}: a vocabulary of {vocab} ids and no tokenizer; bytes need 256")
        result = heldout_loss(loaded.model, args.windows, args.seed, corpus=corpus)
    except (EvalError, textdata.DataError) as exc:
        raise HwtuiError(str(exc)) from None
    if args.json:
        print(json.dumps({"schema": "hwtui.eval/1", "checkpoint": str(loaded.path), "step": loaded.step,
                          "loss": result.loss, "stderr": result.stderr, "windows": result.windows,
                          "context": result.context, "whole_heldout_set": result.complete}, allow_nan=False))
        return 0
    what = (f"all {result.windows:,} windows of the held-out text" if result.complete else
            f"{result.windows:,} windows (+-{result.stderr:.4f} standard error)")
    print(f"held-out loss {result.loss:.4f} on {what}, {result.context} bytes each; {loaded.path} (step {loaded.step})")
    return 0
