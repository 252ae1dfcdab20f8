"""Plan format hwtui.plan/2: digest over every byte, ranks load without re-validating, tables that
validate in one vectorised pass, old JSON plans still readable, and faithful-replica layout."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.plan import (
    build_plan_from_files,
    load_plan,
    load_plan_for_rank,
    load_previous,
    manifest_of,
    validate_plan,
    write_json_atomic,
    write_plan,
)
from hwtui.engine.replication.plan_format import MAGIC
from tests.engine.replication.helpers import files, make_model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    expected = make_model(d, n=12, big=30_000)
    plan = build_plan_from_files(files(d), model="tiny", version="v1", bucket_bytes=16 * 1024)
    p = d / "plan.hwtplan"
    write_plan(p, plan)
    return d, plan, p, expected


def test_round_trip_is_identical_and_ranks_skip_validation(built):
    _, plan, p, _ = built
    assert p.read_bytes()[:8] == MAGIC
    for loaded in (load_plan(p), load_plan_for_rank(p, plan.digest)):
        assert loaded.digest == plan.digest
        assert loaded["tensors"] == plan["tensors"] and loaded["buckets"] == plan["buckets"]
        assert loaded["items"] == plan["items"]
        assert [loaded.bucket_items[b] for b in range(len(loaded.buckets))] == \
            [[i for i in plan["items"] if i["bucket"] == b] for b in range(len(plan.buckets))]
    with pytest.raises(HwtuiError, match="coordinator planned"):
        load_plan_for_rank(p, "0" * 32)


def test_every_byte_is_covered_by_the_digest(built, tmp_path):
    _, _, p, _ = built
    blob = p.read_bytes()
    for pos in (20, len(blob) // 2, len(blob) - 1):  # header, tables, last byte
        bad = bytearray(blob)
        bad[pos] ^= 0x01
        (tmp_path / "bad").write_bytes(bytes(bad))
        with pytest.raises(HwtuiError) as exc:
            load_plan(tmp_path / "bad")
        assert "\n" not in str(exc.value)
    (tmp_path / "short").write_bytes(blob[:-9])
    with pytest.raises(HwtuiError, match="digest mismatch|truncated"):
        load_plan(tmp_path / "short")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_property_any_corruption_of_a_plan_file_fails_cleanly(built, tmp_path_factory, data):
    _, _, p, _ = built
    blob = bytearray(p.read_bytes())
    cut = data.draw(st.integers(0, len(blob)))
    pos = data.draw(st.integers(0, len(blob) - 1))
    blob[pos] = data.draw(st.integers(0, 255))
    out = tmp_path_factory.getbasetemp() / "hypo-corrupt.plan"
    out.write_bytes(bytes(blob[:cut]))
    try:
        loaded = load_plan(out)
    except HwtuiError as exc:
        assert "\n" not in str(exc)
        return
    assert loaded.digest == load_plan(p).digest  # only an unchanged byte or a no-op cut can pass


def _pair(t):
    """The first item whose successor shares its bucket."""
    return int(np.nonzero(t.i_bucket[1:] == t.i_bucket[:-1])[0][0])


def _tampered(plan, edit):
    t = copy.copy(plan.tables)
    for name in ("i_offset", "i_nbytes", "i_tensor", "i_tensor_offset", "b_size", "nbytes", "dims", "send", "file"):
        setattr(t, name, getattr(t, name).copy())
    edit(t)
    return type(plan)(dict(plan.meta), t, plan.digest, "p", plan.source_headers)


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.i_offset.__setitem__(_pair(t) + 1, t.i_offset[_pair(t)]), "overlap"),
    (lambda t: t.i_tensor_offset.__setitem__(int(np.argmax(t.i_tensor_offset)), 1), "gap|overlap"),
    (lambda t: t.i_offset.__setitem__(0, 10 ** 12), "outside its bucket"),
    (lambda t: t.i_tensor.__setitem__(0, 10 ** 6), "does not have"),
    (lambda t: t.nbytes.__setitem__(0, t.nbytes[0] + 1), "nbytes does not match"),
    (lambda t: t.dims.__setitem__(0, -3), "negative dimension"),
    (lambda t: t.send.__setitem__(int(t.i_tensor[0]), 0), "not sent"),
    (lambda t: t.b_size.__setitem__(0, t.b_size[0] - 1), "total_bytes|outside"),
    (lambda t: t.file.__setitem__(0, 7), "file the plan does not list"),
])
def test_tampered_tables_are_rejected_with_one_line(built, edit, words):
    _, plan, _, _ = built
    validate_plan(_tampered(plan, lambda t: None))
    with pytest.raises(HwtuiError, match=words) as exc:
        validate_plan(_tampered(plan, edit))
    assert "\n" not in str(exc.value)


def test_old_json_plans_still_load(built, tmp_path):
    _, plan, _, _ = built
    v1 = plan.to_v1()
    (tmp_path / "old.json").write_text(json.dumps(v1))
    old = load_plan(tmp_path / "old.json")
    assert old.digest == v1["digest"] and old["tensors"] == plan["tensors"] and old["items"] == plan["items"]
    assert old.buckets == plan.buckets
    # and serve as --prev, like the manifest and a new plan do
    write_json_atomic(tmp_path / "m.json", manifest_of(plan))
    for prev in ("old.json", "m.json"):
        assert load_previous(tmp_path / prev)[1] == load_previous(built[2])[1]


def test_replica_layout_rebuilds_the_source_file_byte_for_byte(built):
    d, plan, p, expected = built
    rank = load_plan_for_rank(p)
    src = (d / "model.safetensors").read_bytes()
    (f,) = [i for i, e in enumerate(rank["files"]) if e["format"] == "safetensors"]
    prefix, layout = rank.replica_layout(f)
    out = bytearray(prefix)
    out.extend(bytes(len(src) - len(prefix)))
    for name, (off, n) in layout.items():  # what a receiver writes: each tensor's bytes at its offset
        t = expected[name]
        out[off:off + n] = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    assert bytes(out) == src  # header, __metadata__ and data offsets exactly the source's
    assert prefix[8:] == src[8:len(prefix)]
    with pytest.raises(HwtuiError, match="not a safetensors file"):
        rank.replica_layout(1 - f)


def test_a_tensor_in_two_weight_files_is_refused(tmp_path):
    from safetensors.numpy import save_file

    for i in (1, 2):
        save_file({"shared": np.zeros(3, dtype=np.float32), f"own{i}": np.ones(2, dtype=np.int8)},
                  str(tmp_path / f"s{i}.safetensors"))
    with pytest.raises(HwtuiError, match="'shared' appears in more than one weight file"):
        build_plan_from_files([str(tmp_path / "s1.safetensors"), str(tmp_path / "s2.safetensors")], model="m",
                              version="v1", bucket_bytes=64)


@pytest.mark.timeout(120)
def test_planner_benchmark_runs_at_toy_size():
    # a speed target nobody can run is no target: benchmarks/bench_planner.py at 2,000 tensors
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_planner.py"
    r = subprocess.run([sys.executable, str(bench), "--sizes", "2000", "--runs", "1"], capture_output=True, text=True,
                       timeout=110)
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = [line.split() for line in r.stdout.splitlines() if line.split()[:1] == ["2000"]]
    assert len(row) == 9 and float(row[-1]) > 0  # every column measured; the plan file exists
