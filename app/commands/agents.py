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

from hwtui.core.errors import EXIT_FAILED, EXIT_OK, HwtuiError

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


def add_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token-file", metavar="FILE", help="the agents' bearer token (default: $HWTUI_AGENT_TOKEN, "
                   "else $XDG_CONFIG_HOME/hwtui/agent.token)")
    p.add_argument("--cacert", metavar="PEM", help="CA bundle that signed the agents' certificates (https)")


def client_settings(args: argparse.Namespace) -> tuple[str | None, Any]:
    """(token, httpx ``verify``: True for the system CAs, or an SSL context trusting --cacert)."""
    from hwtui.app.agent.token import client_token

    verify: Any = True
    if getattr(args, "cacert", None):
        import ssl

        try:
            verify = ssl.create_default_context(cafile=args.cacert)
        except (OSError, ssl.SSLError) as exc:
            raise HwtuiError(f"--cacert {args.cacert}: {exc}") from None
    return client_token(getattr(args, "token_file", None)), verify


def _util(d: dict[str, Any]) -> str:
    return "-" if d.get("util") is None else f"{d['util']:.0f}%"


def _line(n: dict[str, Any]) -> str:
    if n["stale"]:
        age = "never answered" if n["age_s"] is None else f"last answer {n['age_s']:.1f} s ago"
        return f"{n['node']:<16} STALE  {age}: {n['error'] or 'no fresh answer'}"
    devs = [d for d in n["devices"] if d.get("device") != "cpu"]
    parts = []
    for d in devs:
        mem = "-" if not d.get("mem_total") else f"{(d.get('mem_used') or 0) / 2**30:.1f}/{d['mem_total'] / 2**30:.0f}G"
        parts.append(f"{d['device']} {_util(d)} {mem}")
    rep = n["replication"] or {}
    flight = rep.get("in_flight") or {}
    ver = f" serving {rep.get('serving')}" if rep.get("serving") else ""
    if flight:
        ver += f", pushing {flight.get('version')} {100 * (flight.get('progress') or 0):.0f}%"
    # A node with no accelerator says so, with its CPU's use, instead of "0 device(s)".
    cpu = next((d for d in n["devices"] if d.get("device") == "cpu"), None)
    if not devs and cpu is not None:
        parts = [f"cpu {_util(cpu)}"]
    what = f"{len(devs)} device(s)" if devs else "no accelerator"
    return f"{n['node']:<16} ok     {what}{ver}  {'; '.join(parts)}"


def run(args: argparse.Namespace) -> int:
    from hwtui.app.agent.client import Cluster, Poller, parse_agents

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
                return Cluster(poller.interval, poller.snapshot())
            stop = asyncio.Event()
            task = asyncio.ensure_future(poller.run(stop))
            end = time.monotonic() + args.watch
            while time.monotonic() < end:
                await asyncio.sleep(min(poller.interval, max(0.0, end - time.monotonic())))
                if args.json:
                    print(json.dumps(Cluster(poller.interval, poller.snapshot()).to_dict(), separators=(",", ":")), flush=True)
            stop.set()
            await task
            return Cluster(poller.interval, poller.snapshot())

    cluster = asyncio.run(main())
    if args.json:
        if args.watch is None:
            json.dump(cluster.to_dict(), sys.stdout, indent=2)
            sys.stdout.write("\n")
    else:
        for n in cluster.nodes:
            print(_line(n))
    return EXIT_FAILED if any(n["stale"] for n in cluster.nodes) else EXIT_OK


def compare_agents(docs: list[tuple[Any, dict[str, Any] | None, str | None]]) -> list[Any]:
    """Findings: every unreachable agent (FAIL, named), then the comparison of the nodes that answered."""
    from hwtui.core.finding import fail
    from hwtui.engine.cluster.compare import compare

    findings = []
    reports = []
    for rank, (target, doc, error) in enumerate(docs):
        facts = (doc or {}).get("facts")
        node = (doc or {}).get("node") or target.name
        if not facts:
            why = error or (doc or {}).get("error") or "its facts are not ready yet (torch still importing?)"
            findings.append(fail(f"cluster.agent[{target.name}]", f"agent {target.name} gave no node facts: {why}",
                                 "A node that cannot be compared is a node a job can hang on.",
                                 f"on {target.name}: systemctl status hwtui-agent (or start `hwtui agent`); "
                                 f"curl {target.url}/v1/node", node=target.name))
            continue
        reports.append({**facts, "rank": rank, "local_rank": 0, "world_size": len(docs), "node": node})
    if reports:
        findings.extend(compare(reports))
    return findings


def run_check(args: argparse.Namespace) -> int:
    """``hwtui --check --agents LIST``: compare the nodes from their agents' facts."""
    from hwtui.app.agent.client import fetch_all, parse_agents
    from hwtui.core.finding import Finding, Status, summarize
    from hwtui.core.redact import redact

    if args.only or args.sysroot or args.replay:
        raise HwtuiError("--check --agents compares live nodes: --only, --sysroot and --replay do not apply")
    targets = parse_agents(args.agents)
    token, verify = client_settings(args)
    t = time.monotonic()
    docs = asyncio.run(fetch_all(targets, "/v1/facts", token=token, timeout=10.0, verify=verify))
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
