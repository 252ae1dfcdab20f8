"""The IPC protocol across real processes (a gloo world on 127.0.0.1, host-memory stand-in slots):
a rank SIGKILLed at each phase leaves nothing committed and nothing held open by the living; a
hostile source's handle is refused and named; a corrupted copy is named on its rank.

The test plays the launcher: it hosts the store, watches the ranks, and when one dies by a signal
it sets the run's abort key (the launcher kills the world the same way), so the living stop
waiting at once instead of at their timeout.
"""

from __future__ import annotations

import datetime
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from hwtui.core.supervisor import Child
from hwtui.engine.rank_fork import preload_for_ranks
from hwtui.engine.replication.ipc_protocol import Channel

SIZES = [5000, 4096, 777, 6000, 3]


def _world(tmp_path: Path, *, world: int = 3, window: int = 2, fault: dict[str, Any] | None = None,
           timeout_s: float = 120.0, device: str = "cpu", sizes: list[int] | None = None,
           check_bytes: bool = True) -> dict[str, Any]:
    # The ranks are forked from this process (torch imported once, hwtui.core.forking) before the
    # store starts its server thread, then each gets its spec, the store's port in it, on stdin; a
    # GPU world execs them (no device runtime near a fork).
    fork = device == "cpu" and preload_for_ranks() is None
    procs = [Child([sys.executable, "-m", "tests.engine.replication.ipc_rank", "-"], name=f"ipc rank {r}", stdin="pipe",
                   stdout="null", stderr="pipe", text=True, fork=fork).start() for r in range(world)]
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
    run = secrets.token_hex(8)
    for r, child in enumerate(procs):
        spec = {"rank": r, "world": world, "port": store.port, "run": run, "window": window, "sizes": sizes or SIZES,
                "out": str(tmp_path), "fault": fault, "timeout_s": timeout_s, "device": device,
                "check_bytes": check_bytes}
        assert child.proc is not None and child.proc.stdin is not None and child.proc.stderr is not None
        try:
            child.proc.stdin.write(json.dumps(spec) + "\n")
            child.proc.stdin.close()
        except BrokenPipeError:
            child.proc.wait(timeout=60)
            pytest.fail(f"rank {r} ended before its spec came: {child.proc.stderr.read()[-3000:]}")
    ch = Channel(store, run, 1.0)
    deadline = time.monotonic() + 240
    codes: dict[int, int] = {}
    while len(codes) < world:
        for r, child in enumerate(procs):
            if r in codes:
                continue
            try:
                assert child.proc is not None
                codes[r] = child.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            if codes[r] < 0:
                ch.abort(f"rank {r} died (signal {-codes[r]})")
        if time.monotonic() > deadline:
            for child in procs:
                child.kill()
            pytest.fail("a rank hung")
    results = {}
    for r, child in enumerate(procs):
        f = tmp_path / f"rank{r}.json"
        results[r] = json.loads(f.read_text()) if f.exists() else None
        err = child.proc.stderr.read() if child.proc is not None and child.proc.stderr else ""
        assert "Traceback" not in err, err[-3000:]
    return {"codes": codes, "results": results, "committed": (tmp_path / "committed").exists(),
            "pids": [child.proc.pid for child in procs if child.proc is not None], "forked": [c.forked for c in procs]}


def test_three_ranks_receive_every_bucket_byte_exact_within_the_window(tmp_path: Path) -> None:
    out = _world(tmp_path, world=3, window=2)
    assert out["codes"] == {0: 0, 1: 0, 2: 0}
    assert out["committed"]
    assert out["results"][0]["peak_exported"] <= 2
    for r in (1, 2):
        assert out["results"][r]["good"] == len(SIZES) and out["results"][r]["opened_after"] == 0


def test_a_corrupted_bucket_is_named_on_its_rank_and_nothing_commits(tmp_path: Path) -> None:
    out = _world(tmp_path, world=3, fault={"action": "corrupt", "rank": 2, "bucket": 3})
    assert not out["committed"]
    assert any("rank 2: bucket 3 failed its device checksum" in e for e in out["results"][2]["errors"])
    assert out["results"][1]["errors"] == [] and out["results"][1]["good"] == len(SIZES)
    assert "3" in out["results"][0]["failed"]


@pytest.mark.parametrize("rank, phase", [(0, "exported"), (0, "published"), (1, "opened"), (1, "copied"),
                                         (2, "acked")])
def test_a_rank_killed_at_each_phase_leaves_nothing_committed_and_nothing_held(tmp_path: Path, rank: Any, phase: Any) -> None:
    out = _world(tmp_path, world=3, fault={"action": "kill", "rank": rank, "bucket": 1, "phase": phase})
    assert out["codes"][rank] == -9
    assert not out["committed"]
    for r, res in out["results"].items():
        if r == rank:
            assert res is None
            continue
        assert res is not None and res["vote"] is False
        assert res["opened_after"] == 0  # the living closed every handle they had open
        # Told by the abort ("rank 0 died"), or, a receiver still opening a bucket of a source
        # that is gone, by the open itself: either way a named error, never a wait to the timeout.
        assert any("died" in e or "aborted" in e or "cannot open the source's shared buffer" in e
                   for e in res["errors"]), res


@pytest.mark.parametrize("what, why", [("foreign-file", "not this run's shared buffer"), ("not-json", "not JSON"),
                                       ("extra-field", "unexpected fields"), ("wrong-size", "the plan says")])
def test_a_hostile_source_handle_is_refused_and_named(tmp_path: Path, what: Any, why: Any) -> None:
    out = _world(tmp_path, world=2, fault={"action": "hostile", "bucket": 1, "what": what})
    assert not out["committed"]
    errors = out["results"][1]["errors"]
    assert any("rank 1: bucket 1: rejected the IPC handle" in e and why in e for e in errors), errors
    assert out["results"][1]["opened_after"] == 0
