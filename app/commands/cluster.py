"""``hwtui cluster``: describe a cluster once (`init`), then prove it works (`test`).

``hwtui cluster init --nodes a=10.0.0.1,b=10.0.0.2 --interface eth0`` writes cluster.json, an env
file per node, per-node torchrun scripts, an mpirun script and a SLURM batch script.
``hwtui cluster preflight`` is what the launch scripts run on each node before joining: the local
checks that would stop it (interface, plugin, store port, torch), each printed with its fix.
``hwtui cluster test`` runs under the launcher on every rank: local check, roll call, all-pairs
reach test, local checks compared across nodes, a correctness all-reduce and a bandwidth sweep.
Exit codes: 0 passed, 1 the cluster failed the test, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine is imported lazily (CLI start-up time)
    from hwtui.engine.cluster.smoke import SmokeOptions
    from hwtui.engine.cluster.spec import ClusterSpec

HELP = "set up a multi-node cluster (init), check a node (preflight), smoke-test it under torchrun/srun/mpirun (test)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subs = parser.add_subparsers(dest="cluster_command", metavar="ACTION")
    init = subs.add_parser("init", help="describe the cluster; write launch commands, env files and a SLURM script",
                           description="Describe the cluster and write cluster.json, env/<node>.env, launch-<node>.sh, "
                                       "launch-mpirun.sh and submit.sbatch into --out.")
    init.add_argument("--nodes", required=True, metavar="LIST",
                      help="comma list of nodes: host names or addresses, or NAME=ADDRESS (e.g. a=10.0.0.1,b=10.0.0.2)")
    init.add_argument("--devices-per-node", type=int, default=1, metavar="N", help="ranks (GPUs) per node (default 1)")
    init.add_argument("--launcher", choices=("torchrun", "slurm", "mpirun", "tpu"), default="torchrun",
                      help="how the test is started (default torchrun with c10d rendezvous)")
    init.add_argument("--interface", metavar="IFACE", help="network interface for NCCL/gloo (NCCL_SOCKET_IFNAME), e.g. eth0")
    init.add_argument("--node-interface", action="append", default=[], metavar="NODE=IFACE",
                      help="a different interface on one node (repeatable)")
    init.add_argument("--master-addr", metavar="ADDR", help="rendezvous address (default: the first node's address)")
    init.add_argument("--master-port", type=int, default=29500, metavar="PORT", help="rendezvous TCP port (default 29500)")
    init.add_argument("--ib-hca", metavar="LIST", help="NCCL_IB_HCA, e.g. mlx5_0,mlx5_1")
    init.add_argument("--tpu-name", metavar="NAME", help="--launcher tpu: the TPU VM (its workers are --nodes, in order)")
    init.add_argument("--zone", metavar="ZONE", help="--launcher tpu: the TPU VM's zone (e.g. us-central2-b)")
    init.add_argument("--project", metavar="PROJECT", help="--launcher tpu: the Google Cloud project (default: gcloud's)")
    init.add_argument("--net-plugin", metavar="PATH", help="NCCL_NET_PLUGIN: absolute path of libnccl-net.so (its "
                                                           "directory is added to LD_LIBRARY_PATH)")
    init.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto", help="process group backend")
    init.add_argument("--python", default=None, metavar="PATH",
                      help="the Python (of the venv with hwtui and torch) on the nodes (default: the interpreter "
                           "running this `cluster init`, so a venv works as it is)")
    init.add_argument("--join-timeout", type=float, default=60.0, metavar="S", help="how long to wait for every node (default 60)")
    init.add_argument("--timeout", type=float, default=60.0, metavar="S", help="timeout of each collective (default 60)")
    init.add_argument("--min-busbw", type=float, metavar="GBPS", help="fail the test below this bus bandwidth (GB/s)")
    init.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra variable for every env file")
    init.add_argument("-o", "--out", default="hwtui-cluster", metavar="DIR", help="output directory (default ./hwtui-cluster)")
    init.add_argument("--force", action="store_true", help="overwrite an existing cluster.json in --out")
    init.add_argument("--json", action="store_true", help="print the description and the launch commands as JSON")

    pre = subs.add_parser("preflight", help="this node's local check before it joins (the launch files run it)",
                          description="Run the checks that would stop this node from joining (NCCL/gloo interface, "
                                      "NCCL net plugin, MASTER_PORT on the store's host, torch in this interpreter). "
                                      "On a failure print each finding with its fix, leave it in the rendezvous store "
                                      "for rank 0 to quote, and exit 1.")
    pre.add_argument("--spec", required=True, metavar="FILE", help="cluster.json from `hwtui cluster init`")
    pre.add_argument("--node", metavar="NAME", help="this node's name (default HWTUI_CLUSTER_NODE, else the host name)")
    pre.add_argument("--hosts-store", action="store_true", help="this node will host the rendezvous store: check the port")

    test = subs.add_parser("test", help="run on every rank under the launcher: compare nodes, all-reduce, bandwidth",
                           description="Run under torchrun, srun or mpirun on every node (or alone for a one-rank "
                                       "check). Rank 0 prints the comparison, the correctness test and the sweep.")
    test.add_argument("--spec", metavar="FILE", help="cluster.json from `hwtui cluster init` (names missing nodes)")
    test.add_argument("--node", metavar="NAME", help="this node's name (default HWTUI_CLUSTER_NODE, else the host name)")
    test.add_argument("--backend", choices=("auto", "gloo", "nccl"), default=None, help="default: the spec's, else auto")
    test.add_argument("--join-timeout", type=float, default=None, metavar="S", help="wait this long for every rank (default 60)")
    test.add_argument("--timeout", type=float, default=None, metavar="S", help="timeout of each collective (default 60)")
    test.add_argument("--min-bytes", default="1K", metavar="SIZE", help="smallest message of the sweep (default 1K)")
    test.add_argument("--max-bytes", default="64M", metavar="SIZE", help="largest message of the sweep (default 64M)")
    test.add_argument("--factor", type=int, default=4, metavar="N", help="size step of the sweep (default 4)")
    test.add_argument("--iters", type=int, default=10, metavar="N", help="timed iterations per size (default 10)")
    test.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed iterations per size (default 3)")
    test.add_argument("--ops", default="broadcast,all_reduce", metavar="LIST", help="collectives to sweep")
    test.add_argument("--min-busbw", type=float, default=None, metavar="GBPS",
                      help="fail when busbw at the largest size is below this (GB/s)")
    test.add_argument("--no-sweep", action="store_true", help="skip the bandwidth sweep")
    test.add_argument("--json", action="store_true", help="print the report as one JSON document (rank 0)")
    test.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE (rank 0, atomic)")
    test.add_argument("--events", metavar="FILE", help="write events as JSON lines to FILE; '-' for stdout "
                                                       "(human output then goes to stderr)")


def run(args: argparse.Namespace) -> int:
    from hwtui.core.errors import HwtuiError

    action = getattr(args, "cluster_command", None)
    if action == "init":
        return _init(args)
    if action == "test":
        return _test(args)
    if action == "preflight":
        return _preflight(args)
    raise HwtuiError("choose an action: hwtui cluster init ... | hwtui cluster preflight ... | hwtui cluster test ... "
                     "(see hwtui cluster --help)")


def _shown(item: str) -> str:
    """An argument echoed in an error: the name part only, since --env values are secrets."""
    name = item.partition("=")[0]
    return repr(name if len(name) <= 60 else name[:60] + "...") + ("=..." if "=" in item else "")


# -- init ------------------------------------------------------------------------------------------

def _pairs(items: list[str], what: str) -> dict[str, str]:
    from hwtui.core.errors import HwtuiError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise HwtuiError(f"{what} {_shown(item)} must look like NAME=VALUE")
        # The value is kept exactly as given (spaces and newlines included): it is data, quoted
        # wherever it is written, and a token with a trailing newline must not change silently.
        out[key.strip()] = value
    return out


def build_spec(args: argparse.Namespace) -> ClusterSpec:
    from hwtui.core.errors import HwtuiError
    from hwtui.engine.cluster.spec import ClusterSpec, SpecError, parse_nodes

    nodes = parse_nodes(args.nodes)
    for name, iface in _pairs(args.node_interface, "--node-interface").items():
        node = next((n for n in nodes if n.name == name), None)
        if node is None:
            raise HwtuiError(f"--node-interface names {name!r}, which is not in --nodes")
        node.interface = iface
    spec = ClusterSpec(nodes=nodes, devices_per_node=args.devices_per_node, launcher=args.launcher,
                       interface=args.interface, master_addr=args.master_addr, master_port=args.master_port,
                       ib_hca=args.ib_hca, net_plugin=args.net_plugin, backend=args.backend, python=args.python or sys.executable,
                       join_timeout=args.join_timeout, timeout=args.timeout, min_busbw=args.min_busbw,
                       extra_env=_pairs(args.env, "--env"), tpu_name=args.tpu_name, tpu_zone=args.zone,
                       tpu_project=args.project)
    try:
        return spec.validate()
    except SpecError as exc:
        raise HwtuiError(str(exc)) from None


def _init(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hwtui.core.errors import HwtuiError
    from hwtui.engine.cluster import launchfiles

    spec = build_spec(args)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise HwtuiError(f"--out {out} exists and is not a directory")
    if (out / launchfiles.SPEC_FILE).exists() and not args.force:
        raise HwtuiError(f"{out / launchfiles.SPEC_FILE} already exists: pass --force to regenerate it, or choose --out")
    try:
        plan = launchfiles.write(spec, out)
    except OSError as exc:
        raise HwtuiError(f"cannot write {out}: {exc.strerror or exc}") from None
    if args.json:
        json.dump({"spec": spec.public_dict(), "out": str(out.resolve()), "files": sorted(plan.files) + [launchfiles.SPEC_FILE],
                   "commands": plan.commands}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"Wrote {out}/ for {len(spec.nodes)} node(s) x {spec.devices_per_node} device(s), launcher {spec.launcher}:")
    print("  " + ", ".join([launchfiles.SPEC_FILE, *sorted(plan.files)]))
    print("Start the smoke test" + (" (each line on its node):" if spec.launcher == "torchrun" else ":"))
    for where, command in plan.commands.items():
        print(f"  {where}: {command}")
    print(f"Every node must reach {spec.master}:{spec.master_port} (tcp) and the others on the cluster interface.")
    return 0


# -- preflight -------------------------------------------------------------------------------------

def _preflight(args: argparse.Namespace) -> int:
    from hwtui.core.errors import HwtuiError
    from hwtui.engine.cluster import preflight
    from hwtui.engine.cluster import spec as specmod
    from hwtui.engine.cluster.smoke import identify_node, preflight_key

    try:
        spec = specmod.load(args.spec)
    except specmod.SpecError as exc:
        raise HwtuiError(str(exc)) from None
    node = identify_node(os.environ, args.node, spec)
    entry = spec.node(node)
    if entry is None:
        raise HwtuiError(f"node {node!r} is not in {args.spec} (it lists {', '.join(n.name for n in spec.nodes)}): "
                         "pass --node NAME, or source that node's env file first")
    env = preflight.node_environment(spec, entry, os.environ)
    found = preflight.interpreter_findings() + preflight.blockers(env, hosts_store=args.hosts_store)
    if not found:
        return 0
    for finding in found:
        print(f"hwtui: node {node} cannot join: {preflight.one_line(finding)}", file=sys.stderr)
    if not args.hosts_store and not any(f.id == "cluster.python" for f in found):
        # Rank 0 names absent nodes; with this it can also say why. Bounded, but long enough for a
        # master started a while after this node: its report then quotes this line, not a bare
        # "never joined". The fix is already on this node's stderr, so waiting costs the user nothing.
        wait = preflight.post_wait(spec)
        where = f"{spec.master}:{spec.master_port}"
        print(f"hwtui: node {node}: leaving this for the master at {where} (up to {wait:g} s; Ctrl-C skips it)",
              file=sys.stderr, flush=True)
        if not preflight.post(spec.master, spec.master_port, preflight_key(node), preflight.one_line(found[0]), wait):
            print(f"hwtui: node {node}: the rendezvous store at {where} did not come up within {wait:g} s; "
                  "the master will only say this node never joined", file=sys.stderr)
    return 1


# -- test ------------------------------------------------------------------------------------------

def _options(args: argparse.Namespace) -> SmokeOptions:
    from hwtui.core.errors import HwtuiError
    from hwtui.engine.cluster import spec as specmod
    from hwtui.engine.cluster.bandwidth import OPS, parse_size, size_series
    from hwtui.engine.cluster.smoke import SmokeOptions

    spec = None
    if args.spec:
        try:
            spec = specmod.load(args.spec)
        except specmod.SpecError as exc:
            raise HwtuiError(str(exc)) from None
    ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise HwtuiError(f"--ops takes a comma list of {', '.join(OPS)}, not {args.ops!r}")
    try:
        sizes = size_series(parse_size(args.min_bytes), parse_size(args.max_bytes), args.factor)
    except ValueError as exc:
        raise HwtuiError(str(exc)) from None
    if args.iters < 1 or args.warmup < 0:
        raise HwtuiError("--iters must be at least 1 and --warmup at least 0")

    def pick(cli: Any, spec_value: Any, default: Any) -> Any:
        return cli if cli is not None else (spec_value if spec is not None and spec_value is not None else default)

    join_timeout = pick(args.join_timeout, spec and spec.join_timeout, 60.0)
    timeout = pick(args.timeout, spec and spec.timeout, 60.0)
    for name, value in (("--join-timeout", join_timeout), ("--timeout", timeout)):
        if not 0 < value <= 86400:
            raise HwtuiError(f"{name} must be a number of seconds above 0")
    min_busbw = pick(args.min_busbw, spec and spec.min_busbw, None)
    if min_busbw is not None and min_busbw < 0:
        raise HwtuiError("--min-busbw must be >= 0 (GB/s)")
    return SmokeOptions(spec=spec, node=args.node, backend=pick(args.backend, spec and spec.backend, "auto"),
                        join_timeout=join_timeout, timeout=timeout, sizes=sizes, ops=ops, iters=args.iters,
                        warmup=args.warmup, min_busbw=min_busbw, sweep=not args.no_sweep)


def _test(args: argparse.Namespace) -> int:
    """The cluster test on this rank; a failure leaves the mark its launcher's last line reads
    (engine.cluster.torchrun.mark_rank_failed)."""
    from hwtui.core.errors import HwtuiError
    from hwtui.engine.cluster.torchrun import mark_rank_failed

    try:
        code = _run_test(args)
    except HwtuiError as exc:
        if exc.exit_code:
            mark_rank_failed()
        raise
    if code:
        mark_rank_failed()
    return code


def _run_test(args: argparse.Namespace) -> int:
    from hwtui.core.errors import HwtuiError

    if args.json and args.events == "-":
        raise HwtuiError("--json and --events - both want stdout: write events to a file, or drop --json")
    opts = _options(args)

    from hwtui.app.output.style import Painter, use_color
    from hwtui.app.output.text_report import render
    from hwtui.core.events import ErrorEvent, EventSink, Fanout, JsonlWriter
    from hwtui.core.finding import Finding, summarize
    from hwtui.engine.cluster import smoke
    from hwtui.engine.cluster.report import LivePrinter, write_report

    try:
        rank = smoke.detect_launch(os.environ, opts.spec).rank
    except smoke.ClusterFailure as exc:
        raise HwtuiError(str(exc)) from None
    human = sys.stderr if (args.json or args.events == "-") else sys.stdout
    writer = None
    sinks: list[EventSink] = []
    if rank == 0:
        if args.events:
            try:
                writer = JsonlWriter(args.events)
            except OSError as exc:
                raise HwtuiError(f"cannot write --events {args.events}: {exc.strerror or exc}") from None
            sinks.append(writer)
        sinks.append(LivePrinter(human))
    emit = Fanout(*sinks)
    try:
        try:
            result = smoke.run(opts, emit)
        except smoke.ClusterFailure as exc:
            if rank == 0:
                emit(ErrorEvent(message=str(exc), rank=rank, where="cluster.test"))
                if args.report:
                    write_report(args.report, {"schema": smoke.REPORT_SCHEMA, "ok": False, "error": str(exc)})
            raise HwtuiError(str(exc), exit_code=1) from None
    finally:
        if writer is not None:
            writer.close()
    if result.report is None:  # ranks other than 0 only speak when something is wrong
        if result.exit_code:
            print(f"hwtui: rank {result.rank}: cluster test failed: {result.message}", file=sys.stderr)
        return result.exit_code
    report = result.report
    if args.report:
        try:
            write_report(args.report, report)
        except OSError as exc:
            raise HwtuiError(f"cannot write --report {args.report}: {exc.strerror or exc}", exit_code=1) from None
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        findings = [Finding.from_dict(f) for f in report["findings"]]
        print("", file=human)
        print(render(findings, summarize(findings), report.get("duration_s", 0.0),
                     f"cluster of {report['world_size']} rank(s), {report['backend']}, via {report['launcher']}",
                     Painter(use_color(human))), file=human)
        if args.report:
            print(f"report written to {args.report}", file=human)
    return result.exit_code
