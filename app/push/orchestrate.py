"""One push, from the pusher's side: replicate a plan's weights into the resident receivers of
running agents.

The first agent listed is the source: it reads the plan's weight files from its own disk. Every
other agent receives, verifies and commits exactly as ``hwtui replicate --commit`` does (the same
worker: xxh3 per bucket, per-tensor checks, a unanimous vote, then the two-phase switch), into the
slot it is not serving. Agents keep torch imported and the process group formed between pushes, so
a second push into the same agents costs little more than its transfer.

The steps, each a method of :class:`_Push`: prepare every agent (and upload the plan beside it);
settle what the nodes already hold of this version (a decided version is finished from the
receivers' staged copies); start every rank at once; follow every node to the end with a long
poll, stopping the others as soon as one is out; then the report (``report.finish_doc``), read
back from the nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from hwtui.app.push.client import PushClient, dict_or_none, refused, text, why
from hwtui.app.push.options import PushOptions
from hwtui.app.push.plan_file import PlanFacts, plan_facts, plan_payload
from hwtui.app.push.report import Run, finish_doc, read_back
from hwtui.core.errors import EXIT_FAILED, EXIT_USAGE, HwtuiError

WAIT_S = 1.0  # one long poll of a node's push state
SILENT_S = 3.0  # a node that answers nothing for this long mid-push has died


def targets_of(agents: str) -> list[Any]:
    """SOURCE,RECEIVER,... -> the node API's targets; one line for anything else (HwtuiError)."""
    from hwtui.app.node_api.client import parse_agents

    targets = parse_agents(agents)
    if len(targets) < 2:
        raise HwtuiError("--agents needs a source and at least one receiver")
    return targets


def run_push(opts: PushOptions, targets: Sequence[Any]) -> dict[str, Any]:
    """Read ``opts.plan`` and push it (blocking): the push's document (schema hwtui.push/1).

    Bad input (an unreadable plan, a bad --cacert, an agent that refuses the request) raises
    HwtuiError; a push that fails or splits is the document's ``ok``/``state``, never an exception."""
    from hwtui.app.node_api.client_options import resolve_client

    raw = plan_payload(opts.plan)
    plan = plan_facts(raw, opts.plan)
    token, verify = resolve_client(opts.token_file, opts.cacert)
    return asyncio.run(push(opts, raw, plan, list(targets), token, verify))


async def push(opts: PushOptions, plan_bytes: bytes, plan: PlanFacts, targets: list[Any], token: str | None,
               verify: Any) -> dict[str, Any]:
    from hwtui.app.node_api.client import tls_verify

    client = PushClient(token, tls_verify(targets, verify))
    try:
        await client.load_transport()
        return await _Push(opts, plan_bytes, plan, targets, client).run()
    finally:
        await client.aclose()


def device_settings(prepared: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Into agents that all keep the served version on a GPU (``hwtui agent --device cuda``) a push
    moves device buffers: CUDA IPC inside one node, NCCL across nodes (the agents' ``host`` answers
    count the nodes). Anything else moves through host memory and each GPU-resident receiver copies
    its verified bytes onto its GPU."""
    if not prepared or any(d.get("device") != "cuda" for d in prepared):
        return {}
    hosts = {d.get("host") for d in prepared}
    nodes = len(prepared) if None in hosts else len(hosts)
    return {"device": "cuda", "nodes": nodes}


def _refusal(t: Any, status: int, doc: dict[str, Any]) -> HwtuiError:
    """One line for an agent's refusal, the same whichever of the first requests meets it."""
    if status == 401:
        return HwtuiError(f"agent {t.name} refused the token (HWTUI_AGENT_TOKEN or --token-file)")
    if status == 404:
        return HwtuiError(f"agent {t.name} takes no pushes: start it with --out DIR")
    error = doc.get("error")
    # 507: the node's disk is full (or unwritable): not bad input, a node that failed.
    return HwtuiError(f"agent {t.name}: {error or f'HTTP {status}'}", EXIT_FAILED if status == 507 else EXIT_USAGE)


def _first_error(errors: list[BaseException]) -> BaseException:
    """The same answer whatever order the requests ended in: an unreachable agent first, then a
    refused token, then anything else, each in the order the agents are listed."""
    def rank(e: BaseException) -> int:
        msg = str(e)
        return 0 if "unreachable" in msg else 1 if "refused the token" in msg else 2

    return min(errors, key=rank)


class _Push:
    def __init__(self, opts: PushOptions, plan_bytes: bytes, plan: PlanFacts, targets: list[Any], client: PushClient):
        self.opts, self.plan_bytes, self.plan, self.targets, self.client = opts, plan_bytes, plan, targets, client
        self.t0 = time.monotonic()
        self.deadline_s = opts.deadline_for(plan["total_bytes"])
        self.run_ = Run(push_id=f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}", started_at=time.time(),
                        t0=self.t0, marks={"client": time.time()},  # when the pusher's own steps ended
                        nodes={t.url: {"agent": t.name, "rank": i, "role": "source" if i == 0 else "receiver"}
                               for i, t in enumerate(targets)})
        self.nodes = self.run_.nodes
        self.world_key = ",".join(t.url for t in targets)
        self.group = list(targets)
        self.prepared: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    def url(self, t: Any, route: str) -> str:
        return f"{t.url}/v1/push/{route}"

    # -- 1. prepare ------------------------------------------------------------------------------
    async def prepare(self, t: Any, key: str) -> dict[str, Any]:
        """Can the agent reuse its group for exactly this world? Any "no" forms a fresh one everywhere."""
        try:
            status, doc = await self.client.post(self.url(t, "prepare"), {"world_key": key, "version": self.plan["version"]},
                                                 timeout=10)
        except Exception as exc:  # noqa: BLE001
            raise HwtuiError(f"agent {t.name} is unreachable: {why(exc)}") from None
        if status != 200:
            raise _refusal(t, status, doc)
        return doc

    async def upload(self, t: Any) -> None:
        """The plan goes to every agent as its file's raw bytes, streamed (POST /v1/push/plan, named
        by its digest), beside the prepare: a plan of any size, and no extra round trip. The
        source's agent validates it (validate=1) before any rank starts."""
        query = {"digest": self.plan["digest"], **({"validate": "1"} if t is self.targets[0] else {})}
        try:
            status, doc = await self.client.post_bytes(self.url(t, "plan"), query, self.plan_bytes,
                                                       timeout=30 + len(self.plan_bytes) / (4 << 20))
        except Exception as exc:  # noqa: BLE001
            raise HwtuiError(f"agent {t.name} is unreachable: {why(exc)}") from None
        if status != 200:
            raise _refusal(t, status, doc)

    async def prepare_all(self) -> None:
        answers = await asyncio.gather(*(self.prepare(t, self.world_key) for t in self.targets),
                                       *(self.upload(t) for t in self.targets), return_exceptions=True)
        errors = [a for a in answers if isinstance(a, BaseException)]
        if errors:
            raise _first_error(errors)
        self.prepared = [a for a in answers[:len(self.targets)] if isinstance(a, dict)]
        self.run_.marks["prepared"] = time.time()
        busy = [t.name for t, d in zip(self.targets, self.prepared, strict=True) if d.get("busy")]
        if busy:
            raise HwtuiError(f"agent(s) {', '.join(busy)} are busy with another push; try again when it ends")
        await self.wait_for_holds()
        for t, d in zip(self.targets, self.prepared, strict=True):
            self.nodes[t.url].update(node=text(d.get("node") or t.name, 64),
                                     before=text(d.get("serving"), 128) if isinstance(d.get("serving"), str) else None)

    async def wait_for_holds(self) -> None:
        """A GPU-resident receiver whose next slot a serving process still holds (slot_holds) would
        refuse the push at its start: say so now, before any rank starts, or wait up to
        ``--wait-holds`` seconds, asking again each second, for the consumers to let go."""
        deadline = time.monotonic() + self.opts.wait_holds
        told = False
        while True:
            # Receivers only (the source stages no slot), and not one that serves this version already.
            held = [(i, t) for i, (t, d) in enumerate(zip(self.targets, self.prepared, strict=True))
                    if i > 0 and isinstance(d.get("slot_held"), str) and d.get("serving") != self.plan["version"]]
            if not held:
                return
            if time.monotonic() >= deadline:
                i, t = held[0]
                waited = f" (waited {self.opts.wait_holds:g} s)" if self.opts.wait_holds else ""
                node = text(self.prepared[i].get("node") or t.name, 64)
                raise HwtuiError(f"agent {t.name} ({node}): {text(self.prepared[i]['slot_held'], 400)}{waited}",
                                 EXIT_FAILED)
            if not told:
                # On stderr: --json's document stays the only thing on stdout.
                names = ", ".join(t.name for _, t in held)
                print(f"hwtui push: waiting up to {self.opts.wait_holds:g} s for the serving processes that hold the "
                      f"next device slot on {names} to release it", file=sys.stderr, flush=True)
                told = True
            await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            answers = await asyncio.gather(*(self.prepare(t, self.world_key) for _, t in held))
            for (i, _), answer in zip(held, answers, strict=True):
                self.prepared[i] = answer

    # -- 1b. settle what the nodes hold ----------------------------------------------------------
    async def settle(self) -> dict[str, Any] | None:
        """What the nodes already hold of this version, read from them. The source's decision record
        is the authority: a decided version is finished on the receivers that missed its switch
        (from their verified staged copy, without moving a byte), a receiver that serves it already
        is left alone, and only the rest receive it (again). Returns the source's decision."""
        plan = self.plan
        decision = dict_or_none(self.prepared[0].get("decision"))
        if decision and decision.get("plan_digest") != plan["digest"]:
            raise HwtuiError(f"version {plan['version']!r} was committed from another plan "
                             f"({text(decision.get('plan_digest'), 16)}) on source {self.targets[0].name}; "
                             "plan a new version")
        for t, d in zip(self.targets[1:], self.prepared[1:], strict=True):
            if d.get("serving") != plan["version"]:
                continue
            if d.get("serving_digest") != plan["digest"]:
                raise HwtuiError(f"agent {t.name} already serves version {plan['version']!r} from another plan; "
                                 "plan a new version")
            self.nodes[t.url].update(outcome="committed", how="already served it")
            self.group.remove(t)
        if self.opts.resume and len(self.group) > 1 and not decision:
            await read_back(self.client, plan, self.targets, self.nodes)  # undecided copies it finds are removed
            raise HwtuiError(f"nothing to resume: version {plan['version']!r} was never decided on source "
                             f"{self.targets[0].name} (push it again without --resume)")
        if decision and len(self.group) > 1:
            await self.finish_decided()
        return decision

    async def finish_one(self, t: Any) -> None:
        body = {"version": self.plan["version"], "plan_digest": self.plan["digest"], "decision": "commit"}
        try:
            status, doc = await self.client.post(self.url(t, "resolve"), body, timeout=600)
        except Exception as exc:  # noqa: BLE001 - it receives the version again, or is named below
            self.nodes[t.url]["note"] = f"could not finish the decided switch: {why(exc)}"
            return
        if status == 200 and doc.get("done") is True:
            self.nodes[t.url].update(outcome="committed", how=text(doc.get("what")))
            self.group.remove(t)
        elif status == 200:
            self.nodes[t.url].update(note=text(doc.get("what")), moved_on=doc.get("moved_on") is True)

    async def finish_decided(self) -> None:
        await asyncio.gather(*(self.finish_one(t) for t in list(self.group[1:])))
        moved_on = [t.name for t in self.group[1:] if self.nodes[t.url].get("moved_on")]
        if moved_on:
            raise HwtuiError(f"agent(s) {', '.join(moved_on)} served version {self.plan['version']!r} before and moved "
                             "on; going back is a new version: plan one")

    async def narrow(self) -> None:
        """The world of this push: the source and the receivers that still need the bytes."""
        self.run_.marks["settled"] = time.time()
        if 1 < len(self.group) < len(self.targets):
            self.world_key = ",".join(t.url for t in self.group)
            self.prepared = list(await asyncio.gather(*(self.prepare(t, self.world_key) for t in self.group)))
        elif len(self.group) == 1:  # nothing to send: every receiver serves it (now)
            self.nodes[self.targets[0].url].update(outcome="committed", how="nothing left to send")
            self.group, self.prepared = [], []
        self.run_.warm = bool(self.prepared) and all(d.get("warm") for d in self.prepared)

    # -- 2. start --------------------------------------------------------------------------------
    def master(self) -> tuple[str, int]:
        master, port = str(self.prepared[0].get("advertise") or ""), int(self.prepared[0]["port"])
        if master in ("", "0.0.0.0", "::"):  # noqa: S104 - a wildcard listener: reach it where we reached its agent
            from urllib.parse import urlsplit

            master = urlsplit(self.group[0].url).hostname or master
        return master, port

    async def start_one(self, i: int, t: Any, master: str, port: int) -> None:
        body = {"push_id": self.run_.push_id, "rank": i, "world_size": len(self.group), "world_key": self.world_key,
                "master_addr": master, "master_port": port, "fresh": not self.run_.warm,
                "plan_digest": self.plan["digest"], "settings": {**self.opts.rank_settings(), **device_settings(self.prepared)}}
        try:
            status, doc = await self.client.post(self.url(t, "start"), body, timeout=180)
        except Exception as exc:  # noqa: BLE001
            self.nodes[t.url].update(outcome="unreachable", error=why(exc))
            return
        if status != 200:
            self.nodes[t.url].update(outcome="refused", error=doc.get("error") or f"HTTP {status}", status=status)

    async def start_all(self) -> None:
        """Every rank at once (a fresh group forms only when all of them are in it)."""
        master, port = self.master()
        self.run_.t_start = time.monotonic()
        await asyncio.gather(*(self.start_one(i, t, master, port) for i, t in enumerate(self.group)))
        self.run_.marks["started"] = time.time()

    # -- 3. follow -------------------------------------------------------------------------------
    async def poll(self, t: Any) -> dict[str, Any]:
        node = self.nodes[t.url]
        status, doc = await self.client.post(self.url(t, "wait"),
                                             {"push_id": self.run_.push_id, "phase": node.get("phase"), "timeout": WAIT_S},
                                             timeout=WAIT_S + SILENT_S)
        if status != 200:
            raise RuntimeError(doc.get("error") or f"HTTP {status}")
        return doc

    def absorb(self, node: dict[str, Any], doc: dict[str, Any]) -> None:
        """One answer of a node's long poll: its phase and progress, or how the push ended there."""
        push_id = self.run_.push_id
        last, flight = doc.get("last") or {}, doc.get("in_flight") or {}
        if flight.get("push_id") == push_id:
            node["progress"] = flight.get("progress")
            node["phase"] = flight.get("phase")
        elif last.get("push_id") == push_id:
            self.run_.marks[f"seen_{node['rank']}"] = time.time()  # this node's end, as the pusher learnt it
            node.update(outcome=last.get("outcome"), serving=last.get("serving"), phases=last.get("phases"),
                        failures=last.get("failures"), warm=last.get("warm"), timeline=last.get("timeline"))
        else:  # neither in flight nor ended there: the agent lost it (restarted)
            node.update(outcome="died", error="the agent no longer knows this push (restarted?)")

    async def follow(self, t: Any) -> None:
        """One node to the end of this push, with a long poll (/v1/push/wait answers when the node's
        phase changes or the push ends there): no polling interval in the end-to-end time, and one
        request a second per node instead of twenty, which a loaded node's transfer would pay for.
        A node that stops answering for SILENT_S is named."""
        node = self.nodes[t.url]
        silent_since: float | None = None
        while "outcome" not in node:
            try:
                doc = await self.poll(t)
            except Exception as exc:  # noqa: BLE001
                silent_since = silent_since or time.monotonic()
                # A connection refused mid-push is an agent that is gone (its resident rank dies
                # with it): named at once. Silence (a host down, a partition) gets SILENT_S.
                if refused(exc) or time.monotonic() - silent_since > SILENT_S:
                    node.update(outcome="died", error=f"stopped answering mid-push ({why(exc)})")
                    self.changed.set()
                    return
                await asyncio.sleep(0.2)
                continue
            silent_since = None
            self.absorb(node, doc)
            self.changed.set()

    async def abort(self, t: Any, reason: str) -> None:
        with contextlib.suppress(Exception):  # followed (and named) like any other node
            await self.client.post(self.url(t, "abort"), {"push_id": self.run_.push_id, "reason": reason}, timeout=15)

    async def stop_the_rest(self) -> None:
        """This push can no longer commit (the vote needs every rank): the others are stopped now
        instead of waiting out their timeouts. A rank already past the vote ("committing") is left
        to finish; its agent refuses to stop it anyway."""
        out = [t for t in self.group if self.nodes[t.url].get("outcome") not in (None, "committed")]
        if not out:
            return
        now = time.monotonic()
        stoppable = [t for t in self.group if "outcome" not in self.nodes[t.url]
                     and now - self.nodes[t.url].get("abort_sent", -1e9) > 5.0  # again if the first was missed
                     and self.nodes[t.url].get("phase") != "committing"]
        # A node that went is the cause; a node that failed may only have seen it go first.
        out.sort(key=lambda t: self.nodes[t.url]["outcome"] not in ("died", "unreachable"))
        first = self.nodes[out[0].url]
        reason = f"{first.get('node') or out[0].name} {first['outcome']}"
        for t in stoppable:
            self.nodes[t.url]["abort_sent"] = now
            self.nodes[t.url].setdefault("note", f"stopped: {reason}")
        await asyncio.gather(*(self.abort(t, reason) for t in stoppable))

    async def follow_all(self) -> None:
        """Every node on its own task; any node out of the push stops the ones still before the vote."""
        deadline = self.t0 + self.deadline_s
        followers = [asyncio.ensure_future(self.follow(t)) for t in self.group if "outcome" not in self.nodes[t.url]]
        self.changed.set()
        try:
            while any(not f.done() for f in followers) and time.monotonic() < deadline:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                self.changed.clear()
                await self.stop_the_rest()
        finally:
            for f in followers:
                f.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
        late = [t for t in self.group if "outcome" not in self.nodes[t.url]]
        # Past the deadline: stop the push where it still runs, so no rank waits on it any longer.
        reason = f"the push passed its deadline ({self.deadline_s:g} s)"
        await asyncio.gather(*(self.abort(t, reason) for t in late))
        for t in late:
            self.nodes[t.url]["outcome"] = "timed out"

    # -- the whole push --------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        await self.prepare_all()
        await self.settle()
        await self.narrow()
        if not self.group:
            self.run_.t_start = time.monotonic()
            return await finish_doc(self.opts, self.client, self.plan, self.targets, self.run_)
        await self.start_all()
        await self.follow_all()
        return await finish_doc(self.opts, self.client, self.plan, self.targets, self.run_)


def preflight(opts: PushOptions, targets: Sequence[Any]) -> None:
    """Before anything is trained or written for ``--push-to``: every agent answers, takes this
    token and takes pushes (``--out``). Read-only (a prepare that names no version, as the
    read-back does); the first refusal is one line (HwtuiError, exit 2), as ``hwtui push`` says it."""
    from hwtui.app.node_api.client import tls_verify
    from hwtui.app.node_api.client_options import resolve_client

    token, verify = resolve_client(opts.token_file, opts.cacert)

    async def ask(client: PushClient, t: Any) -> None:
        try:
            status, doc = await client.post(f"{t.url}/v1/push/prepare", {"world_key": "preflight"}, timeout=10)
        except Exception as exc:  # noqa: BLE001
            raise HwtuiError(f"agent {t.name} is unreachable: {why(exc)}") from None
        if status != 200:
            raise _refusal(t, status, doc)

    async def main() -> None:
        client = PushClient(token, tls_verify(targets, verify))
        try:
            answers = await asyncio.gather(*(ask(client, t) for t in targets), return_exceptions=True)
        finally:
            await client.aclose()
        errors = [a for a in answers if isinstance(a, BaseException)]
        if errors:
            raise _first_error(errors)

    asyncio.run(main())
