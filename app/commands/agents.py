"""``hwtui agents``: every node's agent, polled at once (headless cluster view), and
``hwtui --check --agents ...``: the nodes compared the way ``cluster test`` compares them, without a launcher.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from hwtui.app.node_api.client_options import add_client_options, client_settings
from hwtui.core.errors import EXIT_FAILED, EXIT_OK, HwtuiError
from hwtui.core.terminal_text import clean
from hwtui.engine.resident.summary import Device, NodeStatus

HELP = "poll the node agents (`hwtui agent`) of a cluster: devices, samples, versions served, stale nodes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", metavar="LIST", required=True,
                   help="comma list of agents: HOST[:PORT] (default port 9477), https://HOST:PORT for TLS")
    p.add_argument("--json", action="store_true", help="print one JSON document (schema hwtui.agents/1)")
    p.add_argument("--watch", type=float, default=None, metavar="S",
                   help="keep polling for S seconds at the adaptive interval, then print (JSON lines with --json)")
    p.add_argument("--interval", type=float, default=None, metavar="S",
                   help="seconds between two polls of one node (default: adapts to the number of nodes)")
    add_client_options(p)


def _num(value: float | None, field: str, unknown: tuple[str, ...], fmt: str) -> str:
    """A checked figure: ``?`` when the agent sent an invalid one, ``-`` when it sent none."""
    if field in unknown:
        return "?"
    return "-" if value is None else format(value, fmt)


def _util(d: Device) -> str:
    u = _num(d.util, "util", d.unknown, ".0f")
    return u if u in ("?", "-") else f"{u}%"


def _line(n: NodeStatus) -> str:
    """One node's line. Every string in a NodeStatus is already clean (engine.resident.summary); the
    line is cleaned once more as a whole, so nothing built here can reach the terminal as a control."""
    return clean(_compose(n))


def _host(n: NodeStatus) -> str:
    """``host cpu 12% mem 16.0/64G``: the node's CPU and memory (``?``: the agent sent none valid)."""
    h = n.host
    if h is None:
        return "host cpu ? mem ?"
    if "mem_total" in h.unknown or "mem_used" in h.unknown:
        mem = "?"
    elif not h.mem_total:
        mem = "-"
    else:
        mem = f"{'?' if h.mem_used is None else f'{h.mem_used / 2**30:.1f}'}/{h.mem_total / 2**30:.0f}G"
    return f"host cpu {_util(h)} mem {mem}"


def _device_served(n: NodeStatus) -> str:
    """`` on cuda:0 slot A, 2 hold(s) on v5, the last ends in 280 s``: where a GPU-resident node
    serves from and what serving processes hold (a push that would land in a held slot is refused
    there); ``""`` for host memory."""
    d = n.replication.device
    if d is None:
        return ""
    out = f" on {d.device or '?'}" + (f" slot {d.slot}" if d.slot else "")
    if "replication.device.holds" in n.unknown:
        out += ", holds ?"
    elif d.holds:
        left = "" if d.hold_left_s is None else f", the last ends in {d.hold_left_s:.0f} s"
        out += f", {d.holds} hold(s) on {', '.join(d.held)}{left}"
    if d.error:
        out += f", device error: {d.error}"
    pending, p = n.replication.disk_pending, n.replication.persist
    if pending == "writing":
        out += f", writing {n.replication.serving} to disk"
    elif pending == "failed" and p is not None:
        out += f", its disk copy FAILED: {p.error or '?'}"
    elif pending == "superseded":
        out += ", its disk write stopped for a newer push (not on its disk)"
    return out


def _compose(n: NodeStatus) -> str:
    if not n.answered:
        if n.age_s is None:
            tried = "" if n.tried_s is None else f", tried for {n.tried_s:.1f} s"
            return f"{n.node:<16} STALE  never answered{tried}: {n.error or 'no answer yet'}"
        return f"{n.node:<16} STALE  last answer {n.age_s:.1f} s ago: {n.error or 'no fresh answer'}"
    devs = [d for d in n.devices if not d.is_cpu]
    parts = []
    for d in devs:
        if "mem_total" in d.unknown or "mem_used" in d.unknown:
            mem = "?"
        elif not d.mem_total:
            mem = "-"
        else:
            mem = f"{(d.mem_used or 0) / 2**30:.1f}/{d.mem_total / 2**30:.0f}G"
        parts.append(f"{d.device or '?'} {_util(d)} {mem}")
    rep = n.replication
    unknown = n.unknown
    flight = rep.in_flight
    ver = " serving ?" if "replication.serving" in unknown else (f" serving {rep.serving}" if rep.serving else "")
    ver += _device_served(n)
    if flight is not None:
        pct = "?" if flight.progress is None else f"{100 * flight.progress:.0f}%"
        ver += f", pushing {flight.version or '?'} {pct}"
    what = f"{len(devs)} device(s)" if devs else ("devices unknown" if "devices" in unknown else "no accelerator")
    extra = f"  ({len(unknown)} unknown field(s))" if unknown else ""
    values = f"{what}{ver}  {_host(n)}" + (f"; {'; '.join(parts)}" if parts else "") + extra
    if n.stale:
        # The last values stay: what the node was doing when it went quiet, said to be that old.
        age = "?" if n.age_s is None else f"{n.age_s:.1f} s"
        return f"{n.node:<16} STALE  last answer {age} ago ({n.error or 'no fresh answer'}), then: {values}"
    return f"{n.node:<16} ok     {values}"


def run(args: argparse.Namespace) -> int:
    from hwtui.app.node_api.client import Cluster, Poller, parse_agents

    targets = parse_agents(args.agents)
    if args.interval is not None and not 0.05 <= args.interval <= 3600:
        raise HwtuiError(f"--interval {args.interval}: choose between 0.05 and 3600 seconds")
    if args.watch is not None and not 0 < args.watch <= 86400:
        raise HwtuiError(f"--watch {args.watch}: choose between 0 and 86400 seconds")
    token, verify = client_settings(args)

    async def main() -> Cluster:
        async with Poller(targets, token=token, interval=args.interval, verify=verify) as poller:
            if args.watch is None:
                await poller.round()
                return Cluster(poller.interval, poller.statuses())
            stop = asyncio.Event()
            task = asyncio.ensure_future(poller.run(stop))
            end = time.monotonic() + args.watch
            while time.monotonic() < end:
                await asyncio.sleep(min(poller.interval, max(0.0, end - time.monotonic())))
                if args.json:
                    print(json.dumps(Cluster(poller.interval, poller.statuses()).to_dict(), separators=(",", ":")), flush=True)
            stop.set()
            await task
            return Cluster(poller.interval, poller.statuses())

    cluster = asyncio.run(main())
    if args.json:
        if args.watch is None:
            json.dump(cluster.to_dict(), sys.stdout, indent=2)
            sys.stdout.write("\n")
    else:
        for n in cluster.nodes:
            print(_line(n))
    return EXIT_FAILED if any(n.stale for n in cluster.nodes) else EXIT_OK


# How long `--check --agents` waits for agents that are still collecting their first facts (the
# first collection imports torch: 30-60 s on a cold node). Beyond it such a node is "starting"
# (WARN), never FAIL: nothing is wrong with it yet.
STARTING_WAIT_S = 90.0
STARTING_POLL_S = 1.0


def _starting(doc: dict[str, Any] | None, error: str | None) -> bool:
    """The agent answered as an agent does while its first collection runs: ``facts`` there and
    null, no value ever produced (``age_s`` null) and no failure. Anything else without facts (an
    empty object, another service) is a failure, not a reason to wait."""
    return (error is None and isinstance(doc, dict) and "facts" in doc and doc["facts"] is None
            and "age_s" in doc and doc["age_s"] is None and doc.get("error") is None)


def compare_agents(docs: list[tuple[Any, dict[str, Any] | None, str | None]]) -> list[Any]:
    """Findings: every unreachable agent (FAIL, named), every agent still starting (WARN), then the
    comparison of the nodes that answered. Each agent's document is untrusted: its facts are
    cleaned (engine.resident.summary.parse_facts) and a rule that still trips on one is an error
    finding naming the rule, never a crash."""
    from hwtui.core.finding import error as error_finding
    from hwtui.core.finding import fail, warn
    from hwtui.engine.cluster.compare import RULES, by_node
    from hwtui.engine.resident.summary import MAX_NAME, parse_facts

    findings = []
    reports = []
    for rank, (target, doc, err) in enumerate(docs):
        doc = doc if isinstance(doc, dict) else None
        facts, malformed = parse_facts((doc or {}).get("facts"))
        raw_node = (doc or {}).get("node")
        node = clean(raw_node, MAX_NAME).strip() if isinstance(raw_node, str) and len(raw_node) <= MAX_NAME else ""
        node = node or target.name
        if facts is None and _starting(doc, err):
            findings.append(warn(f"cluster.agent[{target.name}]",
                                 f"agent {target.name} is starting: its first facts are not collected yet",
                                 "The agent answers, and collects its node facts once at start (importing torch "
                                 "takes a while); the node is compared once they are in.",
                                 "run the check again in a minute", node=target.name))
            continue
        if facts is None:
            agent_error = (doc or {}).get("error")
            why = err or (clean(agent_error, 200) if isinstance(agent_error, str) else "") or "it sent none"
            findings.append(fail(f"cluster.agent[{target.name}]", f"agent {target.name} gave no node facts: {why}",
                                 "A node that cannot be compared is a node a job can hang on.",
                                 f"on {target.name}: systemctl status hwtui-agent (or start `hwtui agent`); "
                                 f"curl {target.url}/v1/node", node=target.name))
            continue
        if malformed:
            findings.append(warn(f"cluster.agent_facts[{target.name}]",
                                 f"agent {target.name} sent malformed facts: {', '.join(malformed)} (not compared)",
                                 "Each of these should be an object; the agent is not a current hwtui agent, or "
                                 "not one at all.", f"on {target.name}: hwtui --version; systemctl status hwtui-agent",
                                 node=target.name))
        reports.append({**facts, "rank": rank, "local_rank": 0, "world_size": len(docs), "node": node})
    if reports:
        nodes = by_node(reports)
        for rule in RULES:
            try:
                findings.extend(rule(nodes))
            except Exception as exc:  # noqa: BLE001 - an agent's odd facts cost this rule, not the check
                name = rule.__name__.removeprefix("rule_")
                findings.append(error_finding(f"cluster.compare[{name}]",
                                              f"the nodes' {name} could not be compared: an agent sent facts of "
                                              f"an unexpected shape ({type(exc).__name__})",
                                              "", "curl each agent's /v1/facts and look for the odd one"))
    return findings


async def _fetch_facts(targets: list[Any], token: str | None, verify: Any,
                       wait: float) -> list[tuple[Any, dict[str, Any] | None, str | None]]:
    """Every agent's /v1/facts; agents still collecting their first facts are asked again every
    ``STARTING_POLL_S`` until they have them or ``wait`` seconds have passed (bounded)."""
    from hwtui.app.node_api.client import fetch_all

    docs = await fetch_all(targets, "/v1/facts", token=token, timeout=10.0, verify=verify)
    end = time.monotonic() + wait
    said = False
    while True:
        pending = [i for i, (_, doc, err) in enumerate(docs) if _starting(doc, err)]
        left = end - time.monotonic()
        if not pending or left <= 0:
            return docs
        if not said:
            names = ", ".join(docs[i][0].name for i in pending)
            print(f"hwtui: waiting up to {wait:.0f} s for starting agent(s) to collect their facts: {names}",
                  file=sys.stderr, flush=True)
            said = True
        await asyncio.sleep(min(STARTING_POLL_S, left))
        again = await fetch_all([docs[i][0] for i in pending], "/v1/facts", token=token,
                                timeout=min(10.0, max(left, 1.0)), verify=verify)
        for i, got in zip(pending, again, strict=True):
            docs[i] = got


def run_check(args: argparse.Namespace) -> int:
    """``hwtui --check --agents LIST``: compare the nodes from their agents' facts."""
    from hwtui.app.node_api.client import import_httpx, parse_agents
    from hwtui.core.finding import Finding, Status, summarize
    from hwtui.core.redact import redact

    if args.only or args.sysroot or args.replay:
        raise HwtuiError("--check --agents compares live nodes: --only, --sysroot and --replay do not apply")
    targets = parse_agents(args.agents)
    import_httpx()  # a base install: the one-line "needs the agent extra", before anything else
    token, verify = client_settings(args)
    t = time.monotonic()
    docs = asyncio.run(_fetch_facts(targets, token, verify, STARTING_WAIT_S))
    findings = [Finding.from_dict(redact(f.to_dict())) for f in compare_agents(docs)]
    duration = time.monotonic() - t
    if args.junit:
        from hwtui.app.output.junit import to_junit
        from hwtui.core.atomic import atomic_write_text

        try:
            atomic_write_text(args.junit, to_junit(findings, duration, strict=args.strict))
        except OSError as exc:
            raise HwtuiError(f"--junit {args.junit}: {exc.strerror or exc}") from None
    where = f"agents {', '.join(t.name for t in targets)}"
    if args.json:
        json.dump({"schema": "hwtui.check/1", "host": {"source": where}, "devices": [],
                   "findings": [f.to_dict() for f in findings], "summary": summarize(findings),
                   "duration_s": round(duration, 3)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from hwtui.app.output.style import Painter, use_color
        from hwtui.app.output.text_report import render

        print(render(findings, summarize(findings), duration, where, Painter(use_color(sys.stdout))))
    bad = {Status.FAIL, Status.ERROR} | ({Status.WARN} if args.strict else set())
    return EXIT_FAILED if any(f.status in bad for f in findings) else EXIT_OK
