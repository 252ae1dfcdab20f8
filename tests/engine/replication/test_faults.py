"""The test-only fault injector's own contract: what it parses, refuses, and how a pause ends."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hwtui.engine.replication.faults import Fault, Injector, parse


def test_a_pause_names_its_file_and_waits_until_it_exists(tmp_path: Path) -> None:
    go = tmp_path / "go"
    assert parse(f"pause:rank=1,bucket=1,until={go}") == [Fault("pause", 1, 1, None, str(go))]
    with pytest.raises(ValueError, match="pause needs until"):
        parse("pause:rank=1,bucket=1")
    inj = Injector(1, f"pause:rank=1,bucket=1,until={go}")
    inj.at_bucket(0)  # another bucket: no wait
    released = threading.Event()
    t = threading.Thread(target=lambda: (inj.at_bucket(1), released.set()))
    t.start()
    assert not released.wait(0.2)  # still paused: the file is not there
    go.touch()
    t.join(timeout=30)
    assert released.is_set()
    Injector(2, f"pause:rank=1,until={go}").at_bucket(1)  # another rank's fault: returns at once


def test_unknown_actions_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        parse("explode:rank=1")
