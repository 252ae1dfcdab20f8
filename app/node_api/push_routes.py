"""The agent's POST routes for ``hwtui push`` (all need the bearer token; bodies are bounded JSON)."""

from __future__ import annotations

from typing import Any

from hwtui.app.node_api.peer import export_refusal, peer_uid
from hwtui.app.node_api.server import PeerRoute, StreamRoute
from hwtui.engine.resident.resident import MAX_PLAN_BYTES, PushRefused, ResidentRank


def make_routes(resident: ResidentRank) -> dict[str, Any]:
    def guarded(fn: Any) -> Any:
        def handler(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            try:
                return 200, fn(body)
            except PushRefused as exc:
                return exc.status, {"error": str(exc), "node": resident.node}

        return handler

    def upload(query: dict[str, str], length: int, read: Any) -> tuple[int, dict[str, Any]]:
        try:
            return 200, resident.upload_plan(query, length, read)
        except PushRefused as exc:
            return exc.status, {"error": str(exc), "node": resident.node}

    def consumer(fn: Any) -> PeerRoute:
        # The token got the request this far; the served slot (its handle, its holds) is a matter
        # only for a process of this agent's user or its --serve-group, on this node
        # (app/node_api/peer.py).
        def handler(body: dict[str, Any], peer: tuple[Any, ...], local: tuple[Any, ...]) -> tuple[int, dict[str, Any]]:
            why = export_refusal(peer, local, resident.modes.gid)
            if why is not None:
                return 403, {"error": f"node {resident.node}: {why}", "node": resident.node}
            try:
                return 200, fn(body, peer, local)
            except PushRefused as exc:
                return exc.status, {"error": str(exc), "node": resident.node}

        return PeerRoute(handler)

    def export(body: dict[str, Any], peer: tuple[Any, ...], local: tuple[Any, ...]) -> dict[str, Any]:
        uid = peer_uid(peer, local)
        return resident.export(body, holder=f"uid {uid}" if uid is not None else "uid ?")

    served = {"/v1/served/export": consumer(export),
              "/v1/served/hold": consumer(lambda body, *_: resident.renew_hold(body)),
              "/v1/served/release": consumer(lambda body, *_: resident.release_hold(body))}
    return {**served, "/v1/push/plan": StreamRoute(upload, MAX_PLAN_BYTES), "/v1/push/prepare": guarded(resident.prepare), "/v1/push/start": guarded(resident.start),
            "/v1/push/abort": guarded(resident.abort), "/v1/push/wait": guarded(resident.wait),
            "/v1/push/resolve": guarded(resident.resolve)}
