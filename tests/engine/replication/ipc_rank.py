"""One rank of an IPC-protocol world, run as a real process by test_ipc_processes.py.

``python ipc_rank.py SPEC_JSON`` (or ``python -m tests.engine.replication.ipc_rank -`` with the spec
as one line on stdin: the test forks these ranks before its store exists, then sends each its spec
and the store's port). It joins a gloo world through the test's TCPStore on 127.0.0.1,
then rank 0 exports buckets through the given provider and the others receive them; every rank
votes, and rank 0 writes ``committed`` only on a unanimous yes (the worker's rule). Faults come
from the spec: ``kill`` (SIGKILL at a phase), ``corrupt`` (flip a byte of a receiver's copy),
``hostile`` (the source publishes a malformed or foreign handle). The rank writes its result as
JSON to ``out/rank<r>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
from typing import Any

import torch
import torch.distributed as dist

from hwtui.engine.replication.device_checksum import warm
from hwtui.engine.replication.ipc_protocol import Channel, IpcFailure, IpcReceiver, IpcSource, exports_to
from hwtui.engine.replication.ipc_provider import CudaIpc, HostStandIn
from hwtui.engine.replication.ipc_wire import Export, HostHandle


def bucket_bytes(b: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + b)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def main(spec: dict[str, Any]) -> int:
    rank, world = spec["rank"], spec["world"]
    store = dist.TCPStore("127.0.0.1", spec["port"], is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("world", store), rank=rank, world_size=world)
    # As the replication worker does (its barrier before the transfer): no rank starts exporting,
    # and so no fault kills one, until every rank has formed the world. Without it a source
    # killed at its first export could close its gloo pairs while a receiver was still connecting
    # (forked ranks start fast enough to hit it): a world-formation error, not the IPC fault.
    dist.barrier()
    fault = spec.get("fault") or {}
    device = spec.get("device", "cpu")

    def hook(phase: str, bucket: int, dst: Any) -> None:
        if fault.get("rank") != rank or fault.get("bucket", bucket) != bucket:
            return
        if fault.get("action") == "kill" and fault.get("phase") == phase:
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.get("action") == "corrupt" and phase == "copied":
            dst[min(7, dst.numel() - 1)] ^= 0x10

    provider: Any = CudaIpc(0) if device == "cuda" else HostStandIn(spec["run"])
    warm(device)  # as the replication worker's set-up does: the checksum's kernels before any clock
    ch = Channel(store, spec["run"], spec.get("timeout_s", 60.0))
    sizes: list[int] = spec["sizes"]
    result: dict[str, Any] = {"rank": rank, "ok": True, "errors": []}
    vote = True
    try:
        if rank == 0:
            src = IpcSource(ch, provider, list(range(1, world)), spec["window"], hook=hook)
            try:
                for b, n in enumerate(sizes):
                    buf = src.acquire(b, n)
                    buf.copy_(bucket_bytes(b, n).to(buf.device))
                    if fault.get("action") == "hostile" and b == fault.get("bucket", 0):
                        _publish_hostile(ch, src, b, n, fault["what"])
                        continue
                    src.publish(b, n)
                src.drain()
            finally:
                src.close()
                result["peak_exported"] = src.stats.peak_exported
                result["failed"] = src.stats.failed
            vote = not src.stats.failed
        else:
            rx = IpcReceiver(ch, provider, rank, spec["window"], hook=hook)
            good = 0
            try:
                for b, n in enumerate(sizes):
                    dst = torch.empty(n, dtype=torch.uint8, device=device)
                    got = rx.receive(b, dst)
                    result.setdefault("copy_s", []).append(got.copy_s)
                    result.setdefault("verify_s", []).append(got.verify_s)
                    if not got.ok:
                        result["errors"].append(got.error)
                        vote = False
                    elif spec.get("check_bytes", True) and torch.equal(dst.cpu(), bucket_bytes(b, n)):
                        good += 1
                result["opened_during"] = provider.opened
            finally:
                result["opens"] = rx.opens
                rx.close()
            result["good"] = good
            result["device_bytes_after"] = _device_bytes(device)
    except IpcFailure as exc:
        result["errors"].append(str(exc))
        vote = False
        ch.abort(f"rank {rank}: {exc}")  # a broken exchange stops the others now; a bad checksum only votes no
    result["opened_after"] = provider.opened
    result["vote"] = vote
    # The vote, then rank 0 decides: a rank that died or failed never says yes, so nothing commits.
    try:
        ch.put(f"vote/{rank}", b"yes" if vote else b"no")
        if rank == 0:
            votes = [ch.take(f"vote/{r}", f"rank {r}'s vote") for r in range(world)]
            if all(v == b"yes" for v in votes):
                with open(os.path.join(spec["out"], "committed"), "x") as f:
                    f.write("yes")
    except IpcFailure as exc:
        result["errors"].append(str(exc))
        vote = False
    result["ok"] = vote
    with open(os.path.join(spec["out"], f"rank{rank}.json"), "x") as f:
        json.dump(result, f)
    return 0 if vote else 1


def _device_bytes(device: str) -> int:
    if device != "cuda":
        return 0
    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated())


def _publish_hostile(ch: Channel, src: IpcSource, b: int, n: int, what: str) -> None:
    """A source that lies: each case must be refused by the receiver before it reads a byte."""
    good = Export(bucket=b, slot=b % src.window, nbytes=n, digest="0" * 32, kind="host",
                  handle=src.provider.handle(src.slots[b % src.window].buf))  # type: ignore[union-attr]
    if what == "foreign-file":
        fd = os.open("/etc/hostname" if os.path.exists("/etc/hostname") else "/etc/passwd", os.O_RDONLY)
        raw = Export(b, good.slot, n, good.digest, "host", HostHandle(os.getpid(), fd, n)).encode()
    elif what == "not-json":
        raw = b"\x80\x04\x95 pickle? no"
    elif what == "extra-field":
        obj = json.loads(good.encode())
        obj["exec"] = "rm -rf /"
        raw = json.dumps(obj).encode()
    elif what == "wrong-size":
        obj = json.loads(good.encode())
        obj["nbytes"] = n + 1
        raw = json.dumps(obj).encode()
    else:
        raise ValueError(what)
    for r in src.receivers:
        ch.push(exports_to(r), raw, f"the export of bucket {b}")
    src.pending.append(b)
    src.slots[b % src.window].bucket = b  # type: ignore[union-attr]


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.stdin.readline() if sys.argv[1] == "-" else sys.argv[1])))
