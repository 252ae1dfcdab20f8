"""A whole replicate run over the ipc path (engine/replication/ipc_path.py), on CPU: the test seam
HWTUI_TEST_IPC=host puts host-memory stand-ins where CUDA IPC handles go, everything else (the
launcher, the ranks, the world over gloo, the vote and the commit) is the real run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from hwtui.engine.replication.events import ReplBucket
from hwtui.engine.replication.launcher import ReplicationOptions, run_replication
from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

from .helpers import paths_line

pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]


def _run(plan: Path, out: Path, fault: str | None = None, **kw: Any) -> tuple[Any, list[Any]]:
    env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
    env["HWTUI_TEST_IPC"] = "host"
    if fault:
        env["HWTUI_TEST_FAULT"] = fault
    events: list[Any] = []
    result = run_replication(ReplicationOptions(plan=str(plan), nproc=3, env=env, commit=True, out=str(out),
                                                window=2, **kw), on_event=events.append)
    return result, events


@pytest.fixture
def model(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(9)
    save_file({f"w{i}": torch.randn(3000 + 7 * i, generator=g) for i in range(12)}, str(tmp_path / "m.safetensors"))
    plan = build_plan_from_files([str(tmp_path / "m.safetensors")], model="m", version="i1", bucket_bytes=16 << 10,
                                 align=64)
    write_json_atomic(tmp_path / "p.json", plan)
    return tmp_path


def test_receivers_on_the_node_take_the_ipc_path_byte_exact(model: Path) -> None:
    result, events = _run(model / "p.json", model / "out")
    assert result.ok, result.error
    line = paths_line(events)
    assert "ipc path: rank(s) 1, 2 open each bucket the source exports by IPC handle" in line
    assert {r["rank"]: r["path"] for r in result.report["ranks"]} == {0: "source", 1: "ipc", 2: "ipc"}
    assert all(r["collectives"] == 0 for r in result.report["ranks"])  # not one byte over a socket
    src = next(r for r in result.report["ranks"] if r["rank"] == 0)
    assert 1 <= src["window"]["peak_occupancy"] <= 2  # never more than the window exported
    for r in result.report["ranks"][1:]:
        # A receiver may hold window buckets unacked on a GPU; here each is acked as it is summed.
        assert r["window"] == {"peak_occupancy": 1, "peak_bytes": 0, "final_limit": 2, "changes": 0}, r["window"]
    for rank in (1, 2):
        cur = (model / "out" / f"rank{rank}" / "versions" / "i1" / "model.safetensors").read_bytes()
        assert cur == (model / "m.safetensors").read_bytes()


def test_a_corrupted_ipc_copy_is_named_on_its_rank_and_nothing_commits(model: Path) -> None:
    result, events = _run(model / "p.json", model / "out", fault="corrupt:bucket=2,rank=2")
    assert not result.ok and "rank 2: bucket 2 failed its device checksum after the IPC copy" in result.error
    assert any(e.bucket_id == 2 and e.state == "failed" and e.rank == 2 for e in events if isinstance(e, ReplBucket))
    for rank in (1, 2):
        assert not (model / "out" / f"rank{rank}" / "CURRENT").exists()


@pytest.mark.parametrize("fault", ["kill:rank=0,bucket=3", "kill:rank=2,bucket=1"])
def test_a_killed_rank_on_the_ipc_path_commits_nothing(model: Path, fault: str) -> None:
    result, _ = _run(model / "p.json", model / "out", fault=fault)
    assert not result.ok
    for rank in (1, 2):
        assert not (model / "out" / f"rank{rank}" / "CURRENT").exists()


def test_a_source_failing_otherwise_than_by_ipc_is_named_and_no_receiver_reports_a_raw_store_error(model: Path) -> None:
    """An OSError on the source mid-run (a read error, a full disk): the run names it, and each
    receiver says why it stopped in a transport error (the source's reason, through the channel's
    abort, when it read it in time), never c10d's own "DistNetworkError: Broken pipe" as an
    internal error (rank 0 hosts the world's store and has exited)."""
    from hwtui.core.events import ErrorEvent

    result, events = _run(model / "p.json", model / "out", fault="fail:rank=0,bucket=3")
    assert not result.ok and "rank 0: OSError: [Errno 28]" in result.error
    said = [e for e in events if isinstance(e, ErrorEvent) and e.rank in (1, 2)]
    # Which of these a receiver meets is a race with the source's exit: the abort's reason, the
    # store gone (waiting for an export, or sending its ack: a full suite caught the latter as c10d's
    # raw "Broken pipe"), or (a receiver behind) an export whose source process is gone.
    for e in said:
        assert e.where == "transport" and "DistNetworkError" not in e.message and any(
            why in e.message for why in ("aborted while waiting for the export of bucket 3: rank 0: OSError",
                                         "the control channel went away while waiting for the export of bucket",
                                         "the control channel went away while sending the ack of bucket",
                                         "cannot open the source's shared buffer")), e
    for rank in (1, 2):
        assert not (model / "out" / f"rank{rank}" / "CURRENT").exists()
