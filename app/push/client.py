"""The pusher's HTTP client: JSON requests to the agents' push routes, errors named in one line."""

from __future__ import annotations

import json
from typing import Any

from hwtui.core.terminal_text import clean


class PushClient:
    def __init__(self, token: str | None, verify: Any):
        from hwtui.app.node_api.client import headers, import_httpx

        httpx = import_httpx()
        self.http = httpx.AsyncClient(headers=headers(token), verify=verify, trust_env=False)

    async def load_transport(self) -> None:
        """Load the event-loop half of the HTTP stack now, before the push's clock starts.

        httpx loads it at the first request otherwise (anyio's asyncio backend: 35-50 ms of imports
        measured here, the whole of a warm push's "prepared" step), so a one-time start-up cost of
        the CLI sat on the first push's critical path: a pusher that lives on (``train --push``)
        pays it once. No request is made."""
        try:
            import anyio
        except ImportError:  # an httpx without anyio loads what it needs at its first request
            return
        await anyio.sleep(0)  # anyio picks (imports) its backend for the running loop here

    async def post(self, url: str, body: dict[str, Any], timeout: float) -> tuple[int, dict[str, Any]]:
        resp = await self.http.post(url, content=json.dumps(body, separators=(",", ":")).encode(), timeout=timeout,
                                    headers={"Content-Type": "application/json"})
        return resp.status_code, _json_object(resp)

    async def post_bytes(self, url: str, params: dict[str, str], data: bytes, timeout: float) -> tuple[int, dict[str, Any]]:
        resp = await self.http.post(url, params=params, content=data,
                                    headers={"Content-Type": "application/octet-stream"}, timeout=timeout)
        return resp.status_code, _json_object(resp)

    async def aclose(self) -> None:
        await self.http.aclose()


def _json_object(resp: Any) -> dict[str, Any]:
    """An agent's answer as a JSON object ({} for anything else: it is untrusted input)."""
    try:
        doc = resp.json()
    except ValueError:
        doc = {}
    return doc if isinstance(doc, dict) else {}


def refused(exc: BaseException) -> bool:
    """No connection could be made (refused, unreachable): not a slow answer (that is a timeout)."""
    from hwtui.app.node_api.client import import_httpx

    return isinstance(exc, import_httpx().ConnectError)


def why(exc: BaseException) -> str:
    from hwtui.app.node_api.client import _error_text

    return _error_text(exc)


def text(value: Any, limit: int = 300) -> str:
    """A string from an agent, fit for a terminal (core.terminal_text.clean: whole ESC sequences and
    control/format characters removed, one line), bounded."""
    return clean(str(value if value is not None else ""), limit)


def dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) and value else None


def staged(value: Any) -> list[dict[str, Any]]:
    """An agent's list of staged copies, keeping only well-formed entries (bounded)."""
    if not isinstance(value, list):
        return []
    return [{"version": text(v.get("version"), 128), "prepared": v.get("prepared") is True,
             "decided": v.get("decided") is True} for v in value[:16] if isinstance(v, dict)]
