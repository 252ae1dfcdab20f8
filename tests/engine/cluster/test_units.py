"""Bandwidth arithmetic, launcher detection, port probing and the JSON gather over loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from hwtui.core.finding import Status
from hwtui.engine.cluster.bandwidth import BandwidthResult, algbw, bus_factor, busbw, floor_failures, parse_size, size_series
from hwtui.engine.cluster.smoke import ClusterFailure, _bandwidth_findings, detect_launch, probe_port
from hwtui.engine.cluster.spec import ClusterSpec, Node
from tests import cli_proc


def test_nccl_tests_bus_factors():
    # nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n, broadcast 1.
    assert bus_factor("all_reduce", 8) == 1.75
    assert bus_factor("all_reduce", 2) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0
    assert bus_factor("broadcast", 64) == 1.0
    with pytest.raises(ValueError):
        bus_factor("all_to_all", 4)


def test_algbw_and_busbw_figures():
    # 1 GiB in 0.1 s: algbw = 1073741824 / 1e9 / 0.1 = 10.73741824 GB/s
    assert algbw(1 << 30, 0.1) == pytest.approx(10.73741824)
    assert busbw("all_reduce", 1 << 30, 0.1, 4) == pytest.approx(10.73741824 * 1.5)
    assert busbw("broadcast", 1 << 30, 0.1, 4) == pytest.approx(10.73741824)


def test_sizes():
    assert parse_size("4096") == 4096 and parse_size("64K") == 65536 and parse_size("4M") == 4 << 20
    assert parse_size("1g") == 1 << 30 and parse_size("2MiB") == 2 << 20
    with pytest.raises(ValueError):
        parse_size("4X")
    assert size_series(1024, 1 << 20, 4) == [1024, 4096, 16384, 65536, 262144, 1 << 20]
    assert size_series(1024, 3000, 2) == [1024, 2048, 3000]
    with pytest.raises(ValueError):
        size_series(2048, 1024)


def test_floor_applies_to_the_largest_size_of_each_op():
    rows = [BandwidthResult("all_reduce", 1024, 1e-3, 0.001, 0.0015),  # small: latency-bound, not judged
            BandwidthResult("all_reduce", 1 << 20, 1e-3, 1.0, 1.5),
            BandwidthResult("broadcast", 1 << 20, 1e-3, 0.9, 0.9)]
    assert [r.op for r in floor_failures(rows, 1.0)] == ["broadcast"]
    findings = {f.id: f for f in _bandwidth_findings(rows, 1.0)}
    assert findings["cluster.bandwidth[broadcast]"].status == Status.FAIL
    assert "below the 1 GB/s floor" in findings["cluster.bandwidth[broadcast]"].title
    assert findings["cluster.bandwidth[all_reduce]"].status == Status.PASS


SPEC = ClusterSpec([Node("a", "10.0.0.1"), Node("b", "10.0.0.2")], devices_per_node=2)


@pytest.mark.parametrize("env,expect", [
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "5"},
     ("torchrun", 3, 4, 1, "h", 5)),
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"}, ("slurm", 2, 4, 0, "10.0.0.1", 29500)),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, ("mpirun", 1, 4, 1, "10.0.0.1", 29500)),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MASTER_PORT": "7"}, ("mpirun", 3, 4, 1, "10.0.0.1", 7)),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "9"}, ("env", 0, 2, 0, "m", 9)),
])
def test_detect_launch(env, expect):
    ctx = detect_launch(env, SPEC)
    assert (ctx.launcher, ctx.rank, ctx.world_size, ctx.local_rank, ctx.master_addr, ctx.master_port) == expect


def test_detect_launch_errors():
    with pytest.raises(ClusterFailure, match="outside a world"):
        detect_launch({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "m", "MASTER_PORT": "1"}, None)
    with pytest.raises(ClusterFailure, match="set MASTER_ADDR and MASTER_PORT"):
        detect_launch({"RANK": "1", "WORLD_SIZE": "4"}, None)
    single = detect_launch({}, None)
    assert (single.launcher, single.world_size, single.master_addr) == ("single", 1, "127.0.0.1")


def test_probe_port_tells_refused_from_dropped():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused_port = closed.getsockname()[1]  # bound, never listening: connect is refused
        ok, why = probe_port("127.0.0.1", refused_port, 0.6)
        assert not ok and why.startswith("connection refused")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    try:
        for _ in range(3):  # fill the accept queue: further SYNs are dropped, like a firewall DROP
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(c)
        ok, why = probe_port("127.0.0.1", port, 2.5)
        assert not ok and why.startswith("no answer")
    finally:
        for c in fillers:
            c.close()
        srv.close()
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen(4)
        assert probe_port("127.0.0.1", live.getsockname()[1], 2.0) == (True, "open")


GATHER = textwrap.dedent("""
    import json, os, sys
    from datetime import timedelta
    import torch.distributed as dist
    from hwtui.engine.cluster.gather import GatherError, all_gather_json
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=30))
    payloads = [{"r": 0, "text": "x" * 5000}, {"r": 1, "text": "ünïcødé ✓", "nested": [1, 2.5, None, True], "e": {}}]
    got = all_gather_json(payloads[rank])
    # Rank 1's next document is over the limit: both ranks fail at once, naming rank 1.
    try:
        all_gather_json({"big": "y" * (20000 if rank == 1 else 10)}, max_bytes=10000)
        too_big = None
    except GatherError as exc:
        too_big = str(exc)
    dist.destroy_process_group()
    with open(sys.argv[1], "w") as fh:
        json.dump({"got": got, "ok": got == payloads, "too_big": too_big}, fh)
""")


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_all_gather_json_every_rank_every_byte(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "GLOO_SOCKET_IFNAME": "lo"}
        procs.append(subprocess.Popen([sys.executable, "-c", GATHER, str(tmp_path / f"r{rank}.json")], env=env,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=80)
        assert p.returncode == 0, err[-2000:]
    for rank in range(2):
        result = json.loads((tmp_path / f"r{rank}.json").read_text())
        assert result["ok"] is True, result["got"]
        assert result["too_big"] == "rank 1: its report of 20010 bytes exceeds the 10000-byte limit"


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_min_busbw_floor_fails_a_real_run_and_json_report(tmp_path):
    """Two ranks on loopback, the manual way (RANK/WORLD_SIZE/MASTER_*), with a floor no link meets."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "HWTUI_CLUSTER_NODE": f"n{rank}"}
        procs.append(cli_proc.Popen([sys.executable, "-m", "hwtui.app", "cluster", "test", "--json", "--min-bytes", "4K",
                                     "--max-bytes", "64K", "--iters", "3", "--warmup", "1", "--min-busbw", "100000",
                                     "--join-timeout", "30", "--timeout", "30"],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=80) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs
    report = json.loads(outs[0][0])  # rank 0's stdout is exactly one JSON document
    assert report["ok"] is False and report["world_size"] == 2 and report["min_busbw"] == 100000
    status = {f["id"]: f["status"] for f in report["findings"]}
    assert status["cluster.bandwidth[all_reduce]"] == "fail" and status["cluster.bandwidth[broadcast]"] == "fail"
    assert status["cluster.correctness"] == "pass"
    assert [(r["op"], r["size_bytes"]) for r in report["bandwidth"]] == [
        (op, s) for op in ("broadcast", "all_reduce") for s in (4096, 16384, 65536)]
    # gloo was pinned to the interface that routes to the master, since nothing set it.
    assert {r["gloo_socket_ifname_auto"] for r in report["ranks"]} == {"lo"}
    assert outs[1][0] == "" and "below the 100000 GB/s floor" in outs[1][1]
