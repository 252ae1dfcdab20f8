"""Where each receiver takes its bytes from: a pure function of every rank's agreement record.

Every rank computes the same answer from the same gathered records (agree.py), so no rank has to
tell another which path it took.

- source: rank 0, which holds the files.
- same-host: on the source's host with the same source file: copy from its page cache. Needs the
  version in safetensors files (torch pickles have no byte range to map).
- shm: on the source's host, but a source file is a torch pickle (nothing to map): the source
  stages each bucket in /dev/shm and announces it, as a host leader does for its followers.
- network: one rank per other host (its leader) receives by broadcast from rank 0, in a process
  group of rank 0 and the leaders, so network bytes per host are model bytes.
- host-copy: the other ranks of a leader's host copy from the leader's verified staging copy (a
  file: its ``--out`` staging file, else one in /dev/shm) and verify their own copy.
- ipc: on the source's node when the transport is CUDA IPC (engine.replication.ipc_protocol): the
  source exports each bucket by handle, the receiver copies it device to device and verifies it on
  the device. It takes precedence over same-host: the copy is already in device memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hwtui.engine.replication.agree import same_host_reason

SRC = 0
HostKey = tuple[Any, Any, Any]

_SHM_WHY = "same host, but a source file is not safetensors (cannot be mapped): the source stages each bucket in /dev/shm"
_WHAT = {"same-host": "copy each bucket from the source's page cache (memory map of the same file) and verify it",
         "shm": "copy each bucket from the source's staging copy in /dev/shm and verify it",
         "network": "receive each bucket by {backend} broadcast",
         "host-copy": "copy from their host leader's verified copy and verify it",
         "ipc": "open each bucket the source exports by IPC handle, copy it device to device and verify it on the device"}
_IPC_WHY = "same node as the source (boot id, network namespace and user)"


@dataclass(frozen=True)
class PathChoice:
    """The world's paths: rank -> (path, why), who copies from whom, who is on the network."""

    paths: dict[int, tuple[str, str]]
    leader_of: dict[int, int]  # host-copy (or shm) rank -> the rank whose staging copy it maps
    net_ranks: list[int]  # the source and the ranks that receive by broadcast
    leader_files: dict[int, str]  # leader -> the staging file its followers map


def host_key(record: dict[str, Any]) -> HostKey:
    """One host *and* one user: a leader's staging file is 0600 in a 0700 directory, readable by its own user only."""
    h = record.get("host") or {}
    return h.get("boot_id"), h.get("netns"), h.get("uid")


def _can_lead(record: dict[str, Any]) -> bool:
    return bool(record.get("staging_file"))


def _receiver_path(r: int, records: list[dict[str, Any]], why_not: str | None, mappable: bool,
                   leaders: dict[HostKey, int]) -> tuple[str, str, int | None]:
    """(path, why, the rank it copies from) of receiver ``r``; ``leaders`` collects each other host's leader."""
    if why_not is not None:
        return "network", why_not, None
    src_key = host_key(records[SRC])
    local, why = same_host_reason(records[r].get("host") or {}, records[SRC].get("host") or {})
    if local and mappable:
        return "same-host", why, None
    key = host_key(records[r])
    if local and key == src_key and _can_lead(records[SRC]):
        # The source's bytes are not a file it can map (a torch pickle is unpickled into memory):
        # the source stages each bucket in /dev/shm; the bytes still never touch a socket.
        return "shm", _SHM_WHY, SRC
    if local:
        why = "same host, but a source file is not safetensors (only safetensors files can be mapped)"
    leader = leaders.get(key)
    if key == src_key or not key[0] or leader is None or not _can_lead(records[leader]):
        leaders.setdefault(key, r)
        return "network", (f"host leader: {why}" if key != src_key else why), None
    return "host-copy", f"copies rank {leader}'s verified copy on the same host", leader


def choose_paths(records: list[dict[str, Any]], *, why_not: str | None, mappable: bool,
                 ipc: bool = False) -> PathChoice:
    """Every rank's path from the gathered records. ``why_not``: why no receiver may copy on its
    host (then all take the network); ``mappable``: every source file is safetensors; ``ipc``: the
    transport is IPC, so receivers on the source's node take the ipc path."""
    paths: dict[int, tuple[str, str]] = {SRC: ("source", "holds the files")}
    leader_of: dict[int, int] = {}
    leaders: dict[HostKey, int] = {}
    for r in range(1, len(records)):
        key = host_key(records[r])
        if ipc and key[0] and key == host_key(records[SRC]):
            # Only the node matters (CUDA IPC handles and /proc/<pid>/fd do not cross it), and the
            # user: what the source exports is for its own user's processes.
            paths[r] = ("ipc", _IPC_WHY)
            continue
        path, why, leader = _receiver_path(r, records, why_not, mappable, leaders)
        paths[r] = (path, why)
        if leader is not None:
            leader_of[r] = leader
    net_ranks = [r for r, (path, _) in sorted(paths.items()) if path in ("source", "network")]
    leader_files = {lead: str(records[lead]["staging_file"]) for lead in set(leader_of.values())}
    return PathChoice(paths=paths, leader_of=leader_of, net_ranks=net_ranks, leader_files=leader_files)


def describe_paths(paths: dict[int, tuple[str, str]], backend: str) -> str:
    """The one log line rank 0 writes: which ranks take which path, and why."""
    parts = []
    for kind in ("ipc", "same-host", "shm", "network", "host-copy"):
        rs = [r for r, (path, _) in sorted(paths.items()) if path == kind]
        if rs:
            whys = sorted({paths[r][1] for r in rs})
            what = _WHAT[kind].format(backend=backend)
            parts.append(f"{kind} path: rank(s) {', '.join(map(str, rs))} {what} ({'; '.join(whys)})")
    return "Replication paths: " + "; ".join(parts)
