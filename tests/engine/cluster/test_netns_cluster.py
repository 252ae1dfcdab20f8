"""Real multi-host runs: three network namespaces on a bridge, torchrun in each, gloo between them.

One 3-node world (started with the launch scripts `hwtui cluster init` wrote) is shared by the
assertions on the report, the events and the bandwidth figures; the failure cases (a node that
never starts, a port nobody answers, a port that refuses) are short runs of their own.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hwtui.app.cli import main as cli_main
from hwtui.core.events import iter_events
from hwtui.engine.cluster import events as cluster_events  # noqa: F401 - registers the cluster.* kinds
from tests.engine.cluster.netns import NetnsCluster, finish, unavailable_reason
from tests.procfs import descendants, ppid

pytestmark = [pytest.mark.torch, pytest.mark.netns, pytest.mark.timeout(150)]

_REASON = unavailable_reason()
if _REASON:
    pytest.skip(f"cannot create network namespaces: {_REASON}", allow_module_level=True)

NODES = ("a", "b", "c")
MAX_BYTES = 2 * 1024 * 1024


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE", "TORCHELASTIC",
                                                                     "SLURM_", "OMPI_", "PMI", "HWTUI_CLUSTER"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def cluster():
    net = NetnsCluster(3).up()
    try:
        yield net
    finally:
        net.down()


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cluster") / "hwtui-cluster"
    nodes = ",".join(f"{n}=10.77.0.{i + 1}" for i, n in enumerate(NODES))
    rc = cli_main(["cluster", "init", "--nodes", nodes, "--interface", "eth0", "--python", sys.executable,
                   "--join-timeout", "30", "--timeout", "40", "-o", str(out)])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def world(cluster, setup_dir):
    """Run the generated launch-<node>.sh in each namespace; rank 0 writes the report, and its
    events go to stdout as JSON lines (`--events -`) with the human output on stderr."""
    report = setup_dir / "report.json"
    started = time.monotonic()
    # Two timed iterations and one warm-up per size (not 10 and 3): the tests check the rows and
    # their formulas, not the figures, and the sweep was most of this module's CPU.
    procs = [cluster.popen(i, ["sh", str(setup_dir / f"launch-{n}.sh"), "--min-bytes", "1K", "--max-bytes", str(MAX_BYTES),
                               "--iters", "2", "--warmup", "1", "--report", str(report), "--events", "-"], env=_env())
             for i, n in enumerate(NODES)]
    results = finish(procs, timeout=120)
    return {"results": results, "elapsed": time.monotonic() - started, "report": report}


def test_every_node_passes(world):
    for node, (rc, out, err) in zip(NODES, world["results"], strict=True):
        assert rc == 0, f"node {node} exited {rc}\nstdout:\n{out}\nstderr:\n{err[-3000:]}"


def test_report_names_three_nodes_on_their_own_addresses(world):
    report = json.loads(world["report"].read_text())
    assert report["ok"] is True and report["world_size"] == 3 and report["backend"] == "gloo"
    assert report["launcher"] == "torchrun"
    assert sorted(n["node"] for n in report["nodes"]) == list(NODES)  # torchrun orders ranks itself
    by_node = {r["node"]: r for r in report["ranks"]}
    for i, node in enumerate(NODES):
        route = by_node[node]["route"]
        assert route["local_addr"] == f"10.77.0.{i + 1}" and route["interface"] == "eth0"
        assert sorted(by_node[node]["interfaces"]) == ["eth0", "lo"]
        assert by_node[node]["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
    ids = {f["id"]: f["status"] for f in report["findings"]}
    for node in NODES:
        assert ids[f"cluster.join[{node}]"] == "pass"
        assert ids[f"cluster.interface[{node}]"] == "pass"
    assert ids["cluster.torch"] == "pass" and ids["cluster.correctness"] == "pass"
    assert report["correctness"]["got"] == [6.0, 6.0, 6.0] and report["correctness"]["expected"] == 6.0


def test_bandwidth_follows_nccl_tests_definitions(world):
    report = json.loads(world["report"].read_text())
    rows = report["bandwidth"]
    sizes = [1024, 4096, 16384, 65536, 262144, 1048576, MAX_BYTES]
    assert [(r["op"], r["size_bytes"]) for r in rows] == [(op, s) for op in ("broadcast", "all_reduce") for s in sizes]
    for r in rows:
        assert r["seconds"] > 0
        assert r["algbw"] == pytest.approx(r["size_bytes"] / 1e9 / r["seconds"], rel=1e-9)
        factor = 1.0 if r["op"] == "broadcast" else 2 * (3 - 1) / 3
        assert r["busbw"] == pytest.approx(r["algbw"] * factor, rel=1e-9)
    # The figures measured over the veth bridge, for the record (pytest -s shows them).
    print("\nveth namespaces, gloo, 3 ranks:")
    for r in rows:
        print(f"  {r['op']:>10} {r['size_bytes']:>8} B  algbw {r['algbw']:.4f} GB/s  busbw {r['busbw']:.4f} GB/s")


def test_events_stream_for_the_tui(world):
    talking = [i for i, (_, out, _) in enumerate(world["results"]) if out.strip()]
    assert len(talking) == 1, "only rank 0 writes events"
    _, out, err = world["results"][talking[0]]
    assert all(line.startswith('{"kind":"cluster.') for line in out.splitlines())  # stdout is pure JSON lines
    evs = list(iter_events(io.StringIO(out)))
    kinds = [e.kind for e in evs]
    assert kinds.count("cluster.node") == 3
    assert kinds.count("cluster.bandwidth") == 14
    assert kinds.index("cluster.correctness") < kinds.index("cluster.bandwidth")
    assert kinds[-1] == "cluster.done"
    done = evs[-1]
    assert done.ok is True and done.world_size == 3 and sorted(done.nodes) == list(NODES)
    assert sorted(e.node for e in evs if e.kind == "cluster.node") == list(NODES)
    bw = [e for e in evs if e.kind == "cluster.bandwidth"]
    assert all(e.busbw == pytest.approx(e.algbw * (4 / 3 if e.op == "all_reduce" else 1)) for e in bw)
    # The human side (nccl-tests style table, verdict) went to stderr.
    assert "algbw(GB/s)" in err and "busbw(GB/s)" in err and "cluster test PASSED" in err


def _direct(cluster, node: int, rank: int, world_size: int, port: int, spec: Path, extra: list[str]):
    """A rank started the mpirun/srun/manual way: RANK, WORLD_SIZE and MASTER_* from the environment."""
    env = _env(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="10.77.0.1", MASTER_PORT=str(port),
               HWTUI_CLUSTER_NODE=NODES[node], GLOO_SOCKET_IFNAME="eth0")
    return cluster.popen(node, [sys.executable, "-m", "hwtui.app", "cluster", "test", "--spec", str(spec), *extra], env=env)


def test_node_that_never_starts_is_named_within_the_timeout(cluster, setup_dir, world):
    report = setup_dir / "missing.json"
    # finish() kills a rank still running after 60 s (rc -9): an exit 1 is the join timeout's own
    # verdict, not gloo's 30 minutes, whatever the machine's speed.
    procs = [_direct(cluster, i, i, 3, 29600, setup_dir / "cluster.json",
                     ["--join-timeout", "4", "--report", str(report), "--no-sweep"]) for i in (0, 1)]
    (rc0, out0, err0), (rc1, out1, err1) = finish(procs, timeout=60)
    assert rc0 == 1, out0 + err0
    assert "rank 2 (node c, 10.77.0.3) never joined within 4 s" in out0
    assert rc1 == 1 and "rank 2 (node c, 10.77.0.3) never joined within 4 s" in err1
    data = json.loads(report.read_text())
    assert data["ok"] is False
    [finding] = [f for f in data["findings"] if f["status"] == "fail"]
    assert finding["id"] == "cluster.join[rank 2]" and finding["data"]["node"] == "c"
    assert data["missing"] == [{"rank": 2, "node": "c", "address": "10.77.0.3"}]


BLACKHOLE = textwrap.dedent("""
    import socket, sys, time
    # A listener whose accept queue is full: the kernel then drops new SYNs silently, exactly what
    # a firewall DROP rule looks like from the other side.
    srv = socket.socket(); srv.bind(("10.77.0.1", int(sys.argv[1]))); srv.listen(0)
    fill = []
    for _ in range(3):
        c = socket.socket(); c.setblocking(False)
        try:
            c.connect(("10.77.0.1", int(sys.argv[1])))
        except BlockingIOError:
            pass
        fill.append(c)
    print("ready", flush=True)
    time.sleep(60)
""")


def test_blocked_and_refused_ports_are_told_apart(cluster, setup_dir, world):
    hole = cluster.popen(0, [sys.executable, "-c", BLACKHOLE, "29700"])
    try:
        assert hole.stdout.readline().strip() == "ready"
        procs = [_direct(cluster, 1, 1, 2, 29700, setup_dir / "cluster.json", ["--join-timeout", "3"]),
                 _direct(cluster, 2, 1, 2, 29701, setup_dir / "cluster.json", ["--join-timeout", "3"])]
        (rc_drop, _, err_drop), (rc_ref, _, err_ref) = finish(procs, timeout=60)
    finally:
        hole.kill()
        hole.communicate(timeout=10)
    assert rc_drop == 1 and rc_ref == 1
    assert "rank 1 on node b cannot reach the rendezvous store at 10.77.0.1:29700 (node a) within 3 s" in err_drop
    assert "no answer (packets dropped" in err_drop
    assert "rank 1 on node c cannot reach the rendezvous store at 10.77.0.1:29701 (node a) within 3 s" in err_ref
    assert "connection refused" in err_ref
    assert "Traceback" not in err_drop + err_ref


def test_torchrun_closes_the_rendezvous_and_names_the_absent_node_with_its_reason(cluster, tmp_path, world):
    """The generated torchrun scripts use --nnodes=1:N with last_call_timeout = join timeout. Node c's
    NCCL_SOCKET_IFNAME names ens5, which it lacks: its launch script's preflight stops it with the
    fix and leaves that line in the rendezvous store; a and b run the test after the timeout and
    the report names c *and* why."""
    out = tmp_path / "cl"
    nodes = ",".join(f"{n}=10.77.0.{i + 1}" for i, n in enumerate(NODES))
    assert cli_main(["cluster", "init", "--nodes", nodes, "--interface", "eth0", "--node-interface", "c=ens5",
                     "--python", sys.executable, "--join-timeout", "6", "--master-port", "29800", "-o", str(out)]) == 0
    procs = [cluster.popen(i, ["sh", str(out / f"launch-{n}.sh"), "--max-bytes", "16K", "--report", str(out / "r.json")],
                           env=_env()) for i, n in enumerate(NODES)]
    results = finish(procs, timeout=90)
    assert [rc for rc, _, _ in results] == [1, 1, 1], results  # every node ended by itself (finish kills at 90 s: -9)
    fix = "NCCL_SOCKET_IFNAME=ens5 matches no interface that is up; fix: export NCCL_SOCKET_IFNAME=eth0"
    _, out_c, err_c = results[2]
    assert out_c == "" and err_c.splitlines() == [f"hwtui: node c cannot join: {fix}",
                                                  f"hwtui: node c cannot join: {fix.replace('NCCL', 'GLOO')}",
                                                  "hwtui: node c: leaving this for the master at 10.77.0.1:29800 "
                                                  "(up to 36 s; Ctrl-C skips it)"]
    report = json.loads((out / "r.json").read_text())
    assert report["world_size"] == 2 and sorted(n["node"] for n in report["nodes"]) == ["a", "b"]
    failed = {f["id"]: f for f in report["findings"] if f["status"] == "fail"}
    assert list(failed) == ["cluster.join[c]"]
    assert failed["cluster.join[c]"]["title"] == f"node c (10.77.0.3) never joined: it said: {fix}"
    assert report["correctness"]["ok"] is True  # the nodes that came were still tested


FIREWALL = """
table inet hwtui_test {
  chain input {
    type filter hook input priority 0; policy accept;
    iifname "eth0" ct state new drop
  }
}
"""


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft (nftables) is not installed")
def test_a_firewalled_worker_is_named_before_the_process_group_hangs(cluster, setup_dir):
    """Node c drops every new inbound connection (its own to the store still work): the reach test
    names c and how each attempt failed (each within min(3 s, --timeout)) before any process group."""
    rule = subprocess.run(["ip", "netns", "exec", cluster.node_ns[2], "nft", "-f", "-"], input=FIREWALL, text=True,
                          capture_output=True, timeout=15)
    assert rule.returncode == 0, rule.stderr
    try:
        report = setup_dir / "firewalled.json"
        procs = [_direct(cluster, node, rank, 2, 29820, setup_dir / "cluster.json",
                         ["--no-sweep", "--timeout", "1", "--report", str(report)])
                 for rank, node in enumerate((0, 2))]
        (rc0, out0, err0), (rc1, out1, err1) = finish(procs, timeout=90)
    finally:
        subprocess.run(["ip", "netns", "exec", cluster.node_ns[2], "nft", "delete", "table", "inet", "hwtui_test"],
                       capture_output=True, timeout=15)
    assert (rc0, rc1) == (1, 1), out0 + err0 + err1
    data = json.loads(report.read_text())
    [finding] = [f for f in data["findings"] if f["status"] == "fail"]
    assert finding["id"] == "cluster.reach[c]"
    assert finding["title"] == "node c accepts no connections from a (dropped: a firewall?)"
    assert finding["detail"].startswith("a -> c: no answer.")
    assert "on c: allow incoming TCP" in finding["remedy"]
    assert "node c accepts no connections from a" in err1 and "Traceback" not in err0 + err1


WAIT_FOR_MARK = textwrap.dedent("""
    import sys, time
    from datetime import timedelta
    from torch.distributed import TCPStore
    from hwtui.engine.cluster import preflight, spec
    s = spec.load(sys.argv[1])
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            store = TCPStore(s.master, s.master_port, None, False, timedelta(seconds=3))
            if store.check([preflight.started_key(s)]):
                print("marked", flush=True)
                sys.exit(0)
        except Exception:
            pass
        time.sleep(0.2)
    sys.exit(1)
""")


def _stop_ranks(roots: list[int], count: int = 2, bound_s: float = 60.0) -> list[int]:
    """SIGSTOP the ``count`` torchrun ranks below ``roots`` (torch elastic gives each a LOCAL_RANK;
    its agent has none) once they all exist, and return them. By state: rank 0 marks the store
    first thing, when the other node's torchrun may not have started its rank yet (a CI run
    stopped one rank of two); both then wait out the join timeout in the roll call."""
    def has_local_rank(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return any(v.startswith(b"LOCAL_RANK=") for v in f.read().split(b"\0"))
        except OSError:
            return False

    def parent(pid: int) -> int:
        try:
            return ppid(pid)
        except OSError:  # gone while we looked
            return pid

    deadline = time.monotonic() + bound_s
    while True:
        # torch elastic starts its ranks in sessions of their own: found from /proc, not the launch
        # script's process group. A rank's own children (a probe it runs) inherit LOCAL_RANK: only
        # the agent's children count.
        below = [pid for root in roots for pid in descendants(root)]
        ranks = [pid for pid in below if has_local_rank(pid) and not has_local_rank(parent(pid))]
        if len(ranks) >= count:
            break
        assert time.monotonic() < deadline, f"expected {count} ranks below {roots} within {bound_s:g} s, found {ranks}"
        time.sleep(0.05)
    assert len(ranks) == count, f"expected {count} ranks below {roots}, found {ranks}"
    return [pid for pid in ranks if _signal(pid, signal.SIGSTOP)]


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


# a and b wait out this join timeout for c on purpose (c comes only once the test began): short,
# yet room for a's and b's torchrun, started together, to both join on a loaded box (20 s before).
JOIN_S = "12"


def test_a_node_started_after_the_join_timeout_is_refused_and_no_node_shows_a_traceback(cluster, tmp_path, world):
    """a and b start; once the test has begun (rank 0's mark is in the store) c's launch script
    runs: its torchrun refuses it by name with the fix in one line before the rendezvous,
    and a and b finish undisturbed (before: c joined torchrun's next round, and after 114 s every
    node died with DistStoreError tracebacks)."""
    out = tmp_path / "cl"
    nodes = ",".join(f"{n}=10.77.0.{i + 1}" for i, n in enumerate(NODES))
    assert cli_main(["cluster", "init", "--nodes", nodes, "--interface", "eth0", "--python", sys.executable,
                     "--join-timeout", JOIN_S, "--master-port", "29900", "-o", str(out)]) == 0
    first = [cluster.popen(i, ["sh", str(out / f"launch-{n}.sh"), "--max-bytes", "64K", "--iters", "2"], env=_env())
             for i, n in enumerate(NODES[:2])]
    held: list[int] = []
    try:
        mark = cluster.popen(2, [sys.executable, "-c", WAIT_FOR_MARK, str(out / "cluster.json")], env=_env())
        assert mark.stdout.readline().strip() == "marked", mark.communicate(timeout=10)
        mark.wait(10)
        # a's and b's ranks are held (SIGSTOP) while c comes: their torchrun agents, which keep the
        # rendezvous store c asks, run on. A state, not a time: before, a and b swept 32M x 20 so
        # as to still run when c asked (8 CPU-s of the suite, and a race on a slow enough box).
        held = _stop_ranks([p.pid for p in first])
        late = cluster.popen(2, ["sh", str(out / "launch-c.sh")], env=_env())
        (rc_c, out_c, err_c), = finish([late], timeout=90)
    finally:
        for pid in held:
            _signal(pid, signal.SIGCONT)
        results = finish(first, timeout=120)
    assert rc_c == 1 and out_c == "", err_c
    [line] = err_c.splitlines()
    assert line.startswith("hwtui: node c is too late: the cluster test began at "), line
    assert line.endswith(f" without it (with a, b, after the {JOIN_S} s join timeout); fix: let that run finish, then start "
                         f"every node's launch script again, all within {JOIN_S} s (the join timeout) of the first"), line
    # a and b ran the test without c, which cluster.json lists: it fails naming c, and ends in lines,
    # not tracebacks (torchrun's ChildFailedError included: the launch script's torchrun says one line).
    for node, (rc, o, e) in zip(NODES, results, strict=False):
        assert rc == 1, f"node {node} exited {rc}\n{o[-2000:]}\n{e[-3000:]}"
        assert "Traceback" not in o + e and "DistStoreError" not in o + e, o[-2000:] + e[-3000:]
        assert e.rstrip().endswith("hwtui: torchrun: a rank on this node failed; its output above says why"), e[-2000:]
    assert sum(f"[FAIL] node c (10.77.0.3) never joined within {JOIN_S} s" in o for _, o, _ in results) == 1
    print(f"\nlate node c said: {line}")
