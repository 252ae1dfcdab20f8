"""The device checksum (engine/replication/device_checksum.py) on CPU tensors: the torch version
equals the plain-integer definition, and every single flipped bit of a buffer changes it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from hwtui.engine.replication.device_checksum import device_digest, is_digest, reference_digest


def _t(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 8, 63, 64, 65, 1021, 4096, 10_003, 4 * 4096, 4 * 4096 * 3 + 5])
def test_torch_digest_equals_the_reference_at_every_length_and_slice_size(n: Any) -> None:
    data = os.urandom(n)
    want = reference_digest(data)
    assert is_digest(want)
    assert device_digest(_t(data)) == want
    assert device_digest(_t(data), slice_words=3) == want  # slicing must not change the sums
    assert device_digest(_t(data), slice_words=4096) == want


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


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="Triton is not installed here: the one-read kernel runs live in tests/gpu/test_ipc_live.py")
def test_the_triton_kernel_gives_the_two_reductions_sums_in_its_interpreter() -> None:
    """device_sums_triton under Triton's interpreter (CPU tensors): the same row and column sums as
    torch's two reductions, mod 2^32, for fewer rows than a block, a partial block and many blocks."""
    code = ("import torch; from hwtui.engine.replication.device_sums_triton import row_col_sums\n"
            "for rows in (1, 17, 300):\n"
            "    x = torch.randint(-2**31, 2**31 - 1, (rows, 4096), dtype=torch.int32)\n"
            "    r, c = row_col_sums(x)\n"
            "    assert torch.equal(r, x.sum(1, dtype=torch.int32)) and torch.equal(c, x.sum(0, dtype=torch.int32)), rows\n"
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
