"""The device checksum (engine/replication/device_checksum.py) on CPU tensors: the torch version
equals the plain-integer definition, every single flipped bit of a buffer changes it, the sums
reach the host in one transfer and the torch path launches nothing it does not need; the Triton
kernel's variants under Triton's interpreter where Triton is installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hwtui.engine.replication import device_checksum
from hwtui.engine.replication.device_checksum import (
    ROW_WORDS,
    device_digest,
    device_sums,
    is_digest,
    reference_digest,
    sums_digest,
)

ROW = 4 * ROW_WORDS  # bytes per row


def _t(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 8, 63, 64, 65, 1021, 4096, 10_003, ROW, ROW * 3 + 5, ROW * 2 + 8,
                               ROW * 7, ROW * 7 + 3, ROW - 1, ROW + 1])
def test_torch_digest_equals_the_reference_at_every_length_and_slice_size(n: Any) -> None:
    data = os.urandom(n)
    want = reference_digest(data)
    assert is_digest(want)
    assert device_digest(_t(data)) == want
    assert device_digest(_t(data), slice_words=3) == want  # slicing must not change the sums
    assert device_digest(_t(data), slice_words=4096) == want
    assert device_digest(_t(data), slice_words=2 * 4096) == want  # slices of 2 rows: the last one short at 7 rows


def test_the_sums_are_the_columns_then_the_rows_in_one_tensor() -> None:
    data = os.urandom(ROW * 3 + 6)
    buf = _t(data)
    sums = device_sums(buf)
    words = torch.frombuffer(bytearray(data + bytes(2)), dtype=torch.int32)
    full = words[: 3 * ROW_WORDS].view(3, ROW_WORDS)
    tail = words[3 * ROW_WORDS:]
    cols = full.sum(0, dtype=torch.int32)
    cols[: tail.numel()] += tail
    rows = torch.cat([full.sum(1, dtype=torch.int32), tail.sum(dtype=torch.int32).view(1)])
    assert torch.equal(sums, torch.cat([cols, rows]))
    assert sums_digest(len(data), sums) == device_digest(buf) == reference_digest(data)


@pytest.mark.parametrize("n", [0, 3, 8, ROW, ROW * 5, ROW * 5 + 8, ROW * 5 + 7])
def test_one_transfer_to_the_host_per_digest(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each device-to-host copy of a GPU tensor waits for the stream and costs a round trip: the
    digest makes exactly one (the sums, columns and rows together), at any length and slicing."""
    calls: list[int] = []
    real_cpu = torch.Tensor.cpu

    def counting_cpu(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        calls.append(self.numel())
        return real_cpu(self, *a, **k)

    def no_host_read(self: torch.Tensor, *a: Any, **k: Any) -> Any:
        raise AssertionError("a second way to the host")

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    for name in ("item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, no_host_read)
    data = os.urandom(n)
    for slice_words in (device_checksum.SLICE_WORDS, 4096):
        calls.clear()
        assert device_digest(_t(data), slice_words=slice_words) == reference_digest(data)
        assert calls == [ROW_WORDS + -(-n // ROW)], (n, slice_words, calls)


class _AtenOps(TorchDispatchMode):
    """The aten operators a call runs (what would be kernel launches on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("n", "want"), [
    (ROW * 4, ["empty", "sum", "sum"]),  # whole rows: both sums straight into the one output
    (ROW * 4 + 8, ["empty", "sum", "sum", "sum", "add_"]),  # a short last row of whole words: read in place
    (ROW * 4 + 7, ["empty", "sum", "sum", "zeros", "copy_", "sum", "add_"]),  # 1-3 bytes: the padded word
    (5, ["empty", "zero_", "zeros", "copy_", "sum", "add_"]),  # no whole row: the columns zeroed
])
def test_the_torch_path_launches_no_copies_and_no_zeroing_it_does_not_need(n: int, want: list[str]) -> None:
    buf = _t(os.urandom(n))
    with _AtenOps() as seen:
        device_sums(buf)
    # views (view, slice, select, alias) launch nothing: only what would be a kernel is compared
    launched = [op for op in seen.ops if op not in {"view", "slice", "select", "alias", "_unsafe_view", "detach"}]
    assert launched == want


def test_every_single_flipped_bit_changes_the_digest() -> None:
    data = bytearray(os.urandom(301))  # a tail of 1 byte too
    base = device_digest(_t(bytes(data)))
    seen = {base}
    for i in range(len(data)):
        for bit in range(8):
            data[i] ^= 1 << bit
            d = device_digest(_t(bytes(data)), slice_words=16)
            data[i] ^= 1 << bit
            assert d != base, (i, bit)
            seen.add(d)
    assert len(seen) == 1 + 8 * len(data)  # and no two flips collide either


def test_every_changed_byte_value_and_word_swaps_change_it() -> None:
    data = bytearray(os.urandom(64))
    base = reference_digest(bytes(data))
    for i in (0, 13, 63):
        for v in range(256):
            if v == data[i]:
                continue
            old, data[i] = data[i], v
            assert device_digest(_t(bytes(data))) != base
            data[i] = old
    words = bytearray(data)
    words[0:4], words[8:12] = data[8:12], data[0:4]
    if words != data:
        assert reference_digest(bytes(words)) != base


def test_a_zero_tail_is_told_from_the_padding_by_the_byte_count() -> None:
    # A zero tail sums like the padding itself; the byte count in the digest tells 4 zero bytes from 3.
    assert reference_digest(b"\0\0\0") != reference_digest(b"\0\0\0\0")
    assert device_digest(_t(b"\0\0\0")) == reference_digest(b"\0\0\0")


def test_words_moved_across_rows_and_columns_change_it() -> None:
    """Swaps within a row (columns differ) and between rows (rows differ) of the 4096-word layout."""
    data = bytearray(os.urandom(4 * 4096 * 2 + 12))
    base = device_digest(_t(bytes(data)))
    for a, b in ((0, 4), (0, 4 * 4096), (4 * 4095, 4 * 4096 * 2)):
        moved = bytearray(data)
        moved[a:a + 4], moved[b:b + 4] = data[b:b + 4], data[a:a + 4]
        if moved != data:
            assert device_digest(_t(bytes(moved))) != base, (a, b)


def test_refuses_what_it_cannot_hash_in_place() -> None:
    with pytest.raises(ValueError):
        device_digest(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError):
        device_digest(torch.zeros(8, dtype=torch.uint8)[::2])


def _prints_ok_in_triton_interpreter(code: str) -> None:
    """Run ``code`` in a fresh interpreter under Triton's interpreter (TRITON_INTERPRET=1: the
    kernels run on CPU tensors) and require it to print "ok"."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    if "only 0-dimensional arrays can be converted to Python scalars" in proc.stderr:
        # Triton 3.6's interpreter takes int() of a 1-element array for a loop bound passed as an
        # argument, which numpy >= 2.4 refuses (compiled kernels are not affected).
        pytest.skip("Triton's interpreter cannot run a kernel-argument loop bound under this numpy")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="Triton is not installed here: the one-read kernel runs live in tests/gpu/test_ipc_live.py")
def test_every_triton_kernel_variant_gives_the_two_reductions_sums_in_its_interpreter() -> None:
    """device_sums_triton under Triton's interpreter (CPU tensors), every configuration of VARIANTS
    and a few that loop several tiles per program: the same column and row sums as torch's two
    reductions, mod 2^32, for fewer rows than a block, a partial block and many blocks, and nothing
    written outside the output."""
    code = ("import torch\n"
            "from hwtui.engine.replication.device_sums_triton import VARIANTS, SumsConfig, row_col_sums\n"
            "extra = [SumsConfig(sub_r=4, max_block_r=32, target_programs=16),\n"
            "         SumsConfig(block_c=128, sub_r=4, max_block_r=32, target_programs=16, acc2d=True, atomic=True)]\n"
            "for cfg in [*VARIANTS.values(), *extra]:\n"
            "    for rows in (1, 17, 300):\n"
            "        x = torch.randint(-2**31, 2**31 - 1, (rows, 4096), dtype=torch.int32)\n"
            "        big = torch.full((4096 + rows + 128,), 777, dtype=torch.int32)\n"
            "        out = big[64: 64 + 4096 + rows]\n"
            "        row_col_sums(x, out, cfg)\n"
            "        want = torch.cat([x.sum(0, dtype=torch.int32), x.sum(1, dtype=torch.int32)])\n"
            "        assert torch.equal(out, want), (cfg, rows)\n"
            "        assert bool((big[:64] == 777).all()) and bool((big[-64:] == 777).all()), (cfg, rows)\n"
            "print('ok')")
    _prints_ok_in_triton_interpreter(code)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="Triton is not installed here: the fused kernel is timed on a GPU by bench_device_checksum.py")
def test_the_fused_copy_and_sums_copy_exactly_and_give_the_two_reductions_sums_in_its_interpreter() -> None:
    """device_sums_triton.copy_row_col_sums (a candidate the benchmark times, not in the product)
    under Triton's interpreter: the destination equals the source word for word, the sums are the
    torch reductions' of the destination (columns, then rows) for no rows, fewer rows than a block,
    a partial block and many blocks, in the default (atomic) mode, with partials and with whole
    tiles added, and nothing is written outside the destination or the output; overlapping
    tensors are refused."""
    code = ("import torch\n"
            "from hwtui.engine.replication.device_sums_triton import DEFAULT, SumsConfig, copy_row_col_sums\n"
            "cfgs = [DEFAULT, SumsConfig(sub_r=4, max_block_r=32, target_programs=16),\n"
            "        SumsConfig(block_c=128, sub_r=4, max_block_r=32, target_programs=16, acc2d=True, atomic=True)]\n"
            "G = 96\n"
            "for cfg in cfgs:\n"
            "    for rows in (0, 1, 17, 300):\n"
            "        x = torch.randint(-2**31, 2**31 - 1, (rows, 4096), dtype=torch.int32)\n"
            "        big_d = torch.full((rows * 4096 + 2 * G,), 0x13579BDF, dtype=torch.int32)\n"
            "        d = big_d[G: G + rows * 4096].view(rows, 4096)\n"
            "        big_o = torch.full((4096 + rows + 2 * G,), 777, dtype=torch.int32)\n"
            "        out = big_o[G: G + 4096 + rows]\n"
            "        copy_row_col_sums(x, d, out, cfg)\n"
            "        assert torch.equal(d, x), (cfg, rows)\n"
            "        assert torch.equal(out, torch.cat([d.sum(0, dtype=torch.int32), d.sum(1, dtype=torch.int32)])), (cfg, rows)\n"
            "        assert bool((big_d[:G] == 0x13579BDF).all()) and bool((big_d[-G:] == 0x13579BDF).all()), (cfg, rows)\n"
            "        assert bool((big_o[:G] == 777).all()) and bool((big_o[-G:] == 777).all()), (cfg, rows)\n"
            "x = torch.zeros(4, 4096, dtype=torch.int32)\n"
            "try:\n"
            "    copy_row_col_sums(x[:3], x[1:], torch.empty(4099, dtype=torch.int32))\n"
            "except ValueError:\n"
            "    print('ok')\n")
    _prints_ok_in_triton_interpreter(code)


def test_the_digest_is_xxh3_128_of_the_tag_the_byte_count_the_rows_then_the_columns() -> None:
    """The definition (module docstring), computed in one piece from bytes: the digest hashes the
    sums in place (no copies), and must still be exactly this, for any array it is handed (a
    strided view, a big-endian or wider array of the same values)."""
    import numpy as np
    import xxhash

    rng = np.random.default_rng(3)
    rows = rng.integers(-2**31, 2**31 - 1, 70, dtype=np.int32)
    cols = rng.integers(-2**31, 2**31 - 1, device_checksum.ROW_WORDS, dtype=np.int32)
    whole = b"hwtui-dd1" + (12345).to_bytes(8, "little") + rows.astype("<i4").tobytes() + cols.astype("<i4").tobytes()
    want = f"{xxhash.xxh3_128(whole).intdigest():032x}"
    assert device_checksum._digest(12345, rows, cols) == want
    assert device_checksum._digest(12345, np.repeat(rows, 2)[::2], cols.astype(">i4")) == want
    assert device_checksum._digest(12345, rows.astype(np.int64), cols) == want


def test_a_digest_is_32_lowercase_hex_digits_and_nothing_else() -> None:
    good = "0123456789abcdef" * 2
    assert device_checksum.is_digest(good)
    for bad in (good.upper(), good[:-1], good + "0", good + "\n", " " + good[1:], good[:-1] + "g", good[:-1] + "\u0661",
                good[:-1] + "０", "", None, 32, b"0" * 32, ["0"] * 32):
        assert not device_checksum.is_digest(bad), repr(bad)
