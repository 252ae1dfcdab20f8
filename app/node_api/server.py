"""The agent's HTTP server: versioned JSON under /v1, Prometheus text at /metrics.

Rules every request meets before any handler runs:

* **Who may ask.** A GET from a loopback address needs nothing (a local dashboard or node
  exporter); every other request -- any request from another host, and every POST from anywhere --
  needs ``Authorization: Bearer <token>``; without it the answer is 401 and nothing else happens.
* **Bounded.** A request head must arrive whole within ``HEAD_DEADLINE_S`` (counted from the
  accept, TLS handshake included, or on a kept-alive connection from its first byte) and a body
  within its own deadline; a client that stops sending, or sends a byte now and then, is dropped.
  TLS handshakes run in the connection's thread, never in the accept loop. A POST body needs a
  Content-Length no larger than ``MAX_BODY`` and is refused with 413 before a byte of it is read;
  bodies are JSON parsed with a depth guard, never pickled. A malformed head is a 4xx
  (``http_head``), never a silent drop or a 5xx.
* **Room for clients with the token.** Connections that have not shown the token are capped on
  their own and the oldest is cut when a new one arrives (``admission``): hundreds of slow
  connections cannot turn away the pusher.
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
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from hwtui.app.node_api.admission import Admission, cut
from hwtui.app.node_api.http_head import BadRequest, ClientGone, RequestHead, parse_head, read_head
from hwtui.app.node_api.token import matches
from hwtui.core.redact import redact
from hwtui.engine.resident import metrics
from hwtui.engine.resident.sources import merge_facts
from hwtui.engine.resident.state import NodeState

SCHEMA = "hwtui.agent/1"
MAX_BODY = 32 << 20  # a push's plan for a large model is a few MB of JSON
REQUEST_TIMEOUT_S = 15.0  # one write, and the wait for a kept-alive connection's next request
HEAD_DEADLINE_S = 10.0  # for a whole request head: a client trickling a byte every few seconds is cut off
BODY_DEADLINE_S = 60.0  # for a whole body
MAX_PENDING = 128  # connections that have not shown the token (a thread each); the oldest is cut for a new one
MAX_TRUSTED = 256  # connections that have; more are answered, then closed
MAX_ANON_BUSY = 4  # requests without the token handled at once; the others wait (then 429)
ANON_WRITE_S = 5.0  # bounds the writes of an answer to a request without the token

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


class PeerRoute:
    """A JSON POST route that also needs to know who connected: ``fn(body, peer, local)``, the two
    socket addresses (``app/node_api/peer.py`` finds the asking process's user from them)."""

    def __init__(self, fn: Callable[[dict[str, Any], tuple[Any, ...], tuple[Any, ...]], tuple[int, dict[str, Any]]]):
        self.fn = fn


@dataclass(frozen=True)
class Limits:
    """The time and connection bounds of one server (tests shorten them)."""

    head_deadline_s: float = HEAD_DEADLINE_S
    body_deadline_s: float = BODY_DEADLINE_S
    idle_s: float = REQUEST_TIMEOUT_S
    max_pending: int = MAX_PENDING
    max_trusted: int = MAX_TRUSTED
    max_anon_busy: int = MAX_ANON_BUSY


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
    # Connections are accepted at once and bounded by Admission; a short listen queue would only
    # drop the SYNs of a client arriving during a burst (a 1 s retransmit each).
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], state: NodeState, token: str, *,
                 tls: ssl.SSLContext | None = None, post_routes: dict[str, PostHandler | StreamRoute | PeerRoute] | None = None,
                 limits: Limits | None = None):
        # Set before the base class binds: a failed bind calls server_close(), which uses them.
        self.limits = limits or Limits()
        self.admission = Admission(self.limits.max_pending, self.limits.max_trusted)
        # Requests without the token (loopback GETs, and the 401s) are served a few at a time: a
        # flood of them (pipelined /metrics on 128 connections) would otherwise keep every core and
        # the GIL busy, and the request with the token would wait behind them. It never waits here.
        self.anon_slots = threading.BoundedSemaphore(self.limits.max_anon_busy)
        self._count_lock = threading.Lock()
        self.requests = 0
        self.refused = 0
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, AgentHandler)
        self.state = state
        self.token = token
        self.post_routes = dict(post_routes or {})
        self.tls = tls
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

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.admission.admit(request)  # never refuses: it cuts the oldest connection without the token
        return True

    def shutdown_request(self, request: Any) -> None:
        self.admission.release(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        """Close the listener and every keep-alive connection: a stopped agent answers nothing."""
        super().server_close()
        for conn in self.admission.close_all():
            cut(conn)  # its own thread wakes, sees the end and closes it

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
    head: RequestHead

    def setup(self) -> None:
        # The first head's deadline counts from the accept, so a connection that never completes
        # a TLS handshake or a head holds its thread no longer than any slow head does.
        self._deadline = time.monotonic() + self.server.limits.head_deadline_s
        self._served = False
        self.command, self.path, self.requestline, self.request_version = "", "", "", "HTTP/1.1"
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.settimeout(max(0.01, self._deadline - time.monotonic()))
            try:
                self.connection.do_handshake()
            except (OSError, ssl.SSLError):
                self.close_connection = True
                raise

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request would drown a journal at a 1 s poll of 64 nodes

    # ------------------------------------------------------------------ one request

    def handle_one_request(self) -> None:
        """Read one head under its deadline, refuse it (4xx) or serve it; replaces http.server's
        parser, which answers some malformed heads with nothing (``Content-Length: ²``), takes
        HTTP/0.9, ignores Transfer-Encoding and waits per read, not per head."""
        self.close_connection = True
        limits = self.server.limits
        try:
            if self._served:  # kept alive: wait for the next request; its head's deadline starts with it
                self.connection.settimeout(limits.idle_s)
                if not self.rfile.peek(1):  # type: ignore[attr-defined]
                    return
                self._deadline = time.monotonic() + limits.head_deadline_s
            lines = read_head(self.rfile, self.connection, self._deadline, limits.idle_s)
            self.head = parse_head(lines)
        except (ClientGone, OSError, ValueError):
            return  # closed, reset, cut by admission, or idle too long: nobody to answer
        except BadRequest as exc:
            return self._refuse(exc)
        head = self.head
        self._served = True
        self.command, self.path, self.request_version = head.method, head.target, head.version
        self.requestline = f"{head.method} {head.target} {head.version}"
        self.headers = head  # type: ignore[assignment] # .get(name) is all the handlers use
        self.close_connection = not head.keep_alive
        self.connection.settimeout(REQUEST_TIMEOUT_S)  # bounds the answer's writes
        slots = None
        if matches(self.server.token, head.get("Authorization")):
            if not self.server.admission.promote(self.connection):
                self.close_connection = True  # the trusted pool is full (or this one was cut): answer, then close
        else:
            slots = self.server.anon_slots
            if not slots.acquire(timeout=limits.head_deadline_s):
                return self._refuse(BadRequest(429, "too many requests without the token at once; retry later"))
            self.connection.settimeout(ANON_WRITE_S)  # a client that does not read holds its slot no longer
        try:
            self._dispatch(head)
        finally:
            if slots is not None:
                slots.release()

    def _dispatch(self, head: RequestHead) -> None:
        if head.method in ("GET", "HEAD"):
            if head.content_length or head.expect_continue:
                return self._refuse(BadRequest(400, f"a {head.method} carries no body"))
            self.do_GET()
        elif head.method == "POST":
            self.do_POST()
        else:
            return self._refuse(BadRequest(405, f"method {head.method} is not served (GET, HEAD, POST)"))
        self.wfile.flush()

    def _refuse(self, exc: BadRequest) -> None:
        """Answer a refused request and close, draining a little of what the client still sends
        first: closing with unread bytes makes the kernel send a reset, which can destroy the
        answer before the client reads it."""
        self.close_connection = True
        conn = self.connection
        try:
            conn.settimeout(2.0)  # a client that does not read its answer holds nothing
            self._error(exc.status, str(exc))
            self.wfile.flush()
            if isinstance(conn, ssl.SSLSocket):
                return
            conn.shutdown(socket.SHUT_WR)
            drained, until = 0, time.monotonic() + 1.0
            while drained < (256 << 10) and time.monotonic() < until:
                conn.settimeout(max(0.01, until - time.monotonic()))
                chunk = conn.recv(65536)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass

    # ------------------------------------------------------------------ plumbing

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="hwtui-agent"')
        if status == 405:
            self.send_header("Allow", "GET, HEAD, POST")
        if self.close_connection:
            self.send_header("Connection", "close")
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
        return matches(self.server.token, self.head.get("Authorization"))

    def _length(self, limit: int) -> int:
        length = self.head.content_length
        if length is None:
            raise BadRequest(411, "a POST needs a Content-Length")
        if length > limit:
            raise BadRequest(413, f"the body is {length} bytes; at most {limit} are accepted")
        if self.head.expect_continue:
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return length

    def _read_some(self, n: int, deadline: float) -> bytes:
        """Up to n bytes of the body, waiting no later than ``deadline`` (one recv at most)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BadRequest(408, "the body did not arrive in time")
        self.connection.settimeout(min(remaining, REQUEST_TIMEOUT_S))
        try:
            chunk = self.rfile.read1(n)
        except TimeoutError:
            raise BadRequest(408, "the body did not arrive in time") from None
        finally:
            self.connection.settimeout(REQUEST_TIMEOUT_S)
        if not chunk:
            raise BadRequest(400, "the body ended early")
        return chunk

    def _stream(self, route: StreamRoute) -> tuple[int, dict[str, Any]]:
        length = self._length(route.max_bytes)
        deadline = time.monotonic() + self.server.limits.body_deadline_s + length / UPLOAD_MIN_RATE
        got = 0

        def read(n: int) -> bytes:
            nonlocal got
            chunk = self._read_some(max(1, min(n, 1 << 20, length - got)), deadline)
            got += len(chunk)
            return chunk

        try:
            query = {k: v[-1] for k, v in parse_qs(self.head.query, max_num_fields=16).items()}
        except ValueError:
            raise BadRequest(400, "too many query fields") from None
        status, doc = route.fn(query, length, read)
        if got < length:  # refused before the whole body was read: it must not be taken for a request
            self.close_connection = True
        return status, doc

    def _body(self) -> dict[str, Any]:
        length = self._length(MAX_BODY)
        data = bytearray()
        deadline = time.monotonic() + self.server.limits.body_deadline_s
        while len(data) < length:
            data += self._read_some(min(1 << 20, length - len(data)), deadline)
        return parse_json_body(data)

    # ------------------------------------------------------------------ verbs

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.head.path.rstrip("/") or "/"
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
        path = self.head.path.rstrip("/")
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
            elif isinstance(handler, PeerRoute):
                status, doc = handler.fn(self._body(), tuple(self.client_address), tuple(self.connection.getsockname()))
            else:
                status, doc = handler(self._body())
        except BadRequest as exc:
            return self._refuse(exc)
        self._json(status, doc)


def serve_in_thread(server: AgentServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="agent-http", daemon=True)
    thread.start()
    return thread
