"""Three "nodes" on one machine: Linux network namespaces joined through a bridge.

Layout (all names carry a per-run tag so parallel runs never collide, nothing is added to the root
namespace, and everything is deleted on exit; deleting a namespace deletes its veth ends):

    <tag>br : bridge br0 with ports p0, p1, p2
    <tag>n0 : eth0 = 10.77.0.1/24  (peer of p0)
    <tag>n1 : eth0 = 10.77.0.2/24
    <tag>n2 : eth0 = 10.77.0.3/24

Each node namespace sees only ``lo`` and its ``eth0``; traffic between them stays on the bridge.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Sequence

SUBNET = "10.77.0"


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the suite as root or in a privileged container)"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"hwtprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=10)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    return None


class NetnsCluster:
    def __init__(self, nodes: int = 3):
        self.tag = f"hwt{uuid.uuid4().hex[:6]}"
        self.bridge_ns = f"{self.tag}br"
        self.node_ns = [f"{self.tag}n{i}" for i in range(nodes)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(nodes)]
        self._made: list[str] = []

    def _ip(self, *args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=15)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def up(self) -> NetnsCluster:
        try:
            self._ip("netns", "add", self.bridge_ns)
            self._made.append(self.bridge_ns)
            self._ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            self._ip("-n", self.bridge_ns, "link", "set", "br0", "up")
            for i, (ns, addr) in enumerate(zip(self.node_ns, self.addresses, strict=True)):
                self._ip("netns", "add", ns)
                self._made.append(ns)
                self._ip("-n", ns, "link", "set", "lo", "up")
                # Created inside the bridge namespace with its peer moved straight into the node's,
                # so no interface ever exists in the root namespace.
                self._ip("-n", self.bridge_ns, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                self._ip("-n", self.bridge_ns, "link", "set", f"p{i}", "master", "br0")
                self._ip("-n", self.bridge_ns, "link", "set", f"p{i}", "up")
                self._ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                self._ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15)
        self._made.clear()

    def popen(self, node: int, argv: Sequence[str], env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        """``argv`` in node ``node``'s namespace; a hwtui CLI is forked from the tests' zygote there
        (tests/cli_proc.py, tests/in_netns.py), anything else runs under ``ip netns exec``."""
        from tests import cli_proc

        return cli_proc.Popen(cli_proc.in_netns(self.node_ns[node], argv), env=env,  # type: ignore[return-value]
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def finish(procs: Sequence[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    """Wait for every process (killing the group of any that overruns); return (rc, out, err)."""
    import signal
    import time

    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate(timeout=10)
            err += f"\n<killed after {timeout} s>"
        results.append((p.returncode, out, err))
    return results
