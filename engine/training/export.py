"""``--save-hf DIR``: the merged model as a Hugging Face directory, written all or nothing.

``config.json``, ``model.safetensors`` (never a pickle) and, when the model came with one, the
tokenizer's files go into a hidden temporary sibling of ``DIR`` (owner-only, from ``mkdtemp``),
are fsynced, and the directory is renamed into place: a reader sees no ``DIR`` or a whole one,
and a crash leaves only a ``.tmp-*`` sibling. The rename refuses to replace a directory that has
files in it; the CLI refuses an existing ``DIR`` before training starts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hwtui.core.atomic import fsync_path


def save_hf(model: Any, tokenizer: Any, out: str | os.PathLike[str]) -> Path:
    """Write ``model`` (a transformers PreTrainedModel) and ``tokenizer`` (or None) to ``out``."""
    out = Path(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        # transformers writes only on rank 0 of an initialised torch.distributed group, and the
        # writer here is whichever worker the coordinator chose (its merge group holds every
        # worker): this process writes, whatever its rank there.
        model.should_save_on_this_rank = lambda is_main_process=True: True
        model.save_pretrained(tmp, is_main_process=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if not (tmp / "model.safetensors").is_file() and not (tmp / "model.safetensors.index.json").is_file():
            raise RuntimeError("transformers wrote no safetensors weights")
        for f in tmp.iterdir():
            if f.is_file():
                fsync_path(f)
        fsync_path(tmp)
        os.rename(tmp, out)
        fsync_path(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
