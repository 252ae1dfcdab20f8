"""Sample-weighted merge over gloo in a real three-process world, against a hand computation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> list[dict]:
    import torch.distributed as dist

    tmp = tmp_path_factory.mktemp("merge")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "tests.engine.training._merge_rank", str(r), "3", str(store.port),
                               str(tmp / f"r{r}.json")], cwd=REPO, env=env) for r in range(3)]
    try:
        codes = [p.wait(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0, 0]
    return [json.loads((tmp / f"r{r}.json").read_text()) for r in range(3)]


def test_merge_is_weighted_by_samples_and_identical_on_every_rank(world):
    # Hand computation, samples 10, 30, 0 -> weights 1/4, 3/4, 0:
    #   w     = arange(6) + 100*r          -> arange(6) + (0*10 + 100*30 + 200*0)/40 = arange(6) + 75
    #   half  = 1 + r (bf16)               -> (1*10 + 2*30 + 3*0)/40 = 1.75
    #   count = [3r+1, 7] (int64)          -> [(1*10 + 4*30 + 7*0)/40, 7] = [3.25, 7] -> rounds to [3, 7]
    #   flag  = [r == 1] (bool)            -> 30/40 = 0.75 -> True
    for res in world:
        r1 = res["round1"]
        assert r1["w"] == [[75.0, 76.0, 77.0], [78.0, 79.0, 80.0]]
        assert r1["half"] == [1.75] * 4
        assert r1["count"] == [3, 7]
        assert r1["flag"] == [True]
        assert res["dtypes"] == {"w": "torch.float32", "half": "torch.bfloat16", "count": "torch.int64", "flag": "torch.bool"}
        assert res["total1"] == 40
    assert world[0]["round1"] == world[1]["round1"] == world[2]["round1"]


def test_survivors_regroup_after_a_rank_dies_and_merge_again(world):
    # The dead rank's old group must error out (not hang); generation 1 has ranks 0,1 with 11 and 31 samples:
    #   w = arange(6) + 100*31/42 ; count[0] = (1*11 + 4*31)/42 = 3.214 -> 3
    for res in world[:2]:
        assert res["old_group"] != "succeeded"
        assert res["total2"] == 42
        expected = [float(torch.tensor(float(i) + 100 * 31 / 42, dtype=torch.float32)) for i in range(6)]
        flat = res["round2"]["w"][0] + res["round2"]["w"][1]
        assert flat == pytest.approx(expected, rel=1e-6)
        assert res["round2"]["count"] == [3, 7]
    assert world[0]["round2"] == world[1]["round2"]
