"""The "shm" path: a source that is not a file it can map stages each bucket in /dev/shm for its host's ranks.

A torch pickle is unpickled into the source's memory, so there is no page cache to copy from: the
source writes each bucket into a shared-memory copy with the receivers' layout and announces it;
receivers on its host copy it and verify their own copy. Whatever way a run ends, no shared-memory
copy outlives it. The copy lives in a private run directory (0700, unpredictable name) as a 0600
file; each test points ``HWTUI_SHM_DIR`` at its own sticky, world-writable directory (what
/dev/shm is), so leftovers are this test's alone. The leftover checks also look at the names
hwtui used to choose in /dev/shm itself.
"""

from __future__ import annotations

import glob
import os
import re
import stat

import pytest

from hwtui.engine.replication.events import ReplBucket
from hwtui.engine.replication.launcher import ReplicationOptions, run_replication
from hwtui.engine.replication.plan import load_plan

from .helpers import assert_bytes_equal, make_model, paths_line, served, write_plan

pytestmark = [pytest.mark.torch, pytest.mark.timeout(400)]


@pytest.fixture
def mixed(tmp_path):
    """A version of a safetensors file *and* a torch pickle: not mappable as a whole."""
    expected = make_model(tmp_path / "w", seed=5)
    write_plan(tmp_path / "w", tmp_path / "p.json", version="s1", bucket_kib=64)
    return tmp_path, expected, load_plan(tmp_path / "p.json").digest


def _shm(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    shm.chmod(0o1777)
    return shm


def _leftovers(digest: str, shm=None) -> list[str]:
    old = glob.glob(f"/dev/shm/hwtui-{digest[:16]}-*")  # the predictable names of 769874d
    return old + (sorted(str(p) for p in shm.iterdir()) if shm is not None else [])


def _run(tmp_path, fault=None, on_event=None):
    env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
    env["HWTUI_SHM_DIR"] = str(_shm(tmp_path))
    if fault:
        env["HWTUI_TEST_FAULT"] = fault
    return run_replication(ReplicationOptions(plan=str(tmp_path / "p.json"), nproc=3, env=env, commit=True,
                                              out=str(tmp_path / "out"), timeout=15.0), on_event=on_event)


def test_non_mappable_source_reaches_same_host_ranks_through_shared_memory(mixed):
    tmp_path, expected, digest = mixed
    events: list = []
    seen_shm: list[list[str]] = []

    shm = _shm(tmp_path)
    modes: dict[str, tuple[int, int, bool]] = {}

    go = tmp_path / "go"

    def on_event(ev):
        events.append(ev)
        if isinstance(ev, ReplBucket) and ev.rank == 1 and ev.state == "done" and not seen_shm:
            # Rank 1 waits at bucket 1 until `go` exists, so the source's copy is surely still
            # there (the run cannot end under a slow launcher before this looks).
            seen_shm.append(_leftovers(digest, shm))
            for d in seen_shm[0]:
                for p in [d, *glob.glob(f"{d}/*")]:
                    st = os.lstat(p)
                    modes[p] = (stat.S_IMODE(st.st_mode), st.st_uid, stat.S_ISLNK(st.st_mode))
            go.touch()

    result = _run(tmp_path, fault=f"pause:rank=1,bucket=1,until={go}", on_event=on_event)
    assert result.ok, result.error
    line = paths_line(events)
    assert "shm path: rank(s) 1, 2 copy each bucket from the source's staging copy in /dev/shm and verify it" in line
    assert "a source file is not safetensors (cannot be mapped)" in line
    assert {r["rank"]: r["path"] for r in result.report["ranks"]} == {0: "source", 1: "shm", 2: "shm"}
    assert all(r["collectives"] == 0 for r in result.report["ranks"])  # no bucket byte over a socket
    # One private run directory of the source (0700, 128 random bits in its name), holding its
    # 0600 staging file; nothing else, and nothing at the old predictable names.
    assert len(seen_shm) == 1 and len(seen_shm[0]) == 1, seen_shm
    run_dir = seen_shm[0][0]
    assert re.fullmatch(rf"{re.escape(str(shm))}/hwtui-staging-[0-9a-f]{{32}}", run_dir), run_dir
    assert modes == {run_dir: (0o700, os.geteuid(), False), f"{run_dir}/rank0": (0o600, os.geteuid(), False)}
    for rank in (1, 2):
        version, got = served(tmp_path / "out", rank)
        assert version == "s1"
        assert_bytes_equal(got, expected)
    assert _leftovers(digest, shm) == []


def test_shm_copy_is_verified_on_each_receivers_own_bytes(mixed):
    tmp_path, _, digest = mixed
    result = _run(tmp_path, fault="corrupt:bucket=2,rank=2")
    assert not result.ok and "bucket 2 failed verification on rank 2" in result.error
    assert served(tmp_path / "out", 1)[0] is None and served(tmp_path / "out", 2)[0] is None
    assert _leftovers(digest, _shm(tmp_path)) == []


@pytest.mark.parametrize("fault", [
    "kill:rank=0,phase=setup",   # the copy exists, nobody has mapped it yet: only the launcher can sweep it
    "term:rank=0,phase=setup",   # the source removes its own
    "kill:rank=0,bucket=3",      # mid-transfer: receivers hold it mapped
    "kill:rank=2,bucket=2",      # a receiver dies mid-copy
    "kill:rank=0,phase=prepare",  # every bucket copied, before the vote
    "term:rank=1,phase=prepare",
])
def test_no_shared_memory_copy_outlives_a_run_killed_at_any_phase(mixed, fault):
    tmp_path, _, digest = mixed
    result = _run(tmp_path, fault=fault)
    assert not result.ok
    assert "rank" in (result.error or "")
    assert _leftovers(digest, _shm(tmp_path)) == [], fault
    assert served(tmp_path / "out", 1)[0] is None and served(tmp_path / "out", 2)[0] is None


def test_without_usable_shared_memory_the_ranks_take_the_network(mixed):
    """No private directory can be made there: nothing is staged in shared memory, the bytes travel."""
    tmp_path, expected, digest = mixed
    env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
    env["HWTUI_SHM_DIR"] = str(tmp_path / "missing")
    events: list = []
    result = run_replication(ReplicationOptions(plan=str(tmp_path / "p.json"), nproc=3, env=env, commit=True,
                                                out=str(tmp_path / "out"), timeout=15.0), on_event=events.append)
    assert result.ok, result.error
    assert {r["rank"]: r["path"] for r in result.report["ranks"]} == {0: "source", 1: "network", 2: "network"}
    for rank in (1, 2):
        version, got = served(tmp_path / "out", rank)
        assert version == "s1"
        assert_bytes_equal(got, expected)
    assert _leftovers(digest) == [] and not (tmp_path / "missing").exists()
