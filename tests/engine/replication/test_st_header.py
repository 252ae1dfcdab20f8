"""The planner's vectorised safetensors header reader (st_header.py) against the general reader.

The fast reader must be a pure optimisation: on any header it either declines (None: the general
reader decides) or gives exactly the general reader's columns; it must never accept a header the
general reader refuses. Hostile files stay one line, exit 2, through the planner and the CLI, and a
plan is byte-for-byte the same for the same input, whichever reader read it.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtui.app.cli import main
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication import st_header
from hwtui.engine.replication.plan import build_plan_from_files, write_plan
from hwtui.engine.replication.weights import DTYPES, parse_safetensors_columns

HYPO = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROOT = Path(__file__).resolve().parents[3]


def _header(entries: list[tuple[str, str, list[int]]], *, meta: dict[str, str] | None = None, compact: bool = True,
            ascii_only: bool = False) -> tuple[bytes, int]:
    """(header bytes padded with spaces to 8 as the Rust writer does, data length), tensors end to end."""
    obj: dict[str, object] = {} if meta is None else {"__metadata__": meta}
    pos = 0
    for name, dtype, shape in entries:
        n = DTYPES[dtype][0] * int(np.prod(shape, dtype=np.int64))
        obj[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    raw = json.dumps(obj, separators=(",", ":") if compact else None, ensure_ascii=ascii_only).encode()
    return raw + b" " * (-len(raw) % 8), pos


def _general(raw: bytes, data: int):
    try:
        c = parse_safetensors_columns(raw, 8 + len(raw), 8 + len(raw) + data, "h")
    except HwtuiError:
        return None
    return c


def _same(fast: st_header.Header, general) -> None:
    assert fast.name_list() == general.names
    for key in ("dtype", "ndims", "dims", "nbytes", "offset"):
        a, b = getattr(fast, key), getattr(general, key)
        assert a.dtype == b.dtype and np.array_equal(a, b), key
    if fast.sort_keys is not None:  # the order the planner uses is sorted() of the names
        order = fast.name_order if fast.name_order is not None else st_header.sort_order(fast.sort_keys)
        assert [general.names[i] for i in order.tolist()] == sorted(general.names)


def _check(raw: bytes, data: int) -> st_header.Header | None:
    try:  # _scan, not regular_header: the latter declines on an unforeseen error, which would hide it here
        fast = st_header._scan(raw, 8 + len(raw), 8 + len(raw) + data)
    except st_header._Irregular:
        fast = None
    general = _general(raw, data)
    if general is None:
        assert fast is None, "the fast reader accepted a header the general reader refuses"
    elif fast is not None:
        _same(fast, general)
    return fast


names = st.text(st.characters(codec="utf-8", exclude_characters='"\\', exclude_categories=("Cc",)), max_size=20)
shapes = st.lists(st.integers(0, 3000), max_size=4)  # at most 8e13 x 8 bytes: within the fast form
big_shapes = st.lists(st.integers(0, 10**7), max_size=4)
entries = st.lists(st.tuples(names, st.sampled_from(sorted(DTYPES)), shapes), min_size=1, max_size=12,
                   unique_by=lambda e: e[0]).filter(lambda es: all(e[0] != "__metadata__" for e in es))


@HYPO
@given(entries, st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3))
def test_regular_headers_read_the_same_as_the_general_reader(es, meta):
    raw, data = _header(es, meta=meta)
    fast = _check(raw, data)
    assert fast is not None  # compact, unescaped, no control characters: the fast path must take it
    # The same header in another shape (spaces after separators, escapes) is declined or identical.
    for spaced, ascii_only in ((False, False), (True, True)):
        _check(*_header(es, meta=meta, compact=not spaced, ascii_only=ascii_only))


@HYPO
@given(st.lists(st.tuples(names, st.sampled_from(sorted(DTYPES)), big_shapes), min_size=1, max_size=4,
                unique_by=lambda e: e[0]).filter(lambda es: all(e[0] != "__metadata__" for e in es)))
def test_huge_shapes_are_declined_or_read_the_same(es):
    _check(*_header(es))


_EDITS = b'"\\,:[]{} 0123456789-.e\x00\x1f\x80\xff'


@HYPO
@given(entries, st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(["set", "del", "ins"]),
                                   st.integers(0, len(_EDITS) - 1)), min_size=1, max_size=3))
def test_corrupted_headers_are_declined_or_read_the_same(es, edits):
    raw, data = _header(es, meta={"format": "pt"})
    buf = bytearray(raw)
    for pos, op, ch in edits:
        pos %= len(buf)
        if op == "set":
            buf[pos] = _EDITS[ch]
        elif op == "del":
            del buf[pos]
        else:
            buf.insert(pos, _EDITS[ch])
    _check(bytes(buf), data)


@pytest.mark.parametrize("raw, fast_ok", [
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', True),
    (b'{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}', True),
    (b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}',
     True),
    (b'{"a":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}}', False),  # leading zero: not JSON
    (b'{"a":{"dtype":"F32","shape":[2,],"data_offsets":[0,8]}}', False),
    (b'{"a":{"dtype":"F32","shape":[,2],"data_offsets":[0,8]}}', False),
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}}', False),
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}}', False),
    (b'{"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}}', False),  # unknown dtype
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}',
     False),  # a name twice: JSON keeps the last one; the general reader's rule, not ours
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"x":"y"}}', False),
    (b'{"a":{"shape":[2],"dtype":"F32","data_offsets":[0,8]}}', False),  # keys in another order
    (b'{"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}}', False),
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}\n', False),
    (b'{"__metadata__":{"k":"v\\"}"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', True),
    (b'{"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', False),
])
def test_edge_cases_of_the_regular_form(raw, fast_ok):
    fast = _check(raw, 64)
    assert (fast is not None) == fast_ok


@HYPO
@given(st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=30), unique=True))
def test_name_keys_sort_like_sorted(ns):
    keys = st_header.name_keys(ns)
    assert keys is not None and keys.shape[1] % 8 == 0
    order = st_header.sort_order(keys)
    assert [ns[i] for i in order.tolist()] == sorted(ns)
    got, text, ends = st_header.sorted_names(keys, order)
    assert got == sorted(ns)
    assert bytes(text).decode() == "".join(got) and ends.tolist() == np.cumsum([len(n) for n in got]).tolist()
    assert st_header.first_duplicate(keys, order) is None


def test_common_prefixes_and_duplicates():
    ns = [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(40) for p in "qkvo"]
    keys = st_header.name_keys(ns[::-1])
    assert [ns[::-1][i] for i in st_header.sort_order(keys).tolist()] == sorted(ns)
    keys = st_header.name_keys(["b", "a", "b"])
    assert st_header.first_duplicate(keys, st_header.sort_order(keys)) in (0, 2)
    assert st_header.name_keys(["x" * 300]) is None and st_header.name_keys(["a\0"]) is None


# ------------------------------------------------------------------ hostile files through the planner


def _file(path: Path, raw: bytes, data: bytes) -> str:
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return str(path)


_OK = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I8","shape":[3],"data_offsets":[8,11]}}'


@pytest.mark.parametrize("raw, data, words", [
    (_OK.replace(b"[8,11]", b"[4,7]"), bytes(11), "overlap"),
    (_OK.replace(b'"I8"', b'"Q8"'), bytes(11), "unknown dtype"),
    (_OK.replace(b"[3]", b"[3000000000000000000]"), bytes(11), "inconsistent"),
    (_OK.replace(b"[3]", b"[" + b",".join([b"2"] * 65) + b"]"), bytes(11), "bad shape"),
    (_OK.replace(b"[3]", b"[" + b"9" * 5000 + b"]"), bytes(11), "not valid JSON"),
    (_OK[:-9], bytes(11), "not valid JSON"),  # truncated
    (_OK.replace(b'"b"', b'"\xff\xfe"'), bytes(11), "not valid JSON"),  # not UTF-8
    (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"", "nested too deeply"),
    (_OK.replace(b"[0,8]", b"[0,-8]"), bytes(11), "inconsistent"),
    (_OK, bytes(5), "file size"),
])
def test_hostile_headers_are_one_line_exit_2(tmp_path, capsys, raw, data, words):
    path = _file(tmp_path / "m.safetensors", raw, data)
    with pytest.raises(HwtuiError) as exc:
        build_plan_from_files([path], model="m", version="v1", bucket_bytes=8)
    msg = str(exc.value)
    assert words in msg and "\n" not in msg and len(msg) < 600
    code = main(["plan", "--weights", path, "-o", str(tmp_path / "p.plan")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0] and not (tmp_path / "p.plan").exists()


def test_huge_tensor_count_with_a_short_file_is_refused(tmp_path):
    raw, data = _header([(f"t{i}", "F32", [4]) for i in range(20_000)])
    path = _file(tmp_path / "m.safetensors", raw, bytes(data - 16))  # the last tensor lies past the end
    assert st_header.regular_header(raw, 8 + len(raw), 8 + len(raw) + data) is not None  # the fast path's form
    with pytest.raises(HwtuiError, match="file size"):
        build_plan_from_files([path], model="m", version="v1", bucket_bytes=1 << 20)


# ------------------------------------------------------------------ deterministic plans


def _model(tmp_path: Path, n: int = 3000) -> str:
    rng = np.random.default_rng(7)
    dts = ["F32", "BF16", "I8", "F64"]
    es = [(f"layers.{(i * 7919) % n}.{'wb'[i % 2]}", dts[i % 4], [int(rng.integers(0, 9)), 3][: 1 + i % 2])
          for i in range(n)]
    raw, data = _header(es, meta={"format": "pt"})
    return _file(tmp_path / "m.safetensors", raw, rng.integers(0, 256, data, dtype=np.uint8).tobytes())


def test_plan_is_byte_for_byte_deterministic_whichever_reader_reads_it(tmp_path, monkeypatch):
    path = _model(tmp_path)
    for i in range(2):
        write_plan(tmp_path / f"fast{i}.plan", build_plan_from_files([path], model="m", version=None,
                                                                     bucket_bytes=4096))
    monkeypatch.setattr(st_header, "regular_header", lambda *a: None)  # the general reader only
    write_plan(tmp_path / "general.plan", build_plan_from_files([path], model="m", version=None, bucket_bytes=4096))
    monkeypatch.undo()
    # and in a fresh interpreter with another hash seed (no set or dict order leaks into the file)
    code = ("import sys; from hwtui.engine.replication.plan import build_plan_from_files, write_plan; "
            "write_plan(sys.argv[2], build_plan_from_files([sys.argv[1]], model='m', version=None, "
            "bucket_bytes=4096))")
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", code, path, str(tmp_path / "child.plan")], check=True, env=env, timeout=120)
    blobs = {p.name: p.read_bytes() for p in tmp_path.glob("*.plan")}
    assert len(blobs) == 4 and len(set(blobs.values())) == 1


# ------------------------------------------------------------------ short-input XXH3


def test_vectorised_xxh3_matches_xxhash_at_every_short_length():
    import xxhash

    from hwtui.engine.replication.xxh3_small import MAX_LEN, xxh3_64_short

    rng = np.random.default_rng(3)
    buf = rng.integers(0, 256, 4096, dtype=np.uint8)
    length = np.repeat(np.arange(MAX_LEN + 1), 60)
    offset = rng.integers(0, len(buf) - MAX_LEN, len(length))
    got = xxh3_64_short(buf, offset, length)
    want = [xxhash.xxh3_64_intdigest(buf[o:o + n].tobytes()) for o, n in
            zip(offset.tolist(), length.tolist(), strict=True)]
    assert got.tolist() == want
    with pytest.raises(ValueError):
        xxh3_64_short(buf, np.array([0]), np.array([MAX_LEN + 1]))


def test_streamed_manifest_is_the_json_of_the_manifest(tmp_path):
    from hwtui.engine.replication.plan import load_previous, manifest_of, write_json_atomic

    es = [(f"layer.{i}.w", "F32", [2, 3]) for i in range(70_000)]  # more than one 65,536-tensor chunk
    es += [("ünï\tcode\"\\", "BF16", []), ("zero", "I8", [0]), ("deep", "U8", [1, 2, 1, 2, 1])]
    raw, data = _header(es)
    path = _file(tmp_path / "m.safetensors", raw, bytes(data))
    plan = build_plan_from_files([path], model="m", version="v1", bucket_bytes=1 << 16)
    write_json_atomic(tmp_path / "streamed.json", manifest_of(plan))
    full = manifest_of(plan)
    assert full["tensors"][0]["name"] == "deep" and len(full) == 5  # reading it materialises the list
    write_json_atomic(tmp_path / "dumped.json", full)
    streamed = (tmp_path / "streamed.json").read_bytes()
    assert streamed == (tmp_path / "dumped.json").read_bytes()
    assert streamed == (json.dumps(dict(full), separators=(",", ":")) + "\n").encode()
    version, tensors = load_previous(tmp_path / "streamed.json")
    assert version == "v1" and tensors["ünï\tcode\"\\"] == ("BF16", [], full["tensors"][-1]["checksum"])


def test_a_short_last_name_beside_a_long_one_reads_the_same():
    """Found by hypothesis: a name's sort key is read `width` bytes from its start, and a short
    name at the end of a header with a long name elsewhere ran past the header (IndexError)."""
    es = [("0000" + "\xa0" * 8 + "\U00010000" * 7, "BF16", []), ("", "BF16", [])]
    assert _check(*_header(es)) is not None
