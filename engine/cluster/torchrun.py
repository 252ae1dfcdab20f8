"""``python -m hwtui.engine.cluster.torchrun ARGS``: torchrun for the generated launch scripts,
ending in one line instead of a traceback.

torchrun's own entry point re-raises whatever ended the run: a failed rank (the cluster test
exits 1 whenever it found a problem, e.g. a node that never came) ends in a ChildFailedError
traceback and a "Root Cause" block, a rendezvous that broke in a DistStoreError traceback. The
ranks have already said why on their own output; the launcher adds one line saying how it ended.
Same arguments as torchrun (``torch.distributed.run``), which does all the work.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile

# A private directory this launcher makes for its ranks: a rank whose cluster test fails leaves a
# file there (mark_rank_failed), so the launcher's last line names the rank whatever torchrun
# raised last (a rendezvous whose master had already exited raised over a rank's failure that its
# agent had not seen yet: the node's last line blamed the rendezvous, a netns-test flake).
FAILED_DIR_ENV = "HWTUI_TORCHRUN_FAILED_DIR"


def main(argv: list[str] | None = None) -> int:
    import os

    # The launcher's own c10d warnings (a store client's host name, waits that time out) are noise
    # beside the one line this ends with. Read once when torch loads, so it is set for the import
    # only: the ranks torchrun starts get the environment as it was.
    before = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        from torch.distributed.run import parse_args, run
    finally:
        if before is None:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = before

    args = parse_args(sys.argv[1:] if argv is None else argv)
    refusal = _late(args)
    if refusal:
        print(refusal, file=sys.stderr)
        return 1
    failed_dir = tempfile.mkdtemp(prefix="hwtui-torchrun-")  # 0700, this launcher's own
    os.environ[FAILED_DIR_ENV] = failed_dir  # the ranks torchrun starts inherit it
    try:
        run(args)
    except KeyboardInterrupt:
        print("hwtui: torchrun: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - ChildFailedError, DistStoreError, RendezvousError ...
        print(ending(exc, rank_failed=_any_marked(failed_dir)), file=sys.stderr)
        return 1
    finally:
        os.environ.pop(FAILED_DIR_ENV, None)
        shutil.rmtree(failed_dir, ignore_errors=True)
    return 0


def _any_marked(failed_dir: str) -> bool:
    with contextlib.suppress(OSError):
        return any(os.scandir(failed_dir))
    return False


def mark_rank_failed() -> None:
    """Called by a rank whose cluster test failed, under this launcher: leave the mark it reads."""
    failed_dir = os.environ.get(FAILED_DIR_ENV)
    if not failed_dir:
        return
    from hwtui.core.private_file import create_private

    with contextlib.suppress(OSError):  # only the launcher's last line depends on it
        os.close(create_private(os.path.join(failed_dir, f"rank-{os.environ.get('RANK', '?')}-{os.getpid()}")))


def ending(exc: BaseException, *, rank_failed: bool = False) -> str:
    """The one line for how torchrun ended. A rank that failed comes first even when it is not
    what torchrun raised last: its agent shuts the rendezvous down in a ``finally``, and on a
    node whose master has already exited that shutdown raises RendezvousConnectionError over
    the ChildFailedError (seen under load in the netns cluster test: the node's last line then
    blamed the rendezvous); and its agent's next look at the rendezvous can raise before it has
    seen the rank exit at all (``rank_failed``: the rank's own mark, mark_rank_failed)."""
    if rank_failed:
        return "hwtui: torchrun: a rank on this node failed; its output above says why"
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if type(cur).__name__ == "ChildFailedError":
            return "hwtui: torchrun: a rank on this node failed; its output above says why"
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return (f"hwtui: torchrun: the rendezvous or launch failed ({type(exc).__name__}: {first}); the cluster test's "
            "own lines on the master name the nodes")


def _late(args: argparse.Namespace) -> str | None:
    """A node arriving after the rendezvous closed joins torchrun's next round, which restarts the
    running nodes: refuse it here, in one line, when rank 0 has marked the test as begun."""
    import os

    from hwtui.engine.cluster.preflight import late_refusal

    conf = dict(item.partition("=")[::2] for item in str(args.rdzv_conf or "").split(",") if "=" in item)
    if conf.get("is_host") == "true" or not args.rdzv_endpoint:
        return None
    host, _, port = str(args.rdzv_endpoint).rpartition(":")
    if not port.isdigit():
        return None
    try:
        join_timeout = float(conf.get("last_call_timeout", "60"))
    except ValueError:
        join_timeout = 60.0
    node = os.environ.get("HWTUI_CLUSTER_NODE") or str(args.local_addr or "this node")
    refusal = late_refusal(host.strip("[]"), int(port), str(args.rdzv_id), node, join_timeout)
    return f"hwtui: node {node} {refusal}" if refusal else None


if __name__ == "__main__":
    sys.exit(main())
