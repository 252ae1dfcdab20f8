"""Hostile plans, manifests and weight files: one clear error (exit 2, one line), never a hang.

Issue 12: 100k-deep JSON, list dtypes, ``1e999`` offsets and a weight file that is a FIFO used to end
as exit 3 tracebacks or block ``replicate`` forever. Every loader path here must either accept the
input (and then its invariants hold) or raise HwtuiError with a one-line message.
"""

from __future__ import annotations

import copy
import json
import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtui.app.cli import main
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.plan import (
    build_plan_from_files,
    load_plan,
    load_previous,
    plan_digest,
    preflight_sources,
    validate_plan,
    write_json_atomic,
)
from hwtui.engine.replication.weights import DTYPES, read_safetensors_header

HYPO = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _one_line(exc: pytest.ExceptionInfo[HwtuiError]) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg and len(msg) < 600, msg
    return msg


def _safetensors(path: Path, header: object, data: bytes = b"", *, hlen: int | None = None) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if hlen is None else hlen) + raw + data)
    return path


def _good_header() -> dict:
    return {"__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b": {"dtype": "I8", "shape": [3], "data_offsets": [16, 19]}}


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    return _safetensors(tmp_path_factory.mktemp("w") / "m.safetensors", _good_header(), bytes(range(19)))


@pytest.fixture(scope="module")
def good_plan(weights) -> dict:
    plan = build_plan_from_files([str(weights)], model="m", version="v1", bucket_bytes=8)
    return json.loads(json.dumps(plan.to_v1()))  # an hwtui.plan/1 object, as a reader of such a file sees it


def _deep(n: int) -> str:
    return "[" * n + "]" * n


# ------------------------------------------------------------------ hostile plan files


def _with(plan: dict, edit) -> dict:
    raw = copy.deepcopy(plan)
    edit(raw)
    raw["digest"] = plan_digest(raw)  # re-digested: the validator itself must catch it, not the digest
    return raw


@pytest.mark.parametrize("text, words", [
    (_deep(100_000), "nested too deeply"),
    ('{"schema": ' + _deep(100_000) + "}", "nested too deeply"),
    ('{"offset": 1e999}', "out of range"),
    ('{"offset": NaN}', "not a number"),
    ('{"n": ' + "9" * 5000 + "}", "not valid JSON"),
    ("\xff\xfe", "not valid JSON"),
    ("", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
], ids=["deep-100k", "deep-field", "1e999", "nan", "5000-digits", "latin1", "empty", "list"])
def test_hostile_plan_text_is_one_line(tmp_path, text, words):
    p = tmp_path / "plan.json"
    p.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    with pytest.raises(HwtuiError) as exc:
        load_plan(p)
    assert words in _one_line(exc)


@pytest.mark.parametrize("edit, words", [
    (lambda r: r["tensors"][0].__setitem__("dtype", ["F32"]), "unknown dtype"),
    (lambda r: r["tensors"][0].__setitem__("shape", [[2], 2]), "bad shape"),
    (lambda r: r["tensors"][0].__setitem__("shape", [-2, -2]), "bad shape"),
    (lambda r: r["items"][0].__setitem__("offset", 1.5), "bad bucket/offset"),
    (lambda r: r["items"][0].__setitem__("offset", 10 ** 40), "outside bucket"),
    (lambda r: r["items"][0].__setitem__("name", {"x": 1}), "not a tensor to send"),
    (lambda r: r["files"][0].__setitem__("size", "19"), "file entry 0"),
    (lambda r: r.__setitem__("deleted", [["a"]]), "deleted tensor"),
    (lambda r: r.__setitem__("extra", json.loads(_deep(500))), "digest"),
    (lambda r: r["tensors"][0].__setitem__("name", "\ud800"), "not a tensor to send"),
])
def test_hostile_plan_fields_are_one_line(good_plan, tmp_path, edit, words):
    raw = _with(good_plan, edit)
    if words == "digest":
        raw["digest"] = "0" * 32
    with pytest.raises(HwtuiError) as exc:
        validate_plan(raw, "p.json")
    assert words in _one_line(exc)


def test_hostile_previous_manifest_is_one_line(tmp_path):
    for body in ({"schema": "hwtui.manifest/1", "version": "v1", "tensors": [{"name": ["x"], "dtype": "F32",
                                                                             "shape": [1], "checksum": "0" * 16}]},
                 {"schema": "hwtui.manifest/1", "version": "v1", "tensors": [{"name": "x", "dtype": "F32",
                                                                             "shape": "1", "checksum": "0" * 16}]},
                 {"schema": "hwtui.manifest/1", "tensors": "all"}):
        p = tmp_path / "m.json"
        p.write_text(json.dumps(body))
        with pytest.raises(HwtuiError) as exc:
            load_previous(p)
        _one_line(exc)


# ------------------------------------------------------------------ hostile safetensors files


@pytest.mark.parametrize("header, data, hlen, words", [
    (_good_header(), b"", 1 << 40, "header length"),                       # header length > file
    (_good_header(), bytes(19), 10 ** 6, "header length"),
    (b'{"a": {"dtype": "F32", "sh', b"", None, "not valid JSON"),         # truncated header
    (_deep(5000).encode(), b"", None, "nested too deeply"),
    ({"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, bytes(4), None, "unknown dtype"),
    ({"a": {"dtype": "F32", "shape": [-1, -1], "data_offsets": [0, 4]}}, bytes(4), None, "bad shape"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}}, bytes(4), None, "bad data_offsets"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 1e999]}}', bytes(4), None, "out of range"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, bytes(8), None, "overlap"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8), None, "file size"),
    ({"a": {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}}, bytes(4), None, "bad shape"),
    ({"a": [1, 2]}, b"", None, "malformed header entry"),
    ({"__metadata__": {"format": ["pt"]}}, b"", None, "__metadata__"),
    (b'{"\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', bytes(4), None, "UTF-8"),
    (b"[]", b"", None, "not a JSON object"),
], ids=["hlen-1TiB", "hlen-past-end", "truncated", "deep", "list-dtype", "negative-dims", "float-offsets", "1e999",
        "overlap", "past-eof", "65-dims", "entry-list", "metadata-list", "surrogate-name", "list-header"])
def test_hostile_safetensors_is_one_line(tmp_path, header, data, hlen, words):
    p = _safetensors(tmp_path / "m.safetensors", header, data, hlen=hlen)
    with pytest.raises(HwtuiError) as exc:
        read_safetensors_header(p)
    assert words in _one_line(exc)
    with pytest.raises(HwtuiError):
        build_plan_from_files([str(p)], model="m", version="v1", bucket_bytes=8)


def test_short_file_is_not_safetensors(tmp_path):
    (tmp_path / "s.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(HwtuiError) as exc:
        read_safetensors_header(tmp_path / "s.safetensors")
    assert "8-byte" in _one_line(exc)


# ------------------------------------------------------------------ non-regular files never block


@pytest.fixture
def fifo(tmp_path) -> Path:
    p = tmp_path / "w.safetensors"
    os.mkfifo(p)  # nobody ever opens the write end: a blocking open would wait forever
    return p


@pytest.mark.timeout(30)
def test_fifo_device_and_directory_are_refused_without_blocking(tmp_path, fifo):
    (tmp_path / "dir.safetensors").mkdir()
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "device"), (tmp_path / "dir.safetensors", "directory")):
        with pytest.raises(HwtuiError) as exc:
            build_plan_from_files([str(path)], model="m", version="v1", bucket_bytes=8)
        assert kind in _one_line(exc)
        with pytest.raises(HwtuiError):
            read_safetensors_header(path)
        with pytest.raises(HwtuiError):
            load_plan(path)
        with pytest.raises(HwtuiError):
            load_previous(path)
    torch_fifo = tmp_path / "w.pt"
    os.mkfifo(torch_fifo)
    with pytest.raises(HwtuiError) as exc:
        build_plan_from_files([str(torch_fifo)], model="m", version="v1", bucket_bytes=8)
    assert "a FIFO" in _one_line(exc)


@pytest.mark.timeout(30)
def test_plan_whose_weight_file_became_a_fifo_is_refused(weights, good_plan, tmp_path):
    moved = _with(good_plan, lambda r: r["files"][0].__setitem__("path", str(tmp_path / "gone.safetensors")))
    os.mkfifo(tmp_path / "gone.safetensors")
    with pytest.raises(HwtuiError) as exc:
        preflight_sources(validate_plan(moved, "p.json"))
    assert "a FIFO" in _one_line(exc)


@pytest.mark.timeout(60)
def test_cli_exits_2_with_one_line_and_writes_nothing(tmp_path, fifo, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--weights", str(fifo), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FIFO" in err[0] and not out.exists()
    deep = tmp_path / "deep.json"
    deep.write_text(_deep(100_000))
    assert main(["replicate", "--plan", str(deep), "--nproc", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nested too deeply" in err[0]


# ------------------------------------------------------------------ properties

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


def _paths(obj, prefix=()):
    """Every (container, key) in a plan, so a property can replace any one value."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield obj, k
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield obj, i
            yield from _paths(v, (*prefix, i))


@HYPO
@given(data=st.data(), value=JSON, redigest=st.booleans())
def test_property_plan_with_any_one_value_replaced_fails_cleanly(good_plan, data, value, redigest):
    raw = copy.deepcopy(good_plan)
    slots = list(_paths(raw))
    container, key = slots[data.draw(st.integers(0, len(slots) - 1))]
    container[key] = value
    if redigest:
        raw["digest"] = plan_digest(raw)
    try:
        plan = validate_plan(raw, "p.json")
    except HwtuiError as exc:
        assert "\n" not in str(exc)
        return
    # Accepted: then it is a plan a worker can trust (every item inside its bucket).
    for it in plan["items"]:
        assert 0 <= it["offset"] and it["offset"] + it["nbytes"] <= plan.buckets[it["bucket"]]["size"]


@HYPO
@given(blob=st.binary(max_size=300))
def test_property_any_bytes_as_plan_fail_cleanly(tmp_path_factory, blob):
    p = tmp_path_factory.getbasetemp() / "hypo-plan.json"
    p.write_bytes(blob)
    with pytest.raises(HwtuiError):
        load_plan(p)


ENTRY = st.fixed_dictionaries({
    "dtype": st.sampled_from(list(DTYPES)) | JSON,
    "shape": st.lists(st.integers(-2, 5), max_size=3) | JSON,
    "data_offsets": st.lists(st.integers(-4, 80), min_size=2, max_size=2) | JSON,
})


@HYPO
@given(header=st.dictionaries(st.text(max_size=6), ENTRY | JSON, max_size=5), data_len=st.integers(0, 64),
       hlen_delta=st.sampled_from([0, 0, 0, -1, 1, 1 << 33]))
def test_property_safetensors_header_fails_cleanly_or_is_consistent(tmp_path_factory, header, data_len, hlen_delta):
    raw = json.dumps(header).encode()
    p = _safetensors(tmp_path_factory.getbasetemp() / "hypo.safetensors", raw, bytes(data_len),
                     hlen=max(0, len(raw) + hlen_delta))
    try:
        tensors, _, start = read_safetensors_header(p)
    except HwtuiError as exc:
        assert "\n" not in str(exc)
        return
    size = p.stat().st_size
    end = start
    for t in tensors:  # sorted by offset, inside the file, never overlapping
        assert t.file_offset >= end and t.file_offset + t.nbytes <= size
        end = t.file_offset + t.nbytes


def test_written_plan_round_trips(good_plan, tmp_path):
    write_json_atomic(tmp_path / "p.json", good_plan)
    assert load_plan(tmp_path / "p.json").digest == good_plan["digest"]


MANIFEST_ENTRY = st.fixed_dictionaries({"name": st.text(max_size=4) | JSON, "dtype": st.sampled_from(["F32", "I8"]) | JSON,
                                        "shape": st.lists(st.integers(-1, 3), max_size=2) | JSON,
                                        "checksum": st.just("0" * 16) | JSON})


@HYPO
@given(version=JSON | st.just("v1"), tensors=st.lists(MANIFEST_ENTRY | JSON, max_size=3) | JSON,
       schema=st.sampled_from(["hwtui.manifest/1", "hwtui.plan/1"]) | JSON)
def test_property_any_manifest_loads_or_fails_cleanly(tmp_path_factory, version, tensors, schema):
    p = tmp_path_factory.getbasetemp() / "hypo-manifest.json"
    p.write_text(json.dumps({"schema": schema, "version": version, "tensors": tensors}))
    try:
        got_version, got = load_previous(p)
    except HwtuiError as exc:
        assert "\n" not in str(exc)
        return
    assert all(isinstance(k, str) and isinstance(v[1], list) for k, v in got.items())
    assert got_version is None or isinstance(got_version, str)
