"""Replay snapshots with every recorded fact replaced by every JSON type (issue 22 F8).

A replay is input from elsewhere. Before, `facts.nvml = 1` was exit 3 in `--check` and `list-gpus`,
`facts.torch_runtime` in `--check`, `facts['dist.if_addrs']` in `env`, and dozens more ended in a
probe-error finding whose detail held a traceback. Now the loader checks each fact against the
shape its producer writes (probes/fact_schema.py), and a probe that still fails says so in one
line. The outcome of every run here: exit 0/1 with valid output, or exit 2 with one line on
stderr and nothing on stdout; never exit 3, never a traceback.

Everything runs in-process (the CLI's `main`), so the whole sweep takes seconds.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtui.app.cli import main
from tests import machines

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tests" / "data" / "recordings" / "h200.snapshot.json"  # in the repo: a clone needs no shared/
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.snapshot.json"))

# Every JSON type, a number too big for any C type, NaN both as JSON's NaN token and as a string.
VALUES: dict[str, Any] = {
    "null": None, "false": False, "true": True, "int": 1, "negative": -7, "huge_int": 10**400, "float": 1.5,
    "nan": float("nan"), "nan_string": "NaN", "string": "x", "control_string": "\x1b]0;pwned\x07\n", "empty_list": [],
    "list": [1, "a", None], "empty_object": {}, "object": {"k": 1}, "nested": {"a": [{"b": [None, {"c": 2.5}]}]},
}
COMMANDS = (("--check", "--json"), ("list-gpus", "--json"), ("env",))


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def assert_clean(argv: list[str], what: str) -> int:
    code, out, err = run_cli(argv)
    for text in (out, err):
        assert "Traceback" not in text and 'File "' not in text, f"{what}: a traceback\n{text[-1500:]}"
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hwtui: error: ") and out == "", f"{what}: {err!r}"
        return code
    assert code in (0, 1), f"{what}: exit {code}: {err[-800:]}"
    if "--json" in argv:
        doc = json.loads(out)  # list-gpus: a list of devices; --check: the report with its findings
        for finding in doc.get("findings", []) if isinstance(doc, dict) else []:
            for field in ("title", "detail", "remedy"):
                assert "\n  File " not in str(finding.get(field) or ""), f"{what}: {finding}"
    return code


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Every recorded machine: the shipped examples, the H200 recording, and tests/machines.py as snapshots."""
    found = {p.name: json.loads(p.read_text()) for p in EXAMPLES}
    found[H200.name] = json.loads(H200.read_text())
    base = tmp_path_factory.mktemp("machines")
    for name, build in machines.MACHINES.items():
        build(base / name)
        out = base / f"{name}.snapshot.json"
        code, _, err = run_cli(["snapshot", "--sysroot", str(base / name), "-o", str(out)])
        assert code == 0, err
        found[name] = json.loads(out.read_text())
    return found


def test_every_fact_replaced_by_every_json_type(recordings, tmp_path):
    runs = refused = 0
    path = tmp_path / "fuzzed.json"
    for name, snap in recordings.items():
        for key in snap.get("facts", {}):
            for kind, value in VALUES.items():
                # One top-level fact replaced: a new facts dict is enough (the snapshot is never
                # changed; a deep copy per run was a tenth of this test's time).
                fuzzed = {**snap, "facts": {**snap["facts"], key: value}}
                path.write_text(json.dumps(fuzzed))
                for command in COMMANDS:
                    runs += 1
                    refused += assert_clean([*command, "--replay", str(path)], f"{name}: facts[{key!r}] = {kind}, {command[0]}") == 2
    assert runs > 1000 and refused, (runs, refused)


def _paths(value: Any, prefix: list[Any], depth: int = 4):
    """Every field below a fact, to ``depth`` levels (a list's first item stands for all)."""
    if depth == 0:
        return
    items = value.items() if isinstance(value, dict) else ([(0, value[0])] if isinstance(value, list) and value else [])
    for k, v in items:
        yield [*prefix, k]
        yield from _paths(v, [*prefix, k], depth - 1)


def _get(value: Any, path: list[Any]) -> Any:
    for k in path:
        value = value[k]
    return value


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_field_at_any_depth_replaced_by_any_json(recordings, tmp_path, data):
    """Below the top: nvml.devices[0].mig, torch_build.variant, torch_runtime.cuda.devices[0].pci, ..."""
    name = data.draw(st.sampled_from(sorted(recordings)), label="recording")
    snap = copy.deepcopy(recordings[name])
    paths = [p for key, fact in snap["facts"].items() for p in _paths(fact, [key])]
    if not paths:
        return
    path = data.draw(st.sampled_from(paths), label="field")
    value = data.draw(st.sampled_from(list(VALUES.values())) | JSON, label="value")
    _get(snap["facts"], path[:-1])[path[-1]] = value
    file = tmp_path / "fuzzed.json"
    file.write_text(json.dumps(snap))
    command = data.draw(st.sampled_from(COMMANDS), label="command")
    assert_clean([*command, "--replay", str(file)], f"{name}: facts {path} = {value!r}")


@pytest.mark.parametrize(("fact", "command", "words"), [
    ("nvml", "--check", "facts.nvml must be an object, not 1"),
    ("nvml", "list-gpus", "facts.nvml must be an object, not 1"),
    ("torch_runtime", "--check", "facts.torch_runtime must be an object, not 1"),
    ("dist.if_addrs", "env", "facts['dist.if_addrs'] must be an object, not 1"),
])
def test_the_reported_wrong_typed_facts_are_one_line_exit_2_naming_the_fact(recordings, tmp_path, fact, command, words):
    snap = copy.deepcopy(recordings["mixed3.snapshot.json"])
    snap["facts"][fact] = 1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(snap))
    code, out, err = run_cli([command, "--replay", str(path)])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert words in err and str(path) in err


def test_a_recorded_trees_facts_file_is_checked_the_same_way(tmp_path):
    fs = machines.h100_x8(tmp_path / "tree")
    fs.facts(user={"uid": "root", "gid": 0})
    code, out, err = run_cli(["--check", "--sysroot", str(tmp_path / "tree")])
    assert code == 2 and out == "" and "facts.user.uid must be an integer" in err and len(err.strip().splitlines()) == 1


def test_a_failing_probe_is_one_line_where_raised_never_a_traceback():
    from hwtui.probes.framework import Collector, Rule, collect, run_checks
    from hwtui.probes.host import SNAPSHOT_SCHEMA, ReplayHost

    host = ReplayHost({"schema": SNAPSHOT_SCHEMA})

    def broken(_host):
        raise KeyError("multi\nline")

    def broken_rule(_facts):
        raise ValueError("rule\nbroke")

    _, problems = collect(host, [Collector("broken", broken, "gpu")])
    result = run_checks(host, [], [Rule("broken_rule", broken_rule, "gpu")])
    for finding in [*problems, *result.findings]:
        assert "\n" not in finding.title and "\n" not in finding.detail, finding
        assert finding.detail.startswith("raised at ") and "test_replay_fuzz.py" in finding.detail, finding


def test_a_crashed_torch_child_is_named_by_its_last_stderr_line_not_its_traceback(recordings, tmp_path):
    snap = copy.deepcopy(recordings["h100x8.snapshot.json"])
    snap["facts"]["torch_runtime"] = {"installed": True, "error": {
        "kind": "crash", "message": "probes.runtime_child:torch_facts crashed with SIGSEGV",
        "stderr": 'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
                  "ImportError: libcudart.so.12: cannot open shared object file\n"}}
    path = tmp_path / "crashed.json"
    path.write_text(json.dumps(snap))
    code, out, _ = run_cli(["--check", "--json", "--replay", str(path)])
    finding = next(f for f in json.loads(out)["findings"] if f["id"] == "torch.runtime")
    assert code == 1 and finding["status"] == "error"
    assert "ImportError: libcudart.so.12" in finding["detail"] and "Traceback" not in finding["detail"], finding
