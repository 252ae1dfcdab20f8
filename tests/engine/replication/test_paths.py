"""Each receiver's path (engine.replication.paths.choose_paths): a pure function of the ranks'
agreement records, so every rank computes the same answer. Records here are shaped as
agree.host_facts makes them."""

from __future__ import annotations

from typing import Any

from hwtui.engine.replication.paths import choose_paths, describe_paths

FILES = [[1, 2, 3, 4]]


def rec(boot: str, *, netns: str = "net:[1]", uid: int = 1000, files: Any = FILES, staging: str | None = None) -> dict[str, Any]:
    return {"host": {"boot_id": boot, "netns": netns, "uid": uid, "files": files}, "staging_file": staging}


def test_turned_off_puts_every_receiver_on_the_network():
    c = choose_paths([rec("a", staging="/s0"), rec("a"), rec("b")], why_not="same-host path turned off (--no-same-host)",
                     mappable=True)
    assert c.paths == {0: ("source", "holds the files"), 1: ("network", "same-host path turned off (--no-same-host)"),
                       2: ("network", "same-host path turned off (--no-same-host)")}
    assert (c.net_ranks, c.leader_of, c.leader_files) == ([0, 1, 2], {}, {})


def test_same_host_and_same_file_copies_from_the_page_cache():
    c = choose_paths([rec("a"), rec("a")], why_not=None, mappable=True)
    assert c.paths[1] == ("same-host", "same boot id and the same source file (device/inode/size/mtime)")
    assert c.net_ranks == [0]


def test_a_source_that_cannot_be_mapped_stages_in_shm_for_its_host():
    c = choose_paths([rec("a", staging="/dev/shm/x/rank0"), rec("a")], why_not=None, mappable=False)
    assert c.paths[1][0] == "shm"
    assert (c.leader_of, c.leader_files, c.net_ranks) == ({1: 0}, {0: "/dev/shm/x/rank0"}, [0])


def test_another_host_gets_one_leader_and_its_followers_copy_from_it():
    records = [rec("a"), rec("b", staging="/dev/shm/y/rank1"), rec("b"), rec("c"), rec("b", uid=7)]
    c = choose_paths(records, why_not=None, mappable=True)
    assert c.paths[1] == ("network", "host leader: another host (boot id differs)")
    assert c.paths[2] == ("host-copy", "copies rank 1's verified copy on the same host")
    assert c.paths[3] == ("network", "host leader: another host (boot id differs)")
    assert c.paths[4][0] == "network"  # another user on host b cannot read rank 1's 0600 copy: a leader itself
    assert (c.leader_of, c.leader_files, c.net_ranks) == ({2: 1}, {1: "/dev/shm/y/rank1"}, [0, 1, 3, 4])


def test_a_leader_without_a_staging_file_leaves_its_host_mates_on_the_network():
    c = choose_paths([rec("a"), rec("b"), rec("b")], why_not=None, mappable=True)
    assert [c.paths[r][0] for r in (1, 2)] == ["network", "network"]
    assert c.leader_of == {}


def test_the_log_line_names_every_path_and_its_reason():
    c = choose_paths([rec("a"), rec("a"), rec("b", staging="/s1"), rec("b")], why_not=None, mappable=True)
    assert describe_paths(c.paths, "gloo") == (
        "Replication paths: same-host path: rank(s) 1 copy each bucket from the source's page cache (memory map of "
        "the same file) and verify it (same boot id and the same source file (device/inode/size/mtime)); "
        "network path: rank(s) 2 receive each bucket by gloo broadcast (host leader: another host (boot id differs)); "
        "host-copy path: rank(s) 3 copy from their host leader's verified copy and verify it "
        "(copies rank 2's verified copy on the same host)")
