"""`hwtui cluster init` output files and bad input (exit 2, one line, nothing written)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hwtui.app.cli import main
from hwtui.engine.cluster import spec as specmod

NODES = "a=10.77.0.1,b=10.77.0.2,c=10.77.0.3"


def _init(tmp_path: Path, *extra: str) -> tuple[int, Path]:
    out = tmp_path / "cl"
    return main(["cluster", "init", "--nodes", NODES, "-o", str(out), *extra]), out


def _sourced(env_file: Path, *names: str) -> dict[str, str]:
    """What a POSIX shell really gets from the env file (quoting and expansion included)."""
    script = f'. "{env_file}"; ' + "; ".join(f'printf "%s\\0" "${{{n}-<unset>}}"' for n in names)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10,
                         env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}, check=True).stdout
    return dict(zip(names, out.split("\0")[:-1], strict=True))


def _exec_argv(script: Path) -> list[str]:
    line = next(ln for ln in script.read_text().splitlines() if ln.startswith("exec "))
    return shlex.split(line[len("exec "):].replace('"$HERE/cluster.json"', "SPEC").replace('"$@"', ""))


def test_env_files_per_node(tmp_path):
    rc, out = _init(tmp_path, "--interface", "eth0", "--node-interface", "c=ens5", "--ib-hca", "mlx5_0,mlx5_1",
                    "--net-plugin", "/opt/mesh plugin/libnccl-net.so", "--master-port", "29511", "--env", "NCCL_DEBUG=WARN")
    assert rc == 0
    names = ("HWTUI_CLUSTER_NODE", "MASTER_ADDR", "MASTER_PORT", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
             "NCCL_IB_HCA", "NCCL_NET_PLUGIN", "LD_LIBRARY_PATH", "NODE_RANK", "NCCL_DEBUG")
    a = _sourced(out / "env" / "a.env", *names)
    assert a == {"HWTUI_CLUSTER_NODE": "a", "MASTER_ADDR": "10.77.0.1", "MASTER_PORT": "29511",
                 "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5_0,mlx5_1",
                 "NCCL_NET_PLUGIN": "/opt/mesh plugin/libnccl-net.so",
                 "LD_LIBRARY_PATH": "/opt/mesh plugin:/usr/local/cuda/lib64", "NODE_RANK": "0", "NCCL_DEBUG": "WARN"}
    c = _sourced(out / "env" / "c.env", *names)
    assert c["NCCL_SOCKET_IFNAME"] == "ens5" and c["GLOO_SOCKET_IFNAME"] == "ens5" and c["NODE_RANK"] == "2"
    assert c["MASTER_ADDR"] == "10.77.0.1"


def test_no_interface_means_no_ifname_variables(tmp_path):
    rc, out = _init(tmp_path)
    assert rc == 0
    env = _sourced(out / "env" / "b.env", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_NET_PLUGIN", "LD_LIBRARY_PATH")
    assert env == {"NCCL_SOCKET_IFNAME": "<unset>", "GLOO_SOCKET_IFNAME": "<unset>", "NCCL_NET_PLUGIN": "<unset>",
                   "LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}


def test_torchrun_launch_commands(tmp_path, capsys):
    rc, out = _init(tmp_path, "--devices-per-node", "8", "--python", "/venv/bin/python", "--join-timeout", "45")
    assert rc == 0
    printed = capsys.readouterr().out
    for n in "abc":
        assert f"{n}: sh {out.resolve() / f'launch-{n}.sh'}" in printed
    argv = _exec_argv(out / "launch-b.sh")
    assert argv[:3] == ["/venv/bin/python", "-m", "hwtui.engine.cluster.torchrun"]  # torchrun, ending in one line
    opts = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    assert opts["--nnodes"] == "1:3" and opts["--nproc-per-node"] == "8"
    assert opts["--rdzv-backend"] == "c10d" and opts["--rdzv-endpoint"] == "10.77.0.1:29500"
    assert opts["--local-addr"] == "10.77.0.2" and opts["--max-restarts"] == "0"
    assert "last_call_timeout=45" in opts["--rdzv-conf"] and "is_host=false" in opts["--rdzv-conf"]
    assert "is_host=true" in dict(a.split("=", 1) for a in _exec_argv(out / "launch-a.sh") if "=" in a)["--rdzv-conf"]
    assert argv[-6:] == ["-m", "hwtui.app", "cluster", "test", "--spec", "SPEC"]
    # Same rendezvous id on every node, or the nodes never meet.
    ids = {dict(a.split("=", 1) for a in _exec_argv(out / f"launch-{n}.sh") if "=" in a)["--rdzv-id"] for n in "abc"}
    assert len(ids) == 1
    assert (out / "launch-a.sh").stat().st_mode & 0o111
    assert subprocess.run(["sh", "-n", str(out / "launch-a.sh")], timeout=10).returncode == 0


def test_slurm_batch_script(tmp_path, capsys):
    rc, out = _init(tmp_path, "--launcher", "slurm", "--devices-per-node", "4")
    assert rc == 0
    assert f"slurm: sbatch {out.resolve() / 'submit.sbatch'}" in capsys.readouterr().out
    text = (out / "submit.sbatch").read_text()
    directives = dict(re.findall(r"^#SBATCH (--[\w-]+)=(\S+)$", text, re.M))
    assert directives["--nodes"] == "3" and directives["--ntasks-per-node"] == "4"
    assert directives["--nodelist"] == "a,b,c" and directives["--gpus-per-node"] == "4"
    assert f"export HWTUI_CLUSTER_DIR={out.resolve()}" in text
    assert re.search(r'^srun .*sh "\$HWTUI_CLUSTER_DIR/slurm-task.sh"', text, re.M)
    task = (out / "slurm-task.sh").read_text()
    assert '. "$ENV_FILE"' in task and "${SLURMD_NODENAME" in task and "-m hwtui.app cluster test" in task
    for script in ("submit.sbatch", "slurm-task.sh"):
        assert subprocess.run(["bash", "-n", str(out / script)], timeout=10).returncode == 0


def test_gloo_cluster_asks_slurm_for_no_gpus(tmp_path):
    rc, out = _init(tmp_path, "--backend", "gloo")
    assert rc == 0 and "--gpus-per-node" not in (out / "submit.sbatch").read_text()


def test_mpirun_command(tmp_path):
    rc, out = _init(tmp_path, "--launcher", "mpirun", "--devices-per-node", "2", "--interface", "ib0")
    assert rc == 0
    argv = _exec_argv(out / "launch-mpirun.sh")
    assert argv[:3] == ["mpirun", "-np", "6"]
    assert argv[argv.index("--host") + 1] == "10.77.0.1:2,10.77.0.2:2,10.77.0.3:2"
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert {"MASTER_ADDR", "MASTER_PORT", "NCCL_SOCKET_IFNAME"} <= set(exported)
    assert "HWTUI_CLUSTER_NODE" not in exported  # per node: ranks match their host instead
    assert ["--mca", "btl_tcp_if_include", "ib0"] == argv[argv.index("btl_tcp_if_include") - 1:][:3]


def test_spec_round_trips_and_json_output(tmp_path, capsys):
    rc, out = _init(tmp_path, "--json", "--min-busbw", "10", "--net-plugin", "/opt/p/libnccl-net.so")
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    spec = specmod.load(out / "cluster.json")
    assert printed["spec"] == spec.to_dict()
    assert [n.addr for n in spec.nodes] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    assert spec.min_busbw == 10 and spec.world_size == 3
    assert set(printed["commands"]) == {"a", "b", "c"}
    assert sorted(printed["files"]) == sorted(p.relative_to(out).as_posix() for p in out.rglob("*")
                                              if p.is_file() and not p.name.startswith("."))


def test_existing_description_needs_force_and_stale_files_go(tmp_path, capsys):
    rc, out = _init(tmp_path)
    assert rc == 0 and (out / "env" / "c.env").exists()
    before = (out / "cluster.json").read_text()
    assert main(["cluster", "init", "--nodes", "a,b", "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert (out / "cluster.json").read_text() == before
    assert main(["cluster", "init", "--nodes", "a,b", "-o", str(out), "--force"]) == 0
    assert not (out / "env" / "c.env").exists() and not (out / "launch-c.sh").exists()
    assert [n.name for n in specmod.load(out / "cluster.json").nodes] == ["a", "b"]


@pytest.mark.parametrize("args,message", [
    (["--nodes", "a,a"], "node 'a' is listed twice"),
    (["--nodes", "a=10.0.0.1,b=10.0.0.1"], "address '10.0.0.1' is given to more than one node"),
    (["--nodes", "bad_host!"], "neither a host name nor an IP address"),
    (["--nodes", "a=10.0.0.256"], "neither a host name nor an IP address"),
    (["--nodes", "a=1.2.3"], "neither a host name nor an IP address"),
    (["--nodes", ","], "no nodes given"),
    (["--nodes", "a,b", "--master-port", "70000"], "not a TCP port"),
    (["--nodes", "a,b", "--devices-per-node", "0"], "devices per node"),
    (["--nodes", "a,b", "--interface", "eth0 eth1"], "not an interface name"),
    (["--nodes", "a,b", "--net-plugin", "lib/libnccl-net.so"], "must be absolute"),
    (["--nodes", "a,b", "--node-interface", "z=eth0"], "not in --nodes"),
    (["--nodes", "a,b", "--env", "NOEQUALS"], "must look like NAME=VALUE"),
    (["--nodes", "a,b", "--env", "1BAD=x"], "not an environment variable name"),
    (["--nodes", "a,b", "--join-timeout", "0"], "join timeout"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "cl"
    assert main(["cluster", "init", *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("hwtui: error: ") and err.count("\n") == 1
    assert not out.exists()


def test_argparse_rejects_unknown_launcher(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["cluster", "init", "--nodes", "a", "--launcher", "pdsh", "-o", str(tmp_path / "x")])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_cluster_without_action_is_a_usage_error(capsys):
    assert main(["cluster"]) == 2
    assert "hwtui cluster init" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--ops", "all_to_all"], "--ops takes a comma list"),
    (["--min-bytes", "4M", "--max-bytes", "1M"], "bad sweep"),
    (["--max-bytes", "lots"], "is not a size"),
    (["--iters", "0"], "--iters"),
    (["--json", "--events", "-"], "both want stdout"),
    (["--spec", "/nonexistent/cluster.json"], "no such file"),
    (["--min-busbw", "-1"], "--min-busbw"),
])
def test_cluster_test_bad_input(capsys, args, message):
    assert main(["cluster", "test", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cluster_test_rejects_a_file_that_is_not_a_description(tmp_path, capsys):
    bogus = tmp_path / "c.json"
    bogus.write_text(json.dumps({"schema": "hwtui.snapshot/1"}))
    assert main(["cluster", "test", "--spec", str(bogus)]) == 2
    assert "not a cluster description" in capsys.readouterr().err
    bogus.write_text("{")
    assert main(["cluster", "test", "--spec", str(bogus)]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_env_files_export_world_size_for_launch_training_scripts(tmp_path):
    """Seed 003's launch_training.sh reads WORLD_SIZE, NODE_RANK and NPROC_PER_NODE: all three are exported."""
    rc, out = _init(tmp_path, "--devices-per-node", "4")
    assert rc == 0
    for rank, node in enumerate("abc"):
        env = _sourced(out / "env" / f"{node}.env", "WORLD_SIZE", "NNODES", "NODE_RANK", "NPROC_PER_NODE")
        assert env == {"WORLD_SIZE": "12", "NNODES": "3", "NODE_RANK": str(rank), "NPROC_PER_NODE": "4"}


def test_tpu_launcher_dry_run(tmp_path, capsys):
    """--launcher tpu: the TPU runtime's launcher (gcloud ... tpu-vm ssh --worker=all), not torchrun;
    each worker picks its node by its worker number and runs one rank (dry run: the commands)."""
    rc, out = _init(tmp_path, "--launcher", "tpu", "--tpu-name", "pod-v4-32", "--zone", "us-central2-b",
                    "--project", "my-proj", "--interface", "ens8", "--python", "/opt/venv/bin/python")
    assert rc == 0
    assert f"tpu: sh {out.resolve() / 'launch-tpu.sh'}" in capsys.readouterr().out
    env = {"PATH": "/usr/bin:/bin", "HWTUI_DRY_RUN": "1"}
    launch = subprocess.run(["sh", str(out / "launch-tpu.sh")], capture_output=True, text=True, env=env, timeout=30,
                            check=True)
    assert shlex.split(launch.stdout) == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod-v4-32", "--zone=us-central2-b",
                                          "--project=my-proj", "--worker=all",
                                          f"--command=sh {out.resolve() / 'tpu-task.sh'}"]
    assert "torch.distributed.run" not in (out / "launch-tpu.sh").read_text() + (out / "tpu-task.sh").read_text()
    for worker, node in enumerate("abc"):
        task = subprocess.run(["sh", str(out / "tpu-task.sh")], capture_output=True, text=True, timeout=30, check=True,
                              env={**env, "TPU_WORKER_ID": str(worker)})
        words = shlex.split(task.stdout)
        assert words[:6] == [f"node {node}:".split()[0], f"{node}:", f"RANK={worker}", "WORLD_SIZE=3",
                             "MASTER_ADDR=10.77.0.1", "MASTER_PORT=29500"]
        assert words[6:] == ["/opt/venv/bin/python", "-m", "hwtui.app", "cluster", "test", "--spec",
                             f"{out.resolve()}/cluster.json"]
    bad = subprocess.run(["sh", str(out / "tpu-task.sh")], capture_output=True, text=True, timeout=30,
                         env={**env, "TPU_WORKER_ID": "3"})
    assert bad.returncode == 2 and bad.stderr.strip() == "hwtui: TPU worker 3 has no node in cluster.json (3 listed: a b c)"
    spec = specmod.load(out / "cluster.json")
    assert (spec.launcher, spec.tpu_name, spec.tpu_zone, spec.tpu_project) == ("tpu", "pod-v4-32", "us-central2-b", "my-proj")


@pytest.mark.parametrize("args, message", [
    (["--launcher", "tpu"], "--launcher tpu needs --tpu-name NAME and --zone ZONE"),
    (["--launcher", "tpu", "--tpu-name", "p", "--zone", "z", "--devices-per-node", "4"], "one process per TPU VM worker"),
    (["--launcher", "tpu", "--tpu-name", "Pod;rm", "--zone", "z"], "is not a Google Cloud name"),
])
def test_tpu_launcher_bad_input(tmp_path, capsys, args, message):
    rc, out = _init(tmp_path, *args)
    assert rc == 2 and not out.exists()
    [line] = capsys.readouterr().err.strip().splitlines()
    assert message in line
