"""A warm push into a GPU-resident receiver (``hwtui agent --device cuda``) against the same push into
a plain one, interleaved, medians (issue 23.3). Without a GPU the device slots are the memfd
stand-in (``HWTUI_TEST_IPC=host``, which also puts both worlds on the IPC path), so this measures
what filling the slot during the transfer adds to a push's end to end, and what the receiver's
disk copy costs the push when it is made durable before the vote (``--persist before-vote``)
rather than after the commit (the default with --device cuda), and ("slots-dev") with the receiver's
staging copy written whole at its flush, as a GPU receiver's device copy is. Each world's median phases per
role say where the rest goes.

Run from the repository root: ``python benchmarks/bench_resident_slots.py [MIB=256] [ROUNDS=5] [DIR]``
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.getcwd())

MIB = 1 << 20


def versions(root: Path, mib: int, n: int) -> list[Path]:
    import torch
    from safetensors.torch import save_file

    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

    plans = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        tensors = {f"w{k}": torch.empty(mib * MIB // 8 // 4).uniform_(generator=g) for k in range(8)}
        (root / f"v{i}").mkdir()
        save_file(tensors, str(root / f"v{i}" / "model.safetensors"))
        plan = build_plan_from_files([str(root / f"v{i}" / "model.safetensors")], model="bench", version=f"v{i}",
                                     bucket_bytes=64 * MIB, align=1)
        write_json_atomic(root / f"v{i}.plan", plan)
        plans.append(root / f"v{i}.plan")
    return plans


def _persisted(world: object) -> None:
    """Until the receiver's disk copy of the last push is written (after-commit): the next push
    would wait for it, which is the disk's cost, not the push's (bounded)."""
    import time

    deadline = time.monotonic() + 120
    while (world.replication(1).get("persist") or {}).get("state") == "writing":  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise TimeoutError("the receiver never finished writing its disk copy")
        time.sleep(0.02)


def main() -> None:
    from tests.agent.procs import Agents, push

    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    root = Path(sys.argv[3]) if len(sys.argv) > 3 else Path("/tmp/hwtui-bench-resident-slots")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    plans = versions(root, mib, rounds + 1)
    env = {"HWTUI_TEST_IPC": "host"}
    # "slots-dev": the receiver's staging copy written whole at its flush, as a GPU receiver's
    # device copy is (HWTUI_TEST_STAGING=at-flush): no file before the commit, no spare made.
    at_flush = {**env, "HWTUI_TEST_STAGING": "at-flush"}
    worlds = {}
    for name, extra, renv in (("slots", ("--device", "cuda"), env),
                              ("slots-dev", ("--device", "cuda"), at_flush),
                              ("slots-bv", ("--device", "cuda", "--persist", "before-vote"), env),
                              ("plain", (), env)):
        (root / f"agents-{name}").mkdir()
        world = Agents(root / f"agents-{name}", 2)
        world.start(0, **env)
        world.start(1, *extra, **renv)
        worlds[name] = world
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in worlds}
    phases: dict[str, dict[str, list[float]]] = {k: {} for k in worlds}
    try:
        for i, plan in enumerate(plans):
            for name, world in worlds.items():  # interleaved: both see the same load
                done = push(plan, world.agents(), "--json")
                assert done.returncode == 0, done.stdout + done.stderr
                doc = json.loads(done.stdout)
                if i:  # warm pushes only
                    rows[name].append((doc["seconds"], doc["transfer_s"]))
                    for node in doc["nodes"]:
                        for phase, sec in (node.get("phases") or {}).items():
                            phases[name].setdefault(f"{node['role']}.{phase}", []).append(float(sec))
                _persisted(world)
        # Back to back into the "slots" receiver, whose rank writes its disk copy after each report
        # and then makes a spare (its staging is a host file): how long each push's receiving rank
        # took to start after its agent accepted it (the agent has waited for the disk copy by
        # then). A spare is idle work and is stopped when a push arrives (engine.resident.spare);
        # before, the push waited for the whole zero-fill and fsync (0.27 s of a 0.96 s push).
        b2b = worlds["slots"]
        delays = []
        for plan in plans[:-2]:  # versions this node no longer holds: each a whole push
            done = push(plan, b2b.agents(), "--json")
            assert done.returncode == 0, done.stdout + done.stderr
            rx = next(n for n in json.loads(done.stdout)["nodes"] if n["role"] == "receiver")
            delays.append(rx["timeline"]["phase"] - rx["timeline"]["accepted"])
        spare = b2b.replication(1).get("spare") or {}
    finally:
        for world in worlds.values():
            world.close()
    for name, r in rows.items():
        ratios = [e / t for e, t in r]
        print(f"{name:9} {mib} MiB x{len(r)} warm: e2e median {statistics.median(e for e, _ in r):.3f} s, "
              f"transfer median {statistics.median(t for _, t in r):.3f} s, e2e/transfer median "
              f"{statistics.median(ratios):.2f} (rounds {' '.join(f'{x:.2f}' for x in ratios)})")
        print("          phases (median s): " + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in sorted(phases[name].items())
                                                         if statistics.median(v) >= 0.005))
    if delays:  # ROUNDS >= 3
        print(f"back to back ({len(delays)} pushes into the slots receiver): its rank started a median "
              f"{statistics.median(delays):.3f} s (max {max(delays):.3f}) after its agent accepted each push; "
              f"spares stopped for a push: {spare.get('stopped')}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
