"""A plan upload into a full disk is answered (507, "no space left on <path>") and the pusher says so;
it never reads as an unreachable agent (the connection used to drop without a reply)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hwtui.app.cli import main
from hwtui.app.node_api.push_routes import make_routes
from hwtui.engine.resident.resident import ResidentRank
from tests.agent.helpers import TOKEN, start_agent, stop_agent
from tests.agent.procs import small_tmpfs

pytestmark = [pytest.mark.timeout(120)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of its own (root only), unmounted whatever the test did."""
    yield from small_tmpfs(tmp_path, "1m")


def _fill(disk: Path) -> None:
    """Fill ``disk`` to the last byte (bounded: a 1 MiB tmpfs takes at most 16 writes of 64 KiB)."""
    # The close flushes what the failed write left buffered, and fails the same way: suppressed too
    # (it depended on how many bytes the agent's own files took, its lock file among them).
    with contextlib.suppress(OSError), open(disk / "filler", "wb") as fh:
        for _ in range(64):
            try:
                fh.write(b"\xff" * (64 << 10))
                fh.flush()
            except OSError:
                break
    with contextlib.suppress(OSError), open(disk / "filler2", "wb", buffering=0) as fh:
        for _ in range(4096):
            fh.write(b"\xff" * 256)


@pytest.fixture
def full_agent(small_disk: Path) -> Iterator[tuple[str, ResidentRank]]:
    node = ResidentRank(node="full", out=small_disk / "out", advertise="127.0.0.1")
    srv = start_agent("full", post_routes=make_routes(node), replication=node.state)
    _fill(small_disk)
    try:
        yield f"127.0.0.1:{srv.port}", node
    finally:
        stop_agent(srv)
        node.close()


def test_an_upload_into_a_full_disk_is_answered_507_and_leaves_nothing(full_agent):
    where, node = full_agent
    r = httpx.post(f"http://{where}/v1/push/plan", params={"digest": "ab" * 16}, content=b"\0" * (2 << 20),
                   headers=AUTH, timeout=60)
    assert r.status_code == 507, r.text
    assert "no space left on" in r.json()["error"] and str(node.out / "pushes") in r.json()["error"]
    assert list((node.out / "pushes").iterdir()) == []
    # The connection stays usable for the next request (the body was read to its end).
    assert httpx.get(f"http://{where}/v1/node", timeout=10).status_code == 200


def test_the_pusher_prints_the_full_disk_not_unreachable(full_agent, tmp_path, monkeypatch, capsys):
    pytest.importorskip("xxhash")
    pytest.importorskip("torch")
    from tests.engine.replication.helpers import make_model, write_plan

    where, _ = full_agent
    make_model(tmp_path / "m", seed=1, big=40_000, n=40)
    write_plan(tmp_path / "m", tmp_path / "p.plan", version="v1", bucket_kib=4)
    assert (tmp_path / "p.plan").stat().st_size > 4096  # more than the few bytes the fill may leave
    source = ResidentRank(node="src", out=tmp_path / "src", advertise="127.0.0.1")
    srv = start_agent("src", post_routes=make_routes(source), replication=source.state)
    monkeypatch.setenv("HWTUI_AGENT_TOKEN", TOKEN)
    try:
        rc = main(["push", "--plan", str(tmp_path / "p.plan"), "--agents", f"127.0.0.1:{srv.port},{where}"])
    finally:
        stop_agent(srv)
        source.close()
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "no space left on" in err and "unreachable" not in err and err.count("\n") == 1, err
