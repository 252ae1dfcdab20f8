"""Receivers on the source's host copy buckets from its page cache, verify them, and say so."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

from hwtui.engine.replication.events import ReplBucket
from hwtui.engine.replication.launcher import ReplicationOptions, run_replication
from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

from .helpers import paths_line

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]


def _run(plan, out, fault=None, **kw):
    env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
    if fault:
        env["HWTUI_TEST_FAULT"] = fault
    events: list = []
    result = run_replication(ReplicationOptions(plan=str(plan), nproc=3, env=env, commit=True, out=str(out), **kw),
                             on_event=events.append)
    return result, events


@pytest.fixture
def model(tmp_path):
    g = torch.Generator().manual_seed(8)
    save_file({f"w{i}": torch.randn(3000 + i, generator=g) for i in range(12)}, str(tmp_path / "m.safetensors"))
    plan = build_plan_from_files([str(tmp_path / "m.safetensors")], model="m", version="h1", bucket_bytes=16 << 10, align=64)
    write_json_atomic(tmp_path / "p.json", plan)
    return tmp_path


def test_same_host_receivers_copy_from_page_cache_and_verify(model):
    result, events = _run(model / "p.json", model / "out")
    assert result.ok, result.error
    line = paths_line(events)
    assert "same-host path: rank(s) 1, 2 copy each bucket from the source's page cache" in line
    assert "same boot id and the same source file" in line
    assert {r["rank"]: r["path"] for r in result.report["ranks"]} == {0: "source", 1: "same-host", 2: "same-host"}
    assert all(r["collectives"] == 0 for r in result.report["ranks"])  # not one byte over a socket
    for rank in (1, 2):
        cur = (model / "out" / f"rank{rank}" / "versions" / "h1" / "model.safetensors").read_bytes()
        assert cur == (model / "m.safetensors").read_bytes()


def test_same_host_copy_is_verified_on_the_receivers_own_bytes(model):
    result, events = _run(model / "p.json", model / "out", fault="corrupt:bucket=2,rank=2")
    assert not result.ok and "bucket 2 failed verification on rank 2" in result.error
    assert any(e.bucket_id == 2 and e.state == "failed" and e.rank == 2 for e in events if isinstance(e, ReplBucket))
    assert not (model / "out" / "rank1" / "CURRENT").exists()
    # Turned off, the same ranks take the network path, and the line says why.
    result, events = _run(model / "p.json", model / "out", same_host=False)
    assert result.ok, result.error
    line = paths_line(events)
    assert "network path: rank(s) 1, 2 receive each bucket by gloo broadcast (same-host path turned off" in line
    assert all(r["collectives"] > 0 for r in result.report["ranks"])
