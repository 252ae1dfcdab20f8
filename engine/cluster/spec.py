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
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "hwtui.cluster/1"
LAUNCHERS = ("torchrun", "slurm", "mpirun", "tpu")
BACKENDS = ("auto", "gloo", "nccl")
DEFAULT_PORT = 29500

# The grammar below is the only gate between a user's --nodes and the shell: every accepted host
# or address is made of characters that need no quoting at all (shlex.quote leaves it unchanged),
# and none of them can end a comment or a line. Patterns are matched with fullmatch, never with
# ``$`` (which also matches before a trailing newline).
#
# DNS labels (RFC 1123): letters, digits and inner hyphens, 1-63 each, 253 in all.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*")
_IPV4 = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")
# IPv6: hex digits and colons (an embedded IPv4 tail may add dots), optionally ``%scope`` where
# the scope is an interface name (Linux: at most 15 bytes) or an interface index.
_IPV6 = re.compile(r"[0-9A-Fa-f:.]{2,45}(?:%[A-Za-z0-9_-][A-Za-z0-9_.-]{0,14})?")
_IFNAME = r"[A-Za-z0-9_.:@-]{1,15}"
# NCCL_SOCKET_IFNAME also takes comma lists and the ^ (exclude) and = (exact match) prefixes.
_IFNAME_LIST = re.compile(rf"[\^=]?{_IFNAME}(?:,{_IFNAME})*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HCA = re.compile(r"[\^=]?[A-Za-z0-9_.:,-]{1,256}")
# Google Cloud resource names (TPU name, zone, project): lower-case letters, digits, inner hyphens.
_GCP_NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")


class SpecError(ValueError):
    """The cluster description is invalid; the message says which field and how to fix it."""


def is_address(text: object) -> bool:
    """An IPv4 address, or an IPv6 address with an optional interface-name scope (``fe80::1%eth0``)."""
    if not isinstance(text, str):
        return False
    if _IPV4.fullmatch(text):
        return _parses(ipaddress.IPv4Address, text)
    if ":" in text and _IPV6.fullmatch(text):
        return _parses(ipaddress.IPv6Address, text)
    return False


def _parses(kind: type, text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


def valid_host(text: object) -> bool:
    """An address (see `is_address`) or a DNS name; nothing else, whatever Python's parsers allow."""
    if not isinstance(text, str):
        return False
    # All digits and dots is meant as an IPv4 address: "10.0.0.256" is a typo, not a host name
    # (RFC 1123 forbids an all-numeric top-level label for exactly this reason).
    if re.fullmatch(r"[0-9.]+", text):
        return is_address(text)
    return is_address(text) or bool(_HOSTNAME.fullmatch(text))


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def _matches(pattern: re.Pattern[str], value: object) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: object, limit: int = 60) -> str:
    """A value in an error message: repr (so control characters show as escapes), cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


# Optional network fields, each checked against its grammar when set: (field, check, message with
# {} for the value as shown).
_OPTIONAL_NETWORK_FIELDS: tuple[tuple[str, Callable[[object], bool], str], ...] = (
    ("master_addr", valid_host, "master address {} is neither a host name nor an IP address"),
    ("interface", lambda v: _matches(_IFNAME_LIST, v),
     "interface {} is not an interface name (e.g. eth0, ib0, or a list eth0,eth1)"),
    ("ib_hca", lambda v: _matches(_HCA, v),
     "NCCL_IB_HCA value {} is not a list of HCA names (e.g. mlx5_0,mlx5_1 or =mlx5_0:1)"),
)


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
    # --launcher tpu: the TPU VM (its workers are the nodes, in order) and where it lives.
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_project: str | None = None

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
        """Check every field's type and grammar; the message names the field and the fix. The checks
        run in this order, so the first problem found is always the same one."""
        self._validate_nodes()
        self._validate_launch()
        self._validate_network()
        self._validate_run()
        return self

    def _validate_nodes(self) -> None:
        if not isinstance(self.nodes, list) or not self.nodes:
            raise SpecError("no nodes given: pass --nodes host1,host2,... (name or name=address)")
        seen: dict[str, str] = {}
        for node in self.nodes:
            for what, value in (("node name", node.name), ("address", node.addr)):
                if not valid_host(value):
                    raise SpecError(f"{what} {_shown(value)} is neither a host name nor an IP address "
                                    "(letters, digits, '-' and '.'; IPv4; or IPv6 with an optional %scope)")
            if node.name in seen:
                raise SpecError(f"node {node.name!r} is listed twice")
            seen[node.name] = node.addr
            if node.interface is not None and not _matches(_IFNAME_LIST, node.interface):
                raise SpecError(f"interface {_shown(node.interface)} for node {node.name!r} is not an interface name")
        counts = Counter(n.addr for n in self.nodes)
        dup = next((a for a, k in counts.items() if k > 1), None)
        if dup is not None:
            raise SpecError(f"address {dup!r} is given to more than one node")

    def _validate_launch(self) -> None:
        """Devices per node, the launcher (and a TPU launch's Google Cloud names), the backend."""
        if not _whole(self.devices_per_node) or not 1 <= self.devices_per_node <= 1024:
            raise SpecError(f"devices per node must be a whole number from 1 to 1024, not {_shown(self.devices_per_node)}")
        if self.launcher not in LAUNCHERS:
            raise SpecError(f"launcher {_shown(self.launcher)} is not one of {', '.join(LAUNCHERS)}")
        if self.launcher == "tpu":
            if self.tpu_name is None or self.tpu_zone is None:
                raise SpecError("--launcher tpu needs --tpu-name NAME and --zone ZONE (gcloud compute tpus tpu-vm list)")
            if self.devices_per_node != 1:
                raise SpecError("--launcher tpu runs one process per TPU VM worker (the TPU runtime drives every chip of "
                                "the host from it): drop --devices-per-node")
        for label, gcp in (("TPU name", self.tpu_name), ("zone", self.tpu_zone), ("project", self.tpu_project)):
            if gcp is not None and not _matches(_GCP_NAME, gcp):
                raise SpecError(f"{label} {_shown(gcp)} is not a Google Cloud name (lower-case letters, digits, '-')")
        if self.backend not in BACKENDS:
            raise SpecError(f"backend {_shown(self.backend)} is not one of {', '.join(BACKENDS)}")

    def _validate_network(self) -> None:
        """The rendezvous port, then each optional network field against its grammar, then the plugin."""
        if not _whole(self.master_port) or not 1 <= self.master_port <= 65535:
            raise SpecError(f"master port {_shown(self.master_port)} is not a TCP port (1-65535)")
        for attr, ok, message in _OPTIONAL_NETWORK_FIELDS:
            value = getattr(self, attr)
            if value is not None and not ok(value):
                raise SpecError(message.format(_shown(value)))
        if self.net_plugin is not None:
            if not isinstance(self.net_plugin, str) or not self.net_plugin.strip() or _has_control(self.net_plugin):
                raise SpecError("the NCCL net plugin must be a path or a plugin name (no control characters)")
            if "/" in self.net_plugin and not self.net_plugin.startswith("/"):
                raise SpecError(f"the NCCL net plugin path {_shown(self.net_plugin)} must be absolute: every node resolves it on its own")

    def _validate_run(self) -> None:
        """Timeouts, the bandwidth floor, the interpreter and the extra environment."""
        for what, seconds in (("join timeout", self.join_timeout), ("timeout", self.timeout)):
            if not _number(seconds) or not 0 < seconds <= 86400:
                raise SpecError(f"{what} must be a number of seconds above 0 (at most 86400), not {_shown(seconds)}")
        if self.min_busbw is not None and (not _number(self.min_busbw) or not 0 <= self.min_busbw < 1e9):
            raise SpecError(f"--min-busbw must be a number of GB/s >= 0, not {_shown(self.min_busbw)}")
        if not isinstance(self.python, str) or not self.python.strip() or _has_control(self.python) or len(self.python) > 4096:
            raise SpecError("--python must name an interpreter (a path without control characters)")
        if not isinstance(self.extra_env, dict):
            raise SpecError("extra_env must be an object of NAME: VALUE strings")
        for name, value in self.extra_env.items():
            if not _matches(_ENV_NAME, name):
                raise SpecError(f"{_shown(name)} is not an environment variable name")
            if not isinstance(value, str) or "\0" in value:
                raise SpecError(f"the value of {name} must be a string without NUL bytes")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    def public_dict(self) -> dict[str, Any]:
        """``to_dict`` for printing: --env values are secrets (tokens), so only their names show."""
        from hwtui.core.redact import MASK

        return {**self.to_dict(), "extra_env": {k: MASK for k in self.extra_env}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, raw: Any) -> ClusterSpec:
        if not isinstance(raw, dict):
            raise SpecError("a cluster description is a JSON object")
        if raw.get("schema") != SCHEMA:
            raise SpecError(f"not a cluster description (schema {_shown(raw.get('schema'))}, expected {SCHEMA!r})")
        body = {k: v for k, v in raw.items() if k != "schema"}
        unknown = sorted(set(body) - set(cls.__dataclass_fields__))
        if unknown:
            raise SpecError(f"unknown field(s) in the cluster description: {_shown(', '.join(unknown))}")
        raw_nodes = body.pop("nodes", [])
        if not isinstance(raw_nodes, list):
            raise SpecError("nodes must be a list of {name, address, interface} objects")
        nodes = []
        for item in raw_nodes:
            if isinstance(item, str):
                nodes.append(Node(item))
                continue
            if not isinstance(item, dict) or not set(item) <= {"name", "address", "interface"} or "name" not in item:
                raise SpecError(f"node {_shown(item)} must be an object with name, address and interface")
            node = Node(item["name"], item.get("address", ""), item.get("interface"))
            if not isinstance(node.address, str):
                raise SpecError(f"the address of node {_shown(node.name)} must be a string")
            nodes.append(node)
        return cls(nodes=nodes, **body).validate()


def parse_nodes(text: str) -> list[Node]:
    """``a,b,c`` or ``a=10.0.0.1,b=10.0.0.2``: names, optionally with the address peers use.

    Only spaces and tabs around items are forgiven; any other character is left for the grammar
    to refuse (a newline in a host name is an attack or a paste accident, never a name)."""
    nodes = []
    for item in (part.strip(" \t") for part in text.split(",")):
        if not item:
            continue
        name, _, address = item.partition("=")
        nodes.append(Node(name.strip(" \t"), address.strip(" \t")))
    return nodes


MAX_SPEC_BYTES = 1 << 20  # a description of 1,000 nodes is ~100 KiB


def load(path: str | Path) -> ClusterSpec:
    """Read and validate a description; every problem is one SpecError line, nothing blocks."""

    from hwtui.core.bounded_read import NotRegularFile, read_bounded

    try:
        # Through core.bounded_read: a FIFO named as --spec is refused, never waited on.
        data, more = read_bounded(path, MAX_SPEC_BYTES)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file (create it with `hwtui cluster init`)") from None
    except NotRegularFile:
        raise SpecError(f"{path}: not a regular file") from None
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if more:
        data += b"?"  # the size check below names the cap
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: larger than {MAX_SPEC_BYTES} bytes; not a cluster description")
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text: {exc.reason}") from None
    except RecursionError:
        raise SpecError(f"{path}: not JSON: nested too deeply") from None
    except ValueError as exc:
        raise SpecError(f"{path}: not JSON: {exc}") from None
    try:
        return ClusterSpec.from_dict(raw)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
