"""Under torchrun, srun and mpirun every rank runs `hwtui replicate`: only rank 0 prints, and its
summary counts every receiver of the world, on every node (each rank reports what it serves)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hwtui.core.net import free_loopback_port
from tests import cli_proc
from tests.engine.cluster.netns import finish
from tests.engine.replication.helpers import assert_bytes_equal, make_model, served, write_plan

pytestmark = [pytest.mark.torch, pytest.mark.timeout(150)]

_LAUNCH = ("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "TORCHELASTIC", "SLURM_", "OMPI_", "PMI", "HWTUI_TEST_FAULT",
           "HOTWEIGHTS_")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH)}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


@pytest.fixture
def plan(tmp_path):
    expected = make_model(tmp_path / "src", seed=7, big=30_000, n=6)
    write_plan(tmp_path / "src", tmp_path / "p.json", version="t1", bucket_kib=32)
    return tmp_path / "p.json", expected


def test_torchrun_three_ranks_one_summary_counting_both_receivers(tmp_path, plan):
    path, expected = plan
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr",
                           "127.0.0.1", "--master-port", str(free_loopback_port()), "-m", "hwtui.app", "replicate",
                           "--plan", str(path), "--commit", "--out", str(tmp_path / "out"), "--init-timeout", "60"],
                          capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("done:")].__len__() == 1, proc.stdout
    assert "on 3 ranks" in proc.stdout
    assert "commit commit: ok (all 2 receivers switched to t1 (rank 1 serves t1, rank 2 serves t1))" in proc.stdout
    assert "all 0 receivers" not in text and "all 1 receiver " not in text
    # The start line once (the progress line, "replicating  44% ...", is rank 0's too).
    assert sum(1 for line in proc.stdout.splitlines() if line.startswith("replicating ") and " bucket(s) of " in line) == 1
    for r in (1, 2):
        version, tensors = served(tmp_path / "out", r)
        assert version == "t1"
        assert_bytes_equal(tensors, expected)


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_an_out_per_node_rank_0_still_counts_every_receiver(tmp_path, plan, launcher):
    """Each rank with its own --out (as with one per node): rank 0's disk holds no receiver, and it
    printed "all 0 receivers switched" before."""
    path, expected = plan
    port = str(free_loopback_port())

    def env(rank: int) -> dict[str, str]:
        if launcher == "srun":
            ids = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "3", "SLURM_LOCALID": str(rank), "SLURM_NTASKS_PER_NODE": "3"}
        else:
            ids = {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
                   "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}
        return _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **ids)

    procs = [cli_proc.Popen([sys.executable, "-m", "hwtui.app", "replicate", "--plan", str(path), "--commit", "--out",
                             str(tmp_path / f"node{rank}"), "--init-timeout", "60", "--report",
                             str(tmp_path / "rep{rank}.json")], env=env(rank), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True) for rank in range(3)]
    results = finish(procs, timeout=120)
    assert [rc for rc, _, _ in results] == [0, 0, 0], results
    (_, out0, _), *others = results
    assert "commit commit: ok (all 2 receivers switched to t1 (rank 1 serves t1, rank 2 serves t1))" in out0
    assert "serving: rank 1 t1, rank 2 t1" in out0 and out0.count("done:") == 1
    assert all(out == "" and err == "" for _, out, err in others), others  # other ranks: silent when all is well
    report = json.loads((tmp_path / "rep0.json").read_text())
    assert report["serving"] == {"1": "t1", "2": "t1"} and report["committed"]
    for r in (1, 2):
        version, tensors = served(tmp_path / f"node{r}", r)
        assert version == "t1"
        assert_bytes_equal(tensors, expected)
