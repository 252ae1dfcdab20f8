"""Every file a staging copy makes is created exclusively, 0600, never through a symlink.

The staging copy under ``--out`` (``Staging``), the agent's spare (``make_spare`` and its reuse by
``SpareStaging``), the ``--out`` write probe, and the shared-memory run directories
(``engine.replication.shm``): a symlink or a file planted at any name they use is never followed
or written, and its target keeps its bytes.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.local_user import as_user

RUN_PREFIX = "hwtui-staging-"

TENSORS = [{"name": "a", "dtype": "F32", "shape": [4], "nbytes": 16, "checksum": "0"},
           {"name": "b", "dtype": "U8", "shape": [3], "nbytes": 3, "checksum": "0"}]
PRECIOUS = b"root-owned bytes that must never change\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    victim.chmod(0o644)
    return victim


NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.torch
@pytest.mark.parametrize("planted", ["symlink", "file"])
def test_staging_file_replaces_a_planted_name_without_following_it(tmp_path, planted):
    from hwtui.engine.replication.staging import Staging

    victim = _victim(tmp_path)
    path = tmp_path / "staging" / "v1" / "model.safetensors"
    path.parent.mkdir(parents=True)
    if planted == "symlink":
        path.symlink_to(victim)
    else:
        path.write_bytes(b"planted")
        path.chmod(0o666)
    st = Staging(TENSORS, {"format": "pt"}, file=path)
    st.write_at(0, bytes(range(16)))
    st.flush()
    st.close()
    assert victim.read_bytes() == PRECIOUS
    assert not path.is_symlink()
    assert _mode(path) == 0o600 and os.lstat(path).st_uid == os.geteuid()
    assert path.read_bytes()[-19:-3] == bytes(range(16))


@pytest.mark.torch
def test_flush_never_follows_a_staging_path_swapped_for_a_symlink(tmp_path):
    from hwtui.engine.replication.staging import Staging

    victim = _victim(tmp_path)
    path = tmp_path / "model.safetensors"
    st = Staging(TENSORS, {"format": "pt"}, file=path)
    st.close()
    path.unlink()
    path.symlink_to(victim)  # swapped between set-up and the flush
    with pytest.raises(OSError):
        st.flush()
    assert victim.read_bytes() == PRECIOUS


@pytest.mark.torch
def test_spare_is_private_and_a_planted_spare_or_temp_name_is_not_followed(tmp_path):
    from hwtui.engine.resident.spare import SpareStaging, make_spare, spare_path

    victim = _victim(tmp_path)
    served = tmp_path / "rank1"
    spare = spare_path(served)
    spare.parent.mkdir(parents=True)
    (spare.parent / ".spare.tmp").symlink_to(victim)
    make_spare(served, 64)
    assert victim.read_bytes() == PRECIOUS
    assert _mode(spare) == 0o600 and spare.stat().st_size == 64

    # A spare that is a symlink is never taken as the staging copy (nor followed).
    spare.unlink()
    spare.symlink_to(victim)
    file = served / "staging" / "v2" / "model.safetensors"
    st = SpareStaging(TENSORS, {"format": "pt"}, file=file)
    st.close()
    assert not st.used_spare
    assert victim.read_bytes() == PRECIOUS and _mode(file) == 0o600 and not file.is_symlink()


def test_out_write_probe_never_follows_a_planted_link(tmp_path):
    from hwtui.engine.replication.launcher import ReplicationOptions, preflight_out

    victim = _victim(tmp_path)
    out = tmp_path / "out"
    (out / "rank1").mkdir(parents=True)
    (out / "rank1" / ".write-probe").symlink_to(victim)

    class _Plan(dict):
        digest = "0" * 64

    preflight_out(ReplicationOptions(plan="p", out=str(out), commit=True), [0, 1],
                  _Plan(version="v1", prev_version=None))  # type: ignore[arg-type]
    assert victim.read_bytes() == PRECIOUS and not (out / "rank1" / ".write-probe").exists()


# ---------------------------------------------------------------- the shared-memory run directories


def _sticky_dir(tmp_path: Path) -> Path:
    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o1777)  # what /dev/shm is: anyone may create names, only their owner may remove them
    return shm


def test_run_dir_names_already_taken_by_anything_are_skipped(tmp_path, monkeypatch):
    """Whatever sits at the name hwtui draws (a symlink, a file, another's directory) is never used."""
    from hwtui.engine.replication import shm as shm_mod
    from hwtui.engine.replication.shm import make_run_dir

    shm = _sticky_dir(tmp_path)
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    (victim_dir / "rank0").write_bytes(PRECIOUS)
    drawn = iter(["a" * 32, "b" * 32, "c" * 32, "d" * 32])
    monkeypatch.setattr(shm_mod.secrets, "token_hex", lambda n: next(drawn))
    (shm / f"{RUN_PREFIX}{'a' * 32}").symlink_to(victim_dir)
    (shm / f"{RUN_PREFIX}{'b' * 32}").write_bytes(b"")
    (shm / f"{RUN_PREFIX}{'c' * 32}").mkdir(mode=0o755)
    run = make_run_dir(str(shm))
    try:
        assert run.path == str(shm / f"{RUN_PREFIX}{'d' * 32}")
        assert _mode(Path(run.path)) == 0o700
        fd = os.open(run.file("rank0"), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    finally:
        run.remove()
    assert not os.path.lexists(run.path)
    assert (victim_dir / "rank0").read_bytes() == PRECIOUS
    assert sorted(p.name for p in shm.iterdir()) == [f"{RUN_PREFIX}{c * 32}" for c in "abc"]


_HOLD = """
import os, sys
from hwtui.engine.replication.shm import make_run_dir
run = make_run_dir(sys.argv[1])
os.close(os.open(run.file("rank0"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
print(run.path, flush=True)
sys.stdin.read()
"""


def test_sweep_takes_only_this_users_dead_directories_and_follows_nothing(tmp_path):
    """A live run's directory (its owner holds the lock), another user's, a symlink, a file, a
    directory that is not private: all stay. A dead run's goes, and a symlink inside it goes
    without its target being touched."""
    from hwtui.engine.replication.shm import sweep_dead_run_dirs

    shm = _sticky_dir(tmp_path)
    # A concurrent run, alive (its own start-up sweeps too, so it starts before anything is planted).
    live = subprocess.Popen([sys.executable, "-c", _HOLD, str(shm)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    live_path = Path(live.stdout.readline().strip())  # bounded by the test's timeout
    victim = _victim(tmp_path)
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    (victim_dir / "keep").write_bytes(PRECIOUS)
    NAMES = {k: f"{RUN_PREFIX}{secrets.token_hex(16)}" for k in ("dead", "link", "file", "shared", "nobody")}
    dead = shm / NAMES["dead"]
    dead.mkdir(mode=0o700)
    (dead / "rank0").write_bytes(b"weights")
    (dead / "link").symlink_to(victim)
    (shm / NAMES["link"]).symlink_to(victim_dir)
    (shm / NAMES["file"]).write_bytes(b"x")
    shared = shm / NAMES["shared"]
    shared.mkdir(mode=0o755)
    (shared / "f").write_bytes(b"x")
    # Private directories of this user whose names hwtui never draws (the TUI's temporary
    # directory, were $TMPDIR /dev/shm; a name that only starts alike): never swept.
    alike = [shm / "hwtui-run-k2x9_q1a", shm / f"{RUN_PREFIX}{'0' * 31}", shm / f"{RUN_PREFIX}{'g' * 32}"]
    for d in alike:
        d.mkdir(mode=0o700)
        (d / "f").write_bytes(b"x")
    others = shm / NAMES["nobody"]
    as_user(NOBODY, shm, lambda: (os.mkdir(others.name, 0o700),
                                  os.close(os.open(f"{others.name}/rank0", os.O_CREAT | os.O_WRONLY, 0o600))))
    assert os.lstat(others).st_uid == NOBODY
    try:
        assert live_path.is_dir()
        removed = sweep_dead_run_dirs(str(shm))
        assert removed == [str(dead)]
        assert (live_path / "rank0").exists()
        assert victim.read_bytes() == PRECIOUS and (victim_dir / "keep").read_bytes() == PRECIOUS
        assert (others / "rank0").exists() and (shared / "f").exists() and (shm / NAMES["file"]).exists()
        assert os.path.islink(shm / NAMES["link"])
        assert all((d / "f").exists() for d in alike)
    finally:
        live.stdin.close()
        live.wait(timeout=60)
    # Its owner gone (without removing it, as after a SIGKILL): the next sweep takes it.
    assert sweep_dead_run_dirs(str(shm)) == [str(live_path)]


def test_a_sweep_between_mkdir_and_lock_makes_the_creator_start_over(tmp_path, monkeypatch):
    from hwtui.engine.replication import shm as shm_mod
    from hwtui.engine.replication.shm import make_run_dir, sweep_dead_run_dirs

    shm = _sticky_dir(tmp_path)
    real_open = os.open
    swept: list[list[str]] = []

    def open_then_sweep(path, flags, *a, **kw):  # a concurrent sweep lands right after the mkdir
        fd = real_open(path, flags, *a, **kw)
        if not swept and str(path).startswith(str(shm / RUN_PREFIX)):
            swept.append(sweep_dead_run_dirs(str(shm)))
        return fd

    monkeypatch.setattr(shm_mod.os, "open", open_then_sweep)
    run = make_run_dir(str(shm))
    try:
        assert len(swept) == 1 and len(swept[0]) == 1 and swept[0][0] != run.path
        assert os.path.isdir(run.path)
        fd = real_open(run.path, os.O_RDONLY | os.O_DIRECTORY)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    finally:
        run.remove()


@pytest.mark.torch
def test_a_plan_uploaded_to_a_resident_receiver_is_kept_owner_only(tmp_path):
    """The agent's resident receiver writes what a pusher sends under its --out: 0600, exclusive."""
    import io

    from hwtui.engine.replication.plan import load_plan
    from hwtui.engine.resident.resident import ResidentRank
    from tests.engine.replication.helpers import make_model, write_plan

    make_model(tmp_path / "m", seed=3, big=400, n=3)
    write_plan(tmp_path / "m", tmp_path / "p.plan", version="v1", bucket_kib=4)
    raw = (tmp_path / "p.plan").read_bytes()
    digest = load_plan(tmp_path / "p.plan").digest
    node = ResidentRank(node="solo", out=tmp_path / "solo", advertise="127.0.0.1")
    try:
        node.upload_plan({"digest": digest}, len(raw), io.BytesIO(raw).read)
        kept = list((tmp_path / "solo" / "pushes").iterdir())
        assert [p.name for p in kept] == [f"upload-{digest}.plan"]
        assert _mode(kept[0]) == 0o600 and kept[0].read_bytes() == raw
    finally:
        node.close()
