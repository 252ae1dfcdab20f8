"""Rendezvous against real sockets on 127.0.0.1: listening, refused, never-accepting, in use.

Files come from a recorded tree; the live facts (DNS, route, bind, connect) run for real through
LiveFactsHost. Nothing is sent to any address off this machine, and no payload is sent at all.
"""

from __future__ import annotations

import socket

import pytest

from hwtui.probes.distributed import rendezvous as R
from tests.probes.distributed.netsys import LiveFactsHost, basic_node, findings, status

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return basic_node(tmp_path_factory.mktemp("rdv"))


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    yield srv
    srv.close()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connecting is refused
    return port


def worker_env(port: int, addr: str = "127.0.0.1") -> dict[str, str]:
    return {"MASTER_ADDR": addr, "MASTER_PORT": str(port), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2"}


def test_listening_master_is_reachable(tree, listener):
    port = listener.getsockname()[1]
    f = findings(LiveFactsHost(tree.root, worker_env(port)))
    assert status(f, "rendezvous.master_addr") == "pass"
    assert status(f, "rendezvous.reachable") == "pass"
    assert f["rendezvous.route"].data["interface"] == "lo"
    # The probe connected and closed without sending anything: the accepted socket reads EOF.
    conn, _ = listener.accept()
    conn.settimeout(2)
    assert conn.recv(16) == b""
    conn.close()


def test_refused_port_is_explained_as_possibly_normal(tree):
    f = findings(LiveFactsHost(tree.root, worker_env(free_port())))
    r = f["rendezvous.reachable"]
    assert r.status.value == "warn" and "refused" in r.title
    assert "Normal when rank 0 has not started yet" in r.detail


def test_listener_that_never_accepts_times_out(tree, monkeypatch):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)  # accept queue of one; further SYNs are dropped, never answered
    port = srv.getsockname()[1]
    fillers = []
    try:
        for _ in range(8):  # fill the queue until a handshake no longer completes
            c = socket.socket()
            c.settimeout(0.3)
            try:
                c.connect(("127.0.0.1", port))
                fillers.append(c)
            except OSError:
                c.close()
                break
        monkeypatch.setattr(R, "CONNECT_TIMEOUT_S", 0.5)
        rec = R.connect_test("127.0.0.1", port, 0.5)
        assert rec["outcome"] == "timeout" and 0.4 <= rec["elapsed_s"] < 3
        f = findings(LiveFactsHost(tree.root, worker_env(port)))
    finally:
        for c in fillers:
            c.close()
        srv.close()
    r = f["rendezvous.reachable"]
    assert r.status.value == "fail" and "did not answer" in r.title
    assert f"--dport {port}" in r.remedy


def test_master_binds_its_port(tree, listener):
    busy = listener.getsockname()[1]
    env = {**worker_env(busy), "RANK": "0", "LOCAL_RANK": "0"}
    f = findings(LiveFactsHost(tree.root, env))
    p = f["rendezvous.port"]
    assert p.status.value == "fail" and "already in use" in p.title and "a process is listening" in p.title
    f = findings(LiveFactsHost(tree.root, {**env, "MASTER_PORT": str(free_port())}))
    assert status(f, "rendezvous.port") == "pass" and "is free" in f["rendezvous.port"].title
    assert "rendezvous.reachable" not in f


def test_torchrun_worker_of_rank0_connects_to_the_agent_store(tree, listener):
    # Under torchrun the agent hosts the store, so rank 0's port is legitimately in use: connect instead.
    env = {**worker_env(listener.getsockname()[1]), "RANK": "0", "LOCAL_RANK": "0",
           "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    f = findings(LiveFactsHost(tree.root, env))
    assert status(f, "rendezvous.reachable") == "pass"
    assert status(f, "rendezvous.port") == "pass"


def test_resolution_deadline_and_failure(tree, monkeypatch):
    # The resolver is faked at the library boundary so no DNS query leaves this machine.
    import threading

    release = threading.Event()

    def hanging(*_a, **_k):
        release.wait(5)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    monkeypatch.setattr(R, "RESOLVE_TIMEOUT_S", 0.3)
    rec = R.resolve("master.example", 29500, timeout=0.3)
    assert rec["timed_out"] and rec["elapsed_s"] < 1.0
    rdv = R.collect_rendezvous(LiveFactsHost(tree.root, worker_env(29500, "master.example")))
    assert rdv["resolve"]["timed_out"]
    release.set()

    def nxdomain(*_a, **_k):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", nxdomain)
    f = findings(LiveFactsHost(tree.root, worker_env(29500, "master.example")))
    m = f["rendezvous.master_addr"]
    assert m.status.value == "fail" and "does not resolve: Name or service not known" in m.title
    assert "/etc/hosts" in m.remedy
    assert "rendezvous.reachable" not in f  # nothing to connect to


@pytest.mark.parametrize(("value", "text", "remedy"), [
    ("tcp://127.0.0.1:29500", "is a URL", "export MASTER_ADDR=127.0.0.1"),
    ("node1:29500", "includes a port", "export MASTER_ADDR=node1"),
])
def test_common_master_addr_mistakes(tree, value, text, remedy):
    f = findings(LiveFactsHost(tree.root, worker_env(29500, value)))
    m = f["rendezvous.master_addr"]
    assert m.status.value == "fail" and text in m.title and m.remedy == remedy


def test_loopback_master_in_multi_node_job(tree):
    env = {**worker_env(29500), "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    f = findings(LiveFactsHost(tree.root, env))
    assert status(f, "rendezvous.master_addr") == "fail"


def test_missing_rendezvous_in_multiprocess_job(tree):
    f = findings(LiveFactsHost(tree.root, {"RANK": "1", "WORLD_SIZE": "2"}))
    assert status(f, "rendezvous.master_addr") == "fail"
    assert status(f, "rendezvous.port") == "fail"


@pytest.mark.parametrize(("outcome", "errno_name", "want", "text"), [
    ("unreachable", "EHOSTUNREACH", "fail", "is unreachable"),
    ("unreachable", "ENETUNREACH", "fail", "is unreachable"),
    ("refused", "ECONNREFUSED", "warn", "refused"),
])
def test_recorded_outcomes_replay(tree, tmp_path, outcome, errno_name, want, text):
    import errno

    from hwtui.probes.host import FsHost

    code = getattr(errno, errno_name)
    assert R.classify_errno(code) == outcome
    ns = basic_node(tmp_path)
    ns.facts(**{R.FACT_KEY: {
        "target": {"host": "10.9.0.1", "port": 29500, "master_here": False},
        "resolve": {"ok": True, "timed_out": False, "elapsed_s": 0.001, "addresses": ["10.9.0.1"]},
        "ip": "10.9.0.1", "route": {"source": "10.0.0.5", "interface": "eth0"}, "local": False,
        "port_test": {"action": "connect", "outcome": outcome, "errno": code, "error": "x", "elapsed_s": 0.01}}})
    f = findings(FsHost(ns.root, worker_env(29500, "10.9.0.1")))
    assert status(f, "rendezvous.reachable") == want and text in f["rendezvous.reachable"].title
    assert f["rendezvous.route"].data["interface"] == "eth0"
    # A recorded probe for another target is not reused.
    f = findings(FsHost(ns.root, worker_env(29501, "10.9.0.1")))
    assert status(f, "rendezvous.master_addr") == "skip"


def test_snapshot_replay_reproduces_the_live_probe(tree, listener):
    import json

    from hwtui.probes.host import RecordingHost, ReplayHost

    port = listener.getsockname()[1]
    recording = RecordingHost(LiveFactsHost(tree.root, worker_env(port)))
    live = findings(recording)
    snap = json.loads(json.dumps(recording.snapshot()))
    listener.close()  # the master is gone: replay must still say what the live run saw
    replayed = findings(ReplayHost(snap))
    for fid in ("rendezvous.master_addr", "rendezvous.route", "rendezvous.reachable", "nccl.socket_ifname"):
        assert replayed[fid].status == live[fid].status and replayed[fid].title == live[fid].title
