"""Two hosts x two ranks over network namespaces: one network copy per host, then same-host copies.

Host A (namespace n0): rank 0 (the source) and rank 1; host B (n1): ranks 2 and 3. Rank 1 copies
from the source's page cache, rank 2 (host B's leader) is the only rank that receives over the
network, and rank 3 copies the leader's verified copy. Every replica is the source file, byte
for byte.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic
from tests.engine.cluster.netns import NetnsCluster, finish, unavailable_reason

pytestmark = [pytest.mark.torch, pytest.mark.netns, pytest.mark.timeout(150)]

_REASON = unavailable_reason()
if _REASON:
    pytest.skip(f"cannot create network namespaces: {_REASON}", allow_module_level=True)


def _env(rank: int, host_ranks: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "TORCHELASTIC",
                                                                     "SLURM_", "HWTUI_TEST_FAULT", "HOTWEIGHTS_"))}
    env.update(RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank % host_ranks), LOCAL_WORLD_SIZE=str(host_ranks),
               MASTER_ADDR="10.77.0.1", GLOO_SOCKET_IFNAME="eth0", **extra)
    return env


def test_two_hosts_two_ranks_each_one_network_copy_per_host(tmp_path):
    g = torch.Generator().manual_seed(13)
    save_file({f"w{i}": torch.randn(20_000 + i, generator=g) for i in range(10)}, str(tmp_path / "m.safetensors"),
              metadata={"format": "pt"})
    plan = build_plan_from_files([str(tmp_path / "m.safetensors")], model="m", version="x1", bucket_bytes=64 << 10)
    write_json_atomic(tmp_path / "p.json", plan)
    net = NetnsCluster(2).up()
    try:
        port = "29517"  # inside fresh namespaces nothing else listens
        procs = [net.popen(rank // 2, [sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(tmp_path / "p.json"),
                                       "--commit", "--out", str(tmp_path / "out"), "--init-timeout", "40",
                                       "--report", str(tmp_path / f"rep{rank}.json")],
                           env=_env(rank, 2, MASTER_PORT=port))
                 for rank in range(4)]
        results = finish(procs, timeout=120)
    finally:
        net.down()
    for rank, (rc, _out, err) in enumerate(results):
        assert rc == 0, (rank, err[-2000:])
    assert "same-host path: rank(s) 1 " in results[0][1]
    assert "network path: rank(s) 2 receive each bucket by gloo broadcast (host leader: another network namespace" \
        in results[0][1]
    assert "host-copy path: rank(s) 3 copy from their host leader's verified copy" in results[0][1]
    reports = {r: json.loads((tmp_path / f"rep{r}.json").read_text()) for r in range(4)}
    row = {r: reports[r]["ranks"][0] for r in range(4)}
    assert {r: row[r]["path"] for r in range(4)} == {0: "source", 1: "same-host", 2: "network", 3: "host-copy"}
    # Network bytes per host are model bytes: only host B's leader took part in the broadcasts.
    assert row[2]["collectives"] > 0 and row[1]["collectives"] == row[3]["collectives"] == 0
    source = (tmp_path / "m.safetensors").read_bytes()
    for r in (1, 2, 3):
        assert reports[r]["committed"]
        assert (tmp_path / "out" / f"rank{r}" / "versions" / "x1" / "model.safetensors").read_bytes() == source
    assert not list(Path("/dev/shm").glob(f"hwtui-{plan['digest'][:16]}-*"))
