"""A push's plan as an agent receives it: the plan file's bytes, checked against the announced digest.

Everything here is refused in the HTTP handler's thread, before the agent takes the push (it stays
free), starts a resident rank or keeps a byte of the plan on disk.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

pytest.importorskip("torch")

from hwtui.engine.replication import plan_format  # noqa: E402
from hwtui.engine.replication.plan import _meta_for_file, load_plan  # noqa: E402
from hwtui.engine.resident.resident import PushRefused, ResidentRank  # noqa: E402
from tests.engine.replication.helpers import make_model, write_plan  # noqa: E402


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    make_model(d / "m", seed=4, big=2000, n=3)
    write_plan(d / "m", d / "p.plan", version="v1", bucket_kib=4)
    return d / "p.plan"


def _body(raw: bytes | str, digest: str, rank: int = 1) -> dict:
    return {"push_id": "p-1", "rank": rank, "world_size": 2, "world_key": "k", "master_addr": "127.0.0.1",
            "master_port": 29999, "plan": raw if isinstance(raw, str) else base64.b64encode(raw).decode(),
            "plan_digest": digest, "settings": {}}


def _refused(node: ResidentRank, body: dict) -> str:
    with pytest.raises(PushRefused) as info:
        node.start(body)
    assert info.value.status == 400
    msg = str(info.value)
    assert "\n" not in msg and "Traceback" not in msg
    # Nothing taken: the node is free, no rank was started, no plan bytes are left behind.
    assert not node.busy and node.child is None and node.in_flight is None
    assert list((node.out / "pushes").iterdir()) == []
    return msg


@pytest.fixture
def node(tmp_path):
    n = ResidentRank(node="n1", out=tmp_path / "agent", advertise="127.0.0.1")
    yield n
    n.close()


def test_a_plan_whose_bytes_are_not_the_announced_digest_is_refused(node, plan_file):
    raw = plan_file.read_bytes()
    digest = load_plan(plan_file).digest
    other = "0" * len(digest)
    assert "digest" in _refused(node, _body(raw, other))
    # One byte flipped in the tables: the file's own digest no longer matches its bytes.
    edited = bytearray(raw)
    edited[-9] ^= 0xFF
    assert "digest" in _refused(node, _body(bytes(edited), digest))
    assert "digest mismatch" in _refused(node, _body(raw[: len(raw) // 2], digest))
    assert "truncated" in _refused(node, _body(raw[:10], digest))


def test_garbage_and_malformed_fields_are_one_line_400s(node, plan_file):
    digest = load_plan(plan_file).digest
    assert "base64" in _refused(node, _body("not base64 at all!", digest))
    assert "the pushed plan is not valid JSON" in _refused(node, _body(b"\x00" * 64, digest))
    assert "plan_digest" in _refused(node, _body(plan_file.read_bytes(), "../etc/passwd"))
    body = _body(plan_file.read_bytes(), digest)
    body["plan"] = {"schema": "hwtui.plan/1"}  # the old JSON-object form is not accepted
    assert "base64" in _refused(node, body)


def _plan_with_a_missing_bucket(plan_file, name: str) -> tuple[bytes, str]:
    """A plan whose digest is right but whose tables name a bucket that does not exist: (bytes, digest)."""
    good = load_plan(plan_file)
    sections = good.sections()
    sections["i_bucket"] = np.full_like(sections["i_bucket"], len(good.buckets) + 7)
    bad_path = plan_file.with_name(name)
    digest = plan_format.write(bad_path, _meta_for_file(good.meta), sections)
    return bad_path.read_bytes(), digest


def test_only_the_coordinator_s_agent_validates_the_plan(node, plan_file):
    """A plan whose digest is right but whose tables break an invariant: rank 0's agent refuses it;
    a receiver's agent does not re-validate (its rank compares the digest with rank 0's before any
    byte moves, see tests/engine/replication/test_plan_digest.py)."""
    raw, digest = _plan_with_a_missing_bucket(plan_file, "bad.plan")
    msg = _refused(node, _body(raw, digest, rank=0))
    assert "refused" in msg and "bucket" in msg
    incoming, plan = node._receive_plan(base64.b64encode(raw).decode(), digest, validate=False)
    assert plan.digest == digest
    incoming.unlink()


# ---------------------------------------------------------------------- uploaded plans (by digest)


def _reader(raw: bytes, step: int = 4096):
    pos = 0

    def read(n: int) -> bytes:
        nonlocal pos
        chunk = raw[pos:pos + min(n, step)]
        pos += len(chunk)
        return chunk

    return read


def test_an_uploaded_plan_is_kept_by_digest_and_a_push_names_it(node, plan_file):
    raw = plan_file.read_bytes()
    digest = load_plan(plan_file).digest
    doc = node.upload_plan({"digest": digest}, len(raw), _reader(raw))
    assert doc["bytes"] == len(raw)
    kept = node.out / "pushes" / f"upload-{digest}.plan"
    assert kept.read_bytes() == raw
    # A start that names it by digest takes a link of it (loaded and checked again); the upload stays.
    incoming, plan = node._uploaded_plan(digest, validate=True)
    assert plan.digest == digest and incoming.read_bytes() == raw and kept.exists()
    incoming.unlink()


def test_an_upload_that_is_not_its_digest_or_was_never_made_is_refused(node, plan_file):
    raw = plan_file.read_bytes()
    digest = load_plan(plan_file).digest
    for body, want in ((raw[: len(raw) // 2], "digest mismatch"), (b"\x00" * 64, "not valid JSON")):
        with pytest.raises(PushRefused) as info:
            node.upload_plan({"digest": digest}, len(body), _reader(body))
        assert info.value.status == 400 and want in str(info.value) and "\n" not in str(info.value)
        assert list((node.out / "pushes").iterdir()) == []  # nothing kept
    with pytest.raises(PushRefused) as info:
        node.upload_plan({"digest": "../../etc"}, len(raw), _reader(raw))
    assert info.value.status == 400 and "digest" in str(info.value)
    body = _body(raw, digest)
    del body["plan"]  # named by digest, but never uploaded here
    assert "upload it first" in _refused(node, body)


def test_older_uploads_are_evicted_beyond_the_few_kept(node, plan_file, tmp_path):
    from hwtui.engine.resident.resident import KEEP_UPLOADS

    digests = []
    for seed in range(KEEP_UPLOADS + 2):
        make_model(tmp_path / f"m{seed}", seed=10 + seed, big=200, n=2)
        write_plan(tmp_path / f"m{seed}", tmp_path / f"p{seed}.plan", version=f"v{seed}", bucket_kib=4)
        raw = (tmp_path / f"p{seed}.plan").read_bytes()
        digests.append(load_plan(tmp_path / f"p{seed}.plan").digest)
        node.upload_plan({"digest": digests[-1]}, len(raw), _reader(raw))
    kept = sorted(p.name for p in (node.out / "pushes").glob("upload-*.plan"))
    assert len(kept) == KEEP_UPLOADS and f"upload-{digests[-1]}.plan" in kept


def test_the_pusher_reads_a_plan_s_facts_from_its_header_alone(plan_file, tmp_path):
    from hwtui.app.push.plan_file import plan_facts as _plan_facts
    from hwtui.core.errors import HwtuiError
    from hwtui.engine.replication.plan import write_json_atomic

    full = load_plan(plan_file)
    want = {"digest": full.digest, "model": full["model"], "version": full["version"], "total_bytes": full["total_bytes"]}
    assert _plan_facts(plan_file.read_bytes(), "p") == want
    v1 = tmp_path / "p1.json"  # an old hwtui.plan/1 JSON plan (its own v1 digest)
    write_json_atomic(v1, full.to_v1())
    old = load_plan(v1)
    assert _plan_facts(v1.read_bytes(), "p1")["digest"] == old.digest
    for junk in (b"", b"HWTPLAN2\xff\xff\xff\xff\xff\xff\xff\x7f{}", b'{"schema": "nope"}', b"\x00" * 40):
        with pytest.raises(HwtuiError) as info:
            _plan_facts(junk, "p")
        assert "plan p" in str(info.value) and "\n" not in str(info.value)


def test_the_source_s_agent_validates_an_upload_before_any_rank_starts(node, plan_file):
    raw, digest = _plan_with_a_missing_bucket(plan_file, "bad-upload.plan")
    with pytest.raises(PushRefused) as info:
        node.upload_plan({"digest": digest, "validate": "1"}, len(raw), _reader(raw))
    assert info.value.status == 400 and "bucket" in str(info.value)
    assert list((node.out / "pushes").iterdir()) == []
    # A receiver's agent checks the digest only (its rank compares digests with rank 0's).
    assert node.upload_plan({"digest": digest}, len(raw), _reader(raw))["bytes"] == len(raw)


def test_a_push_into_a_slot_a_consumer_holds_is_refused_by_the_agent_before_anything_is_discarded(tmp_path, plan_file):
    """The pusher's prepare normally refuses first; a hold taken after it is refused at the start
    itself (409), before the node discards a staged copy or starts a rank: the node is as it was."""
    node = ResidentRank(node="n1", out=tmp_path / "agent", advertise="127.0.0.1", device_slots="host")
    try:
        dev = node.device
        assert dev is not None
        for v in ("v0", "v9"):  # A then B serve; the consumer holds A, the slot a push lands in next
            dev.stage(v, 64)
            assert dev.commit(v) is not None
            if v == "v0":
                assert dev.export(300, "uid 1000").hold is not None
        staged = node.served / "staging" / "v8"
        staged.mkdir(parents=True)
        (staged / "model.safetensors").write_bytes(b"kept")
        with pytest.raises(PushRefused) as info:
            node.start(_body(plan_file.read_bytes(), load_plan(plan_file).digest))
        assert info.value.status == 409 and "slot A still serves v0 to 1 consumer(s) holding it (uid 1000)" in str(info.value)
        assert not node.busy and node.child is None and node.in_flight is None
        assert list((node.out / "pushes").iterdir()) == []  # the plan it came with is not kept
        assert (staged / "model.safetensors").read_bytes() == b"kept"  # nothing discarded
        assert dev.state()["receiving"] is None and dev.served()[0] == "v9"
    finally:
        node.close()


def test_a_version_on_disk_that_cannot_be_loaded_into_a_held_slot_is_reported_not_raised(tmp_path):
    """The disk switched to v3 (a switch finished from a staged copy) while a consumer holds the
    slot it would load into: the device keeps serving what it did, the state says why, the agent
    does not fail the request that finished the switch."""
    import torch
    from safetensors.torch import save_file

    node = ResidentRank(node="n1", out=tmp_path / "agent", advertise="127.0.0.1", device_slots="host")
    try:
        dev = node.device
        assert dev is not None
        for v in ("v1", "v2"):
            dev.stage(v, 64)
            assert dev.commit(v) is not None
            if v == "v1":
                dev.export(300, "uid 1000")
        (node.served / "versions" / "v3").mkdir(parents=True)
        save_file({"a": torch.arange(16, dtype=torch.float32)}, str(node.served / "versions" / "v3" / "model.safetensors"))
        (node.served / "CURRENT").write_text('{"version": "v3", "file": "versions/v3/model.safetensors"}')
        node._device_follow_disk()
        assert dev.served()[0] == "v2"
        assert "v3 could not be loaded onto host: slot A still serves v1" in (dev.error or ""), dev.error
    finally:
        node.close()
