"""The node agent's resident ranks are forked by its fork server (core.forkserver), not exec'd:
each exec'd one imported torch again (1.2 CPU-s here, and a cold push waited for it). Real agents
on loopback, real pushes; the agent killed with SIGKILL takes its server and its rank with it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.agent.procs import Agents, push  # noqa: E402
from tests.engine.replication.helpers import assert_bytes_equal, make_model, write_plan  # noqa: E402
from tests.procfs import alive, ppid, wait_gone  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]


def _two_agents(tmp_path: Path) -> tuple[Agents, dict]:
    """Two agents on loopback (node0 the source) and a small version to push: (world, its tensors)."""
    expected = make_model(tmp_path / "v1", seed=3, big=60_000, n=6)
    write_plan(tmp_path / "v1", tmp_path / "v1.plan", version="v1", bucket_kib=64)
    (tmp_path / "agents").mkdir()
    world = Agents(tmp_path / "agents", 2)
    try:
        world.start(0)
        world.start(1)
    except BaseException:
        world.close()
        raise
    return world, expected


def _push_lands(world: Agents, plan: Path, expected: dict) -> None:
    from safetensors.torch import load_file

    done = push(plan, world.agents())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    root = world.served(1)
    meta = json.loads((root / "CURRENT").read_text())
    assert_bytes_equal(load_file(str(root / meta["file"])), expected)


def test_a_resident_rank_is_forked_by_the_agents_server_and_dies_with_the_agent(tmp_path: Path) -> None:
    world, expected = _two_agents(tmp_path)
    try:
        _push_lands(world, tmp_path / "v1.plan", expected)
        agent = world.procs[1].pid
        rank = world.replication(1)["resident"]["pid"]
        server = ppid(rank)
        # Forked: the rank's parent is the agent's fork server, whose parent is the agent; a fork
        # keeps the image it was forked from (the agent's command line), an exec'd rank has its own.
        assert server != agent and ppid(server) == agent
        assert _cmdline(rank) == _cmdline(agent) and "resident_child" not in " ".join(_cmdline(rank))
        world.kill(1)
        wait_gone([server, rank], "the fork server or the resident rank outlived its agent")
    finally:
        world.close()


def test_an_agent_whose_fork_server_is_gone_execs_its_rank_and_still_serves(tmp_path: Path) -> None:
    """The server killed under a running agent: the next push's rank is exec'd, and the push lands."""
    world, expected = _two_agents(tmp_path)
    try:
        agent = world.procs[1].pid
        servers = [int(p) for p in os.listdir("/proc") if p.isdigit() and alive(int(p)) and ppid(int(p)) == agent]
        assert len(servers) == 1, servers  # the agent's one child before any push: its fork server
        os.kill(servers[0], signal.SIGKILL)
        _push_lands(world, tmp_path / "v1.plan", expected)
        rank = world.replication(1)["resident"]["pid"]
        assert ppid(rank) == agent and "resident_child" in " ".join(_cmdline(rank))  # exec'd
    finally:
        world.close()
