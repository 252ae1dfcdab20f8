"""The agent's request-head parser on arbitrary bytes: a RequestHead or a 4xx, nothing else."""

from __future__ import annotations

import socket
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from hwtui.app.node_api.http_head import MAX_HEAD, BadRequest, ClientGone, parse_head, read_head

_lines = st.lists(st.binary(max_size=80).map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=8)


@settings(max_examples=400, deadline=None, database=None)
@given(lines=_lines)
def test_any_lines_parse_or_are_refused_with_a_4xx(lines):
    try:
        head = parse_head(lines)
    except BadRequest as exc:
        assert 400 <= exc.status < 500 and str(exc) and "\n" not in str(exc)
        return
    assert head.version in ("HTTP/1.0", "HTTP/1.1") and head.target.startswith("/")
    assert head.content_length is None or head.content_length >= 0
    assert all(k == k.lower() and v.isascii() for k, v in head.fields.items())


@settings(max_examples=200, deadline=None, database=None)
@given(data=st.binary(max_size=600), body=st.binary(max_size=20))
def test_read_head_returns_lines_or_refuses_and_leaves_the_body_unread(data, body):
    a, b = socket.socketpair()
    try:
        a.sendall(data + b"\r\n\r\n" + body)
        a.shutdown(socket.SHUT_WR)
        rfile = b.makefile("rb")
        try:
            lines = read_head(rfile, b, time.monotonic() + 10, 5)
        except BadRequest as exc:
            assert 400 <= exc.status < 500
            return
        except ClientGone:
            return
        assert lines and all(b"\n" not in line for line in lines)
        assert sum(len(x) for x in lines) <= MAX_HEAD
        # What follows the head is left for the body reader, byte for byte (when the generated
        # bytes are one line: with line ends of their own, the head may end earlier).
        if b"\n" not in data:
            assert rfile.read() == body
    finally:
        a.close()
        b.close()


def test_a_head_trickled_past_its_deadline_is_a_408():
    a, b = socket.socketpair()
    stop = threading.Event()

    def trickle():
        a.sendall(b"GET / HTTP/1.1\r\n")
        while not stop.is_set():
            try:
                a.send(b"x")
            except OSError:
                return
            stop.wait(0.02)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        read_head(b.makefile("rb"), b, time.monotonic() + 0.3, 5)
        raise AssertionError("the trickled head was read whole")
    except BadRequest as exc:
        assert exc.status == 408
    finally:
        stop.set()
        t.join(5)
        a.close()
        b.close()
