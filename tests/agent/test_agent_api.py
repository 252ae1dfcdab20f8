"""The agent's HTTP API in-process (real server, real sockets, httpx), plus one real `hwtui agent`."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time

import httpx
import pytest

from hwtui.app.node_api import token as tokens
from hwtui.app.node_api.server import MAX_BODY, AgentServer, is_loopback, serve_in_thread
from hwtui.engine.resident.state import NodeState
from tests import cli_proc

TOKEN = "t0k3n-for-tests"


def _samples():
    return [{"device": "hip:0", "name": "Radeon \"7800\"\nXT", "mem_used": 1 << 30, "mem_total": 16 << 30,
             "util": 42.0, "temp_c": 55.0, "power_w": 120.5, "power_limit_w": 260.0}]


@pytest.fixture
def agent():
    release = threading.Event()
    calls = {"check": 0}

    def slow_check():
        calls["check"] += 1
        if calls["check"] == 1:
            return {"worst": "warn", "findings": [{"id": "env.x", "status": "warn", "title": "x"}],
                    "summary": {"warn": 1, "pass": 0}, "drivers": {}, "os": "Linux", "kernel": "6"}
        release.wait(30)  # the second run hangs: requests must still answer at once
        return {}

    state = NodeState(node="n1", sample=_samples, check=slow_check, facts=lambda: {"torch": {"version": "2"}},
                      processes=lambda: [{"pid": 7, "name": "python", "devices": ["/dev/kfd"]}],
                      replication=lambda: {"serving": "v1", "in_flight": None, "pushes": {"committed": 2}},
                      check_period=0.05, sample_period=0.05)
    server = AgentServer(("127.0.0.1", 0), state, TOKEN,
                         post_routes={"/v1/echo": lambda body: (200, {"got": body})})
    state.start()
    serve_in_thread(server)
    try:
        yield server, calls
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        state.stop()


def _wait_for(pred, what: str, limit: float = 10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"never saw {what}")


def test_loopback_reads_need_no_token_and_answer_while_a_probe_hangs(agent):
    server, calls = agent
    base = f"http://127.0.0.1:{server.port}"
    with httpx.Client(base_url=base, timeout=5) as c:
        _wait_for(lambda: calls["check"] >= 2, "the second (hanging) check")
        t = time.monotonic()
        doc = c.get("/v1/findings").json()
        assert time.monotonic() - t < 1.0
        assert doc["worst"] == "warn" and doc["findings"][0]["id"] == "env.x"
        assert doc["age_s"] is not None and doc["age_s"] >= 0
        devices = c.get("/v1/devices").json()
        assert devices["devices"][0]["device"] == "hip:0" and devices["error"] is None
        assert c.get("/v1/processes").json()["processes"][0]["pid"] == 7
        assert c.get("/v1/replication").json()["serving"] == "v1"
        summary = c.get("/v1/summary").json()
        assert summary["node"] == "n1" and summary["replication"]["serving"] == "v1"
        assert c.get("/v1/nope").status_code == 404


def test_metrics_are_prometheus_text_with_escaped_labels(agent):
    server, _ = agent
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text
    assert '# TYPE hwtui_device_utilization_percent gauge' in text
    line = next(ln for ln in text.splitlines() if ln.startswith("hwtui_device_utilization_percent{"))
    assert line == 'hwtui_device_utilization_percent{node="n1",device="hip:0",name="Radeon \\"7800\\"\\nXT"} 42.0'
    assert 'hwtui_replication_serving_info{node="n1",version="v1"} 1' in text
    assert 'hwtui_replication_pushes_total{node="n1",outcome="committed"} 2' in text
    # every non-comment line is NAME{labels} VALUE
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            name, _, value = ln.rpartition(" ")
            float(value)
            assert name.endswith("}")


def test_post_needs_the_token_even_from_loopback(agent):
    server, _ = agent
    base = f"http://127.0.0.1:{server.port}"
    refused = httpx.post(f"{base}/v1/echo", json={"a": 1}, timeout=5)
    assert refused.status_code == 401 and "bearer" in refused.json()["error"]
    wrong = httpx.post(f"{base}/v1/echo", json={"a": 1}, headers={"Authorization": "Bearer nope"}, timeout=5)
    assert wrong.status_code == 401
    ok = httpx.post(f"{base}/v1/echo", json={"a": 1}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert ok.status_code == 200 and ok.json() == {"got": {"a": 1}}


def test_bodies_are_bounded_and_must_be_json_objects(agent):
    server, _ = agent
    auth = {"Authorization": f"Bearer {TOKEN}"}
    # Announce a huge body and send none of it: refused from the header alone, at once.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall((f"POST /v1/echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                   f"Content-Length: {MAX_BODY + 1}\r\n\r\n").encode())
        head = s.recv(4096).decode()
    assert head.startswith("HTTP/1.1 413")
    base = f"http://127.0.0.1:{server.port}"
    assert httpx.post(f"{base}/v1/echo", content=b"[1]", headers=auth, timeout=5).status_code == 400
    assert httpx.post(f"{base}/v1/echo", content=b"[" * 100000, headers=auth, timeout=5).status_code == 400
    assert httpx.post(f"{base}/v1/echo", content=b"\xff\xfe", headers=auth, timeout=5).status_code == 400


def test_answers_go_out_without_waiting_for_a_delayed_ack(agent):
    # An answer is written as headers, then body. With Nagle on a kept-alive connection the body
    # waits for the client's delayed ACK of the headers (40 ms on Linux): every long poll of a push
    # paid it. The server's connections set TCP_NODELAY.
    server, _ = agent
    with httpx.Client() as client:
        assert client.get(f"http://127.0.0.1:{server.port}/v1/node", timeout=5).json()["node"] == "n1"
        conns = server.admission.connections()
        assert conns, "the kept-alive connection is open on the server"
        assert all(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for c in conns)


def test_a_silent_client_does_not_hold_the_server(agent):
    server, _ = agent
    with socket.create_connection(("127.0.0.1", server.port), timeout=5):
        # This connection never sends a byte; others are served meanwhile (a thread per connection).
        assert httpx.get(f"http://127.0.0.1:{server.port}/v1/node", timeout=5).json()["node"] == "n1"


def _non_loopback_address() -> str | None:
    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_reads_from_another_address_need_the_token():
    addr = _non_loopback_address()
    if addr is None:
        pytest.skip("no non-loopback IPv4 address on this machine (the netns test covers it)")
    state = NodeState(node="n", sample=_samples, check=dict, facts=dict, processes=list)
    server = AgentServer(("0.0.0.0", 0), state, TOKEN)  # noqa: S104 - the test needs a non-loopback peer
    serve_in_thread(server)
    try:
        url = f"http://{addr}:{server.port}/v1/devices"
        assert httpx.get(url, timeout=5).status_code == 401
        assert httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).status_code == 200
    finally:
        server.shutdown()
        server.server_close()


def test_loopback_addresses():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.0.0.1") and not is_loopback("::ffff:10.0.0.1") and not is_loopback("garbage")


def test_token_file_is_created_0600_and_a_readable_one_is_refused(tmp_path):
    path = tmp_path / "sub" / "agent.token"
    tok, created = tokens.load_or_create(path)
    assert created and len(tok) >= 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tokens.load_or_create(path) == (tok, False)
    path.chmod(0o644)
    with pytest.raises(tokens.HwtuiError, match="chmod 600"):
        tokens.read_token_file(path)
    assert tokens.matches(tok, f"Bearer {tok}") and not tokens.matches(tok, f"Bearer {tok}x")
    assert not tokens.matches(tok, None) and not tokens.matches(tok, tok)


def test_the_agent_process_serves_a_recorded_machine_and_stops_on_sigterm(tmp_path):
    from tests.machines import rtx4090_rx7800xt_arc_a750

    root = tmp_path / "root"
    rtx4090_rx7800xt_arc_a750(root)
    token_file = tmp_path / "tok"
    env = {**os.environ, "HWTUI_AGENT_TOKEN": ""}
    proc = cli_proc.Popen([sys.executable, "-m", "hwtui.app", "agent", "--sysroot", str(root), "--listen", "127.0.0.1:0",
                           "--token-file", str(token_file), "--node", "rec", "--interval", "0.2"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, proc.stderr.read() if proc.poll() is not None else line
        port = int(line.rsplit(":", 1)[1])
        base = f"http://127.0.0.1:{port}"
        devices = _wait_for(lambda: httpx.get(f"{base}/v1/devices", timeout=5).json()["devices"], "samples")
        assert {d["device"] for d in devices} >= {"cpu"} and len(devices) >= 2
        findings = _wait_for(lambda: httpx.get(f"{base}/v1/findings", timeout=5).json()["findings"], "findings")
        assert all({"id", "status"} <= set(f) for f in findings)
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        secret = token_file.read_text().strip()
        assert secret not in json.dumps(httpx.get(f"{base}/v1/summary", timeout=5).json())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_bad_listen_address_is_one_line_exit_2():
    done = cli_proc.run([sys.executable, "-m", "hwtui.app", "agent", "--listen", "nowhere"], capture_output=True,
                        text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--listen" in done.stderr


def _self_signed(tmp_path):
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=30)
    return cert, key


def test_tls_serves_https_and_a_stalled_handshake_blocks_no_one(tmp_path):
    from hwtui.app.commands.agent import _tls

    cert, key = _self_signed(tmp_path)
    state = NodeState(node="tls", sample=_samples, check=dict, facts=dict, processes=list)
    server = AgentServer(("127.0.0.1", 0), state, TOKEN, tls=_tls(str(cert), str(key)))
    serve_in_thread(server)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            # Connected, never says hello: the handshake waits in this connection's thread only.
            doc = httpx.get(f"https://127.0.0.1:{server.port}/v1/node", verify=ssl.create_default_context(cafile=str(cert)),
                            timeout=5).json()
        assert doc["node"] == "tls" and doc["tls"] is True
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{server.port}/v1/node", timeout=5)  # plain HTTP to the TLS port
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"https://127.0.0.1:{server.port}/v1/node", timeout=5)  # an unknown CA is not trusted
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(Exception, match="--cert and --key go together"):
        _tls(str(cert), None)
