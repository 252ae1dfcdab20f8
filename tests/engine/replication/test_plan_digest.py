"""The plan is validated once, by the coordinator; every other rank checks its digest and nothing more.

The launcher (or the agent of rank 0) validates the plan and puts its digest in each rank's
``WorkerConfig``. A rank loads the plan with ``validate=False, expect_digest=<that digest>``: a plan
with another digest is refused in one line before the rank stages anything or joins a transfer.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from hwtui.core.errors import HwtuiError  # noqa: E402
from hwtui.core.net import free_loopback_port  # noqa: E402
from hwtui.core.supervisor import Child, Group, child_env, python_module  # noqa: E402
from hwtui.engine.replication import plan_format  # noqa: E402
from hwtui.engine.replication.config import Timeouts, WorkerConfig  # noqa: E402
from hwtui.engine.replication.launcher import ReplicationOptions, run_replication  # noqa: E402
from hwtui.engine.replication.plan import _meta_for_file, load_plan  # noqa: E402
from hwtui.engine.replication.transport import choose_transport  # noqa: E402
from hwtui.engine.replication.worker import EXIT_BAD_INPUT, Worker  # noqa: E402
from tests.engine.replication.helpers import make_model, write_plan  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(plan A, plan B: another version of the same model, A with a broken table but a valid digest)."""
    d = tmp_path_factory.mktemp("plans")
    make_model(d / "a", seed=1, big=3000, n=3)
    make_model(d / "b", seed=2, big=3000, n=3)
    write_plan(d / "a", d / "a.plan", version="v1", bucket_kib=4)
    write_plan(d / "b", d / "b.plan", version="v2", bucket_kib=4)
    good = load_plan(d / "a.plan")
    sections = good.sections()
    sections["i_bucket"] = np.full_like(sections["i_bucket"], len(good.buckets) + 3)  # buckets that do not exist
    plan_format.write(d / "bad.plan", _meta_for_file(good.meta), sections)
    return d / "a.plan", d / "b.plan", d / "bad.plan"


def _cfg(plan: Path, rank: int, digest: str | None, **kw) -> WorkerConfig:
    return WorkerConfig(plan=str(plan), plan_digest=digest, transport=choose_transport("cpu"), world_size=2, rank=rank,
                        timeouts=Timeouts(init=5, bucket=5, commit=5), **kw)


def test_a_rank_trusts_the_coordinator_s_digest_and_does_not_revalidate(plans):
    _, _, bad = plans
    digest = load_plan(bad, validate=False).digest
    # With the coordinator's digest the rank maps the tables and checks nothing else...
    assert Worker(_cfg(bad, 1, digest), lambda m: None).load().digest == digest
    # ...without one (a hand-written config) it validates the plan itself.
    with pytest.raises(HwtuiError, match="bucket"):
        Worker(_cfg(bad, 1, None), lambda m: None).load()


def test_the_coordinator_validates_once_and_refuses_a_broken_plan(plans, tmp_path):
    _, _, bad = plans
    with pytest.raises(HwtuiError, match="bucket"):  # the CLI's one line and exit 2
        run_replication(ReplicationOptions(plan=str(bad), nproc=2, env=dict(os.environ), commit=True,
                                           out=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()  # refused before anything was written, no rank started


def test_a_rank_handed_another_plan_refuses_it_before_any_byte_moves(plans, tmp_path):
    a, b, _ = plans
    digest_a = load_plan(a).digest
    out = tmp_path / "out"
    # Rank 1's file is plan B; the coordinator validated plan A. A real worker process, as the launcher starts it.
    cfg = _cfg(b, 1, digest_a, commit=True, out=str(out), master_port=free_loopback_port())
    child = Child(python_module("hwtui.engine.replication.worker", "{answer_fd}", cfg.to_json()), name="rank1",
                  env=child_env(), answer_pipe=True, stdout="null", stderr="pipe").start()
    msgs: list[dict] = []
    with Group() as group:
        group.add(child)
        deadline = time.monotonic() + 30
        while (child.poll() is None or group.open_pipes) and time.monotonic() < deadline:
            msgs += [m.msg for m in group.poll(0.1) if m.msg is not None]
        code = child.wait(5)
        stderr = child.stderr_stream()
        err = stderr.read().decode(errors="replace") if stderr is not None else ""
    assert code == EXIT_BAD_INPUT, (msgs, err)
    errors = [m for m in msgs if m.get("kind") == "error"]
    assert len(errors) == 1 and errors[0]["where"] == "input"
    line = errors[0]["message"]
    assert "digest" in line and digest_a[:16] in line and "\n" not in line
    assert "Traceback" not in err
    # Before any byte moves: no transfer began, nothing was staged for either version.
    assert not any(m.get("kind") == "repl.bucket" or m.get("what") in ("ready", "transfer_start") for m in msgs)
    assert not (out / "rank1" / "staging").exists()
