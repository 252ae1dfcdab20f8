"""A checksum computed where the bytes live (a GPU), so verifying a bucket copied by CUDA IPC never
brings the bucket back to the host: only a summary of 1/4096 of its size crosses, and the digest
is 32 hex digits.

xxh3 (checksum.py) has no device kernel, so the receiver of an IPC copy compares this digest with
the one the source computed on its own device buffer (which the source checked against the plan's
xxh3 on the host as it read the file).

Definition. The bytes are little-endian int32 words ``w_i`` (a tail of 1-3 bytes zero-padded to a
word), laid out in rows of ``ROW_WORDS`` (4096) words: word ``i`` is at row ``i // 4096``, column
``i % 4096`` (a short last row is padded with zero words, which add nothing). The device computes
every row's sum and every column's sum, each modulo 2^32 (two reductions that read each byte once
and need no scratch), and the digest is xxh3-128 of ``"hwtui-dd1"``, the byte count, the row sums
and the 4096 column sums (int32 little-endian).

Why any flipped bit, any changed byte and any changed word is seen: a word changes by
``d = 2^a * odd`` with ``a < 32``, which is never 0 modulo 2^32, so its row sum changes and the
summary hashed differs. Swapping two different words changes their rows' sums (different rows) or
their columns' sums (same row). What cancels in both is four changes on the corners of a rectangle
(+d, -d in one row, -d, +d in the same columns of another): corruption detection, not a
cryptographic hash, like xxh3 itself.

Why this and not the weighted sums it replaces (two lanes of ``sum w_i * weight_i`` in int64):
those took a dozen passes of 8 bytes per word (measured on an H200: 1 GiB verified in ~18 ms, 35x
the IPC copy); this takes two passes of 4 bytes per word, at the GPU's memory bandwidth. On a GPU where Triton
imports, one kernel takes both kinds of sums in a single read (device_sums_triton; H200, 1 GiB:
0.61 ms against 0.80 for the two reductions, the copy then the checksum 1,098 GB/s against 877).

Fixed costs per digest (issue 23.2: ~0.4 ms per 64 MiB bucket on an H200, where its bytes take
0.03 ms): the sums go into one device tensor, columns then rows, written in place by the
reductions or the kernel (no zero-filled buffers, no copies between them), and cross to the host
in one transfer; device_sums queues them and sums_digest makes that transfer, so a caller (the
IPC receiver) can mark the stream in between.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import xxhash

ROW_WORDS = 4096
SLICE_WORDS = 1 << 30  # words per reduction call (tests slice smaller: the sums do not depend on it)
MAX_SLICES = 256
DIGEST_HEX = 32
_TAG = b"hwtui-dd1"
_M32 = (1 << 32) - 1
_ROW_BYTES = ROW_WORDS * 4
# Why the Triton kernel is not used in this process, once it failed (no C compiler for Triton's
# launcher, a GPU it does not support): the digest goes on with the torch reductions.
_ONE_READ_BROKEN: list[str] = []


def _digest(nbytes: int, rows: np.ndarray, cols: np.ndarray) -> str:
    # The sums hashed where they are (int32 little-endian already, from the device): no copies. A
    # 1 GiB bucket's 272 KiB of sums copied twice over took 369 us of host time per digest on a
    # 2-core box (each copy a fresh mapping, faulted in), 12 us hashed in place; the IPC receiver
    # and the source each make one per bucket, after the device is done (bench_ipc_leg.py).
    h = xxhash.xxh3_128(_TAG)
    h.update(nbytes.to_bytes(8, "little"))
    h.update(np.ascontiguousarray(rows, dtype="<i4").data)
    h.update(np.ascontiguousarray(cols, dtype="<i4").data)
    return f"{h.intdigest():032x}"


def device_digest(buf: Any, *, slice_words: int = SLICE_WORDS, config: Any = None) -> str:
    """The digest of a contiguous 1-D uint8 tensor (any device), as 32 hex digits.

    Only the row and column sums (4 bytes per 16 KiB of bucket, plus 16 KiB) leave the device, in
    one transfer. ``config``: a device_sums_triton.SumsConfig for the Triton kernel (the benchmark
    times its variants; the digest is the same with any of them, and without Triton).

    Measured and removed (H200, round nine): the copy fused into this pass, slice by slice so the
    sums read bytes still in the cache; the kernel launches cost more than the cache gave back at
    every slice size (4 MiB 104 GB/s .. 128 MiB 759, against 848 for the copy then the checksum)."""
    return sums_digest(int(buf.numel()), device_sums(buf, slice_words=slice_words, config=config))


def device_sums(buf: Any, *, slice_words: int = SLICE_WORDS, config: Any = None) -> Any:
    """The digest's sums of ``buf`` as one int32 tensor on its device: the 4096 column sums, then the
    row sums (a short last row included). Only queued on a GPU: sums_digest's one transfer waits for
    them, and for whatever the stream did before (the IPC receiver's copy)."""
    import torch

    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError("device_digest takes a 1-D uint8 tensor")
    if not buf.is_contiguous():
        raise ValueError("device_digest takes a contiguous tensor")
    n = buf.numel()
    full_rows = n // _ROW_BYTES
    rest = n - full_rows * _ROW_BYTES
    # Columns first: the full rows' sums are then one contiguous [4096 + full_rows] piece (what the
    # Triton kernel writes), and a short last row's sum comes after it. Empty, not zeros: every
    # element is written below.
    sums = torch.empty(ROW_WORDS + full_rows + (1 if rest else 0), dtype=torch.int32, device=buf.device)
    if full_rows:
        words = buf[: full_rows * _ROW_BYTES].view(torch.int32).view(full_rows, ROW_WORDS)
        _full_row_sums(words, sums[: ROW_WORDS + full_rows], slice_words, config)
    else:
        sums[:ROW_WORDS].zero_()
    if rest:
        _last_row_sums(buf[full_rows * _ROW_BYTES:], sums[ROW_WORDS + full_rows:], sums[:ROW_WORDS])
    return sums


def sums_digest(nbytes: int, sums: Any) -> str:
    """The digest from device_sums' tensor: its one device-to-host transfer, then the host hash."""
    host = sums.cpu().numpy()
    return _digest(nbytes, host[ROW_WORDS:], host[:ROW_WORDS])


def _full_row_sums(words: Any, out: Any, slice_words: int, config: Any) -> None:
    """Column sums into out[:4096], row sums into out[4096:], of [rows, 4096] int32 ``words``."""
    import torch

    one_read = _one_read_sums(words)
    if one_read is not None:
        try:
            if config is None:
                one_read(words, out)
            else:
                one_read(words, out, config)
            return
        except Exception as exc:  # noqa: BLE001 - Triton imported but cannot build or run here
            _ONE_READ_BROKEN.append(f"{type(exc).__name__}: {str(exc)[:200]}")  # the torch reductions from now on
    cols, rows = out[:ROW_WORDS], out[ROW_WORDS:]
    full_rows = words.shape[0]
    # At most MAX_SLICES slices: the column parts (16 KiB each) stay small, and a slice smaller
    # than that costs more in kernel launches than any cache can give back.
    step = max(1, slice_words // ROW_WORDS, -(-full_rows // MAX_SLICES))
    # dtype=int32: summed without an int64 copy of the bucket; the result is the sum mod 2^32.
    if step >= full_rows:  # one slice (every bucket under 4 GiB): both sums straight into out
        torch.sum(words, 1, dtype=torch.int32, out=rows)
        torch.sum(words, 0, dtype=torch.int32, out=cols)
        return
    col_parts = torch.empty(-(-full_rows // step), ROW_WORDS, dtype=torch.int32, device=words.device)
    for i, r0 in enumerate(range(0, full_rows, step)):
        m = words[r0: r0 + step]
        torch.sum(m, 1, dtype=torch.int32, out=rows[r0: r0 + step])
        torch.sum(m, 0, dtype=torch.int32, out=col_parts[i])
    torch.sum(col_parts, 0, dtype=torch.int32, out=cols)


def _last_row_sums(tail: Any, row: Any, cols: Any) -> None:
    """A short last row (``tail``: fewer than 16 KiB): its sum into ``row`` (one element), its words
    added to the first columns. Whole words are read in place; only a tail of 1-3 bytes is copied
    into a zero-padded word buffer."""
    import torch

    rest = tail.numel()
    if rest % 4:
        padded = torch.zeros(-(-rest // 4) * 4, dtype=torch.uint8, device=tail.device)
        padded[:rest] = tail
        lw = padded.view(torch.int32)
    else:
        lw = tail.view(torch.int32)
    torch.sum(lw.view(1, -1), 1, dtype=torch.int32, out=row)
    cols[: lw.numel()].add_(lw)  # int32 adds wrap: mod 2^32


def _one_read_sums(buf: Any) -> Any:
    """The Triton kernel's row and column sums (device_sums_triton.row_col_sums) for a CUDA buffer,
    or None (no GPU, no Triton, or HWTUI_DEVICE_CHECKSUM=torch): the same sums either way."""
    if buf.device.type != "cuda" or os.environ.get("HWTUI_DEVICE_CHECKSUM") == "torch" or _ONE_READ_BROKEN:
        return None
    from hwtui.engine.replication import device_sums_triton

    return device_sums_triton.row_col_sums if device_sums_triton.available() else None


def warm(device: str) -> None:
    """Load the checksum's kernels on ``device`` before a clock starts: on an H200 the first
    device_digest of a run took 32 ms (0.5 ms each after), inside the IPC path's transfer; the
    Triton kernel compiles (or loads from Triton's cache) here too."""
    import torch

    device_digest(torch.zeros(2 * ROW_WORDS * 4 + 3, dtype=torch.uint8, device=device))


def reference_digest(data: bytes) -> str:
    """The same digest in plain Python integers: the definition the torch version is tested against."""
    padded = bytes(data) + bytes(-len(data) % 4)
    nwords = len(padded) // 4
    rows = [0] * (-(-nwords // ROW_WORDS))
    cols = [0] * ROW_WORDS
    for i in range(nwords):
        w = int.from_bytes(padded[4 * i: 4 * i + 4], "little")
        rows[i // ROW_WORDS] = (rows[i // ROW_WORDS] + w) & _M32
        cols[i % ROW_WORDS] = (cols[i % ROW_WORDS] + w) & _M32
    as_i32 = lambda v: np.array(v, dtype=np.uint32).view(np.int32)  # noqa: E731 - the same bits, signed
    return _digest(len(data), as_i32(rows), as_i32(cols))


_DIGEST_TEXT = re.compile(f"[0-9a-f]{{{DIGEST_HEX}}}")


def is_digest(text: object) -> bool:
    """32 lowercase hex digits, nothing else (checked on every export and ack the IPC path reads:
    one regex match, not a Python loop over the characters)."""
    return isinstance(text, str) and _DIGEST_TEXT.fullmatch(text) is not None
