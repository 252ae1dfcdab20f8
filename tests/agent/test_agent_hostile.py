"""The agent's HTTP server under attack (issue 22 F2, F9): slow clients, malformed heads.

Every request here goes to a real AgentServer over loopback through raw sockets, so a reply the
server should give and does not is seen as such (no client library in between fixes anything up).
Waits are on state (an answer, the end of the connection, a counter), each bounded.
"""

from __future__ import annotations

import re
import select
import socket
import time

import httpx
import pytest

from hwtui.app.node_api.server import Limits, StreamRoute
from tests.agent.helpers import TOKEN, answered, start_agent, stop_agent

AUTH = f"Authorization: Bearer {TOKEN}\r\n"


def _routes() -> dict:
    def upload(query, length, read):
        got = 0
        while got < length:
            got += len(read(length - got))
        return 200, {"bytes": got}

    return {"/v1/echo": lambda body: (200, {"got": body}), "/v1/upload": StreamRoute(upload, 1 << 20)}


@pytest.fixture
def agent(request):
    limits = getattr(request, "param", None) or Limits()
    server = start_agent("n1", post_routes=_routes(), limits=limits)
    try:
        yield server
    finally:
        stop_agent(server)


def _wait_for(pred, what: str, limit: float = 30.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"never saw {what}")


def read_all(sock: socket.socket, limit: float = 20.0) -> bytes:
    """Everything the server sends until it closes (bounded: `limit` s in all)."""
    out = bytearray()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not chunk:
            return bytes(out)
        out += chunk
    raise AssertionError(f"the server did not close the connection within {limit} s; got {bytes(out[:200])!r}")


def status_of(reply: bytes) -> int:
    line = reply.split(b"\r\n", 1)[0]
    assert line.startswith(b"HTTP/1.1 ") and line[9:12].isdigit(), reply[:200]
    return int(line[9:12])


def exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        return read_all(s)


def authed_get(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/v1/node", headers={"Authorization": f"Bearer {TOKEN}"},
                     timeout=30).status_code


# ---------------------------------------------------------------------- F2: slow connections


@pytest.mark.parametrize("agent", [Limits(head_deadline_s=600.0)], indirect=True)
def test_300_slow_unauthenticated_connections_leave_room_for_a_client_with_the_token(agent):
    # 300 connections, each stopped in the middle of its head (the issue's slow loris sent one byte
    # every 8 s; 262 of them locked every client out). The head deadline is set far beyond the
    # test so that only admission can make room: the authenticated request must be answered while
    # every slow connection the server kept is still open.
    port = agent.port
    slow = []
    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /v1/node HTTP/1.1\r\nX-Slow: ")
            slow.append(s)
        cap = agent.limits.max_pending
        _wait_for(lambda: agent.admission.evicted == 300 - cap, "the oldest slow connections cut")
        assert agent.admission.counts() == (cap, 0)

        assert authed_get(port) == 200

        # Answered during the attack: the server still holds cap - 1 slow connections (one more
        # was cut to admit the client, whose own connection httpx closed since), and those are the
        # newest ones, still open on our side.
        assert agent.admission.evicted == 300 - cap + 1
        assert agent.admission.counts()[0] == cap - 1
        readable, _, _ = select.select(slow[-(cap - 1):], [], [], 0)
        assert readable == [], "a kept slow connection was closed"
        # The cut ones were closed by the server (EOF), none answered.
        for s in slow[:300 - cap]:
            assert read_all(s, limit=10) == b""
    finally:
        for s in slow:
            s.close()


@pytest.mark.parametrize("agent", [Limits(head_deadline_s=0.5, max_anon_busy=1)], indirect=True)
def test_requests_without_the_token_never_hold_up_one_with_it(agent):
    # Every slot for token-less requests busy (as under a flood of pipelined loopback GETs): a
    # request with the token is served at once, one without waits for a slot, then gets 429.
    assert agent.anon_slots.acquire(timeout=10)
    try:
        assert answered(lambda: authed_get(agent.port)) == 200
        assert status_of(answered(lambda: exchange(agent.port, b"GET /v1/node HTTP/1.1\r\nHost: x\r\n\r\n"))) == 429
    finally:
        agent.anon_slots.release()
    assert status_of(answered(lambda: exchange(agent.port, b"GET /v1/node HTTP/1.1\r\nConnection: close\r\n\r\n"))) == 200


@pytest.mark.parametrize("agent", [Limits(head_deadline_s=1.0)], indirect=True)
def test_a_head_trickled_byte_by_byte_is_cut_at_its_deadline(agent):
    # One byte every 50 ms never trips a per-read timeout; the head's deadline (1 s here) does.
    head = b"GET /v1/node HTTP/1.1\r\n" + b"X-Trickle: " + b"a" * 4000
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s:
        sent = 0
        for byte in head:
            if select.select([s], [], [], 0)[0]:
                break  # the server answered or closed: stop trickling
            try:
                s.send(bytes([byte]))
            except OSError:
                break
            sent += 1
            time.sleep(0.05)
        assert sent < len(head), "the server waited for the whole trickled head (4000 bytes at 20 B/s)"
        reply = read_all(s)
    assert reply == b"" or status_of(reply) == 408


@pytest.mark.parametrize("agent", [Limits(body_deadline_s=1.0)], indirect=True)
@pytest.mark.parametrize("path", ["/v1/echo", "/v1/upload"])
def test_a_body_trickled_byte_by_byte_is_cut_at_its_deadline(agent, path):
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Length: 4000\r\n\r\n{{\"a\": \"".encode())
        sent = 0
        while sent < 4000 and not select.select([s], [], [], 0)[0]:
            try:
                s.send(b"a")
            except OSError:
                break
            sent += 1
            time.sleep(0.05)
        assert sent < 3990, "the server waited for the whole trickled body"
        assert status_of(read_all(s)) == 408


@pytest.mark.parametrize("agent", [Limits(idle_s=0.5)], indirect=True)
def test_a_kept_alive_connection_that_stops_sending_is_closed(agent):
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s:
        s.sendall(b"GET /v1/node HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = read_all(s)  # returns only when the server closes the idle connection
    assert status_of(reply) == 200


def test_a_silent_new_connection_is_closed_at_the_head_deadline():
    server = start_agent("n1", limits=Limits(head_deadline_s=0.5))
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            reply = read_all(s)
        assert reply == b"" or status_of(reply) == 408
        assert answered(lambda: authed_get(server.port)) == 200
    finally:
        stop_agent(server)


# ---------------------------------------------------------------------- F9: malformed heads

_POST = f"POST /v1/echo HTTP/1.1\r\nHost: x\r\n{AUTH}"
_GET = "GET /v1/node HTTP/1.1\r\nHost: x\r\n"

MALFORMED = {
    # Content-Length: the issue's superscript two passes str.isdigit() and then fails int().
    "superscript length": (_POST + "Content-Length: \u00b2\r\n\r\n{}").encode("latin-1"),
    "superscript length, UTF-8": (_POST + "Content-Length: \u00b2\r\n\r\n{}").encode(),
    "arabic-indic digits": (_POST + "Content-Length: \u0662\r\n\r\n{}").encode(),
    "negative length": (_POST + "Content-Length: -1\r\n\r\n{}").encode(),
    "plus-signed length": (_POST + "Content-Length: +2\r\n\r\n{}").encode(),
    "huge length": (_POST + "Content-Length: " + "9" * 40 + "\r\n\r\n{}").encode(),
    "two lengths": (_POST + "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}").encode(),
    "comma lengths": (_POST + "Content-Length: 2, 2\r\n\r\n{}").encode(),
    "hex length": (_POST + "Content-Length: 0x2\r\n\r\n{}").encode(),
    "chunked": (_POST + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n").encode(),
    "chunked and length": (_POST + "Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}").encode(),
    "junk transfer-encoding": (_POST + "Transfer-Encoding: xyz\r\nContent-Length: 2\r\n\r\n{}").encode(),
    "header without colon": (_GET + "NoColonHere\r\n\r\n").encode(),
    "space before colon": (_GET + "X-A : b\r\n\r\n").encode(),
    "empty header name": (_GET + ": b\r\n\r\n").encode(),
    "folded header": (_GET + "X-A: b\r\n  folded\r\n\r\n").encode(),
    "overlong request line": ("GET /" + "a" * 20000 + " HTTP/1.1\r\n\r\n").encode(),
    "overlong header line": (_GET + "X-A: " + "a" * 20000 + "\r\n\r\n").encode(),
    "head too large": (_GET + "".join(f"X-{i}: {'a' * 4000}\r\n" for i in range(20)) + "\r\n").encode(),
    "too many headers": (_GET + "".join(f"X-{i}: a\r\n" for i in range(200)) + "\r\n").encode(),
    "NUL in a value": (_GET + "X-A: a\x00b\r\n\r\n").encode(),
    "NUL in a name": (_GET + "X-\x00A: b\r\n\r\n").encode(),
    "NUL in the target": b"GET /v1/no\x00de HTTP/1.1\r\n\r\n",
    "bare CR": (_GET + "X-A: a\rb\r\n\r\n").encode(),
    "escape in a value": (_GET + "X-A: \x1b[2J\r\n\r\n").encode(),
    "non-ASCII value": (_GET + "X-A: caf\u00e9\r\n\r\n").encode(),
    "non-ASCII name": (_GET + "X-\u00e9: a\r\n\r\n").encode(),
    "latin-1 byte": _GET.encode() + b"X-A: \xff\r\n\r\n",
    "non-ASCII target": "GET /v1/n\u00f6de HTTP/1.1\r\n\r\n".encode(),
    "HTTP/0.9": b"GET /v1/node\r\n\r\n",
    "HTTP/0.9 bare": b"GET /v1/node\n\n",
    "HTTP/2.0": b"GET /v1/node HTTP/2.0\r\n\r\n",
    "HTTP/1.2": b"GET /v1/node HTTP/1.2\r\n\r\n",
    "no version digits": b"GET /v1/node HTTP/1\r\n\r\n",
    "lower-case version": b"GET /v1/node http/1.1\r\n\r\n",
    "absolute URI": b"GET http://127.0.0.1/v1/node HTTP/1.1\r\n\r\n",
    "asterisk": b"OPTIONS * HTTP/1.1\r\n\r\n",
    "authority form": b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n",
    "two spaces": b"GET  /v1/node HTTP/1.1\r\n\r\n",
    "tab separated": b"GET\t/v1/node\tHTTP/1.1\r\n\r\n",
    "bad method token": b"G(T /v1/node HTTP/1.1\r\n\r\n",
    "unknown method": b"PUT /v1/node HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    "DELETE": (f"DELETE /v1/node HTTP/1.1\r\n{AUTH}\r\n").encode(),
    "TRACE": b"TRACE /v1/node HTTP/1.1\r\n\r\n",
    "GET with a body": (_GET + "Content-Length: 5\r\n\r\nGET /").encode(),
    "odd expectation": (_POST + "Expect: the-unexpected\r\nContent-Length: 2\r\n\r\n{}").encode(),
    "two authorizations": (_POST + AUTH + "Content-Length: 2\r\n\r\n{}").encode(),
    "ends early": b"GET /v1/node HTTP/1.1\r\nHost: x\r\n",
}


@pytest.mark.parametrize("raw", list(MALFORMED.values()), ids=list(MALFORMED))
def test_every_malformed_head_gets_a_4xx_and_the_agent_stays_healthy(agent, raw):
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)  # "ends early" must be answered too, not dropped
        reply = read_all(s)
    assert reply, "no reply at all"
    assert 400 <= status_of(reply) < 500, reply[:300]
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"\r\ncontent-length: %d\r\n" % len(body) in head.lower() + b"\r\n"
    assert authed_get(agent.port) == 200


def test_a_405_names_the_methods_served(agent):
    reply = exchange(agent.port, b"PATCH /v1/node HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(reply) == 405 and b"\r\nAllow: GET, HEAD, POST\r\n" in reply


def test_well_formed_edge_cases_are_served(agent):
    auth = AUTH.encode()
    # Bare LF line ends, blank lines before the request line, HTTP/1.0, a query, a trailing slash.
    assert status_of(exchange(agent.port, b"\r\n\r\nGET /v1/node?x=1 HTTP/1.0\nHost: x\n\n")) == 200
    assert status_of(exchange(agent.port, b"GET /v1/node/ HTTP/1.1\r\nConnection: close\r\n\r\n")) == 200
    # Expect: 100-continue gets its interim answer, then the real one.
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s:
        s.sendall(b"POST /v1/echo HTTP/1.1\r\nHost: x\r\n" + auth + b"Expect: 100-continue\r\nContent-Length: 8\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b'{"a": 1}')
        s.shutdown(socket.SHUT_WR)
        reply = read_all(s)
    assert status_of(reply) == 200 and reply.endswith(b'{"got":{"a":1}}')
    # Pipelined requests on one connection are answered in order.
    reply = exchange(agent.port, b"GET /v1/node HTTP/1.1\r\n\r\nHEAD /v1/node HTTP/1.1\r\n\r\n"
                                 b"GET /v1/nope HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert re.findall(rb"HTTP/1\.1 ([0-9]{3}) ", reply) == [b"200", b"200", b"404"]
    # A streamed upload (the plan route's kind) with its exact length.
    body = b"x" * 70000
    reply = exchange(agent.port, b"POST /v1/upload HTTP/1.1\r\n" + auth
                     + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert status_of(reply) == 200 and reply.endswith(b'{"bytes":70000}')
