"""The agent's HTTP server: versioned JSON under /v1, Prometheus text at /metrics.

Rules every request meets before any handler runs:

* **Who may ask.** A GET from a loopback address needs nothing (a local dashboard or node
  exporter); every other request -- any request from another host, and every POST from anywhere --
  needs ``Authorization: Bearer <token>``; without it the answer is 401 and nothing else happens.
* **Bounded.** Each connection has a socket timeout (a client that stops sending is dropped, TLS
  handshakes included, which run in the connection's thread, never in the accept loop); a POST
  body needs a Content-Length no larger than ``MAX_BODY`` and is refused with 413 before a byte of
  it is read; bodies are JSON parsed with a depth guard, never pickled.
* **Never blocked by a probe.** Handlers only read the refreshers' last good values
  (``NodeState``), so an answer costs microseconds whatever the probes do.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hwtui.app.agent.token import matches
from hwtui.core.redact import redact
from hwtui.engine.agent import metrics
from hwtui.engine.agent.sources import merge_facts
from hwtui.engine.agent.state import NodeState

SCHEMA = "hwtui.agent/1"
MAX_BODY = 32 << 20  # a push's plan for a large model is a few MB of JSON
REQUEST_TIMEOUT_S = 15.0  # per socket operation
BODY_DEADLINE_S = 60.0  # for a whole body: a client trickling a byte every 14 s is cut off
MAX_CONNECTIONS = 256  # open at once (a thread each); more are closed at once, never queued

UPLOAD_MIN_RATE = 4 << 20  # bytes/s a streamed upload must keep up on average (its deadline grows with its size)

PostHandler = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


class StreamRoute:
    """A POST route whose body is not JSON but raw bytes streamed to ``fn(query, length, read)``.

    It has its own size bound (``max_bytes``, checked against Content-Length before a byte is
    read) instead of ``MAX_BODY``: a push's plan can be far larger than any JSON request, and is
    written to disk as it arrives, never held in memory. ``read(n)`` returns up to n bytes and
    raises ``BadRequest`` when the body ends early or falls behind its deadline.
    """

    def __init__(self, fn: Callable[[dict[str, str], int, Callable[[int], bytes]], tuple[int, dict[str, Any]]],
                 max_bytes: int):
        self.fn = fn
        self.max_bytes = max_bytes


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def parse_json_body(raw: bytes | bytearray) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadRequest(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    return body


class AgentServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: NodeState, token: str, *,
                 tls: ssl.SSLContext | None = None, post_routes: dict[str, PostHandler | StreamRoute] | None = None):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, AgentHandler)
        self.state = state
        self.token = token
        self.post_routes = dict(post_routes or {})
        self.tls = tls
        self.requests = 0
        self.refused = 0
        self._count_lock = threading.Lock()
        self._open: set[Any] = set()
        if tls is not None:
            # Handshakes happen in each connection's thread (AgentHandler.setup), never in accept().
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-answer is routine; anything else is one line, never a traceback."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, ssl.SSLError)):
            return
        print(f"hwtui agent: request from {client_address[0]} failed: {type(exc).__name__}: {exc}", file=sys.stderr)

    def get_request(self) -> tuple[Any, Any]:
        conn, addr = super().get_request()
        with self._count_lock:
            self._open.add(conn)
        return conn, addr

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._count_lock:
            return len(self._open) <= MAX_CONNECTIONS

    def shutdown_request(self, request: Any) -> None:
        with self._count_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        """Close the listener and every keep-alive connection: a stopped agent answers nothing."""
        super().server_close()
        with self._count_lock:
            conns, self._open = list(self._open), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def count(self, refused: bool) -> None:
        with self._count_lock:
            self.requests += 1
            self.refused += int(refused)

    # ------------------------------------------------------------------ answers

    def node_doc(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "node": self.state.node, "hostname": socket.gethostname(),
                "started": self.state.started, "uptime_s": round(time.time() - self.state.started, 3),
                "tls": self.tls is not None}

    def get_json(self, path: str) -> dict[str, Any] | None:
        st = self.state
        if path == "/v1/node":
            return self.node_doc()
        if path == "/v1/devices":
            return {"schema": SCHEMA, "node": st.node, **_rename(st.samples.view(), "devices")}
        if path == "/v1/findings":
            view = st.check.view()
            value = view.pop("value") or {}
            return {"schema": SCHEMA, "node": st.node, "findings": value.get("findings", []),
                    "summary": value.get("summary"), "worst": value.get("worst"), **view}
        if path == "/v1/processes":
            return {"schema": SCHEMA, "node": st.node, **_rename(st.processes.view(), "processes")}
        if path == "/v1/replication":
            return {"schema": SCHEMA, "node": st.node, **st.replication()}
        if path == "/v1/facts":
            view = _rename(st.facts.view(), "facts")
            view["facts"] = merge_facts(view["facts"], st.check.view()["value"])
            return {"schema": SCHEMA, "node": st.node, **view}
        if path == "/v1/summary":
            # What a cluster view needs in one round trip per node per tick.
            samples, check = st.samples.view(), st.check.view()
            return {"schema": SCHEMA, **self.node_doc(), "devices": samples["value"] or [],
                    "devices_age_s": samples["age_s"], "devices_error": samples["error"],
                    "worst": (check["value"] or {}).get("worst"), "check_age_s": check["age_s"],
                    "replication": st.replication()}
        return None

    def metrics_text(self) -> str:
        st = self.state
        return metrics.render(st.node, st.samples.view(), st.check.view(), st.replication(), st.processes.view())


def _rename(view: dict[str, Any], key: str) -> dict[str, Any]:
    out = dict(view)
    out[key] = out.pop("value")
    return out


class AgentHandler(BaseHTTPRequestHandler):
    server: AgentServer
    protocol_version = "HTTP/1.1"  # keep-alive: a poller reuses one connection per node
    # TCP_NODELAY: an answer is written as headers, then body. With Nagle on a kept-alive
    # connection the body waits for the client's delayed ACK of the headers (40 ms on Linux), which
    # every push paid on each long poll's last answer.
    disable_nagle_algorithm = True
    timeout = REQUEST_TIMEOUT_S
    server_version = "hwtui-agent"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            try:
                self.connection.do_handshake()
            except (OSError, ssl.SSLError):
                self.close_connection = True
                raise

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request would drown a journal at a 1 s poll of 64 nodes

    # ------------------------------------------------------------------ plumbing

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="hwtui-agent"')
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(redact(doc), separators=(",", ":"), default=str, allow_nan=False).encode()
        self._send(status, body, "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"schema": SCHEMA, "error": message})

    def _authorized(self) -> bool:
        if self.command in ("GET", "HEAD") and is_loopback(self.client_address[0]):
            return True
        return matches(self.server.token, self.headers.get("Authorization"))

    def _length(self, limit: int) -> int:
        raw_len = self.headers.get("Content-Length")
        if raw_len is None or not raw_len.strip().isdigit() or len(raw_len) > 12:
            raise BadRequest(411, "a POST needs a Content-Length")
        length = int(raw_len)
        if length > limit:
            raise BadRequest(413, f"the body is {length} bytes; at most {limit} are accepted")
        return length

    def _stream(self, route: StreamRoute) -> tuple[int, dict[str, Any]]:
        length = self._length(route.max_bytes)
        deadline = time.monotonic() + BODY_DEADLINE_S + length / UPLOAD_MIN_RATE
        got = 0

        def read(n: int) -> bytes:
            nonlocal got
            if time.monotonic() > deadline:
                raise BadRequest(408, "the body did not arrive in time")
            chunk = self.rfile.read1(max(1, min(n, 1 << 20, length - got)))
            if not chunk:
                raise BadRequest(400, "the body ended early")
            got += len(chunk)
            return chunk

        try:
            query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query, max_num_fields=16).items()}
        except ValueError:
            raise BadRequest(400, "too many query fields") from None
        status, doc = route.fn(query, length, read)
        if got < length:  # refused before the whole body was read: it must not be taken for a request
            self.close_connection = True
        return status, doc

    def _body(self) -> dict[str, Any]:
        length = self._length(MAX_BODY)
        data = bytearray()
        deadline = time.monotonic() + BODY_DEADLINE_S
        while len(data) < length:
            if time.monotonic() > deadline:
                raise BadRequest(408, f"the body did not arrive within {BODY_DEADLINE_S:g} s")
            chunk = self.rfile.read1(min(1 << 20, length - len(data)))
            if not chunk:
                raise BadRequest(400, "the body ended early")
            data += chunk
        return parse_json_body(data)

    # ------------------------------------------------------------------ verbs

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urlsplit(self.path).path.rstrip("/") or "/"
        if not self._authorized():
            self.server.count(refused=True)
            self.close_connection = True
            return self._error(401, "a bearer token is required (Authorization: Bearer <token>)")
        self.server.count(refused=False)
        if path == "/metrics":
            return self._send(200, self.server.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8")
        doc = self.server.get_json(path)
        if doc is None:
            return self._error(404, f"no such resource {path!r}; see /v1/node, /v1/devices, /v1/findings, "
                                    "/v1/processes, /v1/replication, /v1/facts, /v1/summary, /metrics")
        self._json(200, doc)

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path.rstrip("/")
        if not self._authorized():
            self.server.count(refused=True)
            self.close_connection = True  # the unread body must not be taken for the next request
            return self._error(401, "a bearer token is required (Authorization: Bearer <token>)")
        self.server.count(refused=False)
        handler = self.server.post_routes.get(path)
        if handler is None:
            self.close_connection = True
            return self._error(404, f"no such action {path!r}")
        try:
            if isinstance(handler, StreamRoute):
                status, doc = self._stream(handler)
            else:
                status, doc = handler(self._body())
        except BadRequest as exc:
            self.close_connection = True
            return self._error(exc.status, str(exc))
        self._json(status, doc)


def serve_in_thread(server: AgentServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="agent-http", daemon=True)
    thread.start()
    return thread
