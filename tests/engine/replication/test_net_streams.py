"""The network group's TCP streams: the setting, the interface list gloo is given, bad input in one line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication import net_streams as ns
from tests import cli_proc

HERE = {"lo", "eth0"}


def test_the_stream_count_defaults_to_two_and_takes_one_to_eight():
    assert ns.requested_streams({}) == ns.requested_streams({ns.STREAMS_ENV: " "}) == 2
    assert [ns.requested_streams({ns.STREAMS_ENV: str(n)}) for n in (1, 3, 8)] == [1, 3, 8]
    for bad in ("0", "9", "-1", "2.5", "two", "1e1"):
        with pytest.raises(HwtuiError, match=r"HWTUI_NET_STREAMS=.*whole number 1 to 8"):
            ns.requested_streams({ns.STREAMS_ENV: bad})


def test_one_interface_becomes_n_devices_and_a_written_list_is_kept():
    env = {ns.IFNAME_ENV: "eth0"}
    assert ns.network_ifnames(env, gloo=True, present=HERE) == ["eth0", "eth0"]
    assert ns.network_ifnames({**env, ns.STREAMS_ENV: "3"}, gloo=True, present=HERE) == ["eth0"] * 3
    assert ns.device_count({**env, ns.STREAMS_ENV: "3"}, gloo=True, present=HERE) == 3
    # One stream, another backend, the default device, or the user's own list: the group is made as the world is.
    assert ns.network_ifnames({**env, ns.STREAMS_ENV: "1"}, gloo=True, present=HERE) is None
    assert ns.network_ifnames(env, gloo=False, present=HERE) is None and ns.device_count(env, gloo=False) == 1
    assert ns.network_ifnames({}, gloo=True, present=HERE) is None and ns.device_count({}, gloo=True, present=HERE) == 1
    listed = {ns.IFNAME_ENV: "eth0,lo"}
    assert ns.network_ifnames(listed, gloo=True, present=HERE) is None
    assert ns.device_count(listed, gloo=True, present=HERE) == 2
    # torch ignores a value of one character: so does this.
    assert ns.interfaces({ns.IFNAME_ENV: "x"}, present=HERE) == []


@pytest.mark.parametrize(("value", "says"), [
    ("eth0,,eth0", "an empty or padded interface name"),
    (",eth0", "an empty or padded interface name"),
    ("eth0, lo", "an empty or padded interface name"),
    ("eth0,nosuch9", "this host has no interface 'nosuch9' (it has eth0, lo)"),
])
def test_a_bad_interface_list_is_refused_in_one_line(value, says):
    with pytest.raises(HwtuiError) as err:
        ns.device_count({ns.IFNAME_ENV: value}, gloo=True, present=HERE)
    assert says in str(err.value) and "\n" not in str(err.value) and value in str(err.value)


@pytest.mark.parametrize("before", [None, "lo"])
def test_the_list_is_in_the_environment_only_while_the_group_is_made(monkeypatch, before):
    if before is None:
        monkeypatch.delenv(ns.IFNAME_ENV, raising=False)
    else:
        monkeypatch.setenv(ns.IFNAME_ENV, before)
    with ns.gloo_interfaces(["eth0", "eth0"]):
        assert os.environ[ns.IFNAME_ENV] == "eth0,eth0"
    assert os.environ.get(ns.IFNAME_ENV) == before
    with pytest.raises(RuntimeError), ns.gloo_interfaces(["lo", "lo"]):
        raise RuntimeError("new_group failed")
    assert os.environ.get(ns.IFNAME_ENV) == before
    with ns.gloo_interfaces(None):
        assert os.environ.get(ns.IFNAME_ENV) == before


def _cli_plan(tmp_path: Path, numel: int) -> tuple[list[str], dict[str, str]]:
    """A one-tensor plan in ``tmp_path`` (16 KiB buckets); the `hwtui replicate --nproc 2` argv for it
    and an environment without a test fault or a torchrun world."""
    import torch
    from safetensors.torch import save_file

    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

    save_file({"w": torch.arange(numel, dtype=torch.float32)}, str(tmp_path / "m.safetensors"))
    write_json_atomic(tmp_path / "p.json", build_plan_from_files([str(tmp_path / "m.safetensors")], model="m",
                                                                 version="v1", bucket_bytes=16 << 10))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWTUI_TEST_FAULT", "MASTER_", "RANK", "WORLD_SIZE"))}
    return [sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(tmp_path / "p.json"), "--nproc", "2"], env


@pytest.mark.torch
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("var", "value", "says"), [
    ("GLOO_SOCKET_IFNAME", "lo,,lo", "GLOO_SOCKET_IFNAME='lo,,lo': an empty or padded interface name"),
    ("GLOO_SOCKET_IFNAME", "nosuch9", "GLOO_SOCKET_IFNAME='nosuch9': this host has no interface 'nosuch9'"),
    ("HWTUI_NET_STREAMS", "0", "HWTUI_NET_STREAMS='0': the network streams must be a whole number 1 to 8"),
])
def test_replicate_refuses_a_bad_interface_list_or_stream_count_in_one_line(tmp_path: Path, var, value, says):
    """Exit 2, one line naming the variable, no traceback, nothing committed (it was a gloo error
    after the rendezvous: 'forming the world failed (GlooDeviceFactory::makeTCPDevice(): ...)', exit 1)."""
    argv, env = _cli_plan(tmp_path, 20_000)
    env[var] = value
    proc = cli_proc.run([*argv, "--commit", "--out", str(tmp_path / "out")], capture_output=True, text=True,
                        timeout=100, env=env)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hwtui: error:")]
    assert len(errors) == 1 and says in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "out" / "rank1" / "CURRENT").exists()


def _world(rank: int, net_ranks: list[int], backend: str = "gloo"):
    """Just what RankWorld._net_streams reads of a rank; its log lines collected."""
    from types import SimpleNamespace

    logs: list[str] = []
    return SimpleNamespace(rank=rank, net_ranks=net_ranks, choice=SimpleNamespace(backend=backend),
                           emit=lambda ev: logs.append(ev.message)), logs


@pytest.mark.parametrize(("devices", "streams", "says"), [
    ({0: 2, 2: 2}, 2, "2 TCP streams per peer (HWTUI_NET_STREAMS)"),
    ({0: 2, 2: 1}, 1, "one TCP stream per peer (streams each network rank can open: rank 0 2, rank 2 1)"),
    ({0: 3, 2: 2}, 1, "one TCP stream per peer"),
    ({0: 2, 2: "2"}, 1, "one TCP stream per peer"),  # a record that is not a number: no guess
    ({0: 9, 2: 9}, 1, "one TCP stream per peer"),  # beyond the maximum
])
def test_the_network_group_gets_streams_only_where_every_network_rank_can_open_them(devices, streams, says):
    """The same answer on every rank from the records alone (a rank deciding otherwise would make
    a group whose connections never pair up), and rank 0 says which; ranks outside the group too."""
    from hwtui.engine.replication.world import RankWorld

    records = [{"net_devices": devices.get(r, 1)} for r in range(4)]
    answers = set()
    for rank in range(4):
        me, logs = _world(rank, [0, 2])
        answers.add(RankWorld._net_streams(me, records))  # type: ignore[arg-type]
        if rank == 0:
            assert len(logs) == 1 and logs[0].startswith(f"Network group (ranks 0, 2): {says}"), logs
        else:
            assert logs == []
    assert answers == {streams}
    me, logs = _world(0, [0, 2], backend="nccl")
    assert RankWorld._net_streams(me, [{"net_devices": 2}] * 4) == 1 and logs == []  # type: ignore[arg-type]


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_replicate_takes_the_stream_count_as_a_flag_that_wins_over_the_environment(tmp_path: Path) -> None:
    """--net-streams N (it was HWTUI_NET_STREAMS only): the network ranks run on N streams and say so;
    a count out of range is one line, exit 2, before any rank starts."""
    import json

    argv, env = _cli_plan(tmp_path, 40_000)
    env.update(GLOO_SOCKET_IFNAME="lo", HWTUI_NET_STREAMS="2")
    base = [*argv, "--no-same-host"]
    proc = cli_proc.run([*base, "--net-streams", "3", "--report", str(tmp_path / "r.json")], capture_output=True,
                        text=True, timeout=100, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["rank"]: r for r in json.loads((tmp_path / "r.json").read_text())["ranks"]}
    assert {r: rows[r]["net_streams"] for r in rows} == {0: 3, 1: 3}, rows
    assert "3 TCP streams per peer" in proc.stdout, proc.stdout
    bad = cli_proc.run([*base, "--net-streams", "9"], capture_output=True, text=True, timeout=100, env=env)
    errors = [line for line in bad.stderr.splitlines() if line.startswith("hwtui: error:")]
    assert bad.returncode == 2 and errors == ["hwtui: error: --net-streams 9: the network streams must be a whole "
                                              "number 1 to 8"], bad.stderr
