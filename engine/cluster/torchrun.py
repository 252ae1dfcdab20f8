"""``python -m hwtui.engine.cluster.torchrun ARGS``: torchrun for the generated launch scripts,
ending in one line instead of a traceback.

torchrun's own entry point re-raises whatever ended the run: a failed rank (the cluster test
exits 1 whenever it found a problem, e.g. a node that never came) ends in a ChildFailedError
traceback and a "Root Cause" block, a rendezvous that broke in a DistStoreError traceback. The
ranks have already said why on their own output; the launcher adds one line saying how it ended.
Same arguments as torchrun (``torch.distributed.run``), which does all the work.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except KeyboardInterrupt:
        print("hwtui: torchrun: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - ChildFailedError, DistStoreError, RendezvousError ...
        name = type(exc).__name__
        if name == "ChildFailedError":
            print("hwtui: torchrun: a rank on this node failed; its output above says why", file=sys.stderr)
        else:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            print(f"hwtui: torchrun: the rendezvous or launch failed ({name}: {first}); the cluster test's own lines "
                  "on the master name the nodes", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
