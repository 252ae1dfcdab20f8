"""``hwtui train --push-to`` end to end (issue 24 item 5): train, then serve.

- Three "hosts" in network namespaces: node0's agent is the source, on the host that trains (it
  reads the exported files from that disk); node1 and node2 receive. ``hwtui train --gpu-ids
  cpu:0 --push-to node0,node1,node2 --push-every 1 --save-hf OUT`` ends with both receivers
  committing the final version and serving a file whose bytes are OUT/model.safetensors.
- On loopback: a receiver whose rank dies mid-push (a test fault, the agent stays) fails the
  push; the training still completes, writes its checkpoint, --save-hf and its report, lists the
  failed pushes there and on stderr, and exits 4 (trained, push failed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli_proc

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.agent.procs import Agents, env  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

GPT2 = {"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 64,
        "architectures": ["GPT2LMHeadModel"]}
HF_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def _inputs(tmp: Path) -> tuple[Path, Path]:
    model = tmp / "gpt"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(GPT2))
    text = tmp / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog while seven cats sing\n" * 300)
    return model, text


def _train_argv(tmp: Path, agents: str, token_file: Path, *extra: str) -> list[str]:
    model, text = _inputs(tmp)
    return ["train", "--model", str(model), "--data", str(text), "--gpu-ids", "cpu:0", "--steps", "10",
            "--merge-every", "5", "--context", "32", "--push-to", agents, *extra,
            "--save-hf", str(tmp / "out"), "--checkpoint-dir", str(tmp / "ck"), "--report", str(tmp / "r.json"),
            "--token-file", str(token_file)]


def _served_bytes(served: Path) -> tuple[str, bytes]:
    cur = json.loads((served / "CURRENT").read_text())
    return cur["version"], (served / cur["file"]).read_bytes()


def test_a_receiver_that_dies_mid_push_never_loses_the_training_run(tmp_path):
    world = Agents(tmp_path, 3)
    try:
        for i in range(2):
            world.start(i)
        world.start(2, HWTUI_TEST_FAULT="kill:rank=2,phase=prepare")  # its rank dies in every push
        argv = _train_argv(tmp_path, world.agents(), world.token_file)
        done = cli_proc.run([sys.executable, "-m", "hwtui.app", *argv], capture_output=True, text=True, timeout=240,
                            env={**env(), **HF_ENV})
    finally:
        world.close()
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] is True and report["step"] == 10  # the training delivered
    assert (tmp_path / "out" / "model.safetensors").is_file() and report["save_hf"]["ok"]
    assert report["checkpoints"] and Path(report["checkpoints"][-1]["path"]).exists()
    pushes = report["pushes"]
    assert len(pushes) == 1, pushes  # no --push-every: the end's push only
    final = pushes[0]
    assert final["final"] and final["round"] == 2 and not final["ok"], pushes
    assert final["outcome"] in ("not committed", "unknown") and final["version"] and final["seconds"] > 0
    by = {n["node"]: n for n in final["nodes"]}
    assert by["node2"]["outcome"] in ("died", "failed", "aborted"), by
    assert by["node1"]["outcome"] != "committed", by  # all or nothing
    assert not (world.served(1) / "CURRENT").exists()  # node1 was never switched to a version node2 lacks
    failed = [ln for ln in done.stderr.splitlines() if "FAILED" in ln]
    assert len(failed) == 1 and "round 2 (step 10)" in failed[0] and "Traceback" not in done.stderr, done.stderr
    assert not list(tmp_path.glob(".hwtui-push-*"))  # the pusher's working directory is gone


# -- two receivers on two other "hosts" ----------------------------------------------------------

def test_push_to_agents_in_network_namespaces_serves_the_save_hf_bytes(tmp_path):
    from tests.engine.cluster.netns import NetnsCluster, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"cannot create network namespaces: {reason}")
    from hwtui.app.node_api.token import load_or_create

    port = 9477
    net = NetnsCluster(3).up()
    procs: list[subprocess.Popen[str]] = []
    token_file = tmp_path / "agent.token"
    load_or_create(str(token_file))
    nenv = {**env(), **HF_ENV, "GLOO_SOCKET_IFNAME": "eth0"}
    nenv.pop("HWTUI_AGENT_TOKEN")
    try:
        for i, addr in enumerate(net.addresses):
            proc = net.popen(i, [sys.executable, "-m", "hwtui.app", "agent", "--listen", f"{addr}:{port}",
                                 "--token-file", str(token_file), "--node", f"node{i}", "--out",
                                 str(tmp_path / f"node{i}"), "--check-interval", "3600", "--interval", "0.5"], env=nenv)
            procs.append(proc)
            line = proc.stdout.readline() if proc.stdout else ""
            assert "listening on" in line, line
        agents = ",".join(f"{a}:{port}" for a in net.addresses)
        argv = _train_argv(tmp_path, agents, token_file, "--push-every", "1")
        done = cli_proc.run(cli_proc.in_netns(net.node_ns[0], [sys.executable, "-m", "hwtui.app", *argv]),
                            capture_output=True, text=True, timeout=240, env=nenv)
    finally:
        import signal

        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        net.down()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    final = report["pushes"][-1]
    assert final["final"] and final["ok"] and final["outcome"] == "committed", report["pushes"]
    assert [n["outcome"] for n in final["nodes"]] == ["committed"] * 3
    assert final["seconds"] > 0 and final["version"].endswith("-step10")
    want = (tmp_path / "out" / "model.safetensors").read_bytes()
    for i in (1, 2):
        version, got = _served_bytes(tmp_path / f"node{i}" / "served")
        assert version == final["version"] and got == want, i
    # The summary says each push: version, receivers, seconds.
    assert f"push {final['version']}" in done.stdout and "committed on node1, node2" in done.stdout
    print(f"\ntrain --push-to: pushes {[(p['round'], p['outcome'], p['seconds']) for p in report['pushes']]}")
