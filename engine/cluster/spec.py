"""The cluster description `hwtui cluster init` writes and `hwtui cluster test` reads.

One JSON file (schema ``hwtui.cluster/1``) holds everything the launch files are generated from:
the nodes (name and the address the others reach it on), devices per node, the launcher, the
rendezvous endpoint, the interface and the NCCL knobs from the RDMA quick start. Keeping it as data
rather than only as generated shell lets `cluster test` know which node a missing rank belongs to.

Validation is strict and happens before anything is written: a typo in a node name or an
interface only shows up as a 10-minute NCCL hang otherwise.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "hwtui.cluster/1"
LAUNCHERS = ("torchrun", "slurm", "mpirun")
BACKENDS = ("auto", "gloo", "nccl")
DEFAULT_PORT = 29500

# RFC 1123 host name (labels of letters, digits and hyphens); IP addresses are checked separately.
_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
# Linux interface names are at most 15 bytes; NCCL_SOCKET_IFNAME also takes comma lists and the
# ^ (exclude) and = (exact match) prefixes, so those characters are allowed around names.
_IFNAME_LIST = re.compile(r"^[\^=]?[A-Za-z0-9_.:@-]{1,15}(,[A-Za-z0-9_.:@-]{1,15})*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HCA = re.compile(r"^[\^=]?[A-Za-z0-9_.:,-]+$")


class SpecError(ValueError):
    """The cluster description is invalid; the message says which field and how to fix it."""


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def valid_host(text: str) -> bool:
    # All digits and dots is meant as an IPv4 address: "10.0.0.256" is a typo, not a host name
    # (RFC 1123 forbids an all-numeric top-level label for exactly this reason).
    if re.fullmatch(r"[0-9.]+", text):
        return is_address(text)
    return is_address(text) or bool(_HOSTNAME.match(text))


@dataclass
class Node:
    name: str
    address: str = ""  # what the other nodes connect to; the name when empty
    interface: str | None = None  # overrides the cluster-wide interface on this node

    @property
    def addr(self) -> str:
        return self.address or self.name


@dataclass
class ClusterSpec:
    nodes: list[Node]
    devices_per_node: int = 1
    launcher: str = "torchrun"
    interface: str | None = None
    master_addr: str | None = None  # defaults to the first node's address
    master_port: int = DEFAULT_PORT
    ib_hca: str | None = None
    net_plugin: str | None = None  # path to libnccl-net*.so, or a plugin name NCCL resolves itself
    backend: str = "auto"
    python: str = "python3"  # the interpreter (of the venv with hwtui) on every node
    join_timeout: float = 60.0
    timeout: float = 60.0
    min_busbw: float | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    # -- derived -----------------------------------------------------------------------------
    @property
    def master(self) -> str:
        return self.master_addr or self.nodes[0].addr

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.devices_per_node

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    def master_node(self) -> Node | None:
        """The node that hosts the rendezvous store, when the master address names one of them."""
        return next((n for n in self.nodes if self.master in (n.name, n.addr)), None)

    def node_of_rank(self, rank: int) -> Node | None:
        """With a fixed rank layout (srun, mpirun, manual) rank r runs on node r // devices."""
        index = rank // self.devices_per_node
        return self.nodes[index] if 0 <= index < len(self.nodes) else None

    def interface_of(self, node: Node) -> str | None:
        return node.interface or self.interface

    # -- validation and (de)serialisation ----------------------------------------------------
    def validate(self) -> ClusterSpec:
        if not self.nodes:
            raise SpecError("no nodes given: pass --nodes host1,host2,... (name or name=address)")
        seen: dict[str, str] = {}
        for node in self.nodes:
            for what, value in (("node name", node.name), ("address", node.addr)):
                if not valid_host(value):
                    raise SpecError(f"{what} {value!r} is neither a host name nor an IP address")
            if node.name in seen:
                raise SpecError(f"node {node.name!r} is listed twice")
            seen[node.name] = node.addr
            if node.interface is not None and not _IFNAME_LIST.match(node.interface):
                raise SpecError(f"interface {node.interface!r} for node {node.name!r} is not an interface name")
        addrs = [n.addr for n in self.nodes]
        dup = next((a for a in addrs if addrs.count(a) > 1), None)
        if dup is not None:
            raise SpecError(f"address {dup!r} is given to more than one node")
        if not isinstance(self.devices_per_node, int) or not 1 <= self.devices_per_node <= 1024:
            raise SpecError(f"devices per node must be a whole number from 1 to 1024, not {self.devices_per_node!r}")
        if self.launcher not in LAUNCHERS:
            raise SpecError(f"launcher {self.launcher!r} is not one of {', '.join(LAUNCHERS)}")
        if self.backend not in BACKENDS:
            raise SpecError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if not isinstance(self.master_port, int) or not 1 <= self.master_port <= 65535:
            raise SpecError(f"master port {self.master_port!r} is not a TCP port (1-65535)")
        if not valid_host(self.master):
            raise SpecError(f"master address {self.master!r} is neither a host name nor an IP address")
        if self.interface is not None and not _IFNAME_LIST.match(self.interface):
            raise SpecError(f"interface {self.interface!r} is not an interface name (e.g. eth0, ib0, or a list eth0,eth1)")
        if self.ib_hca is not None and not _HCA.match(self.ib_hca):
            raise SpecError(f"NCCL_IB_HCA value {self.ib_hca!r} is not a list of HCA names (e.g. mlx5_0,mlx5_1 or =mlx5_0:1)")
        if self.net_plugin is not None:
            if not self.net_plugin.strip() or any(c in self.net_plugin for c in "\n\0"):
                raise SpecError("the NCCL net plugin must be a path or a plugin name")
            if "/" in self.net_plugin and not self.net_plugin.startswith("/"):
                raise SpecError(f"the NCCL net plugin path {self.net_plugin!r} must be absolute: every node resolves it on its own")
        for what, value in (("join timeout", self.join_timeout), ("timeout", self.timeout)):
            if not isinstance(value, (int, float)) or not 0 < value <= 86400:
                raise SpecError(f"{what} must be a number of seconds above 0, not {value!r}")
        if self.min_busbw is not None and (not isinstance(self.min_busbw, (int, float)) or self.min_busbw < 0):
            raise SpecError(f"--min-busbw must be a number of GB/s >= 0, not {self.min_busbw!r}")
        if not self.python.strip() or "\n" in self.python:
            raise SpecError("--python must name an interpreter")
        for name in self.extra_env:
            if not _ENV_NAME.match(name):
                raise SpecError(f"{name!r} is not an environment variable name")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, raw: Any) -> ClusterSpec:
        if not isinstance(raw, dict):
            raise SpecError("a cluster description is a JSON object")
        if raw.get("schema") != SCHEMA:
            raise SpecError(f"not a cluster description (schema {raw.get('schema')!r}, expected {SCHEMA!r})")
        body = {k: v for k, v in raw.items() if k != "schema"}
        try:
            nodes = [Node(**n) if isinstance(n, dict) else Node(str(n)) for n in body.pop("nodes", [])]
            known = set(cls.__dataclass_fields__)
            unknown = sorted(set(body) - known)
            if unknown:
                raise SpecError(f"unknown field(s) in the cluster description: {', '.join(unknown)}")
            spec = cls(nodes=nodes, **body)
        except TypeError as exc:
            raise SpecError(f"malformed cluster description: {exc}") from None
        return spec.validate()


def parse_nodes(text: str) -> list[Node]:
    """``a,b,c`` or ``a=10.0.0.1,b=10.0.0.2``: names, optionally with the address peers use."""
    nodes = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, address = item.partition("=")
        nodes.append(Node(name.strip(), address.strip()))
    return nodes


def load(path: str | Path) -> ClusterSpec:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file (create it with `hwtui cluster init`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None
    except ValueError as exc:
        raise SpecError(f"{path}: not JSON: {exc}") from None
    try:
        return ClusterSpec.from_dict(raw)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
