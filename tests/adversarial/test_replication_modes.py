"""Who can read what ``replicate --commit --out`` serves: the owner only, or a named serving group.

Served weights, manifests, CURRENT, the decision record and the lock files are 0600 (directories
0700); ``--serve-group G`` makes what a server reads 0640/0750 and group G's, and nothing else.
The modes are given before the rename that publishes a version, whatever the umask. Real
worker processes on gloo over 127.0.0.1, run through the CLI as an operator runs them.
"""

from __future__ import annotations

import grp
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hwtui.engine.replication.commit import decision_path
from hwtui.engine.replication.launcher import ReplicationOptions, run_replication
from tests import cli_proc
from tests.engine.replication.helpers import assert_bytes_equal, make_model, served, write_plan

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("modes")
    v1 = make_model(root / "src1", seed=31, big=5_000, n=4)
    write_plan(root / "src1", root / "v1.json", version="v1", bucket_kib=8)
    v2 = make_model(root / "src2", seed=32, big=5_000, n=4)
    write_plan(root / "src2", root / "v2.json", version="v2", bucket_kib=8)
    return {"root": root, "v1": v1, "v2": v2}


@pytest.fixture(scope="module")
def group() -> grp.struct_group:
    """A group other than this process's own, that it may give files to (any, as root)."""
    mine = set(os.getgroups()) | {os.getegid()}
    for g in grp.getgrall():
        if g.gr_gid != os.getegid() and (os.geteuid() == 0 or g.gr_gid in mine):
            return g
    pytest.skip("no second group this user may give files to")


def cli(plan: Path, out: Path, *extra: str, fault: str | None = None, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
    if fault:
        env["HWTUI_TEST_FAULT"] = fault
    return cli_proc.run([sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(plan), "--nproc", "3",
                         "--commit", "--out", str(out), "--timeout", "10", *extra],
                        capture_output=True, text=True, timeout=90, env=env, umask=umask)


def mode(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_gid


def served_paths(out: Path, rank: int, version: str) -> tuple[list[Path], list[Path]]:
    """(directories, files) a server reads to serve ``version`` on ``rank``."""
    root = out / f"rank{rank}"
    vdir = root / "versions" / version
    return [root, root / "versions", vdir], [root / "CURRENT", vdir / "model.safetensors", vdir / "manifest.json"]


def assert_private_bookkeeping(out: Path, version: str) -> None:
    """What no server needs stays owner-only whatever the serving group."""
    assert mode(decision_path(out, version).parent)[0] == 0o700
    assert mode(decision_path(out, version))[0] == 0o600
    for r in (0, 1, 2):
        assert mode(out / f".lock.rank{r}")[0] == 0o600, r


def test_served_files_are_owner_only_whatever_the_umask(base, tmp_path):
    # On 769874d they were 0644 (0666 under umask 0): anyone on the host could read the weights.
    out = tmp_path / "out"
    proc = cli(base["root"] / "v1.json", out, umask=0)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert mode(out)[0] == 0o700  # created by the run
    for r in (1, 2):
        dirs, files = served_paths(out, r, "v1")
        assert {p.name: mode(p)[0] for p in dirs} == {p.name: 0o700 for p in dirs}, r
        assert {p.name: mode(p)[0] for p in files} == {p.name: 0o600 for p in files}, r
        assert not (out / f"rank{r}" / "staging").exists()
    assert_private_bookkeeping(out, "v1")


def test_serve_group_makes_what_a_server_reads_group_readable_and_nothing_more(base, tmp_path, group):
    out = tmp_path / "out"
    proc = cli(base["root"] / "v1.json", out, "--serve-group", group.gr_name, umask=0o077)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert mode(out) == (0o750, group.gr_gid)
    for r in (1, 2):
        dirs, files = served_paths(out, r, "v1")
        assert {p.name: mode(p) for p in dirs} == {p.name: (0o750, group.gr_gid) for p in dirs}, r
        assert {p.name: mode(p) for p in files} == {p.name: (0o640, group.gr_gid) for p in files}, r
        version, tensors = served(out, r)
        assert version == "v1"
        assert_bytes_equal(tensors, base["v1"])
    assert_private_bookkeeping(out, "v1")


def test_a_version_is_published_with_its_final_modes_never_changed_after(base, tmp_path, group):
    """The rank stops right after the rename that publishes v2: nothing runs after it, so any mode
    seen there was given before the rename. The re-run finishes the switch with the same modes."""
    out = tmp_path / "out"
    # v1 in-process (the set-up: its modes are the umask test's), then the runs under test by the CLI.
    first = run_replication(ReplicationOptions(plan=str(base["root"] / "v1.json"), nproc=3, commit=True, out=str(out),
                                               env={k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}))
    assert first.ok, first.error
    proc = cli(base["root"] / "v2.json", out, "--serve-group", str(group.gr_gid), fault="kill:rank=1,phase=switched")
    assert proc.returncode == 1 and "re-run the same command to finish the switch" in proc.stderr, proc.stderr[-2000:]
    dirs, files = served_paths(out, 1, "v2")
    assert (out / "rank1" / "versions" / "v2").is_dir() and served(out, 1)[0] == "v1"
    assert {p.name: mode(p) for p in dirs} == {p.name: (0o750, group.gr_gid) for p in dirs}
    assert {p.name: mode(p) for p in files[1:]} == {p.name: (0o640, group.gr_gid) for p in files[1:]}
    assert mode(out / "rank1" / ".CURRENT.v2.pending") == (0o640, group.gr_gid)  # the CURRENT-to-be, too

    again = cli(base["root"] / "v2.json", out, "--serve-group", group.gr_name)
    assert again.returncode == 0, again.stderr[-2000:]
    for r in (1, 2):
        dirs, files = served_paths(out, r, "v2")
        assert {p.name: mode(p) for p in files} == {p.name: (0o640, group.gr_gid) for p in files}, r
        version, tensors = served(out, r)
        assert version == "v2"
        assert_bytes_equal(tensors, base["v2"])
    # v1 was published before any group was named: it keeps the modes it was published with.
    assert mode(out / "rank2" / "versions" / "v1" / "model.safetensors")[0] == 0o600


@pytest.mark.parametrize("extra", [["--serve-group", "hwtui-no-such-group"], ["--serve-group", "99999999999"],
                                   ["--serve-group", "bad\x1b[2Jname"], ["--serve-group", ""]])
def test_a_serve_group_that_is_not_a_group_is_one_line_exit_2_and_writes_nothing(base, tmp_path, extra):
    out = tmp_path / "out"
    proc = cli(base["root"] / "v1.json", out, *extra)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--serve-group" in lines[0] and "\x1b" not in lines[0], proc.stderr
    assert not out.exists()


def test_serve_group_without_commit_is_exit_2(base, tmp_path, group):
    proc = cli_proc.run([sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(base["root"] / "v1.json"),
                         "--nproc", "2", "--serve-group", group.gr_name], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--commit" in proc.stderr, proc.stderr


def test_a_group_this_user_cannot_give_files_to_is_refused():
    """Checked before anything is written, not found by a chown in the middle of prepare."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    code = ("import os\nfrom hwtui.core.errors import HwtuiError\nfrom hwtui.engine.replication.served_files import serve_modes\n"
            "os.setgroups([]); os.setegid(65534); os.seteuid(65534)\n"
            "assert serve_modes('65534').gid == 65534\n"
            "try:\n    serve_modes('0')\nexcept HwtuiError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "--serve-group '0': this user is not a member, so it cannot give files to that group"
