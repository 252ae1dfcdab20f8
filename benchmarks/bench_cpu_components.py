"""What the cross-host path's work costs on this box, one component at a time (docs/replication.md, "CPU budget").

Per GiB: xxh3 in 1 MiB slices and in 32 MiB buckets, memcpy into touched memory, copy + hash in 1 MiB
slices, and one / two TCP streams from one network namespace to another across the veth + bridge
(NetnsCluster: sender and receiver CPU, user + system, and the host's /proc/stat around each). Needs
root and ``ip netns`` for the TCP part.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_cpu_components.py
"""
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.engine.cluster.netns import NetnsCluster, finish  # noqa: E402

GB = 1 << 30


def stat():
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:9]]
    tck = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal
    return {"user": (f[0] + f[1]) / tck, "system": f[2] / tck, "softirq": (f[5] + f[6]) / tck, "steal": f[7] / tck,
            "busy": (sum(f) - f[3] - f[4]) / tck}


def local():
    import numpy as np
    import xxhash
    n = GB
    a = np.ones(n, dtype=np.uint8)
    b = np.zeros(n, dtype=np.uint8)
    b[:] = 1  # every page touched
    out = {}
    for name, fn in [
        ("xxh3 1MiB slices (1 GB)", lambda: [xxhash.xxh3_64(a[i:i + (1 << 20)]).intdigest() for i in range(0, n, 1 << 20)]),
        ("xxh3 one pass 32MiB buckets", lambda: [xxhash.xxh3_64(a[i:i + (32 << 20)]).intdigest() for i in range(0, n, 32 << 20)]),
        ("memcpy 1 GB into touched", lambda: np.copyto(b, a)),
        ("memcpy+hash 1MiB slices", lambda: [(np.copyto(b[i:i + (1 << 20)], a[i:i + (1 << 20)]), xxhash.xxh3_64(b[i:i + (1 << 20)]).intdigest()) for i in range(0, n, 1 << 20)]),
    ]:
        best = []
        for _ in range(3):
            c0 = time.process_time()
            fn()
            best.append(time.process_time() - c0)
        out[name] = min(best)
    return out


SENDER = r"""
import os, sys, socket, time, resource, numpy as np
n, port, host, streams = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
buf = np.ones(n // streams, dtype=np.uint8)
import threading
def one(i):
    s = socket.create_connection((host, port + i))
    if len(sys.argv) > 5: s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(sys.argv[5]))
    mv = memoryview(buf)
    for off in range(0, len(mv), 1 << 22): s.sendall(mv[off:off + (1 << 22)])
    s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
r0 = resource.getrusage(resource.RUSAGE_SELF)
ts = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
[t.start() for t in ts]; [t.join() for t in ts]
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime)
"""
RECEIVER = r"""
import os, sys, socket, time, resource, numpy as np, threading
n, port, streams = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
buf = np.zeros(n // streams * streams, dtype=np.uint8)
ls = []
for i in range(streams):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(("0.0.0.0", port + i)); l.listen(1); ls.append(l)
print("ready", flush=True)
conns = [l.accept()[0] for l in ls]
t = [None, None]
def one(i):
    c = conns[i]; mv = memoryview(buf)[i * (n // streams):(i + 1) * (n // streams)]
    got = 0
    while got < len(mv):
        k = c.recv_into(mv[got:], min(len(mv) - got, 1 << 22))
        if k == 0: break
        got += k
    c.send(b"x"); c.close()
r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
ts = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
[x.start() for x in ts]; [x.join() for x in ts]
dt = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(dt, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, flush=True)
"""


def tcp(net, streams, port, n=GB):
    py = sys.executable
    rx = net.popen(1, [py, "-c", RECEIVER, str(n), str(port), str(streams)])
    assert rx.stdout.readline().strip() == "ready"
    s0 = stat()
    tx = net.popen(0, [py, "-c", SENDER, str(n), str(port), net.addresses[1], str(streams)])
    (rc1, out1, err1), (rc2, out2, err2) = finish([tx, rx], 120)
    s1 = stat()
    assert rc1 == 0 and rc2 == 0, (err1, err2)
    su, ss = (float(x) for x in out1.split())
    dt, ru, rs = (float(x) for x in out2.split())
    host = {k: round(s1[k] - s0[k], 3) for k in s0}
    return {"streams": streams, "wall_s": round(dt, 3), "GB/s": round(n / dt / 1e9, 2), "sender_cpu": round(su + ss, 3),
            "sender_sys": round(ss, 3), "receiver_cpu": round(ru + rs, 3), "receiver_sys": round(rs, 3), "host_around_the_run": host}


if __name__ == "__main__":
    print("load", open("/proc/loadavg").read().split()[:3])
    for k, v in local().items():
        print(f"  {k:32} {v:.3f} CPU-s per GiB")
    net = NetnsCluster(2).up()
    try:
        for rep in range(3):
            for streams in (1, 2):
                print(json.dumps(tcp(net, streams, 31000 + 10 * rep + streams)))
    finally:
        net.down()
    print("load", open("/proc/loadavg").read().split()[:3])
