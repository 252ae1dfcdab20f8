"""Cluster hygiene from the hardware guide: a shared, writable checkpoint directory and synced clocks.

A multi-node job that checkpoints to a node-local disk "works" until it resumes: rank 0 wrote the
file on one machine and the others look for it on theirs. The filesystem type comes from
/proc/mounts (longest mount point containing the directory). Clock state comes from timedatectl or
chrony where the host reports it (a live fact), or systemd-timesyncd's marker file.
"""

from __future__ import annotations

import posixpath
import shutil
from collections.abc import Iterator, Mapping
from typing import Any

from hwtui.core.finding import Finding, fail, passed, skip, warn
from hwtui.core.supervisor import run_capture
from hwtui.probes.distributed.launcher import job_shape
from hwtui.probes.distributed.parsers import Mount, parse_chrony_tracking, parse_key_values, parse_mounts
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import FactUnavailable, Host

CHECKPOINT_VAR = "HWTUI_CHECKPOINT_DIR"
SHARED_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "wekafs", "panfs",
             "orangefs", "quobyte", "afs", "ocfs2", "gfs2", "9p"}
# FUSE filesystems that are network-backed: GCSFuse and S3 FUSE from the hardware guide, and friends.
SHARED_FUSE = ("gcsfuse", "s3fs", "goofys", "mountpoint-s3", "juicefs", "glusterfs", "sshfs", "rclone", "ceph",
               "blobfuse", "lustre", "alluxio", "weka", "cvmfs")
TIMESYNC_MARKER = "/run/systemd/timesync/synchronized"
CLOCK_FACT = "dist.clock"


def is_shared(fstype: str) -> bool:
    if fstype in SHARED_FS:
        return True
    if fstype.startswith("fuse."):
        return any(name in fstype[5:] for name in SHARED_FUSE)
    return False


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    best = None
    for m in mounts:
        mp = m.mountpoint.rstrip("/") or "/"
        if path == mp or path.startswith(mp if mp.endswith("/") else mp + "/") or mp == "/":
            if best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/"):
                best = m
    return best


def collect_checkpoint(host: Host) -> dict[str, Any]:
    raw = host.env.get(CHECKPOINT_VAR)
    if not raw:
        return {"path": None}
    if "\x00" in raw:
        return {"path": raw, "invalid": True}  # only a replayed snapshot can carry one; stat() would raise
    if not posixpath.isabs(raw):
        return {"path": raw, "relative": True}
    path = posixpath.normpath(raw)
    existing = path
    while existing != "/" and not host.exists(existing):
        existing = posixpath.dirname(existing)
    mounts = parse_mounts(host.read_text("/proc/mounts") or "")
    mount = mount_of(existing, mounts)
    return {
        "path": path,
        "exists": existing == path,
        "is_dir": host.is_dir(existing),
        "existing": existing,
        "writable": host.can_access(existing, want_write=True),
        "mount": None if mount is None else {"point": mount.mountpoint, "fstype": mount.fstype, "device": mount.device,
                                              "ro": "ro" in mount.options},
    }


def _run(argv: list[str]) -> str | None:
    exe = shutil.which(argv[0])
    if not exe:
        return None
    try:
        out = run_capture([exe, *argv[1:]], timeout=3)
    except OSError:
        return None
    return out.stdout if out.code == 0 else None


def _live_clock() -> dict[str, Any]:
    td = _run(["timedatectl", "show"])
    chrony = _run(["chronyc", "-n", "tracking"])
    return {"timedatectl": parse_key_values(td) if td else None,
            "chrony": parse_chrony_tracking(chrony) if chrony else None}


def collect_clock(host: Host) -> dict[str, Any]:
    try:
        live = host.fact(CLOCK_FACT, _live_clock)
    except FactUnavailable:
        live = {"timedatectl": None, "chrony": None}
    return {**live, "timesync_marker": host.exists(TIMESYNC_MARKER)}


def checkpoint_findings(ck: Mapping[str, Any], multi_node: bool | None) -> Iterator[Finding]:
    fid = "hygiene.checkpoint_dir"
    path = ck.get("path")
    if not path:
        yield skip(fid, f"no checkpoint directory given ({CHECKPOINT_VAR} or --checkpoint-dir)")
        return
    if ck.get("invalid"):
        yield fail(fid, f"{CHECKPOINT_VAR} contains a NUL byte", "", f"export {CHECKPOINT_VAR}=<absolute directory>")
        return
    if ck.get("relative"):
        yield warn(fid, f"{CHECKPOINT_VAR}={path} is relative", "Each rank resolves it against its own working directory.",
                   f"export {CHECKPOINT_VAR}=$(realpath {path})")
        return
    if not ck["is_dir"]:
        yield fail(fid, f"{ck['existing']} is not a directory", "", f"export {CHECKPOINT_VAR}=<a directory>")
        return
    mount = ck.get("mount") or {}
    if mount.get("ro"):
        yield fail(fid, f"{path} is on a read-only mount ({mount['point']})", "", f"export {CHECKPOINT_VAR}=<writable dir>")
        return
    if not ck["writable"]:
        yield fail(fid, f"{ck['existing']} is not writable by this user", "" if ck["exists"] else
                   f"{path} does not exist yet and would be created under it.",
                   f"sudo install -d -o $USER {path}")
        return
    fstype = mount.get("fstype") or "?"
    where = f"{fstype} at {mount.get('point', '?')}"
    if multi_node and not is_shared(fstype):
        yield fail(fid, f"{path} is on a node-local filesystem ({where}) in a multi-node job",
                   "Other nodes cannot read what rank 0 writes, so resuming or merging checkpoints fails.",
                   f"export {CHECKPOINT_VAR}=<directory on NFS, Lustre or GCSFuse mounted on every node>", fstype=fstype)
    else:
        note = "shared filesystem" if is_shared(fstype) else "node-local, fine for a single node"
        yield passed(fid, f"{path} is writable ({where}, {note})" + ("" if ck["exists"] else "; it will be created"),
                     fstype=fstype)


def clock_findings(clock: Mapping[str, Any]) -> Iterator[Finding]:
    fid = "hygiene.clock"
    td = clock.get("timedatectl") or {}
    chrony = clock.get("chrony") or {}
    remedy = "sudo timedatectl set-ntp true (or: sudo systemctl enable --now chrony)"
    if chrony.get("Leap status"):
        status = chrony["Leap status"]
        if status.lower() == "not synchronised":
            yield warn(fid, "chrony reports the clock is not synchronised",
                       "Skewed clocks break certificate checks for experiment tracking and confuse log merging.", remedy)
        else:
            yield passed(fid, f"chrony: {status}", f"offset {chrony.get('System time', '?')}")
        return
    if td.get("NTPSynchronized"):
        if td["NTPSynchronized"] == "yes":
            yield passed(fid, "clock synchronised (timedatectl)")
        else:
            yield warn(fid, "the clock is not NTP-synchronised (timedatectl)",
                       "Skewed clocks break certificate checks for experiment tracking and confuse log merging.", remedy)
        return
    if clock.get("timesync_marker"):
        yield passed(fid, "clock synchronised (systemd-timesyncd)")
        return
    yield skip(fid, "this host does not report clock synchronisation (no timedatectl or chronyc answer)",
               "Containers usually share the host's clock; check it there.")


def checkpoint_rules(facts: Facts) -> Iterator[Finding]:
    env = facts.host.env if facts.host else {}
    yield from checkpoint_findings(facts["checkpoint"], job_shape(env).multi_node)


def clock_rules(facts: Facts) -> Iterator[Finding]:
    yield from clock_findings(facts["clock"])


COLLECTORS = [
    Collector("checkpoint", collect_checkpoint, "env", timeout=5.0),
    Collector("clock", collect_clock, "env", timeout=8.0),
]
RULES = [
    Rule("checkpoint", checkpoint_rules, "env", needs=("checkpoint",)),
    Rule("clock", clock_rules, "env", needs=("clock",)),
]
