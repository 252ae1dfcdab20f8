"""`hwtui env` and `hwtui --check --only env` end to end, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwtui.probes.distributed.rendezvous import FACT_KEY
from tests.probes.distributed.netsys import nvidia_ib_node

HWTUI = str(Path(sys.executable).with_name("hwtui"))
pytestmark = pytest.mark.timeout(120)

ENV = {"PATH": "/usr/bin:/bin", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "RANK": "9", "LOCAL_RANK": "1",
       "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NCCL_IB_HCA": "mlx5_1", "NCCL_P2P_DISABLE": "1",
       "NCCL_DEBUG": "INFO", "HWTUI_PROBE_TIMEOUT_SCALE": "3",
       # this tree's code (tests/conftest.py), not whatever the venv's editable install points at
       "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    ns = nvidia_ib_node(tmp_path_factory.mktemp("cli"), gpus=8)
    ns.facts(**{FACT_KEY: {
        "target": {"host": "10.0.0.1", "port": 29500, "master_here": False},
        "resolve": {"ok": True, "timed_out": False, "elapsed_s": 0.0, "addresses": ["10.0.0.1"]},
        "ip": "10.0.0.1", "route": {"source": "10.0.0.5", "interface": "eth0"}, "local": False,
        "port_test": {"action": "connect", "outcome": "refused", "errno": 111, "error": "Connection refused",
                      "elapsed_s": 0.001}}})
    ns.netif("eth01", mac="02:00:00:00:00:09")  # shares the prefix "eth0": the export must pin it with '='
    return ns


def hwtui(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([HWTUI, *args], capture_output=True, text=True, timeout=100, env=env if env is not None else ENV)


def test_env_prints_exports_filled_from_the_tree(tree, tmp_path):
    out = hwtui("env", "--sysroot", str(tree.root))
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    exports = dict(line[len("export "):].split("=", 1) for line in lines if line.startswith("export "))
    assert exports["MASTER_ADDR"] == "10.0.0.1" and exports["MASTER_PORT"] == "29500"
    assert exports["NCCL_SOCKET_IFNAME"] == "=eth0"  # routes to MASTER_ADDR; eth01 exists, so exact
    assert exports["GLOO_SOCKET_IFNAME"] == "eth0"
    assert exports["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"  # prefix mlx5_1 also matched mlx5_10: replaced
    # hwtui has no UCX path: no UCX variable is exported, the NCCL_IB_HCA -> UCX_NET_DEVICES mapping is a comment.
    assert not any("UCX" in name for name in exports)
    assert "# hwtui has no UCX path; for a UCX program the same ports are UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1" \
        in out.stdout.splitlines()
    assert exports["NCCL_DEBUG"] == "INFO" and exports["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "unset NCCL_P2P_DISABLE" in lines
    assert "RANK" not in exports and "LOCAL_RANK" not in exports
    # The exports are valid shell: sourcing them in bash gives back the values.
    script = out.stdout + '\nprintf "%s|%s" "$NCCL_IB_HCA" "${NCCL_P2P_DISABLE-unset}"\n'
    sh = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10,
                        env={"PATH": "/usr/bin:/bin", "NCCL_P2P_DISABLE": "1"})
    assert sh.stdout == "=mlx5_0:1,mlx5_1:1|unset"


def test_env_write_is_atomic_and_sourceable(tree, tmp_path):
    target = tmp_path / "node.env"
    target.write_text("old content\n")
    out = hwtui("env", "--sysroot", str(tree.root), "--write", str(target), "--checkpoint-dir", "/nowhere")
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""  # written, not printed as well
    assert target.read_text().startswith("# hwtui env: exports for")
    assert f"source {target}" in out.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["node.env"]  # no temporary file left behind
    bad = hwtui("env", "--sysroot", str(tree.root), "--write", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.startswith("hwtui: error: --write")
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_check_only_env(tree):
    out = hwtui("--check", "--only", "env", "--json", "--sysroot", str(tree.root))
    doc = json.loads(out.stdout)
    ids = {f["id"]: f["status"] for f in doc["findings"]}
    assert out.returncode == 0  # warnings only: the prefix HCA list, the refused port, a debugging switch
    assert hwtui("--check", "--only", "env", "--strict", "--sysroot", str(tree.root)).returncode == 1
    assert ids["ib.hca"] == "warn" and ids["rendezvous.reachable"] == "warn"
    assert ids["nccl.switch[NCCL_P2P_DISABLE]"] == "warn" and ids["launcher.rank"] == "pass"
    assert ids["visibility.local_rank"] == "pass"
    # Only env checks ran: none of the hardware area's own findings appear.
    assert not any(i.startswith(("pci.", "devnodes.", "kernel.", "host.")) for i in ids)


def test_check_only_env_text_and_exit_codes(tree):
    clean = {"PATH": "/usr/bin:/bin", "HWTUI_PROBE_TIMEOUT_SCALE": "3"}
    out = hwtui("--check", "--only", "env", "--sysroot", str(tree.root), env=clean)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "launcher.detected" in out.stdout
    bad = hwtui("--check", "--only", "env", "--sysroot", str(tree.root), env={**clean, "RANK": "3", "WORLD_SIZE": "2"})
    assert bad.returncode == 1 and "RANK=3 is not below WORLD_SIZE=2" in bad.stdout


def test_env_on_this_machine_is_quick_and_clean():
    # Live: reads this machine's /sys/class/net; no launcher variables, so no network probe runs.
    out = hwtui("env", env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert out.returncode == 0, out.stderr
    assert "export NCCL_DEBUG=WARN" in out.stdout
