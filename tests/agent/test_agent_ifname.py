"""The agent pins its resident ranks' gloo/NCCL interface from --advertise/--listen, or refuses
with the fix (one line, exit 2) before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hwtui.app.node_api.ifname import IfnameError, derive, interface_holding
from tests import cli_proc

IFACES = {"lo": {"addresses": ["127.0.0.1", "::1"]}, "eth0": {"addresses": ["10.77.0.1", "fe80::1"]},
          "ib0": {"addresses": []}}


def test_the_interface_holding_the_advertised_address_is_used():
    env: dict[str, str] = {}
    assert derive("10.77.0.1", env, IFACES) == "eth0"
    assert env == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert interface_holding("[::1]", IFACES) == "lo" and interface_holding("fe80::1%eth0", IFACES) == "eth0"


def test_an_operators_choice_is_kept_and_nccl_follows_gloo():
    env = {"GLOO_SOCKET_IFNAME": "ib0"}
    assert derive("0.0.0.0", env, IFACES) == "ib0" and env["NCCL_SOCKET_IFNAME"] == "ib0"
    env = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth0,ib0"}
    assert derive("0.0.0.0", env, IFACES) is None and env["NCCL_SOCKET_IFNAME"] == "=eth0,ib0"
    env = {"NCCL_SOCKET_IFNAME": "^docker"}
    assert derive("10.77.0.1", env, IFACES) == "eth0" and env == {"NCCL_SOCKET_IFNAME": "^docker", "GLOO_SOCKET_IFNAME": "eth0"}


@pytest.mark.parametrize("host, words", [
    ("0.0.0.0", "pass --advertise ADDR"),
    ("::", "pass --advertise ADDR"),
    ("10.77.0.9", "is not an address of this node (it has: lo 127.0.0.1, ::1; eth0 10.77.0.1, fe80::1; ib0 -)"),
])
def test_no_usable_address_is_refused_naming_the_fix(host, words):
    with pytest.raises(IfnameError, match="GLOO_SOCKET_IFNAME") as err:
        derive(host, {}, IFACES)
    assert words in str(err.value)


def _agent(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    return cli_proc.run([sys.executable, "-m", "hwtui.app", "agent", "--token-file", str(tmp_path / "t"), "--out",
                         str(tmp_path / "served"), *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("args, words", [
    (["--listen", "0.0.0.0:0"], "--listen 0.0.0.0 serves every interface"),
    (["--listen", "127.0.0.1:0", "--advertise", "198.51.100.7"], "--advertise 198.51.100.7 is not an address of this node"),
])
def test_the_agent_refuses_in_one_line_before_starting(tmp_path, args, words):
    done = _agent(tmp_path, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert words in line and "GLOO_SOCKET_IFNAME" in line
    assert done.stdout == "" and not (tmp_path / "t").exists() and not (tmp_path / "served").exists()


@pytest.mark.torch
@pytest.mark.netns
@pytest.mark.timeout(200)
def test_a_push_across_hosts_works_without_gloo_socket_ifname(tmp_path):
    """Two hosts (network namespaces), agents started with --listen on their cluster address and
    no GLOO_SOCKET_IFNAME: the resident ranks bind eth0 and the push commits (before, gloo bound
    the host name's address and the push failed with "Gloo connectFullMesh ... Connection refused")."""
    from tests.engine.cluster.netns import NetnsCluster, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"cannot create network namespaces: {reason}")
    pytest.importorskip("torch")
    import json

    from hwtui.app.node_api.token import load_or_create
    from tests.engine.replication.helpers import assert_bytes_equal, make_model, write_plan

    expected = make_model(tmp_path / "m", seed=5, big=60_000, n=6)
    write_plan(tmp_path / "m", tmp_path / "p.json", version="v1", bucket_kib=64)
    token, _ = load_or_create(tmp_path / "agent.token")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HWTUI_", "MASTER_", "RANK", "WORLD_SIZE", "GLOO_", "NCCL_SOCKET"))}
    env["OMP_NUM_THREADS"] = "1"
    net = NetnsCluster(2).up()
    procs = []
    try:
        for i, addr in enumerate(net.addresses):
            p = net.popen(i, [sys.executable, "-m", "hwtui.app", "agent", "--listen", f"{addr}:9477", "--token-file",
                              str(tmp_path / "agent.token"), "--node", f"n{i}", "--out", str(tmp_path / f"n{i}"),
                              "--check-interval", "3600"], env=env)
            procs.append(p)
            line = p.stdout.readline()
            assert "listening on" in line, p.stderr.read() if p.poll() is not None else line
        push = cli_proc.run(cli_proc.in_netns(net.node_ns[0], [
            sys.executable, "-m", "hwtui.app", "push", "--plan", str(tmp_path / "p.json"), "--agents",
            ",".join(f"{a}:9477" for a in net.addresses), "--json", "--timeout", "20", "--init-timeout", "40",
            "--deadline", "120"]), capture_output=True, text=True, timeout=150, env={**env, "HWTUI_AGENT_TOKEN": token})
    finally:
        import signal

        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        errs = [p.communicate(timeout=30)[1] for p in procs]
        net.down()
    assert push.returncode == 0, push.stdout[-3000:] + push.stderr[-2000:]
    assert [n["outcome"] for n in json.loads(push.stdout)["nodes"]] == ["committed"] * 2
    assert all("resident ranks use interface eth0" in e for e in errs), errs
    from safetensors.torch import load_file

    meta = json.loads((tmp_path / "n1" / "served" / "CURRENT").read_text())
    assert meta["version"] == "v1"
    assert_bytes_equal(load_file(str(tmp_path / "n1" / "served" / meta["file"])), expected)
