"""``hwtui agent --serve-group GROUP``: what a push puts in place on that node is readable by the group.

Without it a pushed version is 0600 (owner only), so an inference server running as another user
cannot read it; ``hwtui replicate --serve-group`` already had the choice, the agent had not.
Two agents as real processes on loopback (node0 the source, node1 a receiver started with the
group); root runs the suite, so any group of this host can be given (``daemon``, never root's own).
"""

from __future__ import annotations

import grp
import json
import os
import stat
import sys

import pytest

from tests import cli_proc

pytest.importorskip("torch")

from tests.agent.procs import Agents, env, push  # noqa: E402
from tests.engine.replication.helpers import make_model, write_plan  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def _other_group() -> grp.struct_group:
    """A group this process may give files to that is not its own (so a chgrp is visible)."""
    for g in grp.getgrall():
        if g.gr_gid != os.getegid() and (os.geteuid() == 0 or g.gr_gid in os.getgroups()):
            return g
    pytest.skip("no second group this user may give files to")


def test_pushed_files_are_group_readable_by_the_serve_group(tmp_path):
    group = _other_group()
    make_model(tmp_path / "m", seed=5, big=20_000, n=4)
    write_plan(tmp_path / "m", tmp_path / "v1.plan", version="v1", bucket_kib=64)
    world = Agents(tmp_path, 2)
    try:
        world.start(0)
        world.start(1, "--serve-group", group.gr_name)
        done = push(tmp_path / "v1.plan", world.agents(), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        served = world.served(1)
        current = json.loads((served / "CURRENT").read_text())
        assert current["version"] == "v1"
        weights = served / current["file"]
        st = weights.stat()
        assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == group.gr_gid, (oct(st.st_mode), st.st_gid)
        # Every directory on the way from served/ to the file lets the group in (and no one else).
        d = weights.parent
        while True:
            ds = d.stat()
            assert stat.S_IMODE(ds.st_mode) == 0o750 and ds.st_gid == group.gr_gid, (d, oct(ds.st_mode), ds.st_gid)
            if d == served:
                break
            d = d.parent
        # Nothing else changed: the node without the option still serves owner-only files ...
        assert not (world.served(0) / "CURRENT").exists()  # the source serves nothing
        # ... and what is never served (the staging area) stays owner-only on the grouped node.
        staging = served / "staging"
        if staging.exists():
            assert stat.S_IMODE(staging.stat().st_mode) == 0o700
    finally:
        world.close()


def test_pushed_files_stay_owner_only_without_the_option(tmp_path):
    make_model(tmp_path / "m", seed=6, big=20_000, n=4)
    write_plan(tmp_path / "m", tmp_path / "v1.plan", version="v1", bucket_kib=64)
    world = Agents(tmp_path, 2)
    try:
        world.start(0)
        world.start(1)
        done = push(tmp_path / "v1.plan", world.agents(), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        served = world.served(1)
        current = json.loads((served / "CURRENT").read_text())
        st = (served / current["file"]).stat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_gid == os.getegid()
    finally:
        world.close()


@pytest.mark.parametrize("group", ["no-such-group-hwtui", "99999999", "bad\tname"])
def test_an_unknown_serve_group_is_one_line_exit_2_nothing_written(tmp_path, group):
    out = tmp_path / "out"
    token = tmp_path / "agent.token"
    done = cli_proc.run([sys.executable, "-m", "hwtui.app", "agent", "--listen", "127.0.0.1:0", "--out", str(out),
                         "--token-file", str(token), "--serve-group", group, "--check-interval", "3600"],
                        capture_output=True, text=True, timeout=120, env=env())
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--serve-group" in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert not out.exists() and not token.exists()


def test_serve_group_without_out_is_refused(tmp_path):
    done = cli_proc.run([sys.executable, "-m", "hwtui.app", "agent", "--listen", "127.0.0.1:0",
                         "--token-file", str(tmp_path / "t"), "--serve-group", "daemon"],
                        capture_output=True, text=True, timeout=120, env=env())
    assert done.returncode == 2 and "--out" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_serve_group_with_install_unit_is_refused_not_dropped(tmp_path):
    unit = tmp_path / "hwtui-agent.service"
    done = cli_proc.run([sys.executable, "-m", "hwtui.app", "agent", "--install-unit", str(unit),
                         "--serve-group", "daemon"], capture_output=True, text=True, timeout=120, env=env())
    assert done.returncode == 2 and "--install-unit" in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
        done.stderr
    assert not unit.exists()
