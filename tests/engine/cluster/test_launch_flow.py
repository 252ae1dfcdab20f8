"""The launch flow over loopback, with real ranks: srun and mpirun see no false FAIL, only rank 0
talks, --env values stay hidden, and a rank whose local check fails stops every rank at once,
named with its finding (network-namespace cases live in test_netns_cluster.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hwtui.app.cli import main as cli_main
from hwtui.core.net import free_loopback_port
from hwtui.core.redact import MASK
from hwtui.engine.cluster import launchfiles
from hwtui.engine.cluster.smoke import ClusterNodeRow, ClusterReport
from tests import cli_proc
from tests.engine.cluster.netns import finish
from tests.typed_shape import assert_shape

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

TOKEN = "hf_" + "Qx7" * 12
PLAIN_SECRET = "opensesame-4711"  # not secret by its name: hidden only because it came with --env
_LAUNCH_VARS = ("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC", "SLURM_", "OMPI_", "PMI", "HWTUI_CLUSTER",
                "NCCL_", "GLOO_")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARS)}
    env.update(extra)
    return env


def _rank(argv_tail: list[str], **env: str) -> subprocess.Popen:
    return cli_proc.Popen([sys.executable, "-m", "hwtui.app", "cluster", "test", *argv_tail], env=_env(**env),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _init(out: Path, nodes: str, *extra: str) -> Path:
    assert cli_main(["cluster", "init", "--nodes", nodes, "-o", str(out), "--env", f"HF_TOKEN={TOKEN}",
                     "--env", f"NCCL_EXTRA_OPTION={PLAIN_SECRET}", *extra]) == 0
    return out / "cluster.json"


def test_srun_and_mpirun_pass_quietly_and_keep_env_values_hidden(tmp_path, capsys):
    """rank 0 hosts the store under srun and mpirun: its own local check must not call that port 'in use'."""
    spec2 = _init(tmp_path / "two", "n0=127.0.0.1,n1=127.0.0.2", "--launcher", "slurm")
    spec1 = _init(tmp_path / "one", "n0=127.0.0.1", "--launcher", "mpirun")
    capsys.readouterr()
    secrets = {"HF_TOKEN": TOKEN, "NCCL_EXTRA_OPTION": PLAIN_SECRET, "LD_LIBRARY_PATH": f"/opt/{PLAIN_SECRET}/lib"}
    slurm_port, mpi_port = free_loopback_port(), free_loopback_port()
    common = ["--no-sweep", "--join-timeout", "60", "--timeout", "60"]
    procs = [_rank(["--spec", str(spec2), "--report", str(tmp_path / "slurm.json"), "--events", str(tmp_path / "ev.jsonl"),
                    *common], SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID="0", SLURM_JOB_ID="4242",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(slurm_port), HWTUI_CLUSTER_NODE=f"n{r}", **secrets)
             for r in range(2)]
    procs.append(_rank(["--spec", str(spec1), "--json", *common], OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="1",
                       OMPI_COMM_WORLD_LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(mpi_port),
                       HWTUI_CLUSTER_NODE="n0", **secrets))
    results = finish(procs, timeout=100)
    assert [rc for rc, _, _ in results] == [0, 0, 0], results
    slurm = json.loads((tmp_path / "slurm.json").read_text())
    mpi = json.loads(results[2][1])
    for report, launcher in ((slurm, "slurm"), (mpi, "mpirun")):
        assert report["ok"] is True and report["launcher"] == launcher
        assert_shape(report, ClusterReport)  # the declared shape of a test that ran, every node row too
        for row in report["nodes"]:
            assert_shape(row, ClusterNodeRow)
        status = {f["id"]: f["status"] for f in report["findings"]}
        assert all(status[f"cluster.node_check[{n['node']}]"] == "pass" for n in report["nodes"])
        for rank in report["ranks"]:
            port = next(f for f in rank["check"]["findings"] if f["id"] == "rendezvous.port")
            assert port["status"] == "pass" and "serves this test's rendezvous store" in port["title"]
            assert rank["env"]["NCCL_EXTRA_OPTION"] == MASK and rank["env"]["LD_LIBRARY_PATH"] == f"/opt/{MASK}/lib"
    # Only rank 0 speaks under a launcher; nothing anywhere holds an --env value.
    assert results[1][1] == "" and results[1][2] == ""
    everything = "".join(out + err for _, out, err in results) + (tmp_path / "slurm.json").read_text() \
        + (tmp_path / "ev.jsonl").read_text()
    assert TOKEN not in everything and PLAIN_SECRET not in everything
    assert "cluster test PASSED: 2 rank(s) on 2 node(s) (n0, n1)" in results[0][1]


def test_a_rank_whose_local_check_fails_stops_every_rank_at_once(tmp_path):
    """Rank 1's NCCL_SOCKET_IFNAME names an interface this host lacks: it registers with that
    finding, so nobody waits for the (long) join timeout and rank 0 names it with the fix."""
    spec = _init(tmp_path / "cl", "n0=127.0.0.1,n1=127.0.0.2", "--launcher", "slurm")
    port = free_loopback_port()
    started = time.monotonic()
    procs = [_rank(["--spec", str(spec), "--join-timeout", "600", "--report", str(tmp_path / "r.json")],
                   RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HWTUI_CLUSTER_NODE=f"n{r}",
                   **({"NCCL_SOCKET_IFNAME": "ens5"} if r == 1 else {})) for r in range(2)]
    (rc0, out0, err0), (rc1, out1, err1) = finish(procs, timeout=90)
    assert (rc0, rc1) == (1, 1), (out0, err0, err1)
    assert time.monotonic() - started < 600  # the join timeout was never waited out
    report = json.loads((tmp_path / "r.json").read_text())
    assert_shape(report, ClusterReport)  # stopped before the group: node names, no test figures
    assert all(isinstance(n, str) for n in report["nodes"]) and "bandwidth" not in report
    [blocked] = [f for f in report["findings"] if f["status"] == "fail"]
    assert blocked["id"] == "cluster.preflight[n1]"
    assert blocked["title"] == "node n1 stopped before joining: NCCL_SOCKET_IFNAME=ens5 matches no interface that is up"
    assert blocked["remedy"].startswith("on n1: export NCCL_SOCKET_IFNAME=")
    assert "[FAIL] node n1 stopped before joining" in out0
    assert err1.startswith("hwtui: rank 1: cluster test failed: local check on node n1 failed before joining: "
                           "NCCL_SOCKET_IFNAME=ens5 matches no interface that is up; fix: export NCCL_SOCKET_IFNAME=")
    assert out1 == "" and "Traceback" not in err0 + err1



def test_preflight_outside_the_env_file_checks_the_specs_interface(tmp_path):
    """`hwtui cluster preflight --spec cluster.json --node c` in a bare shell (no env file sourced)
    checks what c's launch script will export: the spec's interface for c, which this host lacks;
    and it leaves that line in the rendezvous store for the master to quote."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from hwtui.engine.cluster.smoke import preflight_key

    port = free_loopback_port()
    out = tmp_path / "cl"
    assert cli_main(["cluster", "init", "--nodes", "a=127.0.0.1,c=127.0.0.2", "--interface", "lo", "--node-interface",
                     "c=ens5", "--master-port", str(port), "--join-timeout", "5", "-o", str(out)]) == 0
    store = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False)  # node a's
    argv = [sys.executable, "-m", "hwtui.app", "cluster", "preflight", "--spec", str(out / "cluster.json")]
    done = cli_proc.run([*argv, "--node", "c"], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("hwtui: node c cannot join: NCCL_SOCKET_IFNAME=ens5 matches no interface that is up; fix: "), first
    assert "Traceback" not in done.stderr
    said = store.get(preflight_key("c")).decode()
    assert said.startswith("NCCL_SOCKET_IFNAME=ens5 matches no interface that is up; fix: ")
    # Node a's interface (lo) exists: it may join.
    ok = cli_proc.run([*argv, "--node", "a"], env=_env(), capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    # A node the spec does not list: one line, exit 2.
    bad = cli_proc.run([*argv, "--node", "zz"], env=_env(), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"hwtui: error: node 'zz' is not in {out / 'cluster.json'} (it lists a, c): pass --node NAME, or source that "
        "node's env file first"]



def test_a_node_that_comes_after_the_test_began_is_refused_by_name_in_one_line(tmp_path):
    """Under torchrun rank 0 marks the store when the test begins, with the nodes it runs with; the
    launch script's torchrun (engine/cluster/torchrun.py) of a node not among them refuses it
    before the rendezvous (it joined torchrun's next round before, restarting the running nodes,
    and every node ended in DistStoreError tracebacks)."""
    import json as _json
    import shlex
    from datetime import timedelta

    from torch.distributed import TCPStore

    from hwtui.engine.cluster import preflight
    from hwtui.engine.cluster import spec as specmod

    port = free_loopback_port()
    out = tmp_path / "cl"
    assert cli_main(["cluster", "init", "--nodes", "a=127.0.0.1,b=127.0.0.3,c=127.0.0.2", "--interface", "lo",
                     "--master-port", str(port), "--join-timeout", "30", "--python", sys.executable, "-o", str(out)]) == 0
    spec = specmod.load(out / "cluster.json")
    store = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False)  # a's torchrun

    def torchrun(node: str) -> subprocess.CompletedProcess:
        line = next(ln for ln in (out / f"launch-{node}.sh").read_text().splitlines() if ln.startswith("exec "))
        argv = shlex.split(line[len("exec "):].replace('"$HERE/cluster.json"', str(out / "cluster.json"))
                           .replace('"$@"', ""))
        assert argv[1:3] == ["-m", "hwtui.engine.cluster.torchrun"]
        return subprocess.run(argv, env=_env(HWTUI_CLUSTER_NODE=node), capture_output=True, text=True, timeout=120)

    # Before the test begins there is no mark: any node may join.
    assert preflight.late_refusal("127.0.0.1", port, launchfiles.rdzv_id(spec), "c", 30) is None
    store.set(preflight.started_key(spec), _json.dumps({"nodes": ["a", "b"], "at": "12:00:00"}))
    late = torchrun("c")
    assert late.returncode == 1 and late.stdout == ""
    assert late.stderr.splitlines() == [
        "hwtui: node c is too late: the cluster test began at 12:00:00 without it (with a, b, after the 30 s join "
        "timeout); fix: let that run finish, then start every node's launch script again, all within 30 s (the join "
        "timeout) of the first"]
    # Re-running a node's launch script while it is in the test is refused too (torchrun's next round again).
    again = torchrun("b")
    assert again.returncode == 1 and again.stderr.startswith("hwtui: node b is already running in the cluster test "
                                                             "that began at 12:00:00; fix: "), again.stderr
    # The mark is what rank 0 leaves: first with the world size only, then with the nodes.
    assert preflight.mark_started(spec, None, 2)
    assert "(with 2 rank(s), after the 30 s join timeout)" in preflight.late_refusal("127.0.0.1", port,
                                                                                     launchfiles.rdzv_id(spec), "c", 30)
    assert preflight.mark_started(spec, ["a"], 1)
    assert _json.loads(store.get(preflight.started_key(spec)))["nodes"] == ["a"]


def test_torchrun_ends_on_the_failed_rank_even_when_the_rendezvous_shutdown_fails_after_it():
    """torchrun's agent shuts the rendezvous down in a ``finally``: on a node whose master already
    exited, that raises over the ChildFailedError of the rank that failed. The line still names the
    rank; a rendezvous that broke on its own still names the rendezvous."""
    from hwtui.engine.cluster.torchrun import ending

    class ChildFailedError(Exception):  # torch.distributed.elastic.multiprocessing.errors' name
        pass

    class RendezvousConnectionError(Exception):
        pass

    try:
        try:
            raise ChildFailedError("hwtui.engine.cluster.test FAILED")
        finally:
            raise RendezvousConnectionError("The connection to the C10d store has failed.")
    except RendezvousConnectionError as exc:
        assert ending(exc) == "hwtui: torchrun: a rank on this node failed; its output above says why"
    alone = RendezvousConnectionError("The connection to the C10d store has failed.\nmore")
    assert ending(alone) == ("hwtui: torchrun: the rendezvous or launch failed (RendezvousConnectionError: The "
                             "connection to the C10d store has failed.); the cluster test's own lines on the master "
                             "name the nodes")
    looped = RendezvousConnectionError("x")
    looped.__context__ = looped  # a cycle ends the walk
    assert "rendezvous or launch failed" in ending(looped)


def test_a_rank_that_marked_its_failure_names_the_ending_whatever_torchrun_raised(tmp_path, monkeypatch):
    """torchrun's agent can hit a master that already exited (RendezvousConnectionError) before it
    has seen its own rank exit, so nothing of the rank's failure is in what it raises: the rank's
    mark in the launcher's private directory is what names it (the netns cluster test's flake)."""
    from hwtui.engine.cluster import torchrun

    class RendezvousConnectionError(Exception):
        pass

    monkeypatch.delenv(torchrun.FAILED_DIR_ENV, raising=False)
    torchrun.mark_rank_failed()  # not under the launcher: nothing to mark, no error
    monkeypatch.setenv(torchrun.FAILED_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    assert not torchrun._any_marked(str(tmp_path))
    torchrun.mark_rank_failed()
    assert torchrun._any_marked(str(tmp_path)) and [p.name.split("-")[:2] for p in tmp_path.iterdir()] == [["rank", "1"]]
    exc = RendezvousConnectionError("The connection to the C10d store has failed.")
    assert torchrun.ending(exc, rank_failed=True) == "hwtui: torchrun: a rank on this node failed; its output above says why"
    assert "rendezvous or launch failed" in torchrun.ending(exc)
