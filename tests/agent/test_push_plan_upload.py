"""A push's plan travels as a streamed upload (POST /v1/push/plan?digest=D), not inside a JSON body:
a plan larger than the JSON request limit goes through, end to end, and the upload route keeps its
own bounds (token, size, digest)."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

pytest.importorskip("torch")

from hwtui.app.cli import main  # noqa: E402
from hwtui.app.node_api import server  # noqa: E402
from hwtui.app.node_api.push_routes import make_routes  # noqa: E402
from hwtui.engine.replication.plan import load_plan  # noqa: E402
from hwtui.engine.resident import resident as resident_mod  # noqa: E402
from hwtui.engine.resident.resident import ResidentRank  # noqa: E402
from tests.agent.helpers import TOKEN, start_agent, stop_agent  # noqa: E402
from tests.engine.replication.helpers import assert_bytes_equal, make_model, write_plan  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def agent(tmp_path):
    node = ResidentRank(node="solo", out=tmp_path / "solo", advertise="127.0.0.1")
    srv = start_agent("solo", post_routes=make_routes(node), replication=node.state)
    yield srv, node
    stop_agent(srv)
    node.close()


def test_the_upload_route_is_not_bound_by_the_json_body_limit_but_by_its_own(agent):
    srv, node = agent
    url = f"http://127.0.0.1:{srv.port}/v1/push/plan"
    big = b"\x00" * (server.MAX_BODY + (1 << 20))  # above the old limit of the plan in a JSON body
    r = httpx.post(url, params={"digest": "ab" * 16}, content=big, headers=AUTH, timeout=60)
    # Streamed to disk in full, then refused on what it is (not a plan), never on its size.
    assert r.status_code == 400 and "refused" in r.json()["error"]
    assert list((node.out / "pushes").iterdir()) == []
    r = httpx.post(url, params={"digest": "ab" * 16}, content=b"x", timeout=10)
    assert r.status_code == 401  # no token, nothing read
    # Refused on its Content-Length, before a byte of it is read (none is ever sent here).
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(f"POST /v1/push/plan?digest={'ab' * 16} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                     f"Content-Length: {resident_mod.MAX_PLAN_BYTES + 1}\r\n\r\n".encode())
        assert sock.recv(4096).split(b" ")[1] == b"413"


def test_a_plan_larger_than_a_json_request_is_pushed_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("HWTUI_AGENT_TOKEN", TOKEN)
    expected = make_model(tmp_path / "m", seed=5, big=4000, n=6)
    write_plan(tmp_path / "m", tmp_path / "p.plan", version="v1", bucket_kib=4)
    size = (tmp_path / "p.plan").stat().st_size
    # Every JSON request of the push (prepare, start, wait) is far smaller than the plan: with the
    # JSON limit below the plan's size, the old way (base64 inside /v1/push/start) would be a 413.
    monkeypatch.setattr(server, "MAX_BODY", size // 2)
    nodes = [ResidentRank(node=f"n{i}", out=tmp_path / f"n{i}", advertise="127.0.0.1") for i in range(2)]
    servers = [start_agent(f"n{i}", post_routes=make_routes(n), replication=n.state) for i, n in enumerate(nodes)]
    try:
        agents = ",".join(f"127.0.0.1:{s.port}" for s in servers)
        rc = main(["push", "--plan", str(tmp_path / "p.plan"), "--agents", agents, "--json", "--timeout", "20",
                   "--init-timeout", "60", "--deadline", "200"])
        doc = json.loads(capsys.readouterr().out)
        assert rc == 0 and doc["ok"], doc
        assert [n["outcome"] for n in doc["nodes"]] == ["committed", "committed"]
    finally:
        for s in servers:
            stop_agent(s)
        for n in nodes:
            n.close()
    from safetensors.torch import load_file

    current = json.loads((tmp_path / "n1" / "served" / "CURRENT").read_text())
    assert current["version"] == "v1" and current["plan_digest"] == load_plan(tmp_path / "p.plan").digest
    assert_bytes_equal(load_file(str(tmp_path / "n1" / "served" / current["file"])), expected)
