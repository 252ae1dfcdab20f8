"""The replication commit under attack: signals at every phase, a disk in the way, two runs at once.

Every case ends with the same check: each receiver serves one complete, verified version (every
byte compared), and no rank serves a different version than its peers once the run (or its
re-run) is over. Real worker processes on gloo over 127.0.0.1; faults are injected with
HWTUI_TEST_FAULT at exact phases so each case is deterministic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.commit import OutLock, decision_path
from hwtui.engine.replication.events import ReplCommit
from hwtui.engine.replication.launcher import ReplicationOptions, run_replication
from tests import cli_proc
from tests.engine.replication.helpers import assert_bytes_equal, make_model, served, write_plan

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]


# Every wait of the product set far beyond this module's pytest timeout (120 s): a run that ends
# at all ended because the fault was seen as it happened (a rank's exit), never because a timeout
# fired, and that holds however loaded the machine is (a wall-clock bound would not).
NEVER = {"timeout": 3600.0, "init_timeout": 3600.0}


def replicate(plan: Path, out: Path, *, nproc: int, fault: str | None = None,
              **kw: Any) -> tuple[Any, list[Any]]:
    env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
    if fault:
        env["HWTUI_TEST_FAULT"] = fault
    events: list = []
    result = run_replication(ReplicationOptions(plan=str(plan), nproc=nproc, env=env, commit=True, out=str(out), **kw),
                             on_event=events.append)
    return result, events


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """v1 served by ranks 1 and 2, and a v2 plan ready to push (a full push: every tensor changes)."""
    root = tmp_path_factory.mktemp("faults")
    v1 = make_model(root / "src1", seed=21, big=20_000, n=8)
    write_plan(root / "src1", root / "v1.json", version="v1", bucket_kib=16)
    v2 = make_model(root / "src2", seed=22, big=20_000, n=8)
    write_plan(root / "src2", root / "v2.json", version="v2", bucket_kib=16)
    return {"root": root, "v1": v1, "v2": v2, "n": 0}


@pytest.fixture
def out(base: dict[str, Any]) -> Path:
    """A fresh --out where ranks 1 and 2 serve v1 (copied from a template committed once)."""
    import shutil

    template = base["root"] / "template"
    if not template.exists():
        result, _ = replicate(base["root"] / "v1.json", template, nproc=3)
        assert result.ok, result.error
    base["n"] += 1
    dst: Path = base["root"] / f"out{base['n']}"
    shutil.copytree(template, dst, ignore=shutil.ignore_patterns(".lock.*"))
    return dst


def serving(out: Path, base: dict[str, Any], ranks: tuple[int, ...] = (1, 2)) -> dict[int, str | None]:
    """What each rank serves, after checking every byte of it against the version it claims."""
    got: dict[int, str | None] = {}
    for r in ranks:
        version, tensors = served(out, r)
        assert version in ("v1", "v2"), (r, version)
        assert_bytes_equal(tensors, base[version])
        got[r] = version
    return got


def test_sigkill_between_decision_and_switch_is_finished_by_a_rerun(base: dict[str, Any], out: Path) -> None:
    plan = base["root"] / "v2.json"
    # Waits far beyond the test's own timeout: only rank 1's death, seen as it happens, can end the run.
    result, events = replicate(plan, out, nproc=3, fault="kill:rank=1,phase=commit", **NEVER)
    assert not result.ok and result.exit_code == 1
    # The decision was recorded before anyone switched: rank 2 switched, rank 1 died first.
    assert decision_path(out, "v2").exists()
    assert serving(out, base) == {1: "v1", 2: "v2"}
    assert "re-run the same command" in result.error and "rank 1 serves v1" in result.error
    rep = result.report
    assert rep["decision"] == "commit" and rep["committed"] is False and rep["serving"] == {"1": "v1", "2": "v2"}
    assert [(c.phase, c.ok) for c in events if isinstance(c, ReplCommit)] == [("prepare", True), ("commit", False)]
    assert (out / "rank1" / "staging" / "v2" / "manifest.json").exists()  # the prepared copy survived

    # The same command again: no transfer, rank 1 finishes from its prepared copy.
    again, events = replicate(plan, out, nproc=3)
    assert again.ok and again.exit_code == 0, again.error
    assert serving(out, base) == {1: "v2", 2: "v2"}
    assert again.report["recovered"] and again.report["committed"] and again.report["serving"] == {"1": "v2", "2": "v2"}
    detail = [c.detail for c in events if isinstance(c, ReplCommit)][0]
    assert "rank 1 finished the switch" in detail and "rank 2 already serves it" in detail

    # And once more: a committed version is a no-op success.
    third, _ = replicate(plan, out, nproc=3)
    assert third.ok and third.report["serving"] == {"1": "v2", "2": "v2"}


def test_sigterm_during_commit_cannot_split_the_world_and_prints_no_traceback(base: dict[str, Any], out: Path) -> None:
    env = dict(os.environ, HWTUI_TEST_FAULT="term:rank=2,phase=commit")
    proc = cli_proc.run([sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(base["root"] / "v2.json"),
                         "--nproc", "3", "--commit", "--out", str(out), "--report", str(out / "report.json")],
                        capture_output=True, text=True, timeout=90, env=env)
    assert "Traceback" not in proc.stderr + proc.stdout
    # The signal arrived after the decision: the switch finishes, then the rank stops.
    assert serving(out, base) == {1: "v2", 2: "v2"}
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "serving: rank 1 v2, rank 2 v2"
    report = json.loads((out / "report.json").read_text())
    assert report["committed"] and report["serving"] == {"1": "v2", "2": "v2"}


# kill:rank=2,phase=prepare is test_replicate.py::test_rank_dying_after_prepare_means_no_commit_anywhere
@pytest.mark.parametrize("fault", ["term:rank=1,bucket=1", "fail:rank=0,phase=decide"])
def test_fault_before_the_decision_leaves_every_rank_on_the_old_version(base: dict[str, Any], out: Path, fault: str) -> None:
    result, events = replicate(base["root"] / "v2.json", out, nproc=3, fault=fault, **NEVER)
    assert not result.ok and result.exit_code == 1
    rank = fault.split("rank=")[1][0]
    assert f"rank {rank}" in result.error, result.error
    assert not decision_path(out, "v2").exists()
    assert serving(out, base) == {1: "v1", 2: "v1"}
    assert not (out / "rank1" / "staging" / "v2").exists() and not (out / "rank2" / "staging" / "v2").exists()
    assert result.report["serving"] == {"1": "v1", "2": "v1"} and not result.report["committed"]


def cli(plan: Path, out: Path, *, fault: str | None = None, mountns: tuple[str, str, list[Any]] | None = None,
        timeout: float = 90, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``hwtui replicate --commit`` as an operator runs it; ``mountns`` = (setup, after, their
    arguments): in a mount namespace of its own, between those two shell scripts (cli_proc.in_mountns)."""
    env = {k: v for k, v in os.environ.items() if k != "HWTUI_TEST_FAULT"}
    if fault:
        env["HWTUI_TEST_FAULT"] = fault
    argv = [sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(plan), "--nproc", "3", "--commit",
            "--out", str(out), "--timeout", "10", *extra]
    if mountns is not None:
        argv = cli_proc.in_mountns(*mountns, argv)
    return cli_proc.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def assert_rank_2_voted_no(result: Any, events: list[Any]) -> None:
    """Rank 2 could not switch and said so before the decision: exit 1, its line, and the commit
    went prepare (refused) then abort."""
    assert not result.ok and result.exit_code == 1
    assert "rank 2 cannot switch to 'v2'" in result.error, result.error
    assert [(c.phase, c.ok) for c in events if isinstance(c, ReplCommit)] == [("prepare", False), ("abort", True)]


def assert_aborted_everywhere(out: Path, base: dict[str, Any]) -> None:
    """Nobody switched, nothing of v2 is left: no decision, no staging copy, no pending CURRENT."""
    assert not decision_path(out, "v2").exists()
    assert serving(out, base) == {1: "v1", 2: "v1"}
    for r in (1, 2):
        assert not (out / f"rank{r}" / "staging" / "v2").exists(), r
        assert not (out / f"rank{r}" / ".CURRENT.v2.pending").exists(), r
        assert not (out / f"rank{r}" / "versions" / "v2").exists(), r
        assert not [p.name for p in (out / f"rank{r}" / "versions").iterdir() if p.name.startswith(".probe")], r


@pytest.fixture
def chattr(tmp_path: Path) -> Iterator[Any]:
    """``chattr(path, "+i")``, undone after the test; None where inode flags cannot be set (not root, no ext4)."""
    probe = tmp_path / "chattr-probe"
    probe.mkdir()
    try:
        if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
            yield None
            return
    except FileNotFoundError:  # no e2fsprogs
        yield None
        return
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    done: list[tuple[Path, str]] = []

    def set_flag(path: Path, flag: str) -> None:
        subprocess.run(["chattr", flag, str(path)], check=True)
        done.append((path, flag.replace("+", "-")))

    yield set_flag
    for path, undo in reversed(done):
        subprocess.run(["chattr", undo, str(path)], check=False)


@pytest.mark.parametrize("target,flag", [("versions", "+i"), ("versions", "+a"), ("CURRENT", "+i")])
def test_a_rank_whose_switch_would_fail_votes_no_and_nobody_switches(base: dict[str, Any], out: Path, chattr: Any, target: Any, flag: Any) -> None:
    # On 769874d an immutable versions/ passed the probe (it wrote into the rank directory), the
    # vote was unanimous and rank 2 failed its rename after the decision: rank 1 served v2, rank 2 v1.
    if chattr is None:
        pytest.skip("chattr is not permitted here (needs CAP_LINUX_IMMUTABLE on a filesystem with inode flags)")
    chattr(out / "rank2" / target, flag)
    if (target, flag) == ("versions", "+i"):  # the CLI's lines, once; the other flags in-process
        proc = cli(base["root"] / "v2.json", out)
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "Traceback" not in proc.stdout + proc.stderr
        assert "rank 2 cannot switch to 'v2'" in proc.stderr, proc.stderr
        assert "commit abort: ok" in proc.stdout and proc.stdout.strip().splitlines()[-1] == "serving: rank 1 v1, rank 2 v1"
    else:
        result, events = replicate(base["root"] / "v2.json", out, nproc=3)
        assert_rank_2_voted_no(result, events)
        assert result.report["serving"] == {"1": "v1", "2": "v1"}
    assert_aborted_everywhere(out, base)
    # The flag removed, the same run again (in-process: the CLI's lines were checked above, and a
    # CLI start costs the suite an `import torch`): every rank switches.
    subprocess.run(["chattr", flag.replace("+", "-"), str(out / "rank2" / target)], check=True)
    again, _ = replicate(base["root"] / "v2.json", out, nproc=3)
    assert again.ok, again.error
    assert serving(out, base) == {1: "v2", 2: "v2"} and again.report["serving"] == {"1": "v2", "2": "v2"}


def test_something_in_the_way_of_the_new_current_votes_no(base: dict[str, Any], out: Path) -> None:
    # The same without root: a non-empty directory where rank 2 must write its new CURRENT.
    blocker = out / "rank2" / ".CURRENT.v2.tmp"
    blocker.mkdir()
    (blocker / "x").write_text("in the way")
    result, events = replicate(base["root"] / "v2.json", out, nproc=3)
    assert_rank_2_voted_no(result, events)
    assert_aborted_everywhere(out, base)
    (blocker / "x").unlink()
    blocker.rmdir()
    again, _ = replicate(base["root"] / "v2.json", out, nproc=3)
    assert again.ok, again.error
    assert serving(out, base) == {1: "v2", 2: "v2"} and again.report["serving"] == {"1": "v2", "2": "v2"}


# Run under a private mount namespace: rank 2's versions/ becomes another mount for this run only.
_MOUNTS = {
    "ro-bind": 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1"',
    "tmpfs": 'cp -a "$1/." "$2" && mount -t tmpfs -o mode=700 hwtui-test "$1" && cp -a "$2/." "$1"',
    "tmpfs-ro": 'cp -a "$1/." "$2" && mount -t tmpfs -o mode=700 hwtui-test "$1" && cp -a "$2/." "$1" && mount -o remount,ro "$1"',
}


@pytest.mark.parametrize("mount", sorted(_MOUNTS))
def test_versions_on_another_or_read_only_mount_votes_no(base: dict[str, Any], out: Path, tmp_path: Path, mount: str) -> None:
    # A read-only versions/ refuses the rename (EROFS); a writable one on another mount refuses it
    # too (EXDEV): both used to be found only by the switch, after the decision.
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -m needs CAP_SYS_ADMIN)")
    setup = f'set -e; mount --make-rprivate /; {_MOUNTS[mount]}'
    proc = cli(base["root"] / "v2.json", out, mountns=(setup, "", [out / "rank2" / "versions", tmp_path]))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "rank 2 cannot switch to 'v2'" in proc.stderr, proc.stderr
    # The mount went with the namespace: what every rank serves is read back from the real disk.
    assert_aborted_everywhere(out, base)


def test_no_space_for_the_new_current_is_caught_before_the_vote(base: dict[str, Any], out: Path) -> None:
    # On 769874d CURRENT was written after the decision: a full disk there left a split.
    result, events = replicate(base["root"] / "v2.json", out, nproc=3, fault="fail:rank=2,phase=current")
    assert_rank_2_voted_no(result, events)
    assert "No space left on device" in result.error, result.error
    assert_aborted_everywhere(out, base)
    again, _ = replicate(base["root"] / "v2.json", out, nproc=3)
    assert again.ok, again.error
    assert serving(out, base) == {1: "v2", 2: "v2"}


# rank 2's directory on a tmpfs of its own, filled until exactly FREE pages are left ($3).
_FULL_DISK = ('set -e; mount --make-rprivate /; cp -a "$1/." "$2"; mount -t tmpfs -o size=4m,mode=700 hwtui-test "$1"; '
              'cp -a "$2/." "$1"; "$4" -c "import os,sys; d,free=sys.argv[1],int(sys.argv[2]); s=os.statvfs(d); '
              'open(os.path.join(d,\'.filler\'),\'wb\').write(bytes(s.f_bavail*s.f_frsize-free*4096))" "$1" "$3"')


@pytest.mark.parametrize("spare_pages,switches", [(0, False), (1, True)])
def test_a_real_full_disk_at_current_votes_no(base: dict[str, Any], out: Path, tmp_path: Path, spare_pages: int, switches: bool) -> None:
    """Exactly the pages the staging copy and its manifest take are free on rank 2: the new CURRENT
    finds no space. On 769874d that came after the decision (rank 1 v2, rank 2 v1); now rank 2
    votes no. One page more and the same run commits: CURRENT was the write that did not fit."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -m needs CAP_SYS_ADMIN)")
    v1 = out / "rank2" / "versions" / "v1"
    pages = sum(-(-(v1 / name).stat().st_size // 4096) for name in ("model.safetensors", "manifest.json"))
    proc = cli(base["root"] / "v2.json", out,
               mountns=(_FULL_DISK, "", [out / "rank2", tmp_path, pages + spare_pages, sys.executable]))
    assert "Traceback" not in proc.stdout + proc.stderr
    if switches:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip().splitlines()[-1] == "serving: rank 1 v2, rank 2 v2"
        assert serving(out, base, ranks=(1,)) == {1: "v2"}  # rank 2's tmpfs went with its namespace
        return
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "rank 2 cannot switch to 'v2'" in proc.stderr and "No space left on device" in proc.stderr, proc.stderr
    # The last line is read back inside the namespace, from rank 2's tmpfs: nobody switched.
    assert "commit abort: ok" in proc.stdout and proc.stdout.strip().splitlines()[-1] == "serving: rank 1 v1, rank 2 v1"
    assert not decision_path(out, "v2").exists() and serving(out, base, ranks=(1,)) == {1: "v1"}


@pytest.mark.timeout(300)  # up to four runs of the CLI, on a loaded box
@pytest.mark.parametrize("fault", ["fail:rank=2,phase=commit", "fail:rank=2,phase=switched",
                                   "kill:rank=2,phase=switched"])
def test_a_fault_after_the_decision_is_finished_by_the_rerun_it_names(base: dict[str, Any], out: Path, chattr: Any, fault: str) -> None:
    """After the decision the only way is forward: one line names the command, and that command finishes it."""
    plan = base["root"] / "v2.json"
    proc = cli(plan, out, fault=fault)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hwtui: error:")]
    assert len(errors) == 1 and errors[0].endswith("re-run the same command to finish the switch"), proc.stderr
    assert "rank 2 serves v1" in errors[0], errors[0]
    assert decision_path(out, "v2").exists()
    assert serving(out, base) == {1: "v2", 2: "v1"}
    assert proc.stdout.strip().splitlines()[-1] == "serving: rank 1 v2, rank 2 v1"
    moved = "phase=switched" in fault
    assert (out / "rank2" / "versions" / "v2").is_dir() is moved
    assert (out / "rank2" / "staging" / "v2").is_dir() is not moved

    # The re-run meets a fault of its own (versions/ made immutable meanwhile, where the rename is
    # still to come): it says so in one line naming the same command, and changes nothing.
    if not moved and chattr is not None:
        chattr(out / "rank2" / "versions", "+i")
        stuck, _ = replicate(plan, out, nproc=3, timeout=10.0)  # in-process: the CLI's one line is the error
        assert not stuck.ok and stuck.exit_code == 1
        assert stuck.error.endswith("re-run the same command to finish the switch"), stuck.error
        assert serving(out, base) == {1: "v2", 2: "v1"}
        subprocess.run(["chattr", "-i", str(out / "rank2" / "versions")], check=True)

    if fault == "fail:rank=2,phase=commit":  # the named command, as the user runs it, once
        again = cli(plan, out)
        assert again.returncode == 0, again.stderr[-2000:]
        assert again.stdout.strip().splitlines()[-1] == "serving: rank 1 v2, rank 2 v2"
    else:  # the same run in-process (a CLI start costs the suite an `import torch`)
        finished, _ = replicate(plan, out, nproc=3)
        assert finished.ok, finished.error
        assert finished.report["serving"] == {"1": "v2", "2": "v2"}
    assert serving(out, base) == {1: "v2", 2: "v2"}  # every byte, on every rank
    assert not (out / "rank2" / ".CURRENT.v2.pending").exists() and not (out / "rank2" / "staging").exists()


def test_rank_failing_before_the_world_forms_ends_the_run_at_once(base: dict[str, Any], out: Path) -> None:
    # rank 2 cannot create its staging directory (a full disk): exit 2 within seconds, not at the init timeout
    result, events = replicate(base["root"] / "v2.json", out, nproc=3, fault="fail:rank=2,phase=load", **NEVER)
    assert not result.ok and result.exit_code == 2
    assert "rank 2" in result.error and "No space left on device" in result.error
    assert serving(out, base) == {1: "v1", 2: "v1"}


def test_out_that_is_a_file_or_blocked_is_exit_2_before_any_process(base: dict[str, Any], tmp_path: Path) -> None:
    blocked = tmp_path / "out"
    blocked.write_text("a file, not a directory")
    for target in (blocked, blocked / "sub"):
        proc = cli_proc.run([sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(base["root"] / "v2.json"),
                             "--nproc", "3", "--commit", "--out", str(target)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "--out" in proc.stderr, proc.stderr
    (tmp_path / "o2").mkdir()
    (tmp_path / "o2" / "rank2").write_text("in the way")
    with pytest.raises(HwtuiError, match="rank 2 cannot write"):
        replicate(base["root"] / "v2.json", tmp_path / "o2", nproc=3)


def test_second_concurrent_run_is_refused_naming_the_holder(base: dict[str, Any], out: Path) -> None:
    with OutLock(out, [0, 1, 2]):  # this test process plays the first run
        proc = cli_proc.run([sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(base["root"] / "v2.json"),
                             "--nproc", "3", "--commit", "--out", str(out)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert f"in use by pid {os.getpid()}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert serving(out, base) == {1: "v1", 2: "v1"}
    # The lock dies with its holder: the next run gets it.
    with OutLock(out, [0, 1, 2]):
        pass


def test_decision_for_another_plan_under_the_same_version_is_refused(base: dict[str, Any], out: Path) -> None:
    decision_path(out, "v2").parent.mkdir(parents=True, exist_ok=True)
    decision_path(out, "v2").write_text(json.dumps({"schema": "hwtui.replication-decision/1", "version": "v2",
                                                    "plan_digest": "0" * 32, "decision": "commit", "ranks": [1, 2]}))
    with pytest.raises(HwtuiError, match="from another plan"):
        replicate(base["root"] / "v2.json", out, nproc=3)
    assert serving(out, base) == {1: "v1", 2: "v1"}


def test_symlinks_planted_at_every_name_the_commit_chooses_are_never_followed(base: dict[str, Any], out: Path, tmp_path: Path) -> None:
    victim, victim_dir = tmp_path / "victim", tmp_path / "victim-dir"
    victim.write_text("not yours")
    victim_dir.mkdir()
    rank2 = out / "rank2"
    (rank2 / "staging").mkdir()
    for name in (".CURRENT.v2.tmp", ".CURRENT.v2.pending"):
        (rank2 / name).symlink_to(victim)
    for name in ("staging/v2", "staging/.probe-v2", "versions/.probe-v2"):
        (rank2 / name).symlink_to(victim_dir)
    # CURRENT itself a link (to a copy of what it said): the switch replaces the link, not its target.
    (tmp_path / "current-copy").write_bytes((rank2 / "CURRENT").read_bytes())
    (rank2 / "CURRENT").unlink()
    (rank2 / "CURRENT").symlink_to(tmp_path / "current-copy")
    result, _ = replicate(base["root"] / "v2.json", out, nproc=3)
    assert result.ok, result.error
    assert serving(out, base) == {1: "v2", 2: "v2"}
    assert victim.read_text() == "not yours" and not list(victim_dir.iterdir())
    assert json.loads((tmp_path / "current-copy").read_text())["version"] == "v1"
    assert not (rank2 / "CURRENT").is_symlink() and not (rank2 / "staging").exists()
    assert not [p for p in rank2.iterdir() if p.name.startswith(".CURRENT")]


# rank 2's directory on a loop-mounted ext2 of its own (no fallocate there: the staging copy stays
# sparse, so a full disk can only be seen from the free space), FREE ($3) pages left free.
_FULL_EXT2 = ('set -e; mount --make-rprivate /; mkdir "$2/save"; cp -a "$1/." "$2/save"; '
              'truncate -s 24M "$2/fs.img"; mkfs.ext2 -q -F -m 0 "$2/fs.img"; mount -o loop "$2/fs.img" "$1"; '
              'cp -a "$2/save/." "$1"; "$4" -c "import os,sys; d,free=sys.argv[1],int(sys.argv[2]); '
              'fd=os.open(os.path.join(d,\'.filler\'),os.O_WRONLY|os.O_CREAT,0o600)\n'
              'while (lambda s: s.f_bavail*s.f_frsize)(os.statvfs(d)) > free*4096:\n'
              ' try: os.write(fd,bytes(4096))\n'
              ' except OSError: break\n'
              'os.fsync(fd)" "$1" "$3"')


# After the run: what is left of rank 2's staging/ ($1), read inside the namespace where its
# filesystem still exists, printed as "LEFT: <name>" lines.
_LEFTOVERS = 'ls -A "$1/staging" 2>/dev/null | sed "s/^/LEFT: /"'


def _loop_mounts_work(tmp_path: Path) -> bool:
    probe = tmp_path / "loop-probe"
    probe.mkdir()
    script = ('set -e; mount --make-rprivate /; truncate -s 8M "$1/p.img"; mkfs.ext2 -q -F "$1/p.img"; '
              'mkdir "$1/m"; mount -o loop "$1/p.img" "$1/m"')
    try:
        ok = subprocess.run(["unshare", "-m", "--", "sh", "-c", script, "sh", str(probe)], capture_output=True,
                            timeout=60).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        ok = False
    return ok


@pytest.mark.parametrize("fs", ["tmpfs", "ext2"])
@pytest.mark.parametrize("path", ["same-host", "network"])
def test_no_space_for_the_staging_copy_is_one_no_space_line_and_nothing_commits(base: dict[str, Any], out: Path,
                                                                               tmp_path: Path, path: str, fs: str) -> None:
    """Rank 2's disk has room for half the staging copy. The run stops at set-up with one line that
    says "no space", names the file, exit 2, and no rank switches. On tmpfs the copy is reserved
    whole (fallocate). ext2 cannot reserve: the free space is checked instead.

    On 7309e8d the sparse copy filled mid-transfer: on the same-host path the rank died of an
    internal OSError ("rank 2 exited with status 3"), on the network path its stores through the
    mapping hit the full disk and the run read it as "rank 2 hung". On ext2 that stayed so on the
    network path until the free space was checked."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -m needs CAP_SYS_ADMIN)")
    if fs == "ext2" and not _loop_mounts_work(tmp_path):
        pytest.skip("no loop-mounted ext2 in a private mount namespace here (needs root, unshare -m, mkfs.ext2)")
    pages = -(-(out / "rank2" / "versions" / "v1" / "model.safetensors").stat().st_size // 4096)
    setup = _FULL_DISK if fs == "tmpfs" else _FULL_EXT2
    proc = cli(base["root"] / "v2.json", out, mountns=(setup, _LEFTOVERS, [out / "rank2", tmp_path, pages // 2, sys.executable]),
               extra=("--no-same-host",) if path == "network" else ())
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hwtui: error:")]
    assert len(errors) == 1 and "no space left on device for the staging copy" in errors[0], proc.stderr
    assert "rank2/staging/v2/model.safetensors" in errors[0] and "free" in errors[0], errors[0]
    assert "LEFT:" not in proc.stdout, proc.stdout  # rank 2's half-made copy went with the abort
    assert proc.stdout.strip().splitlines()[-1] == "serving: rank 1 v1, rank 2 v1"
    assert not decision_path(out, "v2").exists()
    assert serving(out, base, ranks=(1,)) == {1: "v1"}  # rank 2's filesystem went with its namespace
    assert not (out / "rank1" / "staging" / "v2").exists() and not (out / "rank1" / ".CURRENT.v2.pending").exists()
