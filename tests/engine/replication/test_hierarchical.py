"""Two hosts x two ranks over network namespaces: one network copy per host, then same-host copies.

Host A (namespace n0): rank 0 (the source) and rank 1; host B (n1): ranks 2 and 3. Rank 1 copies
from the source's page cache, rank 2 (host B's leader) is the only rank that receives over the
network, and rank 3 copies the leader's verified copy. Every replica is the source file, byte
for byte.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
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


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(tmp_path: Path, plan: dict, extra: list[str], env_extra: dict[str, str] | None = None, timeout: float = 120):
    net = NetnsCluster(2).up()
    try:
        procs = [net.popen(rank // 2, [sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(tmp_path / "p.json"),
                                       "--init-timeout", "40", "--report", str(tmp_path / f"rep{rank}.json"),
                                       "--events", str(tmp_path / f"ev{rank}.jsonl"), *extra],
                           env=_env(rank, 2, MASTER_PORT="29519", **(env_extra or {})))
                 for rank in range(4)]
        return net, procs
    except BaseException:
        net.down()
        raise


def _model(tmp_path: Path, bucket_bytes: int = 64 << 10, *, seed: int = 23, numel: int = 30_000, version: str = "x2") -> dict:
    """Twelve random float tensors of about ``numel`` elements each, saved, and their plan."""
    g = torch.Generator().manual_seed(seed)
    save_file({f"w{i}": torch.randn(numel + i, generator=g) for i in range(12)}, str(tmp_path / "m.safetensors"),
              metadata={"format": "pt"})
    plan = build_plan_from_files([str(tmp_path / "m.safetensors")], model="m", version=version, bucket_bytes=bucket_bytes)
    write_json_atomic(tmp_path / "p.json", plan)
    return plan


def _shm_dir(tmp_path: Path) -> Path:
    """A private stand-in for /dev/shm (HWTUI_SHM_DIR): sticky and world-writable like the real one,
    and what a killed rank leaves there stays out of the real one."""
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o1777)
    shm.chmod(0o1777)  # mkdir's mode goes through the umask
    return shm


def _wait_for_state(done: Callable[[], bool], procs: list, what: str, limit: float = 90) -> None:
    """Poll ``done`` until it holds (bounded); every rank must still be running meanwhile."""
    deadline = time.monotonic() + limit
    while not done():
        assert all(p.poll() is None for p in procs), f"a rank ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {limit:.0f} s"
        time.sleep(0.05)


def _done(path: Path, rank: int) -> set[int]:
    """The buckets ``rank`` has verified so far, from its events file (empty before it exists)."""
    return {e["bucket_id"] for e in (_events(path) if path.exists() else [])
            if e.get("kind") == "repl.bucket" and e.get("rank") == rank and e.get("state") == "done"}


def _kill_all(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def test_leader_stages_in_shared_memory_and_the_timeline_is_its_events(tmp_path):
    """Without --out: host B's leader (local rank 0) received into shared memory faulted in while
    its world formed, its follower read it from there, every bucket verified on every rank; the
    timeline built from the ranks' events says exactly what those events say."""
    from hwtui.engine.replication.timeline import follower_lag, steps_from_events

    plan = _model(tmp_path)
    shm = _shm_dir(tmp_path)
    net, procs = _run(tmp_path, plan, [], {"HWTUI_SHM_DIR": str(shm)})
    try:
        results = finish(procs, timeout=120)
    finally:
        net.down()
    for rank, (rc, _out, err) in enumerate(results):
        assert rc == 0, (rank, err[-2000:])
    rows = {r: json.loads((tmp_path / f"rep{r}.json").read_text())["ranks"][0] for r in range(4)}
    assert {r: rows[r]["path"] for r in range(4)} == {0: "source", 1: "same-host", 2: "network", 3: "host-copy"}
    assert rows[2]["shared_staging"] is True  # the leader's copy: shared memory, faulted in before the transfer
    assert rows[3]["shared_staging"] is False and rows[1]["shared_staging"] is False
    assert all(rows[r]["ok"] for r in range(4))
    # The network group (source and leader) ran on two TCP streams per peer (engine.replication.net_streams),
    # and every bucket was still verified on every rank (ok above).
    assert {r: rows[r]["net_streams"] for r in range(4)} == {0: 2, 1: 0, 2: 2, 3: 0}
    assert "Network group (ranks 0, 2): 2 TCP streams per peer (HWTUI_NET_STREAMS)." in results[0][1]
    for r in range(4):
        cpu = rows[r]["transfer_cpu"]
        assert cpu["process_s"] >= 0 and cpu["wall_s"] > 0 and cpu["cores"] >= 1
    events = {r: _events(tmp_path / f"ev{r}.jsonl") for r in range(4)}
    mine = {r: [e for e in events[r] if e.get("rank") == r and e["kind"] in ("repl.bucket", "repl.span")] for r in range(4)}
    steps = steps_from_events([e for r in range(4) for e in mine[r]], {r: rows[r]["path"] for r in range(4)})
    n = len(plan["buckets"])

    def ev(r, kind, key, value):
        return {e["bucket_id"]: e for e in mine[r] if e["kind"] == kind and e.get(key) == value}

    def st(r, phase):
        return {s.bucket: s for s in steps if s.rank == r and s.phase == phase}

    # The leader: each verify step is its "done" event; each receive ends at its post + the
    # "verifying" state's seconds (the bucket's arrival).
    done2, ver2, post2 = ev(2, "repl.bucket", "state", "done"), ev(2, "repl.bucket", "state", "verifying"), \
        ev(2, "repl.bucket", "state", "inflight")
    assert set(st(2, "verify")) == set(st(2, "receive")) == set(range(n))
    for b in range(n):
        assert st(2, "verify")[b].end == done2[b]["t"]
        assert st(2, "verify")[b].seconds == pytest.approx(done2[b]["seconds"], abs=1e-6)
        assert st(2, "receive")[b].end == pytest.approx(post2[b]["t"] + ver2[b]["seconds"], abs=1e-6)
    assert set(ev(2, "repl.span", "phase", "announce")) == set(range(n))
    # The follower: copy and verify steps are its states; it waited for every announcement and
    # began copying each bucket only after the leader had verified it (cause, then effect).
    ver3, done3 = ev(3, "repl.bucket", "state", "verifying"), ev(3, "repl.bucket", "state", "done")
    waits = ev(3, "repl.span", "phase", "wait")
    assert set(waits) == set(st(3, "copy")) == set(st(3, "verify")) == set(range(n))
    for b in range(n):
        assert st(3, "copy")[b].seconds == pytest.approx(ver3[b]["seconds"], abs=1e-6)
        assert st(3, "verify")[b].end == done3[b]["t"]
        assert st(3, "wait")[b].seconds == pytest.approx(waits[b]["seconds"], abs=1e-6)
        assert st(3, "copy")[b].start >= done2[b]["t"] - 1e-3
    assert follower_lag(steps, leader=2, follower=3)["to_verified"] > 0
    # The source's hashing of every bucket, and every rank's whole transfer, are spans too.
    assert set(ev(0, "repl.span", "phase", "hash")) == set(range(n))
    for r in range(4):
        (transfer,) = [e for e in mine[r] if e["kind"] == "repl.span" and e["phase"] == "transfer"]
        assert transfer["seconds"] == pytest.approx(rows[r]["phases"]["transfer"], abs=1e-5)
    assert not list(shm.iterdir())  # the leader's shared memory is gone with the run


def _big_model(tmp_path: Path, bucket_bytes: int) -> dict:
    return _model(tmp_path, bucket_bytes, seed=29, numel=250_000, version="x3")


def _received_per_socket(ns: str, peer: str) -> list[int]:
    """bytes_received of every established TCP socket in namespace ``ns`` whose peer is ``peer`` (ss -ti)."""
    import re
    import subprocess

    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-tinH", "state", "established", "dst", peer],
                         capture_output=True, text=True, timeout=15, check=True).stdout
    entries: list[str] = []
    for line in out.splitlines():
        if line[:1].isspace() and entries:
            entries[-1] += line
        elif line.strip():
            entries.append(line)
    return [int(m.group(1)) if (m := re.search(r"bytes_received:(\d+)", e)) else 0 for e in entries]


def _mappers(directory: Path) -> set[int]:
    """The processes that map a file under ``directory`` (from /proc/<pid>/maps)."""
    pids = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            if str(directory) in maps.read_text():
                pids.add(int(maps.parent.name))
        except OSError:
            continue
    return pids


def test_two_streams_carry_the_buckets_and_the_follower_copies_from_a_mapping_while_the_leader_waits(tmp_path):
    """By state, with the source stopped before bucket 8 reaches the wire: the leader has verified
    buckets 0-7, and they reached it on two TCP connections from the source, each carrying more
    than a whole 256 KiB bucket (on one stream, one connection carried them all); the follower
    reads its leader's shared memory through a mapping of its own, made before the transfer (it
    read the file by preadv before: only the leader mapped it), and has copied and verified bucket
    0 while its leader still waits for the network (nothing is committed: the run is then
    stopped). One run: the follower's overlap and the two streams were two runs of 4 processes."""
    bucket = 256 << 10
    plan = _big_model(tmp_path, bucket)
    assert len(plan["buckets"]) > 10
    shm = _shm_dir(tmp_path)
    net, procs = _run(tmp_path, plan, ["--timeout", "60"], {"HWTUI_TEST_FAULT": "hang:rank=0,bucket=8",
                                                             "HWTUI_SHM_DIR": str(shm)})
    try:
        _wait_for_state(lambda: set(range(8)) <= _done(tmp_path / "ev2.jsonl", 2) and 0 in _done(tmp_path / "ev3.jsonl", 3),
                        procs, "the leader verified buckets 0-7 and the follower bucket 0")
        carried = sorted(_received_per_socket(net.node_ns[1], net.addresses[0]), reverse=True)
        assert len([n for n in carried if n > bucket]) >= 2, carried
        assert sum(carried) >= 8 * bucket
        assert len(_mappers(shm)) == 2  # the leader, and its follower
        arrived = {e["bucket_id"] for e in _events(tmp_path / "ev2.jsonl") if e.get("rank") == 2 and e.get("state") == "verifying"}
        assert set(range(8)) <= arrived and not {b for b in arrived if b >= 8}, arrived
    finally:
        _kill_all(procs)
        finish(procs, timeout=30)
        net.down()


def test_corrupted_buckets_on_the_two_stream_leader_and_the_mapping_follower_are_named_on_their_ranks(tmp_path):
    """Bucket 3 flipped on the leader (after two streams delivered it) and bucket 5 flipped in the
    follower's own copy (taken from its mapping): each is named on its rank (the leader's bad
    bucket again on its follower, which copied it), every rank votes no, no rank says ok."""
    plan = _big_model(tmp_path, 256 << 10)
    shm = _shm_dir(tmp_path)
    net, procs = _run(tmp_path, plan, [], {"HWTUI_TEST_FAULT": "corrupt:rank=2,bucket=3;corrupt:rank=3,bucket=5",
                                           "HWTUI_SHM_DIR": str(shm)})
    try:
        results = finish(procs, timeout=120)
    finally:
        net.down()
    assert all(rc != 0 for rc, _, _ in results), [e[-800:] for _, _, e in results]
    rows = {r: json.loads((tmp_path / f"rep{r}.json").read_text())["ranks"][0] for r in range(4)}
    assert rows[2]["net_streams"] == 2 and not any(rows[r]["ok"] for r in range(4))
    assert [f for f in rows[2]["failures"] if f.startswith("bucket ")] == \
        [f for f in rows[2]["failures"] if f.startswith("bucket 3 failed verification on rank 2")]
    named3 = sorted(int(f.split()[1]) for f in rows[3]["failures"] if f.startswith("bucket "))
    assert named3 == [3, 5], rows[3]["failures"]
    assert all("failed verification on rank 3" in f for f in rows[3]["failures"] if f.startswith("bucket "))
    assert not list(shm.iterdir())
