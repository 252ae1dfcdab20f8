"""The spare staging file against a hostile node: a full disk, planted links, a second agent.

Each case was found by attacking round fourteen's spare (engine/resident/spare.py): a full disk
killed the rank with SIGBUS through the spare's mapping and left the whole temporary file; a
symlink at ``<served>/spare`` was followed (the spare's zeros replaced a file elsewhere, a push
moved that directory's model into its staging, the agent's start unlinked files there); the
directory took the umask's mode; a failed rename left the temporary file; an unreadable CURRENT
ended the rank with a traceback; and a second agent on the same --out ran its recovery on the live
agent's files before it failed on its port.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hwtui.core.errors import HwtuiError
from hwtui.engine.resident.resident import ResidentRank
from hwtui.engine.resident.spare import spare_path
from tests.agent.procs import small_tmpfs, until

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of its own (root only), unmounted whatever the test did."""
    yield from small_tmpfs(tmp_path, "4m")


def _served_version(out: Path, rank: int = 1, size: int = 0, current: str | None = None) -> Path:
    """``<out>/rank<rank>`` serving v1 (a sparse model of ``size`` bytes), or with ``current`` as its CURRENT."""
    root = out / f"rank{rank}"
    (root / "versions" / "v1").mkdir(parents=True)
    model = root / "versions" / "v1" / "model.safetensors"
    with open(model, "wb") as fh:
        fh.truncate(size)
    (root / "CURRENT").write_text(current if current is not None else
                                  json.dumps({"version": "v1", "file": "versions/v1/model.safetensors"}))
    return root


def _make_spare_in_a_child(out: Path) -> subprocess.CompletedProcess[str]:
    """The resident rank's idle work (_make_spare) in a process of its own: a SIGBUS must not take
    the test with it. Prints each message the rank would send the agent, then "alive"."""
    code = textwrap.dedent(f"""
        import json, types
        from hwtui.engine.resident.resident_child import _make_spare
        cfg = types.SimpleNamespace(settings=types.SimpleNamespace(device="cpu"), out={str(out)!r}, rank=1)
        _make_spare(cfg, lambda m: print(json.dumps(m), flush=True), lambda: False)
        print("alive", flush=True)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)


def test_a_full_disk_is_a_failed_spare_in_one_line_and_leaves_nothing(small_disk):
    out = small_disk / "out"
    root = _served_version(out, size=64 << 20)  # sparse: the model is more than the disk holds
    done = _make_spare_in_a_child(out)
    assert done.returncode == 0, f"the rank died ({done.returncode}): {done.stderr[-500:]}"
    lines = done.stdout.splitlines()
    assert lines[-1] == "alive" and "Traceback" not in done.stderr, done.stderr
    (msg,) = [json.loads(ln) for ln in lines[:-1]]
    assert msg["kind"] == "resident.spare" and msg["state"] == "failed", msg
    assert "space" in msg["reason"], msg
    spare_dir = root / "spare"
    until("the stopped spare's files to go", lambda: not any(spare_dir.iterdir()))  # unlinked on a thread
    assert not spare_path(root).exists()


@pytest.mark.parametrize("current", ["{not json", json.dumps({"version": "v1", "file": 5})])
def test_an_unreadable_current_is_a_failed_spare_not_the_rank_s_end(tmp_path, current):
    _served_version(tmp_path / "out", current=current)
    done = _make_spare_in_a_child(tmp_path / "out")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    msg = json.loads(done.stdout.splitlines()[0])
    assert (msg["kind"], msg["state"]) == ("resident.spare", "failed") and msg["reason"], msg


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    (victim / "model.safetensors").write_bytes(b"not yours")
    (victim / ".spare.tmp").write_bytes(b"keep me")
    (victim / ".spare.discard.notes").write_bytes(b"keep me too")
    return victim


def _untouched(victim: Path) -> None:
    assert (victim / "model.safetensors").read_bytes() == b"not yours"
    assert (victim / ".spare.tmp").read_bytes() == b"keep me"
    assert (victim / ".spare.discard.notes").read_bytes() == b"keep me too"


def test_a_link_planted_at_the_spare_directory_is_never_followed(tmp_path):
    from hwtui.engine.resident.spare import SpareStaging, make_spare

    victim = _victim(tmp_path)
    root = tmp_path / "out" / "served"
    root.mkdir(parents=True)
    (root / "spare").symlink_to(victim)
    with pytest.raises(OSError):
        make_spare(root, 4096)
    _untouched(victim)
    # A push's staging never takes a "spare" through the link.
    st = SpareStaging([{"name": "t", "dtype": "U8", "shape": [4], "nbytes": 4, "checksum": "0"}], {},
                      file=root / "staging" / "v2" / "model.safetensors")
    assert not st.used_spare
    st.close()
    _untouched(victim)
    # Nor does the agent's start, which removes a dead rank's half-made spares.
    agent = ResidentRank(node="n", out=tmp_path / "out", advertise="127.0.0.1")
    agent.close()
    _untouched(victim)


def test_the_spare_directory_is_owner_only_whatever_the_umask(tmp_path):
    from hwtui.engine.resident.spare import make_spare

    old = os.umask(0)
    try:
        make_spare(tmp_path / "served", 4096)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "served" / "spare").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(spare_path(tmp_path / "served")).st_mode) == 0o600


def test_a_spare_that_cannot_be_renamed_into_place_leaves_no_temporary_file(tmp_path):
    from hwtui.engine.resident.spare import make_spare

    root = tmp_path / "served"
    spare_path(root).mkdir(parents=True)  # a directory where the spare goes
    with pytest.raises(OSError):
        make_spare(root, 1 << 20)
    until("the temporary file to go", lambda: sorted(p.name for p in (root / "spare").iterdir()) == ["model.safetensors"])


def test_a_second_agent_on_the_same_out_refuses_before_it_touches_anything(tmp_path):
    out = tmp_path / "out"
    live = ResidentRank(node="a", out=out, advertise="127.0.0.1")
    try:
        # What a push and the idle spare of the live agent have on disk right now.
        (live.out / "pushes" / "p1.plan").write_text("{}")
        (live.served / "spare").mkdir(mode=0o700)
        (live.served / "spare" / ".spare.tmp").write_bytes(b"being made")
        with pytest.raises(HwtuiError, match=rf"--out {out} is in use by another agent \(pid {os.getpid()}\)"):
            ResidentRank(node="b", out=out, advertise="127.0.0.1")
        assert (live.out / "pushes" / "p1.plan").exists()
        assert (live.served / "spare" / ".spare.tmp").read_bytes() == b"being made"
    finally:
        live.close()
    # Once the first agent is gone, the next one takes --out and cleans up what it left.
    after = ResidentRank(node="b", out=out, advertise="127.0.0.1")
    after.close()
    assert not (out / "pushes" / "p1.plan").exists() and not (out / "served" / "spare" / ".spare.tmp").exists()


def test_the_agent_s_lock_dies_with_it(tmp_path):
    """A killed agent leaves no stale lock: the kernel drops a flock with its holder."""
    out = tmp_path / "out"
    code = f"from hwtui.engine.resident.resident import ResidentRank; ResidentRank(node='a', out={str(out)!r}, advertise='127.0.0.1'); import os; os.kill(os.getpid(), 9)"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert (out / ".lock.agent").exists()
    ResidentRank(node="b", out=out, advertise="127.0.0.1").close()


def test_the_spare_s_blocks_are_reserved_chunk_by_chunk_so_a_stop_never_waits_for_all_of_them(tmp_path):
    """Reserving the whole spare at once took 0.9 s for 1 GiB on tmpfs, with no stop between: a push
    arriving then waited. Each time the stop is asked, at most the chunks already zeroed are reserved."""
    from hwtui.engine.resident.spare import SPARE_CHUNK, SpareStopped, make_spare

    tmp = tmp_path / "served" / "spare" / ".spare.tmp"
    seen: list[int] = []

    def stop() -> bool:
        seen.append(os.stat(tmp).st_blocks * 512)
        return len(seen) == 3

    with pytest.raises(SpareStopped):
        make_spare(tmp_path / "served", 8 * SPARE_CHUNK, stop)
    assert len(seen) == 3
    assert all(reserved <= i * SPARE_CHUNK + (1 << 20) for i, reserved in enumerate(seen)), seen


@pytest.mark.parametrize("planted", ["symlink", "fifo", "directory"])
def test_whatever_is_planted_at_the_agent_s_lock_is_one_line_and_never_followed(tmp_path, planted):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    lock = out / ".lock.agent"
    {"symlink": lambda: lock.symlink_to(victim), "fifo": lambda: os.mkfifo(lock),
     "directory": lambda: lock.mkdir()}[planted]()
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(HwtuiError, match=rf"--out {out} cannot hold this agent's lock: "):
        ResidentRank(node="n", out=out, advertise="127.0.0.1")
    assert victim.read_text() == "keep"
    assert len(os.listdir("/proc/self/fd")) == fds, "a refusal leaves no descriptor open"
