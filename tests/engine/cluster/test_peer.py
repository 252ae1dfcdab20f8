"""Peer reports as rank 0 sees them: capped, shape-checked, --env values masked."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hwtui.core.redact import MASK, redact
from hwtui.engine.cluster import compare as cmp
from hwtui.engine.cluster.local import SCHEMA
from hwtui.engine.cluster.peer import MAX_ITEMS, MAX_STRING, PeerReportError, cap, checked_report, mask_env, mask_values

RANKS = json.loads((Path(__file__).parent / "fixtures" / "veth_3node_cpu.json").read_text())["ranks"]


def test_recorded_reports_pass_unchanged():
    for slot, rep in enumerate(RANKS):
        assert checked_report(cap(copy.deepcopy(rep)), slot, SCHEMA) == rep


def test_a_1mb_field_is_cut_before_anything_reads_it():
    rep = copy.deepcopy(RANKS[1])
    huge = "eth" * 350_000  # ~1 MB, as a hostile or broken peer might send
    rep["env"]["NCCL_SOCKET_IFNAME"] = huge
    rep["interfaces"].update({f"if{i}": {"addresses": []} for i in range(5000)})
    rep["hostname"] = "b" * 1_000_000
    capped = checked_report(cap(rep), 1, SCHEMA)
    value = capped["env"]["NCCL_SOCKET_IFNAME"]
    assert value.startswith(huge[:MAX_STRING]) and value.endswith(f"[{len(huge) - MAX_STRING} characters cut]")
    assert len(capped["interfaces"]) == MAX_ITEMS
    # Everything after the cap (redaction, comparison) now works on a bounded document.
    assert len(json.dumps(capped)) < 64 * MAX_STRING
    assert len(capped["hostname"]) < MAX_STRING + 40
    findings = {f.id: f for f in cmp.compare([RANKS[0], capped])}
    node = capped["node"]
    assert findings[f"cluster.interface[{node}]"].status.value == "fail"
    assert redact(capped)["env"]["NCCL_SOCKET_IFNAME"] == value


def test_nesting_is_cut_too():
    deep: list = []
    for _ in range(50):
        deep = [deep]
    assert json.dumps(cap({"x": deep})).count("[") <= 9


@pytest.mark.parametrize("path,value,message", [
    (("rank",), 2, "rank must be its own rank (1)"),
    (("rank",), True, "rank must be its own rank (1)"),
    (("node",), 7, "node must be a non-empty string"),
    (("torch",), [], "torch must be an object"),
    (("torch", "version"), {"a": 1}, "torch.version must be a string or null"),
    (("env",), {"NCCL_DEBUG": 3}, "env must be an object of strings"),
    (("interfaces", "eth0", "addresses"), "10.0.0.1", "interfaces.eth0.addresses must be a list of strings"),
    (("route",), None, "route must be an object"),
    (("plugin",), "x", "plugin must be null or {value, path}"),
    (("check", "findings"), [{"id": 1}], "check.findings must be a list of findings"),
    (("schema",), "hwtui.cluster.rank/0", "schema must be"),
])
def test_wrong_typed_peer_reports_name_the_rank_and_field(path, value, message):
    rep = copy.deepcopy(RANKS[1])
    target = rep
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(PeerReportError) as exc:
        checked_report(cap(rep), 1, SCHEMA)
    assert str(exc.value).startswith("rank 1 sent a malformed report: ") and message in str(exc.value)


def test_env_values_are_masked_by_name_and_wherever_they_appear():
    token = "hf_" + "A1b2" * 8
    env = mask_env({"HF_TOKEN": token, "NCCL_DEBUG": "WARN"}, ["HF_TOKEN"])
    assert env == {"HF_TOKEN": MASK, "NCCL_DEBUG": "WARN"}
    doc = {"a": [f"https://x/{token}/y", {token: "k"}], "b": 3, "short": "WARN"}
    assert mask_values(doc, [token, "1"]) == {"a": [f"https://x/{MASK}/y", {MASK: "k"}], "b": 3, "short": "WARN"}
