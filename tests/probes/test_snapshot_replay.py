"""Snapshot then replay reproduces a machine exactly, secrets never leave it."""

import json

import pytest

from hwtui.probes.catalog import catalog
from hwtui.probes.framework import run_checks
from hwtui.probes.host import SNAPSHOT_SCHEMA, RecordingHost, ReplayHost
from tests import machines


def _key(result):
    return sorted((f.id, f.status.value, f.title, f.detail, f.remedy) for f in result.findings)


@pytest.mark.parametrize("name", sorted(machines.MACHINES))
def test_snapshot_then_replay_gives_same_findings(tmp_path, name):
    fs = machines.MACHINES[name](tmp_path / "tree")
    env = {"PATH": "/usr/bin:/bin", "WORLD_SIZE": "2", "RANK": "0", "HF_TOKEN": "hf_" + "x" * 30}
    collectors, rules = catalog()
    recorder = RecordingHost(fs.host(env))
    original = run_checks(recorder, collectors, rules)
    snap = json.loads(json.dumps(recorder.snapshot()))  # through JSON, as on disk
    assert snap["schema"] == SNAPSHOT_SCHEMA
    replayed = run_checks(ReplayHost(snap), collectors, rules)
    assert _key(replayed) == _key(original)
    assert "hf_xxxx" not in json.dumps(snap)


def test_replay_rejects_foreign_json(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "something/1"}')
    with pytest.raises(ValueError, match="not a hwtui snapshot"):
        ReplayHost.load(bad)
    bad.write_text("{trunc")
    with pytest.raises(ValueError, match="not valid JSON"):
        ReplayHost.load(bad)
