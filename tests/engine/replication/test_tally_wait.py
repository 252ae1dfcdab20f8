"""How long rank 0 of a joined world waits for the receivers' tally (what each serves after a commit).

The default is the commit timeout; ``HWTUI_TALLY_WAIT_S`` sets it, for tests of agent pushes whose
resident tally feeds no report and which stop a rank after the decision on purpose (each such push
waited out the whole commit timeout before). In-process: a store that records the wait it is given.
"""

from __future__ import annotations

import datetime
import json
import types

import pytest

pytest.importorskip("torch")

from hwtui.engine.replication.vote import RankCommit  # noqa: E402


class Store:
    """Receiver 1 reported; receiver 2 never does (stopped after the decision)."""

    def __init__(self) -> None:
        self.keys = {"hwtui-tally/v2/abc/1/1": json.dumps({"serves": "v2"})}
        self.waited: list[datetime.timedelta] = []

    def set(self, key: str, value: str) -> None:
        self.keys[key] = value

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        self.waited.append(timeout)
        if any(k not in self.keys for k in keys):
            raise RuntimeError("Wait timeout")  # what the real store raises once `timeout` has passed

    def check(self, keys: list[str]) -> bool:
        return all(k in self.keys for k in keys)

    def get(self, key: str) -> bytes:
        return self.keys[key].encode()


def _tally(monkeypatch: pytest.MonkeyPatch) -> tuple[Store, dict]:
    import torch.distributed as dist

    store = Store()
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    rank = RankCommit.__new__(RankCommit)  # only what _tally reads: no world, no files
    said: dict = {}
    rank.rank, rank.world, rank.served = 0, 3, None
    rank.cfg = types.SimpleNamespace(timeouts=types.SimpleNamespace(commit=15.0))
    rank.internal = lambda what, **data: said.update({what: data})
    rank.emit = lambda ev: said.update({"error": ev})
    RankCommit._tally(rank, Plan())  # type: ignore[arg-type]
    return store, said


class Plan(dict):
    """What _tally reads of a plan: its version and digest."""

    digest = "abc"

    def __init__(self) -> None:
        super().__init__(version="v2")


def test_the_tally_waits_the_commit_timeout_by_default(monkeypatch):
    monkeypatch.delenv("HWTUI_TALLY_WAIT_S", raising=False)
    store, said = _tally(monkeypatch)
    assert store.waited == [datetime.timedelta(seconds=15)]
    assert said["tally"] == {"serving": {"1": "v2"}, "unknown": [2]} and "error" not in said


def test_hwtui_tally_wait_s_sets_the_wait(monkeypatch):
    monkeypatch.setenv("HWTUI_TALLY_WAIT_S", "2")
    store, said = _tally(monkeypatch)
    assert store.waited == [datetime.timedelta(seconds=2)]
    assert said["tally"] == {"serving": {"1": "v2"}, "unknown": [2]} and "error" not in said
