"""Shared helpers: small models with awkward shapes, and byte-exact checks of what ranks serve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from hwtui.core.events import LogEvent
from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic


def make_model(directory: Path, seed: int = 0, *, big: int = 200_000, n: int = 30) -> dict[str, torch.Tensor]:
    """A safetensors file (mixed dtypes, a tensor far larger than the test buckets) plus a torch state dict."""
    g = torch.Generator().manual_seed(seed)
    st = {f"layers.{i}.weight": torch.randn(7 * i + 3, 11, generator=g) for i in range(n)}
    st["embed.big"] = torch.randn(big, generator=g)  # ~800 KB: split across many buckets
    st["norm.bf16"] = torch.randn(513, generator=g).to(torch.bfloat16)
    st["ids.int8"] = torch.randint(-128, 127, (77,), dtype=torch.int8, generator=g)
    st["scalar"] = torch.tensor(3.5)
    st["empty"] = torch.zeros(0, 4)
    pt = {"head": {"w": torch.randn(64, 33, generator=g), "b": torch.randn(33, generator=g)}, "step": 7}
    directory.mkdir(parents=True, exist_ok=True)
    save_file(st, str(directory / "model.safetensors"))
    torch.save(pt, directory / "head.pt")
    expected = dict(st)
    expected["head.w"], expected["head.b"] = pt["head"]["w"], pt["head"]["b"]
    return expected


def files(directory: Path) -> list[str]:
    return [str(directory / "model.safetensors"), str(directory / "head.pt")]


def write_plan(directory: Path, out: Path, *, version: str, bucket_kib: float = 64, align: int = 1,
               prev: Path | None = None) -> dict[str, Any]:
    plan = build_plan_from_files(files(directory), model="tiny", version=version, bucket_bytes=int(bucket_kib * 1024),
                                 align=align, prev_path=str(prev) if prev else None)
    write_json_atomic(out, plan)
    return plan


def served(out: Path, rank: int) -> tuple[str | None, dict[str, torch.Tensor]]:
    root = out / f"rank{rank}"
    cur = root / "CURRENT"
    if not cur.exists():
        return None, {}
    meta = json.loads(cur.read_text())
    return meta["version"], load_file(str(root / meta["file"]))


def assert_bytes_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for name, t in expected.items():
        g = got[name]
        assert g.dtype == t.dtype and tuple(g.shape) == tuple(t.shape), name
        # Compare raw bytes: NaN-safe and exact for every dtype.
        assert torch.equal(g.contiguous().view(-1).view(torch.uint8), t.contiguous().view(-1).view(torch.uint8)), name


def paths_line(events: list[Any]) -> str:
    """The launcher's "Replication paths" log line: which path each rank took, and why."""
    return next(e.message for e in events if isinstance(e, LogEvent) and e.message.startswith("Replication paths"))
