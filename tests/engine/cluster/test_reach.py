"""The all-pairs reach test: verdicts from recorded outcomes, and a real run over loopback."""

from __future__ import annotations

import threading

from torch.distributed import HashStore

from hwtui.core.finding import Status
from hwtui.engine.cluster.reach import check_peers, judge

NODES = {0: "a", 1: "b", 2: "c"}


def test_a_node_nobody_reaches_is_named_with_each_attempt():
    results = {0: {"1": "ok", "2": "no answer"}, 1: {"0": "ok", "2": "no answer"}, 2: {"0": "ok", "1": "ok"}}
    [f] = judge(results, 3, NODES, lambda r: None)
    assert f.id == "cluster.reach[c]" and f.status == Status.FAIL
    assert f.title == "node c accepts no connections from a, b (dropped: a firewall?)"
    assert f.detail.startswith("a -> c: no answer, b -> c: no answer.")
    assert f.remedy.startswith("on c: allow incoming TCP")


def test_refusals_are_not_called_a_drop_and_a_silent_rank_is_quoted():
    results = {0: {"1": "refused", "2": "ok"}, 2: {"0": "ok", "1": "refused"}}
    found = {f.id: f for f in judge(results, 3, NODES, lambda r: "testing connections to its peers" if r == 1 else None)}
    assert found["cluster.reach[b]"].title == "node b accepts no connections from a, c"
    assert found["cluster.reach[rank 1]"].title == "rank 1 (b) did not answer the connection test"
    assert found["cluster.reach[rank 1]"].detail == "it last said: 'testing connections to its peers'"


def test_every_rank_gets_rank_0s_verdict_over_a_real_store():
    store = HashStore()
    verdicts: dict[int, dict] = {}

    def rank(r: int) -> None:
        verdicts[r] = check_peers(store, r, 3, "127.0.0.1", NODES, connect_timeout=2.0, timeout=20.0,
                                  last_said=lambda _: None)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert verdicts == {r: {"ok": True, "findings": []} for r in range(3)}


def test_a_peer_that_never_published_its_address_is_named_not_skipped():
    results = {0: {"1": "ok", "2": "silent"}, 1: {"0": "ok", "2": "silent"}}
    [f] = judge(results, 3, NODES, lambda r: "registered")
    assert f.id == "cluster.reach[rank 2]" and f.detail == "it last said: 'registered'"
