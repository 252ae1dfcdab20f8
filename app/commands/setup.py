"""``hwtui setup``: one Python environment per GPU vendor present, each with the torch its driver takes.

Plans from the detected hardware (so ``--sysroot`` / ``--replay`` plan for a recorded machine),
prints the exact commands with ``--dry-run``, otherwise runs them (uv when it is on PATH, venv +
pip otherwise; each step bounded by ``--step-timeout``), links this hwtui tree into each
environment with a ``.pth`` file, and records the environments in the config file, where
``hwtui train`` and the check find them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys

from hwtui.core.errors import EXIT_FAILED, EXIT_OK, HwtuiError
from hwtui.core.redact import redact_text

HELP = "create one Python environment per GPU vendor with the matching torch wheel, and record it for `train`"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="print the exact commands and the config change; run nothing")
    parser.add_argument("--vendor", action="append", choices=("NVIDIA", "AMD", "Intel"),
                        help="only this vendor (repeatable; default: every vendor with a usable GPU here)")
    parser.add_argument("--dir", metavar="DIR", help="where the environments go (default: $XDG_DATA_HOME/hwtui/envs)")
    parser.add_argument("--python", metavar="PYTHON", default=sys.executable,
                        help="base interpreter for the environments (default: the one running hwtui)")
    parser.add_argument("--tool", choices=("auto", "uv", "pip"), default="auto", help="installer (default: uv if on PATH)")
    parser.add_argument("--index-url", metavar="URL", default=None,
                        help="base of the per-build torch indexes (default https://download.pytorch.org/whl); "
                             "<URL>/<tag> is used, e.g. <URL>/cu128")
    parser.add_argument("--deps-index-url", metavar="URL", default=None,
                        help="index for the engine's other packages (default: pip's own)")
    parser.add_argument("--torch-version", metavar="X.Y.Z", default=None,
                        help="the torch release to pin (default 2.9.1; cu118: 2.7.1, cu129: 2.8.0); the build "
                             "installed is exactly torch==<X.Y.Z>+<tag> from <URL>/<tag>")
    parser.add_argument("--step-timeout", type=float, default=1800.0, metavar="S",
                        help="longest one install step may take (default 1800 s)")


def _facts(host):
    from hwtui.probes.catalog import catalog
    from hwtui.probes.framework import collect

    collectors, _ = catalog()
    facts, _problems = collect(host, [c for c in collectors if c.name in ("pci", "nvml", "host")])
    return facts


def run(args: argparse.Namespace) -> int:
    from hwtui.app.commands._host import host_from_args
    from hwtui.core.supervisor import hwtui_root
    from hwtui.probes import vendor_envs as ve
    from hwtui.probes.torchwheel import INDEX_URL

    if not 0 < args.step_timeout <= 86400:
        raise HwtuiError(f"--step-timeout {args.step_timeout}: give seconds in (0, 86400]")
    try:
        for option, url in (("--index-url", args.index_url), ("--deps-index-url", args.deps_index_url)):
            if url is not None:
                ve.check_index_url(option, url)
    except ValueError as exc:
        raise HwtuiError(str(exc)) from None
    if args.torch_version is not None and not re.fullmatch(r"\d+\.\d+(\.\d+)?", args.torch_version):
        raise HwtuiError(f"--torch-version {redact_text(args.torch_version)[:40]!r}: give a release such as 2.9.1 "
                         "(the build tag is added from the hardware)")
    host = host_from_args(args)
    if not host.is_live and not args.dry_run:
        # Preparing environments for another machine's GPUs (an image built elsewhere) is allowed; say it.
        print(f"hwtui setup: planning for {host.description}; the environments are created on this machine",
              file=sys.stderr)
    base = os.path.abspath(args.dir) if args.dir else ve.envs_dir(os.environ)
    plans = ve.plan_environments(_facts(host), base, set(args.vendor or ()))
    if not plans:
        wanted = f" from {', '.join(args.vendor)}" if args.vendor else ""
        print(f"hwtui setup: no usable NVIDIA, AMD or Intel GPU{wanted} on {host.description}: nothing to set up",
              file=sys.stderr)
        return EXIT_OK
    tool = args.tool if args.tool != "auto" else ("uv" if shutil.which("uv") else "pip")
    if tool == "uv" and not shutil.which("uv") and not args.dry_run:
        raise HwtuiError("--tool uv: uv is not on PATH (install it, or use --tool pip)")
    root = hwtui_root()
    config = ve.config_path(os.environ)
    for plan in plans:
        torch = ve.torch_requirement(plan.tag, args.torch_version)
        print(f"# {plan.vendor}: {', '.join(plan.devices)} -> {torch} from {plan.tag}'s index only, in {plan.path}")
        if plan.note:
            print(f"# warning: {plan.note}")
        steps = ve.commands_for(plan, args.python, tool, root, args.index_url or INDEX_URL, args.deps_index_url,
                                args.torch_version)
        for step in steps:
            print(ve.shell_line(step))
        print(f"# then: link {root} into the environment ({plan.backend}.pth) and record {plan.python} in {config}")
        if args.dry_run:
            continue
        created = not os.path.exists(plan.path)
        try:
            for step in steps:
                _run_step(step.argv, args.step_timeout, ve.isolated_env(os.environ) if step.isolated else None)
            _check_torch(plan, torch)
            _link_hwtui(plan, root)
        except HwtuiError:
            if created:  # no half-built environment is left behind to be mistaken for a working one
                shutil.rmtree(plan.path, ignore_errors=True)
            raise
        try:
            ve.record_environments({plan.backend: ve.record_entry(plan, tool, torch.split("==", 1)[1],
                                                                   args.index_url or INDEX_URL)})
        except (OSError, ValueError) as exc:
            raise HwtuiError(f"environment {plan.path} is ready but could not be recorded: {exc}") from None
        print(f"hwtui setup: {plan.vendor} environment ready: {plan.python}", file=sys.stderr)
    if args.dry_run:
        print(f"hwtui setup: dry run, nothing was run; without --dry-run the environments are recorded in {config}",
              file=sys.stderr)
    return EXIT_OK


def _relay(stream, out) -> None:
    """Copy a step's output line by line with credentials masked: pip and uv print the index URLs
    they use, and ``--index-url https://user:pw@host/`` must not reach a terminal or a log."""
    for line in iter(lambda: stream.readline(1 << 16), ""):
        out.write(redact_text(line))
        out.flush()


def _run_step(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> None:
    import threading

    from hwtui.core.supervisor import Child, exit_text

    shown = redact_text(" ".join(argv[:4]))
    child = Child(argv, name=os.path.basename(argv[0]), env=env, stdout="pipe", stderr="pipe", text=True)
    try:
        child.start()
    except OSError as exc:
        raise HwtuiError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    assert child.proc is not None
    relays = [threading.Thread(target=_relay, args=(stream, out), daemon=True)
              for stream, out in ((child.proc.stdout, sys.stdout), (child.proc.stderr, sys.stderr))]
    for t in relays:
        t.start()
    try:
        code = child.wait(timeout)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: stop the whole step's group
        child.terminate()
        raise HwtuiError(f"`{shown} ...` did not finish within {timeout:.0f} s (stopped); "
                         "re-run with a larger --step-timeout", EXIT_FAILED) from None
    finally:
        for t in relays:  # the pipes close when the step's group is gone; a grandchild holding one is not waited for
            t.join(5.0)
    if code != 0:
        raise HwtuiError(f"`{shown} ...` {exit_text(code)}; the output above says why (nothing was recorded "
                         "for this environment)", EXIT_FAILED)


def _check_torch(plan, wanted: str) -> None:
    """The environment holds exactly the pinned build (``torch==2.9.1+rocm6.4``), or the step failed."""
    import glob

    from hwtui.core.bounded_read import SMALL_FILE_CAP, decode_text, read_capped
    from hwtui.probes.torchwheel import parse_version_py

    version = None
    for path in sorted(glob.glob(os.path.join(plan.path, "lib*", "python*", "site-packages", "torch", "version.py"))):
        try:
            version = parse_version_py(decode_text(read_capped(path, SMALL_FILE_CAP))).get("__version__")
        except OSError:
            continue
        break
    expected = wanted.split("==", 1)[1]
    if version != expected:
        raise HwtuiError(f"{plan.path} got torch {version or '(none)'}, not the pinned {expected}; nothing was recorded "
                         "for this environment", EXIT_FAILED)


def _link_hwtui(plan, root: str) -> None:
    """A .pth in the environment's site-packages: its interpreter imports this very hwtui tree."""
    import glob

    from hwtui.core.atomic import atomic_write_text

    found = sorted(glob.glob(os.path.join(plan.path, "lib", "python*", "site-packages")))
    if not found:
        raise HwtuiError(f"{plan.path} has no lib/python*/site-packages: the environment was not created")
    atomic_write_text(os.path.join(found[0], "hwtui-tree.pth"), root + "\n")
