"""``hwtui push``: replicate a plan's weights into the resident receivers of running agents.

The first agent listed is the source: it reads the plan's weight files from its own disk. Every
other agent receives, verifies and commits exactly as ``hwtui replicate --commit`` does (the same
worker: xxh3 per bucket, per-tensor checks, a unanimous vote, then the two-phase switch), into the
slot it is not serving. Agents keep torch imported and the process group formed between pushes, so
a second push into the same agents costs little more than its transfer.

The report says what each node serves as the node itself tells it when the push is over (read
back, never inferred from the push's messages; a node that cannot be read is "unknown"). A
version that was decided but not switched everywhere is a split, reported with the command that
finishes it: ``--resume`` (or a re-run of the same push) finishes the switch on the nodes that
missed it from their verified staged copy, and sends the version again to those without one.

Exit codes: 0 every receiver committed and serves the version; 1 the push failed or is split (what
each node serves is named); 2 bad input (plan, options, an agent refusing the request).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from typing import Any

from hwtui.core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, HwtuiError
from hwtui.core.terminal_text import clean
from hwtui.probes.distributed.replication_defaults import (
    DEFAULT_CHUNK_MB,
    DEFAULT_INIT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WINDOW,
    MAX_CHUNK_MB,
    MAX_TIMEOUT_S,
    MAX_WINDOW,
)

HELP = "push a plan's weights into the resident receivers of running agents (first agent = source)"
SCHEMA = "hwtui.push/1"
WAIT_S = 1.0  # one long poll of a node's push state
SILENT_S = 3.0  # a node that answers nothing for this long mid-push has died


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", required=True, metavar="FILE", help="plan written by `hwtui plan` (paths as the source agent sees them)")
    p.add_argument("--agents", required=True, metavar="LIST",
                   help="SOURCE,RECEIVER,...: agents as HOST[:PORT] (default port 9477); the first one sends")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"per-bucket and commit wait (default {DEFAULT_TIMEOUT_S:g} s)")
    p.add_argument("--init-timeout", type=float, default=DEFAULT_INIT_TIMEOUT_S, metavar="S",
                   help=f"wait for a new process group to form (default {DEFAULT_INIT_TIMEOUT_S:g} s)")
    p.add_argument("--deadline", type=float, default=None, metavar="S",
                   help="give up on the whole push after S s and stop it on every agent "
                        "(default: init timeout + 2 min + 1 min per GB)")
    p.add_argument("--inflight", type=int, default=DEFAULT_WINDOW, metavar="K",
                   help=f"buckets in flight (default {DEFAULT_WINDOW}, at most {MAX_WINDOW})")
    p.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK_MB, metavar="MB",
                   help=f"largest collective (default {DEFAULT_CHUNK_MB:g}, at most {MAX_CHUNK_MB:g})")
    p.add_argument("--resume", action="store_true",
                   help="finish a push whose version was decided but not switched everywhere (a split); "
                        "refused when nothing was decided. A plain re-run does the same when there is a decision")
    p.add_argument("--json", action="store_true", help="print one JSON document (schema hwtui.push/1)")
    from hwtui.app.commands.agents import add_client_options

    add_client_options(p)


class _Client:
    def __init__(self, token: str | None, verify: Any):
        from hwtui.app.node_api.client import headers, import_httpx

        httpx = import_httpx()
        self.http = httpx.AsyncClient(headers=headers(token), verify=verify, trust_env=False)

    async def post(self, url: str, body: dict[str, Any], timeout: float) -> tuple[int, dict[str, Any]]:
        resp = await self.http.post(url, content=json.dumps(body, separators=(",", ":")).encode(), timeout=timeout,
                                    headers={"Content-Type": "application/json"})
        try:
            doc = resp.json()
        except ValueError:
            doc = {}
        return resp.status_code, doc if isinstance(doc, dict) else {}


def _refused(exc: BaseException) -> bool:
    """No connection could be made (refused, unreachable): not a slow answer (that is a timeout)."""
    from hwtui.app.node_api.client import import_httpx

    return isinstance(exc, import_httpx().ConnectError)


def _why(exc: BaseException) -> str:
    from hwtui.app.node_api.client import _error_text

    return _error_text(exc)


async def push(args: argparse.Namespace, plan_bytes: bytes, plan: dict[str, Any], targets: list[Any], token: str | None,
               verify: Any) -> dict[str, Any]:
    from hwtui.app.node_api.client import tls_verify

    t0 = time.monotonic()
    started_at = time.time()
    push_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    world_key = ",".join(t.url for t in targets)
    client = _Client(token, tls_verify(targets, verify))
    marks = {"client": time.time()}  # when the pusher's own steps ended (the agents report theirs)
    nodes: dict[str, dict[str, Any]] = {t.url: {"agent": t.name, "rank": i, "role": "source" if i == 0 else "receiver"}
                                        for i, t in enumerate(targets)}
    try:
        # 1. Can every agent reuse its group for exactly this world? Any "no" forms a fresh one everywhere.
        def refused(t: Any, status: int, doc: Any) -> HwtuiError:
            """One line for an agent's refusal, the same whichever of the first requests meets it."""
            if status == 401:
                return HwtuiError(f"agent {t.name} refused the token (HWTUI_AGENT_TOKEN or --token-file)")
            if status == 404:
                return HwtuiError(f"agent {t.name} takes no pushes: start it with --out DIR")
            error = doc.get("error") if isinstance(doc, dict) else None
            # 507: the node's disk is full (or unwritable): not bad input, a node that failed.
            return HwtuiError(f"agent {t.name}: {error or f'HTTP {status}'}",
                              EXIT_FAILED if status == 507 else EXIT_USAGE)

        async def prepare(t: Any, key: str = world_key) -> dict[str, Any]:
            try:
                status, doc = await client.post(f"{t.url}/v1/push/prepare", {"world_key": key, "version": plan["version"]},
                                                timeout=10)
            except Exception as exc:  # noqa: BLE001
                raise HwtuiError(f"agent {t.name} is unreachable: {_why(exc)}") from None
            if status != 200:
                raise refused(t, status, doc)
            return doc

        # The plan goes to every agent as its file's raw bytes, streamed (POST /v1/push/plan, named
        # by its digest), beside the prepare: a plan of any size, and no extra round trip. The
        # source's agent validates it (validate=1) before any rank starts.
        async def upload(t: Any) -> None:
            query = {"digest": plan["digest"], **({"validate": "1"} if t is targets[0] else {})}
            try:
                resp = await client.http.post(f"{t.url}/v1/push/plan", params=query, content=plan_bytes,
                                              headers={"Content-Type": "application/octet-stream"},
                                              timeout=30 + len(plan_bytes) / (4 << 20))
            except Exception as exc:  # noqa: BLE001
                raise HwtuiError(f"agent {t.name} is unreachable: {_why(exc)}") from None
            if resp.status_code != 200:
                try:
                    doc = resp.json()
                except ValueError:
                    doc = {}
                raise refused(t, resp.status_code, doc)

        answers = await asyncio.gather(*(prepare(t) for t in targets), *(upload(t) for t in targets),
                                       return_exceptions=True)
        errors = [a for a in answers if isinstance(a, BaseException)]
        if errors:
            # The same answer whatever order the requests ended in: an unreachable agent first,
            # then a refused token, then anything else, each in the order the agents are listed.
            def rank(e: BaseException) -> int:
                text = str(e)
                return 0 if "unreachable" in text else 1 if "refused the token" in text else 2

            raise min(errors, key=rank)
        prepared: list[dict[str, Any]] = [a for a in answers[:len(targets)] if isinstance(a, dict)]
        marks["prepared"] = time.time()
        busy = [t.name for t, d in zip(targets, prepared, strict=True) if d.get("busy")]
        if busy:
            raise HwtuiError(f"agent(s) {', '.join(busy)} are busy with another push; try again when it ends")
        for t, d in zip(targets, prepared, strict=True):
            nodes[t.url].update(node=_text(d.get("node") or t.name, 64),
                                before=_text(d.get("serving"), 128) if isinstance(d.get("serving"), str) else None)

        # 1b. What the nodes already hold of this version, read from them. The source's decision
        #     record is the authority: a decided version is finished on the receivers that missed
        #     its switch (from their verified staged copy, without moving a byte), a receiver that
        #     serves it already is left alone, and only the rest receive it (again).
        decision = _dict_or_none(prepared[0].get("decision"))
        if decision and decision.get("plan_digest") != plan["digest"]:
            raise HwtuiError(f"version {plan['version']!r} was committed from another plan "
                             f"({_text(decision.get('plan_digest'), 16)}) on source {targets[0].name}; plan a new version")
        group = list(targets)
        for t, d in zip(targets[1:], prepared[1:], strict=True):
            if d.get("serving") != plan["version"]:
                continue
            if d.get("serving_digest") != plan["digest"]:
                raise HwtuiError(f"agent {t.name} already serves version {plan['version']!r} from another plan; "
                                 "plan a new version")
            nodes[t.url].update(outcome="committed", how="already served it")
            group.remove(t)
        if args.resume and len(group) > 1 and not decision:
            await _read_back(client, plan, targets, nodes)  # undecided copies it finds are removed
            raise HwtuiError(f"nothing to resume: version {plan['version']!r} was never decided on source "
                             f"{targets[0].name} (push it again without --resume)")
        if decision and len(group) > 1:
            async def finish(t: Any) -> None:
                try:
                    status, doc = await client.post(f"{t.url}/v1/push/resolve", {
                        "version": plan["version"], "plan_digest": plan["digest"], "decision": "commit"}, timeout=600)
                except Exception as exc:  # noqa: BLE001 - it receives the version again, or is named below
                    nodes[t.url]["note"] = f"could not finish the decided switch: {_why(exc)}"
                    return
                if status == 200 and doc.get("done") is True:
                    nodes[t.url].update(outcome="committed", how=_text(doc.get("what")))
                    group.remove(t)
                elif status == 200:
                    nodes[t.url].update(note=_text(doc.get("what")), moved_on=doc.get("moved_on") is True)

            await asyncio.gather(*(finish(t) for t in list(group[1:])))
            moved_on = [t.name for t in group[1:] if nodes[t.url].get("moved_on")]
            if moved_on:
                raise HwtuiError(f"agent(s) {', '.join(moved_on)} served version {plan['version']!r} before and moved "
                                 "on; going back is a new version: plan one")
        marks["settled"] = time.time()
        if len(group) > 1 and len(group) < len(targets):
            # Only some receivers need the bytes: a world of the source and those.
            world_key = ",".join(t.url for t in group)
            prepared = list(await asyncio.gather(*(prepare(t, world_key) for t in group)))
        elif len(group) == 1:  # nothing to send: every receiver serves it (now)
            nodes[targets[0].url].update(outcome="committed", how="nothing left to send")
            group, prepared = [], []
        warm = bool(prepared) and all(d.get("warm") for d in prepared)
        if not group:
            return await _finish_doc(args, client, plan, targets, nodes, marks, t0, started_at, push_id, warm,
                                     time.monotonic())
        master, port = str(prepared[0].get("advertise") or ""), int(prepared[0]["port"])
        if master in ("", "0.0.0.0", "::"):  # noqa: S104 - a wildcard listener: reach it where we reached its agent
            from urllib.parse import urlsplit

            master = urlsplit(group[0].url).hostname or master
        settings = {"timeout": args.timeout, "init_timeout": args.init_timeout, "inflight": args.inflight,
                    "chunk_mb": args.chunk_mb}

        # 2. Start every rank at once (a fresh group forms only when all of them are in it).
        async def start(i: int, t: Any) -> None:
            body = {"push_id": push_id, "rank": i, "world_size": len(group), "world_key": world_key,
                    "master_addr": master, "master_port": port, "fresh": not warm, "plan_digest": plan["digest"],
                    "settings": settings}
            try:
                status, doc = await client.post(f"{t.url}/v1/push/start", body, timeout=180)
            except Exception as exc:  # noqa: BLE001
                nodes[t.url].update(outcome="unreachable", error=_why(exc))
                return
            if status != 200:
                nodes[t.url].update(outcome="refused", error=doc.get("error") or f"HTTP {status}", status=status)

        t_start = time.monotonic()
        await asyncio.gather(*(start(i, t) for i, t in enumerate(group)))
        marks["started"] = time.time()

        # 3. Follow every node to the end of this push, each on its own task with a long poll
        #    (/v1/push/wait answers when the node's phase changes or the push ends there): no
        #    polling interval in the end-to-end time, and one request a second per node instead
        #    of twenty, which a loaded node's transfer would pay for. A node that stops answering
        #    for SILENT_S is named; any node out of the push stops the ones still before the vote.
        deadline = t0 + args.deadline
        changed = asyncio.Event()

        async def follow(t: Any) -> None:
            node = nodes[t.url]
            silent_since: float | None = None
            while "outcome" not in node:
                try:
                    status, doc = await client.post(f"{t.url}/v1/push/wait",
                                                    {"push_id": push_id, "phase": node.get("phase"), "timeout": WAIT_S},
                                                    timeout=WAIT_S + SILENT_S)
                    if status != 200:
                        raise RuntimeError(doc.get("error") or f"HTTP {status}")
                except Exception as exc:  # noqa: BLE001
                    silent_since = silent_since or time.monotonic()
                    # A connection refused mid-push is an agent that is gone (its resident rank dies
                    # with it): named at once. Silence (a host down, a partition) gets SILENT_S.
                    if _refused(exc) or time.monotonic() - silent_since > SILENT_S:
                        node.update(outcome="died", error=f"stopped answering mid-push ({_why(exc)})")
                        changed.set()
                        return
                    await asyncio.sleep(0.2)
                    continue
                silent_since = None
                last, flight = doc.get("last") or {}, doc.get("in_flight") or {}
                if flight.get("push_id") == push_id:
                    node["progress"] = flight.get("progress")
                    node["phase"] = flight.get("phase")
                elif last.get("push_id") == push_id:
                    marks[f"seen_{node['rank']}"] = time.time()  # this node's end, as the pusher learnt it
                    node.update(outcome=last.get("outcome"), serving=last.get("serving"), phases=last.get("phases"),
                                failures=last.get("failures"), warm=last.get("warm"), timeline=last.get("timeline"))
                else:  # neither in flight nor ended there: the agent lost it (restarted)
                    node.update(outcome="died", error="the agent no longer knows this push (restarted?)")
                changed.set()

        followers = [asyncio.ensure_future(follow(t)) for t in group if "outcome" not in nodes[t.url]]
        changed.set()
        try:
            while any(not f.done() for f in followers) and time.monotonic() < deadline:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                changed.clear()
                out = [t for t in group if nodes[t.url].get("outcome") not in (None, "committed")]
                if not out:
                    continue
                # This push can no longer commit (the vote needs every rank): the others are stopped
                # now instead of waiting out their timeouts. A rank already past the vote
                # ("committing") is left to finish; its agent refuses to stop it anyway.
                now = time.monotonic()
                stoppable = [t for t in group if "outcome" not in nodes[t.url]
                             and now - nodes[t.url].get("abort_sent", -1e9) > 5.0  # again if the first was missed
                             and nodes[t.url].get("phase") != "committing"]
                # A node that went is the cause; a node that failed may only have seen it go first.
                out.sort(key=lambda t: nodes[t.url]["outcome"] not in ("died", "unreachable"))
                first = nodes[out[0].url]
                reason = f"{first.get('node') or out[0].name} {first['outcome']}"
                for t in stoppable:
                    nodes[t.url]["abort_sent"] = now
                    nodes[t.url].setdefault("note", f"stopped: {reason}")

                async def stop_one(t: Any, reason: str) -> None:
                    try:
                        await client.post(f"{t.url}/v1/push/abort", {"push_id": push_id, "reason": reason}, timeout=15)
                    except Exception:  # noqa: BLE001, S110 - followed (and named) like any other node
                        pass

                await asyncio.gather(*(stop_one(t, reason) for t in stoppable))
        finally:
            for f in followers:
                f.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
        late = [t for t in group if "outcome" not in nodes[t.url]]
        if late:
            # Past the deadline: stop the push where it still runs, so no rank waits on it any longer.
            async def abort(t: Any) -> None:
                try:
                    await client.post(f"{t.url}/v1/push/abort", {"push_id": push_id,
                                      "reason": f"the push passed its deadline ({args.deadline:g} s)"}, timeout=15)
                except Exception:  # noqa: BLE001, S110 - the node is named as timed out either way
                    pass

            await asyncio.gather(*(abort(t) for t in late))
        for t in late:
            nodes[t.url]["outcome"] = "timed out"
        return await _finish_doc(args, client, plan, targets, nodes, marks, t0, started_at, push_id, warm, t_start)
    finally:
        await client.http.aclose()


async def _read_back(client: _Client, plan: dict[str, Any], targets: list[Any], nodes: dict[str, dict[str, Any]]) -> None:
    """Each node's state as the node itself reports it (what it serves, what it holds staged, its
    decision record for this version), never inferred from the push's messages: a node that cannot
    be read is ``unknown`` in the report. A prepared copy of a version nothing decided (the source
    has no record, and the push is over) is removed on the way: a leftover of an aborted push."""
    async def read(t: Any) -> None:
        row = nodes[t.url]
        try:
            status, doc = await client.post(f"{t.url}/v1/push/prepare",
                                            {"world_key": "read-back", "version": plan["version"]}, timeout=10)
            if status != 200:
                raise RuntimeError(doc.get("error") or f"HTTP {status}")
        except Exception as exc:  # noqa: BLE001 - named as unknown, with why
            row.update(read_back=False, serving=None, read_error=_why(exc))
            return
        # An agent's answer is untrusted: each field is taken only in the type it must have.
        serving = doc.get("serving")
        row.update(read_back=True, serving=_text(serving) if isinstance(serving, str) else None,
                   serving_digest=doc.get("serving_digest") if isinstance(doc.get("serving_digest"), str) else None,
                   decision=_dict_or_none(doc.get("decision")), staged=_staged(doc.get("staged")),
                   busy=doc.get("busy") is True)

    await asyncio.gather(*(read(t) for t in targets))
    source = nodes[targets[0].url]
    decided = bool(source.get("decision")) or any(r.get("decision") for r in nodes.values())
    if decided or not source.get("read_back") or source.get("busy"):
        return
    undecided = [t for t in targets[1:] if nodes[t.url].get("read_back") and not nodes[t.url].get("busy")
                 and any(s.get("version") == plan["version"] for s in nodes[t.url].get("staged") or [])]

    async def discard(t: Any) -> None:
        with contextlib.suppress(Exception):
            status, doc = await client.post(f"{t.url}/v1/push/resolve", {
                "version": plan["version"], "plan_digest": plan["digest"], "decision": "abort"}, timeout=30)
            if status == 200:
                nodes[t.url]["staged"] = _staged(doc.get("staged"))

    await asyncio.gather(*(discard(t) for t in undecided))


async def _finish_doc(args: argparse.Namespace, client: _Client, plan: dict[str, Any], targets: list[Any],
                      nodes: dict[str, dict[str, Any]], marks: dict[str, float], t0: float, started_at: float,
                      push_id: str, warm: bool, t_start: float) -> dict[str, Any]:
    end = time.monotonic()
    wall = end - t0
    rows_ = list(nodes.values())
    if all(r.get("outcome") == "committed" and "serving" in r for r in rows_) \
            and all(r.get("serving") == plan["version"] for r in rows_ if r["role"] == "receiver"):
        # Every node's own end-of-push report (its agent read CURRENT on its disk) says it serves
        # the version: that is the read-back; a round trip more would only cost the hot path.
        for r in rows_:
            r["read_back"] = True
    else:
        await _read_back(client, plan, targets, nodes)

    dead = [r.get("node") or r["agent"] for r in nodes.values() if r.get("outcome") in ("died", "unreachable")]
    for r in nodes.values():
        r.pop("abort_sent", None)
        if dead and r.get("outcome") not in ("committed", "died", "unreachable"):
            # Stopped by this pusher (perhaps naming a peer that saw the loss first) or by its own
            # transport error: either way, because of the node(s) that went, which the note names.
            r["note"] = f"stopped: {', '.join(dead)} {'is' if len(dead) == 1 else 'are'} gone"
    rows = list(nodes.values())
    receivers = [r for r in rows if r["role"] == "receiver"]
    for r in rows:
        r.setdefault("outcome", "not started")
    # Read back, not inferred: every receiver serves this version by its own account.
    serving_it = [r for r in receivers if r.get("read_back") and r.get("serving") == plan["version"]]
    decided = any(r.get("decision") for r in rows) or bool(serving_it)
    state = ("committed" if len(serving_it) == len(receivers) else "split" if decided else
             "not committed" if all(r.get("read_back") for r in receivers) else "unknown")
    ok = state == "committed" and all(r["outcome"] == "committed" for r in rows)
    transfer = max((float((r.get("phases") or {}).get("transfer") or 0) for r in rows), default=0.0)
    return {"schema": SCHEMA, "ok": ok, "push_id": push_id, "version": plan["version"], "model": plan["model"],
            "total_bytes": plan["total_bytes"], "warm": warm, "seconds": round(wall, 4), "started_at": started_at,
            "timeline": {k: round(v - started_at, 4) for k, v in marks.items()},
            "start_to_end_s": round(end - t_start, 4), "transfer_s": round(transfer, 4),
            "receivers": len(receivers), "state": state, "resume": _resume_command(args) if state != "committed" else None,
            "nodes": rows}


def _text(value: Any, limit: int = 300) -> str:
    """A string from an agent, fit for a terminal (core.terminal_text.clean: whole ESC sequences and
    control/format characters removed, one line), bounded."""
    return clean(str(value if value is not None else ""), limit)


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) and value else None


def _staged(value: Any) -> list[dict[str, Any]]:
    """An agent's list of staged copies, keeping only well-formed entries (bounded)."""
    if not isinstance(value, list):
        return []
    return [{"version": _text(v.get("version"), 128), "prepared": v.get("prepared") is True,
             "decided": v.get("decided") is True} for v in value[:16] if isinstance(v, dict)]


def _resume_command(args: argparse.Namespace) -> str:
    """The exact command that finishes (or settles) this push: the same plan and agents, --resume."""
    import shlex

    extra = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("token_file", "cacert") if getattr(args, k, None)]
    return shlex.join(["hwtui", "push", "--plan", args.plan, "--agents", args.agents, *extra, "--resume"])


def run(args: argparse.Namespace) -> int:
    from hwtui.app.commands.agents import client_settings
    from hwtui.app.node_api.client import parse_agents

    targets = parse_agents(args.agents)
    if len(targets) < 2:
        raise HwtuiError("--agents needs a source and at least one receiver")
    for name in ("timeout", "init_timeout", "deadline"):
        v = getattr(args, name)
        if v is None:
            continue
        if not 0 < v <= MAX_TIMEOUT_S:
            raise HwtuiError(f"--{name.replace('_', '-')} {v}: expected 0 to {MAX_TIMEOUT_S:g} seconds")
    if not 1 <= args.inflight <= MAX_WINDOW or not 1 <= args.chunk_mb <= MAX_CHUNK_MB:
        raise HwtuiError(f"--inflight is 1 to {MAX_WINDOW} and --chunk-mb 1 to {MAX_CHUNK_MB:g}")
    plan_bytes = _plan_payload(args.plan)
    plan = _plan_facts(plan_bytes, args.plan)
    token, verify = client_settings(args)
    if args.deadline is None:
        args.deadline = args.init_timeout + 120 + 60 * plan["total_bytes"] / 1e9
    doc = asyncio.run(push(args, plan_bytes, plan, targets, token, verify))
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in doc["nodes"]:
            what = r["outcome"] + (f" ({r['how']})" if r.get("how") else "") + \
                (f", serves {r.get('serving') or 'nothing'}" if r.get("read_back") else ", state unknown")
            err = "; ".join(([r["note"]] if r.get("note") else [])
                            + (r.get("failures") or ([r["error"]] if r.get("error") else [])))
            print(_text(f"  {r.get('node', r['agent']):<16} rank {r['rank']} {r['role']:<8} {what}"
                        + (f" ({err[:200]})" if err else ""), 1000))
        print(_text(final_line(doc), 100_000))
    if doc["ok"]:
        return EXIT_OK
    if any(r.get("status") == 400 for r in doc["nodes"]):
        return EXIT_USAGE
    return EXIT_FAILED


def _plan_payload(path: str) -> bytes:
    """The plan file's own bytes: the agents load exactly the file that was validated here, and
    refuse it if its digest is not the validated one (a file replaced between the two reads
    included). Bounded by what an agent accepts as one plan (``MAX_PLAN_BYTES``)."""
    from hwtui.engine.resident import resident

    try:
        with open(path, "rb") as fh:
            raw = fh.read(resident.MAX_PLAN_BYTES)
            if fh.read(1):
                raise HwtuiError(f"plan {path} is larger than an agent accepts ({resident.MAX_PLAN_BYTES >> 20} MiB)")
    except OSError as exc:
        raise HwtuiError(f"cannot read plan {path}: {exc.strerror or exc}") from None
    return raw


def _plan_facts(raw: bytes, path: str) -> dict[str, Any]:
    """What the pusher needs from a plan file (digest, model, version, total bytes), read from its
    header alone: no numpy, no tables (0.3-0.4 s of every push's start-up). The plan is validated
    where its weights are, by the source's agent, when it is uploaded (``validate=1``) and before
    any rank starts; every agent checks that the bytes are this digest."""
    import struct

    try:
        if raw[:8] == b"HWTPLAN2":  # hwtui.plan/2: magic, u64 header length, JSON header (plan_format.py)
            (hlen,) = struct.unpack("<Q", raw[8:16])
            head = json.loads(raw[16:16 + hlen]) if 16 + hlen <= len(raw) else None
        else:  # an hwtui.plan/1 JSON plan
            head = json.loads(raw)
    except (ValueError, struct.error, RecursionError):
        head = None
    if not isinstance(head, dict) or (raw[:8] != b"HWTPLAN2" and head.get("schema") != "hwtui.plan/1"):
        raise HwtuiError(f"plan {path} is not an hwtui plan (write one with `hwtui plan`)")
    facts = {k: head.get(k) for k in ("digest", "model", "version", "total_bytes")}
    if not (isinstance(facts["digest"], str) and isinstance(facts["version"], str) and type(facts["total_bytes"]) is int
            and facts["total_bytes"] >= 0):
        raise HwtuiError(f"plan {path} is malformed: its header lacks a digest, version or total_bytes")
    return facts


def final_line(doc: dict[str, Any]) -> str:
    """The push's outcome in one line, from what the nodes said they serve when read back at the end."""
    v = doc["version"]
    if doc["ok"]:
        return (f"pushed {v} to {doc['receivers']} receiver(s): all committed "
                f"({'warm' if doc['warm'] else 'new process group'}), {doc['seconds']:.2f} s end to end, "
                f"transfer {doc['transfer_s']:.2f} s")

    def name(r: dict[str, Any]) -> str:
        return str(r.get("node") or r["agent"])

    bad = ", ".join(f"{name(r)} {r['outcome']}" for r in doc["nodes"] if r["outcome"] != "committed")
    holds = ", ".join(
        (f"{name(r)} serves {r.get('serving') or 'nothing'}" if r.get("read_back")
         else f"{name(r)} unknown ({r.get('read_error') or 'not read'})")
        for r in doc["nodes"] if r["role"] == "receiver" or not r.get("read_back"))
    state = doc.get("state")
    if state == "committed":
        return f"push of {v}: every receiver serves {v} (read back: {holds}); but {bad}"
    if state == "split":
        return f"push of {v} is SPLIT (decided, not switched everywhere; read back: {holds}); finish it with: {doc['resume']}"
    if state == "not committed":
        return f"push of {v} FAILED: {bad}; nothing committed (read back: {holds})"
    return (f"push of {v} FAILED: {bad}; not every node could be read back ({holds}); "
            f"once they answer, settle it with: {doc['resume']}")
