"""The /dev/shm staging path under attack by a local user (issue 22, F1).

A torch-pickle source stages each bucket in shared memory for the ranks on its host. On 769874d
that file was ``/dev/shm/hwtui-<digest16>-<port>-rank0``, opened ``w+b``: a symlink planted at
that name for every port made root overwrite the link's target with the weights, a planted 0666
file left the planter a copy, and a SIGKILLed launcher left the file behind.

Real runs (``hwtui replicate --nproc 3 --commit``, gloo over 127.0.0.1), every byte on every
receiver compared. Planting is done as root and as ``nobody`` (a forked child that drops to uid
65534), in the real /dev/shm at every name 769874d could choose, and at names of the new form.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hwtui.engine.replication.launcher import ReplicationOptions, run_replication
from hwtui.engine.replication.plan import load_plan
from tests.engine.replication.helpers import assert_bytes_equal, make_model, paths_line, served, write_plan
from tests.local_user import as_user

pytestmark = [pytest.mark.torch, pytest.mark.timeout(400)]

NOBODY = 65534
PRECIOUS = b"a root-owned file the weights must never land in\n"
REPO = Path(__file__).resolve().parents[2]


def wait_for(pred, what: str, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def model(tmp_path):
    """A version of a safetensors file and a torch pickle: the source takes the shm path."""
    expected = make_model(tmp_path / "w", seed=11)
    write_plan(tmp_path / "w", tmp_path / "p.json", version="s1", bucket_kib=64)
    return expected, load_plan(tmp_path / "p.json").digest


def _ports() -> range:
    lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(lo), int(hi) + 1)


def _check_replicas(out: Path, expected, version: str = "s1") -> None:
    for rank in (1, 2):
        have, got = served(out, rank)
        assert have == version, rank
        assert_bytes_equal(got, expected)


@pytest.mark.parametrize("kind", ["symlink", "file"])
@pytest.mark.parametrize("planter", ["root", "nobody"])
def test_planted_symlinks_and_files_at_every_name_are_never_followed_or_written(tmp_path, model, planter, kind):
    expected, digest = model
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    victim.chmod(0o644)
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    (victim_dir / "rank0").write_bytes(PRECIOUS)
    # Every name 769874d could choose: a symlink to the victim, or a 0666 file the planter also
    # keeps a hard link to (its copy of the weights, had hwtui written them). Plus names of the new
    # form: a symlink, a file and a directory, none of which hwtui may follow, write or remove.
    old = [f"hwtui-{digest[:16]}-{p}-rank{r}" for p in _ports() for r in range(3)]
    tag = secrets.token_hex(8)
    new_link, new_file, new_dir = (f"hwtui-staging-{secrets.token_hex(16)}" for _ in range(3))
    keep = f"hwtui-plant-{tag}"  # the planter's hard links
    uid = os.geteuid() if planter == "root" else NOBODY

    def plant() -> None:
        os.umask(0)
        if kind == "file":
            os.mkdir(keep, 0o700)
        for name in old:
            if kind == "symlink":
                os.symlink(str(victim), name)
            else:
                os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
                os.link(name, f"{keep}/{name}")
        os.symlink(str(victim_dir), new_link)
        os.close(os.open(new_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        os.mkdir(new_dir, 0o777)  # a directory others may write: never one of hwtui's
        os.close(os.open(f"{new_dir}/rank0", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))

    planted = [*old, new_link, new_file, new_dir]
    try:
        as_user(uid, "/dev/shm", plant)
        events: list = []
        env = {k: v for k, v in os.environ.items() if k not in ("HWTUI_TEST_FAULT", "HWTUI_SHM_DIR")}
        result = run_replication(ReplicationOptions(plan=str(tmp_path / "p.json"), nproc=3, env=env, commit=True,
                                                    out=str(tmp_path / "out"), timeout=60.0), on_event=events.append)
        assert result.ok, result.error
        assert "shm path: rank(s) 1, 2" in paths_line(events)
        _check_replicas(tmp_path / "out", expected)
        assert victim.read_bytes() == PRECIOUS and (victim_dir / "rank0").read_bytes() == PRECIOUS
        for name in old:
            if kind == "file":  # the planter's copy holds nothing, and the planted name is still theirs
                assert os.path.getsize(f"/dev/shm/{keep}/{name}") == 0, name
            st = os.lstat(f"/dev/shm/{name}")
            assert st.st_uid == uid, name
            if kind == "symlink":
                assert stat.S_ISLNK(st.st_mode) and os.readlink(f"/dev/shm/{name}") == str(victim), name
            else:
                assert stat.S_ISREG(st.st_mode) and st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0o666, name
        assert os.readlink(f"/dev/shm/{new_link}") == str(victim_dir)
        assert os.path.getsize(f"/dev/shm/{new_file}") == 0 and os.path.getsize(f"/dev/shm/{new_dir}/rank0") == 0
    finally:
        with contextlib.suppress(OSError):
            for name in os.listdir(f"/dev/shm/{keep}"):
                os.unlink(f"/dev/shm/{keep}/{name}")
            os.rmdir(f"/dev/shm/{keep}")
        for name in planted:
            with contextlib.suppress(OSError):
                if name == new_dir:
                    with contextlib.suppress(OSError):
                        os.unlink(f"/dev/shm/{new_dir}/rank0")
                    os.rmdir(f"/dev/shm/{name}")
                else:
                    os.unlink(f"/dev/shm/{name}")


# ---------------------------------------------------------------- a SIGKILLed launcher, then the next run


def _staging_files(shm: Path, digest: str) -> set[str]:
    """Staging files in the test's shared-memory directory, and at 769874d's names in /dev/shm."""
    def ours(d: str) -> bool:  # never through a planted link, never another user's
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()

    mine = [d for d in glob.glob(f"{shm}/hwtui-staging-*") if ours(d)]
    return {f for d in mine for f in glob.glob(f"{d}/rank*")} | set(glob.glob(f"/dev/shm/hwtui-{digest[:16]}-*"))


def _ranks_of(plan: Path, out: Path) -> list[int]:
    """Processes whose command line names this plan and this --out (the launcher and its ranks)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                if str(plan).encode() in cmd and str(out).encode() in cmd:
                    pids.append(int(entry))
    return pids


def _start(tmp_path: Path, shm: Path, out: str, fault: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
    env.update({"HWTUI_SHM_DIR": str(shm), "HWTUI_TEST_FAULT": fault, "PYTHONPATH": str(REPO)})
    return subprocess.Popen([sys.executable, "-m", "hwtui", "replicate", "--plan", str(tmp_path / "p.json"),
                             "--nproc", "3", "--commit", "--out", str(tmp_path / out), "--timeout", "300"],
                            env=env, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_sigkilled_launchers_staging_goes_with_the_next_run_and_a_live_runs_stays(tmp_path, model):
    expected, digest = model
    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o1777)  # what /dev/shm is
    # Another user's leftovers (a dead run of theirs, by name) and a symlink: never touched.
    theirs = f"hwtui-staging-{secrets.token_hex(16)}"
    link = f"hwtui-staging-{secrets.token_hex(16)}"
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    (victim_dir / "rank0").write_bytes(PRECIOUS)

    def plant() -> None:
        os.mkdir(theirs, 0o700)
        os.close(os.open(f"{theirs}/rank0", os.O_CREAT | os.O_WRONLY, 0o600))
        os.symlink(str(victim_dir), link)

    as_user(NOBODY, str(shm), plant)

    # Run K: stalls with its staging copy made (rank 1 hangs at bucket 2); SIGKILL its launcher's
    # process group: its ranks die with it (PR_SET_PDEATHSIG), nothing of it removes anything.
    killed = _start(tmp_path, shm, "out-k", "hang:rank=1,bucket=2")
    try:
        k_files = wait_for(lambda: _staging_files(shm, digest), "run K's staging file")
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=60)
        wait_for(lambda: not _ranks_of(tmp_path / "p.json", tmp_path / "out-k"), "run K's ranks to die")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(killed.pid, signal.SIGKILL)
    assert _staging_files(shm, digest) == k_files  # left behind, as after any SIGKILL
    for f in k_files:
        assert stat.S_IMODE(os.lstat(f).st_mode) == 0o600 and stat.S_IMODE(os.lstat(os.path.dirname(f)).st_mode) == 0o700

    # Run L: a live concurrent run of the same user, stalled with its staging copy made.
    live = _start(tmp_path, shm, "out-l", "hang:rank=1,bucket=2")
    try:
        l_files = wait_for(lambda: _staging_files(shm, digest) - k_files, "run L's staging file")
        # Run M, the next run: to completion, every byte right; it sweeps K's leftovers only.
        env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
        env["HWTUI_SHM_DIR"] = str(shm)
        result = run_replication(ReplicationOptions(plan=str(tmp_path / "p.json"), nproc=3, env=env, commit=True,
                                                    out=str(tmp_path / "out-m"), timeout=60.0))
        assert result.ok, result.error
        _check_replicas(tmp_path / "out-m", expected)
        assert _staging_files(shm, digest) == l_files, "K's leftovers must go, L's live copy must stay"
        assert live.poll() is None
        assert all(os.path.getsize(f) > 0 for f in l_files)
    finally:
        os.killpg(live.pid, signal.SIGTERM)  # L cleans up after itself
        live.wait(timeout=120)
    wait_for(lambda: not _ranks_of(tmp_path / "p.json", tmp_path / "out-l"), "run L's ranks to exit")
    assert _staging_files(shm, digest) == set()
    assert sorted(os.listdir(shm)) == sorted([theirs, link])
    assert os.lstat(shm / theirs).st_uid == NOBODY and (shm / theirs / "rank0").exists()
    assert os.readlink(shm / link) == str(victim_dir) and (victim_dir / "rank0").read_bytes() == PRECIOUS
