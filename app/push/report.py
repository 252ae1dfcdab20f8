"""The push's report: what each node serves as the node itself tells it when the push is over
(read back, never inferred from the push's messages; a node that cannot be read is "unknown").

A version that was decided but not switched everywhere is a split, reported with the command that
finishes it: ``--resume`` (or a re-run of the same push) finishes the switch on the nodes that
missed it from their verified staged copy, and sends the version again to those without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from hwtui.app.push.client import PushClient, dict_or_none, staged, text, why
from hwtui.app.push.options import PushOptions
from hwtui.app.push.plan_file import PlanFacts

SCHEMA = "hwtui.push/1"


@dataclass
class Run:
    """What the orchestration learns while it pushes, handed to :func:`finish_doc`."""

    push_id: str
    started_at: float  # wall clock (the timeline's origin)
    t0: float  # monotonic, at the start
    nodes: dict[str, dict[str, Any]]  # by agent URL, in the order the agents are listed
    marks: dict[str, float] = field(default_factory=dict)  # when the pusher's own steps ended (wall clock)
    warm: bool = False
    t_start: float = 0.0  # monotonic, when the ranks were started


async def read_back(client: PushClient, plan: PlanFacts, targets: list[Any], nodes: dict[str, dict[str, Any]]) -> None:
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
            row.update(read_back=False, serving=None, read_error=why(exc))
            return
        # An agent's answer is untrusted: each field is taken only in the type it must have.
        serving = doc.get("serving")
        row.update(read_back=True, serving=text(serving) if isinstance(serving, str) else None,
                   serving_digest=doc.get("serving_digest") if isinstance(doc.get("serving_digest"), str) else None,
                   decision=dict_or_none(doc.get("decision")), staged=staged(doc.get("staged")),
                   busy=doc.get("busy") is True)

    await asyncio.gather(*(read(t) for t in targets))
    await _discard_undecided(client, plan, targets, nodes)


async def _discard_undecided(client: PushClient, plan: PlanFacts, targets: list[Any],
                             nodes: dict[str, dict[str, Any]]) -> None:
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
                nodes[t.url]["staged"] = staged(doc.get("staged"))

    await asyncio.gather(*(discard(t) for t in undecided))


def _all_said_so(rows: list[dict[str, Any]], version: str) -> bool:
    """Every node's own end-of-push report (its agent read CURRENT on its disk) says it serves the
    version: that is the read-back; a round trip more would only cost the hot path."""
    return all(r.get("outcome") == "committed" and "serving" in r for r in rows) \
        and all(r.get("serving") == version for r in rows if r["role"] == "receiver")


def _note_the_dead(nodes: dict[str, dict[str, Any]]) -> None:
    dead = [r.get("node") or r["agent"] for r in nodes.values() if r.get("outcome") in ("died", "unreachable")]
    for r in nodes.values():
        r.pop("abort_sent", None)
        if dead and r.get("outcome") not in ("committed", "died", "unreachable"):
            # Stopped by this pusher (perhaps naming a peer that saw the loss first) or by its own
            # transport error: either way, because of the node(s) that went, which the note names.
            r["note"] = f"stopped: {', '.join(dead)} {'is' if len(dead) == 1 else 'are'} gone"


def _state(rows: list[dict[str, Any]], version: str) -> str:
    """committed / split / not committed / unknown: read back, not inferred (every receiver serves
    this version by its own account, or some do after a decision, or none, or not all could say)."""
    receivers = [r for r in rows if r["role"] == "receiver"]
    serving_it = [r for r in receivers if r.get("read_back") and r.get("serving") == version]
    decided = any(r.get("decision") for r in rows) or bool(serving_it)
    if len(serving_it) == len(receivers):
        return "committed"
    if decided:
        return "split"
    return "not committed" if all(r.get("read_back") for r in receivers) else "unknown"


async def finish_doc(opts: PushOptions, client: PushClient, plan: PlanFacts, targets: list[Any], run: Run) -> dict[str, Any]:
    end = time.monotonic()
    rows = list(run.nodes.values())
    if _all_said_so(rows, plan["version"]):
        for r in rows:
            r["read_back"] = True
    else:
        await read_back(client, plan, targets, run.nodes)
    _note_the_dead(run.nodes)
    rows = list(run.nodes.values())
    for r in rows:
        r.setdefault("outcome", "not started")
    state = _state(rows, plan["version"])
    ok = state == "committed" and all(r["outcome"] == "committed" for r in rows)
    transfer = max((float((r.get("phases") or {}).get("transfer") or 0) for r in rows), default=0.0)
    return {"schema": SCHEMA, "ok": ok, "push_id": run.push_id, "version": plan["version"], "model": plan["model"],
            "total_bytes": plan["total_bytes"], "warm": run.warm, "seconds": round(end - run.t0, 4),
            "started_at": run.started_at,
            "timeline": {k: round(v - run.started_at, 4) for k, v in run.marks.items()},
            "start_to_end_s": round(end - run.t_start, 4), "transfer_s": round(transfer, 4),
            "receivers": sum(r["role"] == "receiver" for r in rows), "state": state,
            "resume": opts.resume_command() if state != "committed" else None, "nodes": rows}


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


def node_lines(doc: dict[str, Any]) -> list[str]:
    """One line per node: its outcome, what it serves (read back) and why, fit for a terminal."""
    lines = []
    for r in doc["nodes"]:
        what = r["outcome"] + (f" ({r['how']})" if r.get("how") else "") + \
            (f", serves {r.get('serving') or 'nothing'}" if r.get("read_back") else ", state unknown")
        err = "; ".join(([r["note"]] if r.get("note") else [])
                        + (r.get("failures") or ([r["error"]] if r.get("error") else [])))
        lines.append(text(f"  {r.get('node', r['agent']):<16} rank {r['rank']} {r['role']:<8} {what}"
                          + (f" ({err[:200]})" if err else ""), 1000))
    return lines
