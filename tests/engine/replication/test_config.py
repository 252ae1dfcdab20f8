"""The worker configuration crosses the process boundary once, as versioned JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.config import CONFIG_VERSION, Timeouts, WorkerConfig
from hwtui.engine.replication.settings import ReplicationSettings
from hwtui.engine.replication.transport import choose_transport


def _cfg() -> WorkerConfig:
    return WorkerConfig(plan="/p.json", transport=choose_transport("cpu"), world_size=3, rank=0,
                        settings=ReplicationSettings(chunk_bytes=1 << 20),
                        out="/out", commit=True, timeouts=Timeouts(init=5, bucket=2, commit=3), fault="kill:rank=1")


def test_round_trip_is_exact_and_per_rank():
    cfg = _cfg().for_rank(2, master_port=1234, parent_pid=99)
    back = WorkerConfig.from_json(cfg.to_json())
    assert back == cfg and back.rank == back.local_rank == 2 and back.master_port == 1234
    assert back.transport.backend == "gloo" and back.timeouts.commit == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.rank = 1  # type: ignore[misc]


@pytest.mark.parametrize("change, needle", [
    ({"version": CONFIG_VERSION + 1}, "version"),
    ({"version": None}, "version"),
    ({"surprise": 1}, "surprise"),
])
def test_unknown_version_or_field_is_one_clear_error(change, needle):
    raw = json.loads(_cfg().to_json())
    raw.update(change)
    with pytest.raises(HwtuiError, match=needle):
        WorkerConfig.from_json(json.dumps(raw))


def test_missing_field_and_garbage_are_clear_errors():
    raw = json.loads(_cfg().to_json())
    del raw["transport"]
    with pytest.raises(HwtuiError, match="incomplete"):
        WorkerConfig.from_json(json.dumps(raw))
    with pytest.raises(HwtuiError, match="not JSON"):
        WorkerConfig.from_json("{")
