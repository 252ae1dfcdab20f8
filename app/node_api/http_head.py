"""A request head off the wire, for a server that answers hosts it does not trust.

``read_head`` reads one HTTP/1.x request head under a deadline for the *whole* head (a client
that sends a byte every few seconds is cut off at the deadline, not kept forever by a per-read
timeout) and within size bounds; ``parse_head`` turns it into a ``RequestHead`` or refuses it.
Every fault is a ``BadRequest`` carrying a 4xx status and one line, so a malformed request is
answered, never dropped silently and never a 5xx: a line without a colon, a folded line, a control
or non-ASCII byte, a Content-Length that is not plain ASCII digits (``²`` passes ``str.isdigit``),
two Content-Lengths, any Transfer-Encoding (the agent reads a body by its Content-Length only, so
a chunked body could otherwise be read as the next request), HTTP/0.9 or any version but 1.0 and
1.1, and a target that is not a path (an absolute URI or ``*``: the agent is no proxy).
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any

MAX_LINE = 8192  # one line of the head, terminator excluded
MAX_HEAD = 32 << 10  # the whole head
MAX_HEADERS = 64

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token: methods and header names
_VERSION = re.compile(rb"HTTP/[0-9]\.[0-9]")
_BAD_IN_LINE = re.compile(rb"[^\x21-\x7e ]")  # the request line: visible ASCII and single spaces
_BAD_IN_VALUE = re.compile(rb"[^\t\x20-\x7e]")  # a header value: visible ASCII, space, tab
_DIGITS = re.compile(rb"[0-9]+")
_SINGLE = ("content-length", "transfer-encoding", "host", "authorization", "expect")


class BadRequest(Exception):
    """A request refused with ``status`` (4xx) and one line that says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ClientGone(Exception):
    """The client closed, reset or stalled before a request began: nothing to answer."""


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str  # as sent: path and query
    path: str
    query: str
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    fields: dict[str, str] = field(default_factory=dict)  # lower-case name -> value
    content_length: int | None = None
    keep_alive: bool = True
    expect_continue: bool = False

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.fields.get(name.lower(), default)


def read_head(rfile: Any, sock: socket.socket, deadline: float, per_read_s: float) -> list[bytes]:
    """The lines of one request head (terminators removed, the blank line not included).

    Each read waits at most until ``deadline`` (and at most ``per_read_s``), so the head as a
    whole is bounded however the client spaces its bytes. Reads take bytes up to a line end only
    (``peek`` then ``read`` of what is buffered), leaving a body in ``rfile``'s buffer.
    Raises ``ClientGone`` when the client closes before the first byte, ``BadRequest`` for a head
    that is too large (414/431), ends early (400) or misses the deadline (408).
    """
    lines: list[bytes] = []
    line = bytearray()
    total = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BadRequest(408, "the request head did not arrive in time")
        sock.settimeout(min(remaining, per_read_s))
        try:
            buffered = rfile.peek(1)  # at most one recv (rfile is a BufferedReader)
        except TimeoutError:
            continue  # the deadline check above decides
        if not buffered:
            if total == 0:
                raise ClientGone()
            raise BadRequest(400, "the request head ended early")
        end = buffered.find(b"\n")
        take = end + 1 if end >= 0 else len(buffered)
        line += rfile.read(take)
        total += take
        if len(line) > MAX_LINE + 2:
            if not lines:
                raise BadRequest(414, f"the request line is longer than {MAX_LINE} bytes")
            raise BadRequest(431, f"a header line is longer than {MAX_LINE} bytes")
        if total > MAX_HEAD:
            raise BadRequest(431, f"the request head is larger than {MAX_HEAD} bytes")
        if end < 0:
            continue
        text = bytes(line[:-2] if line.endswith(b"\r\n") else line[:-1])
        line.clear()
        if not text:
            if lines:
                return lines
            continue  # blank lines before a request line are ignored (RFC 9112 2.2)
        lines.append(text)
        if len(lines) > MAX_HEADERS + 1:
            raise BadRequest(431, f"more than {MAX_HEADERS} header lines")


def parse_head(lines: list[bytes]) -> RequestHead:
    """The request head in ``lines`` (from ``read_head``), or BadRequest (4xx) saying what is wrong."""
    request_line = lines[0]
    if b"\r" in request_line or _BAD_IN_LINE.search(request_line):
        raise BadRequest(400, "the request line holds a control or non-ASCII byte")
    parts = request_line.split(b" ")
    if len(parts) == 2:
        raise BadRequest(400, "HTTP/0.9 requests are not served: send 'METHOD /path HTTP/1.1'")
    if len(parts) != 3 or not all(parts):
        raise BadRequest(400, "the request line is not 'METHOD /path HTTP/1.1'")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise BadRequest(400, "the method is not a token")
    if not _VERSION.fullmatch(version):
        raise BadRequest(400, "the request line does not end in an HTTP version")
    if version not in (b"HTTP/1.0", b"HTTP/1.1"):
        raise BadRequest(400, f"{version.decode()} is not served; send HTTP/1.1")
    if not target.startswith(b"/"):
        raise BadRequest(400, "the request target must be a path such as /v1/node (no absolute URI, no '*')")

    fields: dict[str, str] = {}
    for raw in lines[1:]:
        if b"\r" in raw:
            raise BadRequest(400, "a header line holds a bare CR")
        if raw[:1] in (b" ", b"\t"):
            raise BadRequest(400, "folded header lines are not accepted")
        name, colon, value = raw.partition(b":")
        if not colon:
            raise BadRequest(400, "a header line without ':'")
        if not _TOKEN.fullmatch(name):
            raise BadRequest(400, "a header name that is not a token (a space before ':' or a control byte)")
        value = value.strip(b" \t")
        if _BAD_IN_VALUE.search(value):
            raise BadRequest(400, f"the {name.decode()} header holds a control or non-ASCII byte")
        key = name.decode().lower()
        if key in fields:
            if key in _SINGLE:
                raise BadRequest(400, f"the {name.decode()} header appears twice")
            fields[key] += ", " + value.decode()
        else:
            fields[key] = value.decode()
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(431, f"more than {MAX_HEADERS} header lines")

    if "transfer-encoding" in fields:
        # The agent reads bodies by Content-Length only; a chunked body would be taken for requests.
        raise BadRequest(400, "Transfer-Encoding is not accepted: send the body with a Content-Length")
    length = None
    if "content-length" in fields:
        raw_len = fields["content-length"].encode()
        if not _DIGITS.fullmatch(raw_len):
            raise BadRequest(400, "Content-Length is not a number of bytes (ASCII digits)")
        if len(raw_len) > 15:
            raise BadRequest(413, "Content-Length is beyond any body the agent accepts")
        length = int(raw_len)
    ver = version.decode()
    connection = {t.strip().lower() for t in fields.get("connection", "").split(",")}
    keep_alive = ver == "HTTP/1.1" and "close" not in connection
    expect = fields.get("expect")
    if expect is not None and expect.lower() != "100-continue":
        raise BadRequest(417, "the only expectation served is 100-continue")
    path, _, query = target.decode().partition("?")
    return RequestHead(method=method.decode(), target=target.decode(), path=path, query=query, version=ver,
                       fields=fields, content_length=length, keep_alive=keep_alive,
                       expect_continue=expect is not None and ver == "HTTP/1.1")
