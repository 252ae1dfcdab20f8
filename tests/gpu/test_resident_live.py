"""A GPU-resident receiver on a live NVIDIA GPU (issue 23.3): ``hwtui agent --device cuda`` keeps
the served version in two CUDA slots; ``hwtui push`` into it (both agents on one node: by CUDA IPC)
commits, switches the slot, and a
serving process on the node opens the served slot by CUDA IPC (the agent's export) and reads the
pushed bytes exactly. A push whose rank is killed leaves the served slot and counts its own slot
freed; stopping the agent frees both (nvidia-smi agrees). Skipped without a GPU
(tests/gpu/conftest.py says why).

Known and open (H200, round nine), reported as an expected failure after every other check: the
killed push's slot still shows in nvidia-smi (+1 GiB), and the pushing node's rank grows by ~256
MiB per push (its "memory.device" in the agent's last push says what torch holds).

Prints, for the record, each push's end to end against its transfer (issue 23's target: the push
of 1 GiB into a resident cuda receiver end to end <= 1.5x its transfer) and where it goes (the
pusher's timeline, each node's phases); the house rule is no timed assertion, so the figure is
printed, not asserted.

Run: ``python3 -m pytest tests/gpu/test_resident_live.py -m gpu -v -rs -s -p no:cacheprovider -o addopts=""``
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]
MIB = 1 << 20

CONSUMER = """
import hashlib, json, sys, urllib.request
import torch
from hwtui.engine.resident.served_export import open_served
req = urllib.request.Request(sys.argv[1], data=b"{}", method="POST", headers={"Authorization": "Bearer " + sys.argv[2]})
doc = json.loads(urllib.request.urlopen(req, timeout=60).read())
t = __import__("time").perf_counter()
served = open_served(doc)
opened = __import__("time").perf_counter() - t
h = hashlib.sha256()
for name in sorted(served.tensors):
    x = served.tensors[name]
    assert x.is_cuda, name
    h.update(name.encode()); h.update(x.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
served.close()
# Done reading: the hold the export took on this slot goes, so the push after next may land there.
rel = urllib.request.Request(sys.argv[1].replace("/export", "/release"), data=json.dumps({"lease": doc["hold"]["lease"]}).encode(),
                             method="POST", headers={"Authorization": "Bearer " + sys.argv[2]})
assert json.loads(urllib.request.urlopen(rel, timeout=60).read())["released"] is True
print(json.dumps({"version": doc["version"], "slot": doc["slot"], "sha": h.hexdigest(), "open_ms": opened * 1e3}))
"""


def _smi() -> dict[int, int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60).stdout
    got = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            got[int(parts[0])] = int(parts[1])
    return got


def _versions(d: Path, n: int, mib: int) -> dict[str, tuple[Path, str]]:
    """``n`` versions of a ``mib`` MiB model (8 tensors) with their plans and the sha256 a consumer sees."""
    import torch
    from safetensors.torch import save_file

    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

    out = {}
    for i in range(1, n + 1):
        v = f"v{i}"
        g = torch.Generator().manual_seed(i)
        t = {f"layers.{k}.weight": torch.empty(mib * MIB // 8 // 4, dtype=torch.float32).uniform_(generator=g)
             for k in range(8)}
        (d / v).mkdir(parents=True)
        save_file(t, str(d / v / "model.safetensors"))
        h = hashlib.sha256()
        for name in sorted(t):
            h.update(name.encode())
            h.update(t[name].view(-1).view(torch.uint8).numpy().tobytes())
        plan = build_plan_from_files([str(d / v / "model.safetensors")], model="live", version=v,
                                     bucket_bytes=64 * MIB, align=1)
        write_json_atomic(d / f"{v}.plan", plan)
        out[v] = (d / f"{v}.plan", h.hexdigest())
    return out


def _consume(world: Any, i: int) -> dict[str, Any]:
    from tests.agent.helpers import TOKEN
    from tests.agent.procs import env

    done = subprocess.run([sys.executable, "-c", CONSUMER, f"http://127.0.0.1:{world.ports[i]}/v1/served/export", TOKEN],
                          capture_output=True, text=True, timeout=300, env=env())
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _persisted(world: Any, i: int, version: str, bound_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + bound_s
    while True:
        state = world.replication(i).get("persist") or {}
        if state.get("version") == version and state.get("state") != "writing":
            assert state.get("state") == "done", state
            return dict(state)
        assert time.monotonic() < deadline, f"node{i} never finished writing {version}: {state}"
        time.sleep(0.05)


def test_a_push_into_a_resident_cuda_receiver(tmp_path: Path) -> None:
    from tests.agent.procs import Agents, push

    models = _versions(tmp_path / "models", 5, 1024)
    (tmp_path / "agents").mkdir()
    world = Agents(tmp_path / "agents", 2)
    # Both agents GPU-resident, on one node: the push moves device buffers by hwtui's CUDA IPC path.
    world.start(0, "--device", "cuda")
    world.start(1, "--device", "cuda")
    rows = []
    source_mib: list[int] = []  # the pushing node's resident rank, after each push
    leaks: list[str] = []
    try:
        for v, slot in (("v1", "A"), ("v2", "B"), ("v3", "A"), ("v4", "B")):
            t = time.perf_counter()
            done = push(models[v][0], world.agents(), "--json")
            wall = time.perf_counter() - t
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            doc = json.loads(done.stdout)
            rows.append((v, doc.get("warm"), wall, doc["seconds"], doc["transfer_s"]))
            # Where a push's end to end goes, for the record: the pusher's marks and each node's phases.
            print(f"\n{v} timeline {json.dumps(doc['timeline'])}")
            for node in doc["nodes"]:
                print(f"{v} {node['role']} phases {json.dumps(node.get('phases'))}")
            dev = world.replication(1)["device"]
            assert (dev["serving"], dev["slot"], dev["device"]) == (v, slot, "cuda:0"), dev
            # --persist after-commit (the default): the receiver's disk copy is written after the
            # report; how long it took, off the push's path (waited for here, bounded).
            print(f"{v} receiver's disk copy after the push: {_persisted(world, 1, v)}")
            seen = _consume(world, 1)
            assert (seen["version"], seen["slot"], seen["sha"]) == (v, slot, models[v][1])
            rep0 = world.replication(0)
            rank0 = (rep0.get("resident") or {}).get("pid")
            source_mib.append(_smi().get(rank0, 0) if isinstance(rank0, int) else -1)
            print(f"{v} source rank's allocator after the push: {((rep0.get('last') or {}).get('memory') or {}).get('device')}")
        assert world.replication(1)["device"]["allocs"] == 2  # steady state: the slots are reused
        print("\npush  warm   cli wall s   push e2e s   transfer s   e2e/transfer")
        for v, warm, wall, e2e, transfer in rows:
            print(f"{v:<5} {str(warm):<6} {wall:10.2f}   {e2e:10.2f}   {transfer:10.2f}   {e2e / max(transfer, 1e-9):8.2f}")
        print(f"nvidia-smi, the source's resident rank MiB after each push: {source_mib}")
        warm_rows = [r for r in rows if r[1]]
        if warm_rows:
            print(f"warm pushes ({len(warm_rows)}): median end to end / transfer "
                  f"{statistics.median(r[3] / max(r[4], 1e-9) for r in warm_rows):.2f} (issue 23 target <= 1.5)")

        # A push whose receiving rank dies mid-transfer: its slot is freed, the served one stays.
        agent = world.procs[1].pid
        held = _smi().get(agent, 0)
        world.kill(1)
        world.start(1, "--device", "cuda", HWTUI_TEST_FAULT="kill:rank=1,bucket=4")
        agent = world.procs[1].pid
        loaded = _smi().get(agent, 0)  # the restart loaded v4 from disk into one slot
        done = push(models["v5"][0], world.agents())
        assert done.returncode == 1
        dev = world.replication(1)["device"]
        assert (dev["serving"], dev["receiving"]) == ("v4", None) and dev["frees"] == 1, dev
        after = _smi().get(agent, 0)
        print(f"nvidia-smi, agent MiB: serving two slots {held}, after restart (one slot) {loaded}, "
              f"after the failed push {after}")
        assert _consume(world, 1)["sha"] == models["v4"][1]
        # Device memory that must be freed (H200, round nine: both held before the buffers were
        # shared once with torch's count released, ipc_provider.CudaIpc.handle). Checked after
        # every other check of this test, and after the agents are stopped, with the figures.
        if after > loaded + 64:
            leaks.append(f"the failed push's slot is still held (agent {after} MiB, {loaded} before the push)")
        if source_mib[-1] > source_mib[1] + 64:
            leaks.append(f"the source's rank grows by push: {source_mib} MiB")
    finally:
        pids = [p.pid for p in world.procs.values()]
        for i in world.procs:
            rank = (world.replication(i).get("resident") or {}).get("pid")
            pids += [rank] if isinstance(rank, int) else []
        world.close()
    deadline = time.monotonic() + 60
    while set(_smi()) & set(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not set(_smi()) & set(pids), "a stopped agent still holds device memory"
    assert not leaks, "; ".join(leaks)
