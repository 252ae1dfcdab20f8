"""Polling many agents at once with httpx (asyncio): the live cluster view's data, and one-shot reads.

Every node has its own polling task, so a node that is slow or dead costs only its own task: the
others keep their own period. An agent is untrusted: each poll has one overall deadline
(``request_timeout``, the whole exchange: connect, head and body, so an agent that drip-feeds its
answer is cut there, where httpx's own timeout is per read), its answer is capped in size
(``MAX_SUMMARY``), and it is read only through the typed parser of ``engine.resident.summary``, which
turns every invalid field into "unknown" and strips terminal controls from every string. A node whose last good
answer is older than ``STALE_INTERVALS`` refresh intervals (or that never answered) is *stale*, and
views say so instead of showing old figures as current.

The refresh interval adapts to the number of nodes (``adaptive_interval``): a handful are polled
every second; 64 every 2.4 s; the view's CPU stays flat as the cluster grows.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hwtui.core.errors import HwtuiError
from hwtui.core.redact import redact_text
from hwtui.core.terminal_text import clean
from hwtui.engine.resident.summary import NodeStatus, Processes, Summary, parse_processes, parse_summary

DEFAULT_PORT = 9477
STALE_INTERVALS = 2.0
MAX_RESPONSE = 8 << 20  # facts with every finding: tens of KB; an answer this large is not an agent's
MAX_SUMMARY = 1 << 20  # a summary is a few KB (256 devices: about 60 KB)
MAX_ERROR = 200  # characters of a failure's text shown for a node
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$")


@dataclass(frozen=True)
class Target:
    name: str  # what views show: host[:port] as given
    url: str  # base URL, no trailing slash


def parse_agents(text: str, default_port: int = DEFAULT_PORT) -> list[Target]:
    """``a:9477,b,https://c:9443,[fe80::1]:9477`` -> targets; one clear error for anything else."""
    out: list[Target] = []
    for raw in (p.strip() for p in (text or "").split(",")):
        if not raw:
            continue
        scheme = "http"
        rest = raw
        if "://" in raw:
            scheme, _, rest = raw.partition("://")
            if scheme not in ("http", "https"):
                raise HwtuiError(f"--agents {raw!r}: the scheme must be http or https")
        bracketed = rest.startswith("[")
        if bracketed:
            host, _, tail = rest[1:].partition("]")
            port_text = tail[1:] if tail.startswith(":") else ("" if not tail else None)
        else:
            host, sep, port_text = rest.partition(":")
            if not sep:
                port_text = ""
        if port_text is None or (port_text and (not port_text.isdigit() or len(port_text) > 5 or not 0 < int(port_text) < 65536)):
            raise HwtuiError(f"--agents {raw!r}: the port must be a number from 1 to 65535")
        port = int(port_text) if port_text else default_port
        if ":" in host or bracketed:
            import ipaddress

            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise HwtuiError(f"--agents {raw!r}: not an IPv6 address") from None
            url_host = f"[{host}]"
        elif _HOST.match(host) and ".." not in host:
            url_host = host
        else:
            raise HwtuiError(f"--agents {raw!r}: expected HOST[:PORT] (a name or an address)")
        out.append(Target(raw, f"{scheme}://{url_host}:{port}"))
    if not out:
        raise HwtuiError("--agents: give at least one HOST[:PORT]")
    names = [t.url for t in out]
    if len(set(names)) != len(names):
        raise HwtuiError("--agents: an agent is listed twice")
    return out


# Nodes asked at once (Poller.run). Each wake-up of the event loop costs about what a request
# does: 64 nodes each on its own schedule cost the view 5.1-5.5 % of a core at 2.4 s, in groups
# of 8 2.5-2.6 % (benchmarks/bench_agent.py, idle box), and no agent sees more than 8 requests at once.
POLL_GROUP = 8


def adaptive_interval(nodes: int, base: float = 1.0) -> float:
    """Seconds between two polls of one node: ``base`` up to 11 nodes, then growing as sqrt(n).

    Polled in groups of ``POLL_GROUP``, a node costs the view about 1 ms of CPU per poll (httpx),
    so n nodes every 0.3*sqrt(n) s cost about 0.33*sqrt(n) % of a core: 2.6 % at 64 nodes
    (2.4 s, measured), about 5 % at 256 (4.8 s).
    """
    return max(base, 0.3 * math.sqrt(max(nodes, 1)))


def import_httpx() -> Any:
    """``httpx``, without its command-line tool: with rich and click installed (the TUI's), ``import
    httpx`` also imports ``httpx._main`` and with it rich, pygments and click -- 0.4 s of a push's
    start-up, for an entry point hwtui never calls. httpx falls back to a stub when that import fails."""
    import importlib
    import sys

    if sys.modules.get("httpx") is not None:  # None there means "blocked": import_module raises for it
        return sys.modules["httpx"]
    blocked = "httpx._main" not in sys.modules
    if blocked:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]  # None in sys.modules: that import fails
    try:
        return importlib.import_module("httpx")
    finally:
        if blocked and sys.modules.get("httpx._main", False) is None:
            del sys.modules["httpx._main"]


def tls_verify(targets: Sequence[Target], verify: Any) -> Any:
    """httpx's ``verify`` for these targets: with no https:// agent there is no TLS at all, so no
    CA bundle is loaded (building that context was 0.1-0.3 s of every `hwtui push`)."""
    return verify if any(t.url.startswith("https://") for t in targets) else False


def headers(token: str | None) -> dict[str, str]:
    # identity: agents never compress, and an answer is capped in the bytes that arrive (aiter_raw),
    # so a compressed one (a decompression bomb) would only fail as "not JSON".
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return {"Accept-Encoding": "identity", **auth}


@dataclass
class NodeView:
    target: Target
    summary: Summary | None = None  # last good /v1/summary, checked (engine.resident.summary)
    last_ok: float | None = None  # monotonic
    error: str | None = None  # clean text
    latency_s: float | None = None
    polls: int = 0
    failures: int = 0
    first_try: float | None = None  # monotonic time of the first poll: "never answered, tried for N s"
    processes: Processes | None = None  # last good /v1/processes, only while this node's detail is open
    processes_error: str | None = None

    def tried(self, now: float | None = None) -> float | None:
        return None if self.first_try is None else (time.monotonic() if now is None else now) - self.first_try

    def age(self, now: float | None = None) -> float | None:
        return None if self.last_ok is None else (time.monotonic() if now is None else now) - self.last_ok

    def stale(self, interval: float, now: float | None = None) -> bool:
        age = self.age(now)
        return age is None or age > STALE_INTERVALS * interval

    def status(self, interval: float, now: float | None = None) -> NodeStatus:
        return NodeStatus(agent=self.target.name, url=self.target.url, stale=self.stale(interval, now),
                          age_s=self.age(now), error=self.error, latency_s=self.latency_s, summary=self.summary,
                          tried_s=self.tried(now), processes=self.processes, processes_error=self.processes_error)

    def to_dict(self, interval: float, now: float | None = None) -> dict[str, Any]:
        return self.status(interval, now).to_dict()


def _error_text(exc: BaseException) -> str:
    httpx = import_httpx()

    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    if isinstance(exc, httpx.ConnectError):
        return "connection refused or unreachable"
    # An exception's text can quote what the agent sent (a protocol error, its "error" field): clean, never raw.
    return clean(redact_text(f"{type(exc).__name__}: {exc}"), MAX_ERROR)


def _poll_error(exc: BaseException) -> str:
    """Why one poll of one agent failed, for the views: fetch_json's own one-line reasons as they
    are, the poll's deadline as a timeout, anything else as ``_error_text`` says it."""
    if isinstance(exc, (PermissionError, RuntimeError)):
        return clean(str(exc), MAX_ERROR)
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer in time"
    return _error_text(exc)


async def fetch_json(client: Any, url: str | Any, *, timeout: float, max_bytes: int = MAX_RESPONSE) -> dict[str, Any]:
    """GET ``url`` (or send a prebuilt GET ``httpx.Request``) -> JSON object; raises with a one-line
    reason (HTTP status, size, not JSON). ``timeout`` bounds each read; the caller bounds the whole
    exchange (``fetch_bounded``)."""
    import json

    request = client.build_request("GET", url, timeout=timeout) if isinstance(url, str) else url
    resp = await client.send(request, stream=True)
    try:
        if resp.status_code == 401:
            raise PermissionError("refused: the agent wants a token (HWTUI_AGENT_TOKEN or --token-file)")
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}")
        length = resp.headers.get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > max_bytes:
            raise RuntimeError("answer too large")
        body = bytearray()
        async for chunk in resp.aiter_raw():  # raw: a compressed answer cannot expand past the cap
            body += chunk
            if len(body) > max_bytes:
                raise RuntimeError("answer too large")
    finally:
        await resp.aclose()
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise RuntimeError("answer is not JSON") from None
    if not isinstance(doc, dict):
        raise RuntimeError("answer is not a JSON object")
    return doc


async def fetch_bounded(client: Any, url: str | Any, *, deadline: float, max_bytes: int = MAX_RESPONSE) -> dict[str, Any]:
    """``fetch_json`` with one deadline for the whole exchange: an agent that answers a byte at a
    time never holds a poll (or `hwtui agents`) longer than ``deadline`` seconds. Raises
    ``asyncio.TimeoutError`` at the deadline."""
    exchange = fetch_json(client, url, timeout=deadline, max_bytes=max_bytes)
    timeout_cm = getattr(asyncio, "timeout", None)  # 3.11+: no extra task per poll, unlike wait_for
    if timeout_cm is None:
        return await asyncio.wait_for(exchange, deadline)
    async with timeout_cm(deadline):
        return await exchange


class Poller:
    """Poll ``/v1/summary`` of every target on its own task; ``views`` always holds the latest."""

    def __init__(self, targets: Sequence[Target], *, token: str | None = None, interval: float | None = None,
                 request_timeout: float | None = None, verify: Any = True,
                 on_update: Callable[[NodeView], None] | None = None):
        self.targets = list(targets)
        self.interval = interval if interval is not None else adaptive_interval(len(self.targets))
        # A request may take at most one interval: a slow node must never look fresher than it is.
        self.request_timeout = request_timeout if request_timeout is not None else min(self.interval, 5.0)
        self.views = {t.url: NodeView(t) for t in self.targets}
        self._token = token
        self._verify = verify
        self._on_update = on_update
        self._clients: dict[str, Any] = {}
        self._requests: dict[str, Any] = {}
        # The node whose detail view is open (its URL): its processes are polled too, after its
        # summary on the same connection and under the same deadline and cap; no other node's are.
        self._detail: str | None = None

    @property
    def detail(self) -> str | None:
        return self._detail

    @detail.setter
    def detail(self, url: str | None) -> None:
        if url == self._detail:
            return
        if self._detail in self.views:  # the processes of a node no longer watched are not kept
            view = self.views[self._detail]
            view.processes, view.processes_error = None, None
        self._detail = url if url in self.views else None

    async def __aenter__(self) -> Poller:
        httpx = import_httpx()

        # One client (one kept-alive connection) per node: httpcore scans its whole pool on every
        # request, so one shared pool of 64 connections costs O(nodes) per request, O(n^2) per round.
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        for url in self.views:
            # An http:// node gets no TLS context: each client would load the CA bundle again
            # (16 ms apiece, a second of start-up for 64 nodes, for connections that never use it).
            verify = tls_verify([self.views[url].target], self._verify)
            self._clients[url] = httpx.AsyncClient(headers=headers(self._token), limits=limits, verify=verify,
                                                   trust_env=False, follow_redirects=False)
            # Built once, sent every interval: building a request (URL parsing, header merging)
            # was a fifth of each poll's CPU.
            self._requests[url] = self._clients[url].build_request("GET", f"{url}/v1/summary",
                                                                   timeout=self.request_timeout)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.gather(*(c.aclose() for c in self._clients.values()), return_exceptions=True)
        self._clients.clear()

    async def poll_once(self, view: NodeView) -> None:
        t = time.monotonic()
        view.polls += 1
        if view.first_try is None:
            view.first_try = t
        try:
            doc = await fetch_bounded(self._clients[view.target.url], self._requests[view.target.url],
                                      deadline=self.request_timeout, max_bytes=MAX_SUMMARY)
        except Exception as exc:  # noqa: BLE001 - every failure is this node's state, never the view's crash
            view.failures += 1
            view.error = _poll_error(exc)
        else:
            view.summary, view.last_ok, view.error = parse_summary(doc), time.monotonic(), None
            view.latency_s = view.last_ok - t
            if self._detail == view.target.url:
                await self._poll_processes(view)
        if self._on_update is not None:
            self._on_update(view)

    async def _poll_processes(self, view: NodeView) -> None:
        url = view.target.url
        try:
            # Half the poll's deadline: it runs after the summary in the same task, and a node whose
            # processes never come must still be asked for its summary every interval (else it
            # would be skipped a turn and flicker STALE while its detail is open).
            doc = await fetch_bounded(self._clients[url], f"{url}/v1/processes", deadline=self.request_timeout / 2,
                                      max_bytes=MAX_SUMMARY)
        except Exception as exc:  # noqa: BLE001 - the node's processes are unknown, the node itself answered
            if self._detail == url:
                view.processes_error = _poll_error(exc)
        else:
            if self._detail == url:  # the detail may have closed while this was out
                view.processes, view.processes_error = parse_processes(doc), None

    async def round(self) -> list[NodeView]:
        """Poll every node once, concurrently (each bounded by the request timeout)."""
        await asyncio.gather(*(self.poll_once(v) for v in self.views.values()))
        return list(self.views.values())

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set: nodes in groups of up to ``POLL_GROUP``, the groups spread
        over the interval (so requests never come in one burst of every node).

        A group's nodes are asked together, each on its own task: a slow or dead node never
        delays the others' next poll (it is skipped while its request is still out, so it is
        never asked twice at once)."""
        views = list(self.views.values())
        groups = [views[k:k + POLL_GROUP] for k in range(0, len(views), POLL_GROUP)]
        n = max(len(groups), 1)
        out: dict[str, asyncio.Task[None]] = {}

        async def loop(i: int, members: list[NodeView]) -> None:
            await _sleep_or_stop(stop, self.interval * i / n)
            next_at = time.monotonic()
            while not stop.is_set():
                for view in members:
                    task = out.get(view.target.url)
                    if task is None or task.done():
                        out[view.target.url] = asyncio.ensure_future(self.poll_once(view))
                next_at += self.interval
                now = time.monotonic()
                if next_at < now:  # fell behind (a stalled loop): skip ahead, never burst to catch up
                    next_at = now
                await _sleep_or_stop(stop, next_at - now)

        try:
            await asyncio.gather(*(loop(i, g) for i, g in enumerate(groups)))
        finally:
            for task in out.values():
                task.cancel()
            await asyncio.gather(*out.values(), return_exceptions=True)

    def statuses(self) -> list[NodeStatus]:
        """Every node's checked state now: what the views draw."""
        now = time.monotonic()
        return [v.status(self.interval, now) for v in self.views.values()]

    def snapshot(self) -> list[dict[str, Any]]:
        """``statuses`` as the JSON objects of ``hwtui.agents/1``."""
        return [s.to_dict() for s in self.statuses()]


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    if seconds <= 0:
        return
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass


async def fetch_all(targets: Sequence[Target], path: str, *, token: str | None, timeout: float,
                    verify: Any = True) -> list[tuple[Target, dict[str, Any] | None, str | None]]:
    """One GET of ``path`` on every target at once: (target, document or None, error or None).

    ``timeout`` is each agent's whole deadline. The documents are the agents' own, unchecked:
    callers read them through a parser (``engine.resident.summary``) or clean them (``clean_tree``)."""
    httpx = import_httpx()

    async with httpx.AsyncClient(headers=headers(token), verify=tls_verify(targets, verify), trust_env=False,
                                 follow_redirects=False) as client:
        async def one(t: Target) -> tuple[Target, dict[str, Any] | None, str | None]:
            try:
                return t, await fetch_bounded(client, f"{t.url}{path}", deadline=timeout), None
            except Exception as exc:  # noqa: BLE001 - every failure is this agent's, named
                return t, None, _poll_error(exc)

        return list(await asyncio.gather(*(one(t) for t in targets)))


@dataclass
class Cluster:
    """What ``hwtui agents`` prints: every node's view after one round or a watch."""

    interval: float
    nodes: list[NodeStatus] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "hwtui.agents/1", "interval_s": self.interval,
                "stale": [n.node for n in self.nodes if n.stale], "nodes": [n.to_dict() for n in self.nodes]}
