"""Staging copies: bytes copied in land where the layout says, whether the copy is a file or memory."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hwtui.engine.replication.checksum import tensor_hex  # noqa: E402
from hwtui.engine.replication.staging import Prefaulted, Staging, populate  # noqa: E402


def _tensors(sizes: list[int]) -> tuple[list[dict], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    data = {f"t{i}": torch.randint(0, 255, (n,), dtype=torch.uint8, generator=g) for i, n in enumerate(sizes)}
    meta = [{"name": k, "dtype": "U8", "shape": [v.numel()], "nbytes": v.numel(), "checksum": tensor_hex(v)}
            for k, v in data.items()]
    return meta, data


def test_a_file_staging_copy_written_by_pwrite_is_the_safetensors_file(tmp_path):
    from safetensors.torch import load_file

    meta, data = _tensors([5000, 1, 70_000])
    st = Staging(meta, {"format": "pt"}, file=tmp_path / "s" / "model.safetensors")
    for name, t in data.items():
        st.write(name, 0, t[:10])
        st.write_at(st.layout[name][0] + 10, t[10:].numpy())  # a plain buffer works too
    assert st.verify() == []  # read back through the mapping: the same page cache
    st.flush()
    st.close()
    got = load_file(str(tmp_path / "s" / "model.safetensors"))
    assert all(torch.equal(got[k], data[k]) for k in data)


def test_memory_staging_takes_a_prefaulted_buffer_that_reads_as_zeros(tmp_path):
    meta, data = _tensors([3000, 4096 * 3 + 5])
    pre = Prefaulted(sum(t["nbytes"] for t in meta) + 100)  # an upper bound, as the worker's
    buf = pre.take(30.0)
    assert buf is not None and pre.populated == populate(buf)  # populated once; again is harmless
    st = Staging(meta, {"format": "pt"}, buffer=buf)
    assert st.data.numel() == st.data_bytes == sum(t["nbytes"] for t in meta)
    assert bool((st.data == 0).all())
    for name, t in data.items():
        st.write(name, 0, t)
    assert st.verify() == []
    st.close()


def test_a_buffer_too_small_is_not_used():
    meta, data = _tensors([10_000])
    pre = Prefaulted(100)
    st = Staging(meta, {"format": "pt"}, buffer=pre.take(30.0))
    assert st.data.numel() == 10_000 and bool((st.data == 0).all())
    st.write("t0", 0, data["t0"])
    assert st.verify() == []
    st.close()


@pytest.mark.parametrize("to_file", [True, False])
def test_write_hashed_returns_the_hash_of_what_landed(tmp_path, to_file):
    from hwtui.engine.replication.checksum import xxh3_hex

    meta, data = _tensors([3 * (1 << 20) + 17, 5])
    st = Staging(meta, {"format": "pt"}, file=tmp_path / "m.safetensors" if to_file else None)
    off = st.layout["t0"][0]
    digest = st.write_hashed(off, data["t0"], step=1 << 20)  # several slices and a short last one
    assert digest == xxh3_hex(data["t0"].numpy()) == tensor_hex(st.region("t0"))
    st.close()
