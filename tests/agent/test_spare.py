"""The spare staging file: a push's staging copy made ahead of time, with the same bytes in the end."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hwtui.engine.replication.checksum import tensor_hex  # noqa: E402
from hwtui.engine.replication.staging import Staging  # noqa: E402
from hwtui.engine.resident.spare import SpareStaging, make_spare, spare_path  # noqa: E402
from tests.agent.procs import until  # noqa: E402


def _tensors(seed: int, sizes: list[int]) -> tuple[list[dict], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    data = {f"t{i}": torch.randint(0, 255, (n,), dtype=torch.uint8, generator=g) for i, n in enumerate(sizes)}
    meta = [{"name": k, "dtype": "U8", "shape": [v.numel()], "nbytes": v.numel(), "checksum": tensor_hex(v)}
            for k, v in data.items()]
    return meta, data


@pytest.mark.parametrize("spare_size", [10, 5000, 1 << 16])  # smaller, equal-ish, larger than the model
def test_a_staging_copy_made_from_the_spare_holds_exactly_the_model(tmp_path, spare_size):
    from safetensors.torch import load_file

    root = tmp_path / "served"
    make_spare(root, spare_size)
    assert spare_path(root).stat().st_size == spare_size
    meta, data = _tensors(1, [1000, 3000, 7])
    target = root / "staging" / "v2" / "model.safetensors"
    st = SpareStaging(meta, {"version": "v2"}, file=target)
    assert getattr(st, "used_spare", False) and not spare_path(root).exists()
    for name, t in data.items():
        st.write(name, 0, t)
    assert st.verify() == []
    st.flush()
    st.close()
    got = load_file(str(target))
    assert set(got) == set(data) and all(torch.equal(got[k], data[k]) for k in data)


def test_without_a_spare_it_is_the_worker_s_own_staging(tmp_path):
    meta, data = _tensors(2, [64])
    st = SpareStaging(meta, {}, file=tmp_path / "served" / "staging" / "v1" / "model.safetensors")
    assert not getattr(st, "used_spare", False) and isinstance(st, Staging)
    assert bool((st.data == 0).all())  # zero-filled, as Staging does
    st.close()


@pytest.mark.parametrize("sync_fails", [False, True])
def test_finished_ranges_are_written_back_during_the_transfer_and_flush_stays_durable(tmp_path, sync_fails):
    """``written`` hands finished ranges to the writeback thread; a failing ``sync_file_range`` is
    kept as an error and stops that head start, and ``flush`` (the fsync) still makes it durable."""
    from safetensors.torch import load_file

    meta, data = _tensors(3, [1 << 20, 1 << 20, 12345])
    target = tmp_path / "served" / "staging" / "v1" / "model.safetensors"
    st = SpareStaging(meta, {"version": "v1"}, file=target)
    wb = st.writeback
    if wb is None:
        pytest.skip("no sync_file_range here (not Linux)")
    if sync_fails:
        wb._sync = lambda *a: -1
    offset = 0
    for name, t in data.items():
        st.write(name, 0, t)
        st.written([(offset, t.numel())])
        offset += t.numel()
    st.flush()
    assert (wb.error is not None) == sync_fails
    assert wb.bytes == offset
    assert st.verify() == []
    st.close()
    got = load_file(str(target))
    assert all(torch.equal(got[k], data[k]) for k in data)


def test_a_spare_stopped_between_chunks_leaves_nothing_and_an_unstopped_one_is_all_zeros(tmp_path, monkeypatch):
    """make_spare asks ``stop`` before each chunk: True gives up (SpareStopped), the temporary file
    gone and no spare; an earlier spare's ``.spare.tmp`` leftover never blocks it."""
    from hwtui.engine.resident import spare as spare_mod

    monkeypatch.setattr(spare_mod, "SPARE_CHUNK", 4096)
    root = tmp_path / "served"
    asked: list[int] = []

    def stop_at_third() -> bool:
        asked.append(1)
        return len(asked) == 3

    with pytest.raises(spare_mod.SpareStopped):
        make_spare(root, 5 * 4096 + 7, stop_at_third)
    assert len(asked) == 3
    _until_empty(spare_path(root).parent)  # renamed away at once, unlinked on a thread
    assert not spare_path(root).exists()
    (spare_path(root).parent / ".spare.tmp").write_bytes(b"x" * 100)  # a killed agent's leftover
    assert make_spare(root, 5 * 4096 + 7, lambda: False) == 5 * 4096 + 7
    assert spare_path(root).read_bytes() == bytes(5 * 4096 + 7)
    assert list(spare_path(root).parent.iterdir()) == [spare_path(root)]


def test_a_signal_while_the_spare_is_made_leaves_no_temporary_file(tmp_path, monkeypatch):
    """SIGTERM reaches a resident rank as an exception (rank_signals.Interrupted) wherever it is:
    mid-spare, the temporary file goes with it and no spare is left half-made."""
    from hwtui.engine.resident import spare as spare_mod

    monkeypatch.setattr(spare_mod, "SPARE_CHUNK", 4096)
    root = tmp_path / "served"
    calls: list[int] = []

    def signalled() -> bool:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what the signal gate raises, as any exception would be
        return False

    with pytest.raises(KeyboardInterrupt):
        make_spare(root, 3 * 4096, signalled)
    _until_empty(spare_path(root).parent)


def _until_empty(d) -> None:
    """A stopped spare is renamed away and unlinked on a thread: wait (bounded) for the thread."""
    until(f"nothing left in {d}", lambda: list(d.iterdir()) == [], bound_s=30.0, step_s=0.01)


def test_a_stopped_spare_is_renamed_away_before_make_spare_returns(tmp_path, monkeypatch):
    """The push that stopped it must not wait for the unlink (a file still being written back
    makes its unlink wait): what make_spare leaves at the temporary name is nothing, at once."""
    from hwtui.engine.resident import spare as spare_mod

    monkeypatch.setattr(spare_mod, "SPARE_CHUNK", 4096)
    unlinked = []
    gate = __import__("threading").Event()
    real_unlink = spare_mod.os.unlink

    def slow_unlink(path, *a, **k):  # at the OS boundary: an unlink that waits on write-back
        gate.wait(30)
        unlinked.append(str(path))
        return real_unlink(path, *a, **k)

    monkeypatch.setattr(spare_mod.os, "unlink", slow_unlink)
    root = tmp_path / "served"
    with pytest.raises(spare_mod.SpareStopped):
        make_spare(root, 3 * 4096, lambda: True)
    names = [p.name for p in spare_path(root).parent.iterdir()]
    assert len(names) == 1 and names[0].startswith(spare_mod.DISCARD_PREFIX) and unlinked == []
    gate.set()
    _until_empty(spare_path(root).parent)
    assert len(unlinked) == 1
