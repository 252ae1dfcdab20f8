"""GPU-resident receivers (issue 23.3) on CPU: ``hwtui agent --device cuda`` with its device slots in
host memory (``HWTUI_TEST_IPC=host``: the memfd stand-in where CUDA memory goes, as the IPC path's
own tests do), pushed into by ``hwtui push`` as real processes on loopback.

- a push commits, switches the served slot (A, B, A...) and serves the pushed bytes byte for
  byte, read by a consumer through the agent's export (the slot mapped, no copy); a delta push's
  unchanged tensors are in the slot too; repeated pushes allocate nothing new (slot reuse);
- a restarted agent loads the version its disk serves into a slot;
- a corrupted bucket is named, and the served slot is untouched, the staged one freed;
- a resident rank killed mid-push: the agent keeps serving its slot and frees the staged one
  (its memfds, counted in /proc, agree);
- a switch that failed after the decision (a split): the device keeps serving what the disk
  serves, and ``hwtui push --resume`` finishing it from the staged copy loads it onto the device;
- the export is authenticated (the token) and refused to a process of another user.

One world, shared by the cases in order (each case leaves what the next one starts from).
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.agent.helpers import TOKEN, ipc_memfds  # noqa: E402
from tests.agent.procs import Agents, push, push_bg  # noqa: E402
from tests.engine.replication.helpers import assert_bytes_equal  # noqa: E402
from tests.procfs import descendants  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]

DEVICE = {"HWTUI_TEST_IPC": "host"}


def _model(d: Path, tensors: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(d / "model.safetensors"))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from hwtui.engine.replication.plan import build_plan_from_files, write_json_atomic

    d = tmp_path_factory.mktemp("models")
    g = torch.Generator().manual_seed(7)
    base = {f"layers.{i}.weight": torch.randn(5 * i + 3, 17, generator=g) for i in range(8)}
    base["embed.big"] = torch.randn(150_000, generator=g)  # split across many 64 KiB buckets
    base["norm.bf16"] = torch.randn(257, generator=g).to(torch.bfloat16)
    base["ids.int8"] = torch.randint(-128, 127, (77,), dtype=torch.int8, generator=g)
    out: dict[str, tuple[Path, dict[str, Any]]] = {}
    prev = None
    for i, v in enumerate(("v1", "v2", "v3", "v4", "v5", "v6", "v7"), start=1):
        t = {k: x.clone() for k, x in base.items()}
        t["layers.0.weight"] += i  # the rest unchanged: v2 on is a delta of the version before
        t["embed.big"][: 1000 * i] -= i
        _model(d / v, t)
        plan = build_plan_from_files([str(d / v / "model.safetensors")], model="tiny", version=v, bucket_bytes=64 << 10,
                                     align=1, prev_path=str(prev) if prev else None)
        write_json_atomic(d / f"{v}.plan", plan)
        out[v] = (d / f"{v}.plan", t)
        prev = d / f"{v}.plan"
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = Agents(tmp_path_factory.mktemp("agents"), 2)
    w.start(0, **DEVICE)  # the ipc path: every rank of the world takes it under the stand-in
    w.start(1, "--device", "cuda", **DEVICE)
    try:
        yield w
    finally:
        w.close()


def export(world: Agents, i: int, token: str | None = TOKEN, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    return post(world, i, "/v1/served/export", {} if body is None else body, token)


def post(world: Agents, i: int, path: str, body: dict[str, Any], token: str | None = TOKEN) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"http://127.0.0.1:{world.ports[i]}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def served_tensors(world: Agents, i: int) -> tuple[str, dict[str, Any]]:
    """What node ``i`` serves from its device slot, read through its export (copied out, then
    closed: a one-shot reader takes no hold)."""
    from hwtui.engine.resident.served_export import open_served

    status, doc = export(world, i, body={"hold_s": 0})
    assert status == 200 and doc["hold"] is None, doc
    served = open_served(doc)
    try:
        return served.version, {k: t.clone() for k, t in served.tensors.items()}
    finally:
        served.close()


def slot_memfds(world: Agents, i: int) -> int:
    """Device-slot stand-ins the agent process holds: distinct memfds named for its slots."""
    return ipc_memfds(world.procs[i].pid)


def descendant_threads(world: Agents, i: int) -> int:
    """Threads alive in agent ``i``'s descendants (its resident rank and what that runs)."""
    return sum(len(os.listdir(f"/proc/{pid}/task")) for pid in descendants(world.procs[i].pid)
               if os.path.isdir(f"/proc/{pid}/task"))


def _settled_threads(world: Agents, i: int, want: int | None) -> int:
    """The descendant thread count once it is back to ``want`` (bounded: a thread still winding
    down after the push's last answer gets 30 s), or what it is then."""
    deadline = time.monotonic() + 30
    n = descendant_threads(world, i)
    while want is not None and n > want and time.monotonic() < deadline:
        time.sleep(0.05)
        n = descendant_threads(world, i)
    return n


def device(world: Agents, i: int) -> dict[str, Any]:
    return world.replication(i)["device"]


def test_pushes_switch_the_served_slot_and_serve_the_pushed_bytes(world, models):
    threads: list[int] = []
    for v, slot in (("v1", "A"), ("v2", "B"), ("v3", "A")):
        done = push(models[v][0], world.agents())
        assert done.returncode == 0, done.stdout + done.stderr
        # The source's resident rank lives on across pushes: what a push started there (its reader
        # threads above all) ends with it. Before, each push left its readers' threads behind.
        threads.append(_settled_threads(world, 0, threads[0] if threads else None))
        dev = device(world, 1)
        assert (dev["serving"], dev["slot"], dev["receiving"]) == (v, slot, None), dev
        assert dev["bytes"] > 0 and dev["device"] == "host"
        version, got = served_tensors(world, 1)
        assert version == v
        assert_bytes_equal(got, models[v][1])  # v2, v3: a delta; its unchanged tensors are in the slot too
    assert threads == [threads[0]] * 3, threads
    dev = device(world, 1)
    assert dev["allocs"] == 2 and dev["frees"] == 0, dev  # v3 reused v1's slot: nothing new in steady state
    assert slot_memfds(world, 1) == 2
    with urllib.request.urlopen(f"http://127.0.0.1:{world.ports[1]}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'hwtui_resident_device_serving_info{node="node1",device="host",slot="A",version="v3"} 1' in text
    assert 'hwtui_resident_device_slot_bytes{node="node1",device="host",slot="B"}' in text


def test_a_restarted_agent_loads_what_its_disk_serves(world, models):
    world.kill(1)
    world.start(1, "--device", "cuda", **DEVICE)
    dev = device(world, 1)
    assert dev["serving"] == "v3" and "loaded from disk" in dev.get("loaded", ""), dev
    assert_bytes_equal(served_tensors(world, 1)[1], models["v3"][1])


def _failed_push(world, models, fault: str):  # type: ignore[no-untyped-def]
    """Agent 1 restarted with ``fault``, then a push of v4 that must fail; the push and agent 1's device view."""
    world.kill(1)
    world.start(1, "--device", "cuda", **DEVICE, HWTUI_TEST_FAULT=fault)
    done = push(models["v4"][0], world.agents())
    assert done.returncode == 1, done.stdout + done.stderr
    return done, device(world, 1)


def test_a_corrupted_bucket_is_named_and_the_served_slot_stays(world, models):
    done, dev = _failed_push(world, models, "corrupt:bucket=1,rank=1")
    assert "bucket 1" in done.stdout + done.stderr
    assert (dev["serving"], dev["receiving"]) == ("v3", None), dev
    assert dev["slots"]["B"]["bytes"] == 0 and slot_memfds(world, 1) == 1  # the staged slot is freed
    assert_bytes_equal(served_tensors(world, 1)[1], models["v3"][1])


def test_a_rank_killed_mid_push_leaves_the_served_slot_and_frees_the_staged_one(world, models):
    _, dev = _failed_push(world, models, "kill:rank=1,bucket=3")
    assert (dev["serving"], dev["slot"], dev["receiving"]) == ("v3", "A", None), dev
    assert slot_memfds(world, 1) == 1 and dev["frees"] == 1, dev
    assert_bytes_equal(served_tensors(world, 1)[1], models["v3"][1])
    # and the next push (a fresh rank) lands in the other slot and serves
    world.kill(1)
    world.start(1, "--device", "cuda", **DEVICE)
    done = push(models["v4"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
    assert device(world, 1)["serving"] == "v4"
    assert_bytes_equal(served_tensors(world, 1)[1], models["v4"][1])


def test_a_split_finished_by_resume_is_loaded_onto_the_device(world, models):
    world.kill(1)
    world.start(1, "--device", "cuda", **DEVICE, HWTUI_TEST_FAULT="fail:rank=1,phase=commit")
    done = push(models["v5"][0], world.agents())
    assert done.returncode == 1 and "SPLIT" in done.stdout, done.stdout + done.stderr
    dev = device(world, 1)
    assert (dev["serving"], dev["receiving"]) == ("v4", None), dev  # as its disk: the switch failed there
    assert slot_memfds(world, 1) == 1
    resumed = push(models["v5"][0], world.agents(), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    dev = device(world, 1)
    assert dev["serving"] == "v5" and "v5 loaded from disk" in dev.get("loaded", ""), dev
    assert_bytes_equal(served_tensors(world, 1)[1], models["v5"][1])
    assert slot_memfds(world, 1) == 2  # v5 in the other slot; v4's stays allocated for the next push


def test_a_push_is_refused_into_the_slot_a_consumer_holds_until_it_lets_go(world, models):
    """A serving process exported v5's slot and holds it. v6 lands in the other slot; v7 would be
    received into the held one: refused on that node with who holds it, nothing changed, the
    consumer's weights intact. Renewed, then released: v7 lands there."""
    world.kill(1)
    world.start(1, "--device", "cuda", **DEVICE)  # without the fault the test before started it with
    for bad, why in (({"hold_s": "60"}, "hold_s must be a number"), ({"hold_s": -1}, "hold_s must be a number"),
                     ({"lease": "0" * 32}, "takes hold_s only")):
        status, doc = export(world, 1, body=bad)
        assert status == 400 and why in doc["error"], doc
    status, held = export(world, 1, body={"hold_s": 300})
    assert status == 200 and held["version"] == "v5" and held["hold"]["slot"] == held["slot"], held
    lease, slot = held["hold"]["lease"], held["slot"]
    done = push(models["v6"][0], world.agents())
    assert done.returncode == 0, done.stdout + done.stderr
    assert device(world, 1)["serving"] == "v6" and device(world, 1)["slot"] != slot
    refused = push(models["v7"][0], world.agents())
    out = refused.stdout + refused.stderr
    # Refused before any rank starts (the prepare says so), one line naming the node, slot and holder.
    assert refused.returncode == 1 and out.count("\n") == 1, out
    assert f"agent {world.agents().split(',')[1]} (node1): slot {slot} still serves v5 to 1 consumer(s) holding it " \
           f"(uid {os.geteuid()})" in out, out
    short = push(models["v7"][0], world.agents(), "--wait-holds", "1")
    assert short.returncode == 1 and "(waited 1 s)" in short.stderr and "waiting up to 1 s" in short.stderr, short.stderr
    bad = push(models["v7"][0], world.agents(), "--wait-holds", "-1")
    assert bad.returncode == 2 and "--wait-holds -1.0: expected 0 to" in bad.stderr, bad.stderr
    dev = device(world, 1)
    assert (dev["serving"], dev["receiving"]) == ("v6", None), dev
    assert [(h["slot"], h["version"]) for h in dev["holds"]] == [(slot, "v5")] and "lease" not in dev["holds"][0]
    with urllib.request.urlopen(f"http://127.0.0.1:{world.ports[1]}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert f'hwtui_resident_device_slot_holds{{node="node1",device="host",slot="{slot}"}} 1' in text
    assert lease not in text
    # The live view and `hwtui agents` show the same hold, from the node's /v1/summary.
    from hwtui.app.commands.agents import _line
    from hwtui.engine.resident.summary import NodeStatus, parse_summary
    from hwtui.widgets.cluster_nodes import node_rows

    with urllib.request.urlopen(f"http://127.0.0.1:{world.ports[1]}/v1/summary", timeout=10) as r:
        summary = parse_summary(json.loads(r.read()))
    shown = summary.replication.device
    assert summary.unknown == () and shown is not None
    assert (shown.device, shown.slot, shown.holds) == (dev["device"], dev["slot"], len(dev["holds"])), (shown, dev)
    assert shown.hold_left_s is not None and abs(shown.hold_left_s - dev["holds"][0]["left_s"]) < 30
    status = NodeStatus(agent=f"127.0.0.1:{world.ports[1]}", url="", stale=False, age_s=0.1, summary=summary)
    assert shown.held == ("v5",)
    assert str(node_rows(status)[0]["version"]) == "v6 [1 held: v5]"
    assert f"serving v6 on host slot {dev['slot']}, 1 hold(s) on v5, the last ends in" in _line(status), _line(status)
    from hwtui.engine.resident.served_export import open_served

    served = open_served(held)  # the consumer's view of v5, still exact
    try:
        assert_bytes_equal({k: t.clone() for k, t in served.tensors.items()}, models["v5"][1])
    finally:
        served.close()
    status, doc = post(world, 1, "/v1/served/hold", {"lease": lease, "hold_s": 300})
    assert status == 200 and doc["hold"]["slot"] == slot and doc["hold"]["version"] == "v5", doc
    assert post(world, 1, "/v1/served/hold", {"lease": "f" * 32, "hold_s": 5})[0] == 404
    assert post(world, 1, "/v1/served/release", {"lease": lease, "extra": 1})[0] == 400
    assert post(world, 1, "/v1/served/release", {"lease": lease}, token="wrong")[0] == 401
    # --wait-holds: the push waits (and says so on stderr) until the consumer lets go, then lands.
    bg = push_bg(models["v7"][0], world.agents(), "--wait-holds", "120")
    try:
        assert bg.stderr is not None
        line = bg.stderr.readline()  # bounded: the push gives up after 120 s and exits
        assert "waiting up to 120 s for the serving processes that hold the next device slot on" in line, line
        assert post(world, 1, "/v1/served/release", {"lease": lease}) == (200, {"node": "node1", "released": True})
        out, err = bg.communicate(timeout=200)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    assert bg.returncode == 0, out + err
    assert post(world, 1, "/v1/served/release", {"lease": lease})[1]["released"] is False
    dev = device(world, 1)
    assert (dev["serving"], dev["slot"], dev["holds"]) == ("v7", slot, []), dev
    assert_bytes_equal(served_tensors(world, 1)[1], models["v7"][1])


def test_the_export_needs_the_token_and_the_agents_user(world):
    status, doc = export(world, 1, token=None)
    assert status == 401
    status, doc = export(world, 1, token="wrong")
    assert status == 401
    status, doc = export(world, 0)  # the source keeps no device copy
    assert status == 404 and "--device cuda" in doc["error"]
    if os.geteuid() != 0:
        pytest.skip("asking as another user needs root to start a process as one")
    from tests.local_user import as_user

    def ask_as_nobody() -> None:
        # A process of another local user, with the right token: the asking socket is nobody's.
        conn = http.client.HTTPConnection("127.0.0.1", world.ports[1], timeout=30)
        conn.request("POST", "/v1/served/export", body=b"{}", headers={"Authorization": f"Bearer {TOKEN}",
                                                                      "Content-Type": "application/json"})
        answer = conn.getresponse()
        doc = json.loads(answer.read())
        assert answer.status == 403 and doc["error"].startswith("node node1: uid 65534 is not the agent's user"), doc
        assert "handle" not in doc

    as_user(65534, "/", ask_as_nobody)
