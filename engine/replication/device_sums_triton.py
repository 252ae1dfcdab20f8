"""The device checksum's sums in one read of the bucket, on a GPU where Triton is installed.

engine.replication.device_checksum defines the digest by every row's and every column's sum
(mod 2^32) of the bucket as int32 words in rows of 4096. Two torch reductions read the bucket
twice. This kernel reads each tile once and writes both kinds of sums: program (i, j) takes the
rows of block i and the columns of block j, SUB_R rows at a time. By default it stores the tile's
partial sums (row sums per column block, column sums per row block) and two small torch
reductions finish them straight into the caller's output; the ``atomic`` variant adds its partial
sums into the zeroed output itself (one memset, no second reduction). The sums are the same, so
the digest is: the source and a receiver may each take either path, and any variant.
Measured on an H200, 1 GiB (bench_device_checksum.py, round nine): the digest 0.61 ms against
0.80 with the two reductions; the copy, then the digest, 1,098 GB/s copied and verified against
877. The kernel alone read only ~1.75 TB/s of the ~4 TB/s HBM gives: ``VARIANTS`` are the tile
shapes and launch settings the benchmark times against the default (issue 23.2).

``copy_row_col_sums`` is a measured candidate, not used by the product: the receiver's copy and
these sums in one kernel (each tile read from the source once, stored to the copy and summed).
Its docstring says what it verifies and why it is not wired in.

Triton is optional: it comes with torch's CUDA wheels on Linux, and where it cannot be imported
(CPU, some AMD and Intel stacks) device_checksum keeps the torch reductions. Imported on first
use only.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # optional: without it this module imports and says so (available())
    triton = None

W_WORDS = 4096  # the digest's row width (device_checksum.ROW_WORDS; not imported: no cycle)


@dataclass(frozen=True)
class SumsConfig:
    """One way to launch the kernel: the same sums, a different speed."""

    block_c: int = 256  # columns per program (a power of two dividing 4096)
    sub_r: int = 16  # rows per load: a sub_r x block_c int32 tile
    max_block_r: int = 512  # rows per program at most (a power of two, at least sub_r)
    target_programs: int = 1024  # programs wanted; rows per program grow until about this many
    num_warps: int = 4
    atomic: bool = False  # add into the zeroed output in the kernel instead of partials + reductions
    acc2d: bool = False  # add whole tiles in the loop, sum their columns once after it (no per-tile column reduction)

    def check(self) -> None:
        pow2 = lambda v: v > 0 and v & (v - 1) == 0  # noqa: E731 - a one-line predicate
        if not (pow2(self.block_c) and W_WORDS % self.block_c == 0 and pow2(self.sub_r)
                and pow2(self.max_block_r) and self.max_block_r >= self.sub_r and pow2(self.num_warps)
                and self.target_programs >= 1):
            raise ValueError(f"not a launchable configuration: {self}")


# The fastest of VARIANTS on an H200 (round thirteen, bench_device_checksum.py, 1 GiB, 7 interleaved
# rounds, every sum checked against the torch reductions): the sums in 0.325 ms (3.3 TB/s read)
# against 0.374 for round nine's shape, the digest 0.449 ms against 0.530, per 64 MiB bucket 0.110
# ms against 0.124. Atomic adds wrap mod 2^32 like the partial sums: the same digest.
DEFAULT = SumsConfig(sub_r=32, num_warps=8, atomic=True)
ROUND_NINE = SumsConfig()  # the tile shape and launch measured in round nine, kept for the comparison
# What bench_device_checksum.py times against the default (8 at most: each one compiles on the GPU
# inside the benchmark's minute). Why these (from the default's PTX for sm_90): its loop waits on
# one 16 KiB tile per program per iteration and reduces each tile's columns across warps through
# shared memory (8 barriers an iteration); more rows and warps put more bytes in flight, whole
# tiles added in the loop (acc2d) with 128 columns per program left 2 barriers an iteration, and
# the atomic ones drop the partials' write-out, read-back and two reductions (two launches fewer
# per bucket: the fixed cost per bucket). Compiled for sm_90 with Triton 3.6 here, none spills.
VARIANTS: dict[str, SumsConfig] = {
    "default": DEFAULT,
    "round-nine": ROUND_NINE,
    "sub32-w8": SumsConfig(sub_r=32, num_warps=8),
    "acc2d-c128-sub32-w8": SumsConfig(block_c=128, sub_r=32, num_warps=8, acc2d=True),
    "acc2d-c128-sub64-w8": SumsConfig(block_c=128, sub_r=64, num_warps=8, acc2d=True),
    "acc2d-c256-sub32-w8": SumsConfig(sub_r=32, num_warps=8, acc2d=True),
    "atomic-acc2d-c128-sub32-w8": SumsConfig(block_c=128, sub_r=32, num_warps=8, acc2d=True, atomic=True),
    "atomic-wholerow-sub4-w8": SumsConfig(block_c=4096, sub_r=4, max_block_r=256, target_programs=512, num_warps=8,
                                          atomic=True),
}


def available() -> bool:
    return triton is not None


@functools.cache  # made on first use, where Triton imports
def _kernel() -> Any:
    # n_rows and block_r are not specialized on: one compile per configuration serves every bucket
    # size (a new specialization compiled inside a transfer costs more than the whole bucket).
    # COPY (copy_row_col_sums, a candidate) also stores every tile loaded to the same place in y;
    # without it y is never touched, and the compiled sums are the same instructions as before
    # COPY existed (their PTX compared for sm_90).
    @triton.jit(do_not_specialize=["n_rows", "block_r"])
    def _row_col_sums(x_ptr, y_ptr, rows_ptr, cols_ptr, n_rows, block_r,  # type: ignore[no-untyped-def]
                      W: tl.constexpr, SUB_R: tl.constexpr, BLOCK_C: tl.constexpr, ATOMIC: tl.constexpr,
                      ACC2D: tl.constexpr, COPY: tl.constexpr):
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
        offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        if ACC2D:  # the tiles added as they are; their columns summed once, after the loop
            acc = tl.zeros((SUB_R, BLOCK_C), dtype=tl.int32)
        else:
            col = tl.zeros((BLOCK_C,), dtype=tl.int32)
        for rr in range(0, block_r, SUB_R):
            offs_r = pid_r * block_r + rr + tl.arange(0, SUB_R)
            mask = offs_r < n_rows
            offs = offs_r[:, None].to(tl.int64) * W + offs_c[None, :]
            tile = tl.load(x_ptr + offs, mask=mask[:, None], other=0)
            if COPY:
                tl.store(y_ptr + offs, tile, mask=mask[:, None])  # the values summed are the values stored
            # int32 adds wrap: sums mod 2^32, as the digest defines them
            if ACC2D:
                acc += tile
            else:
                col += tl.sum(tile, axis=0)
            if ATOMIC:  # relaxed: only the sum matters, and the host reads it after the stream is done
                tl.atomic_add(rows_ptr + offs_r, tl.sum(tile, axis=1), mask=mask, sem="relaxed")
            else:
                tl.store(rows_ptr + offs_r.to(tl.int64) * (W // BLOCK_C) + pid_c, tl.sum(tile, axis=1), mask=mask)
        if ACC2D:
            col = tl.sum(acc, axis=0)
        if ATOMIC:
            tl.atomic_add(cols_ptr + offs_c, col, sem="relaxed")
        else:
            tl.store(cols_ptr + pid_r.to(tl.int64) * W + offs_c, col)

    return _row_col_sums


def _block_rows(n_rows: int, cfg: SumsConfig) -> int:
    """Rows per program: as many programs as cfg wants, at least one tile, at most max_block_r."""
    want = max(1, cfg.target_programs // (W_WORDS // cfg.block_c))
    return int(min(cfg.max_block_r, max(cfg.sub_r, triton.next_power_of_2(triton.cdiv(n_rows, want)))))


def _check_words(words: Any, what: str) -> None:
    if words.dim() != 2 or words.shape[1] != W_WORDS or words.dtype != torch.int32 or not words.is_contiguous():
        raise ValueError(f"{what} takes a contiguous [rows, 4096] int32 tensor")


def _check_out(out: Any, n_rows: int, what: str) -> None:
    if out.dtype != torch.int32 or out.shape != (W_WORDS + n_rows,) or not out.is_contiguous():
        raise ValueError(f"{what} writes into a contiguous int32 tensor of 4096 + rows")


def row_col_sums(words: Any, out: Any, config: SumsConfig = DEFAULT) -> None:
    """Write the column sums, then the row sums (int32, mod 2^32) of a contiguous [rows, 4096] int32
    tensor on a GPU into ``out``, a contiguous int32 tensor of 4096 + rows: ``out[:4096]`` the
    columns, ``out[4096:]`` the rows (one tensor, so the caller brings both back in one transfer)."""
    if triton is None:
        raise ImportError("Triton is not installed")
    config.check()
    _check_words(words, "row_col_sums")
    _check_out(out, words.shape[0], "row_col_sums")
    _launch(words, None, out, config)


def copy_row_col_sums(src_words: Any, dst_words: Any, out: Any, config: SumsConfig = DEFAULT) -> None:
    """Copy ``src_words`` into ``dst_words`` (both contiguous [rows, 4096] int32 on one GPU, not
    overlapping) and write the sums row_col_sums writes into ``out`` (4096 column sums, then the row
    sums, int32 mod 2^32), in one kernel: each tile is read from the source once, stored to the same
    place in the destination and summed.

    A measured candidate, not used by the product (ipc_protocol and device_checksum do not call it).
    The receiver copies the bucket out of the exporter's slot (``dst.copy_(src)``), then reads its
    copy again for the sums: on an H200 (round seventeen, bench_ipc_leg.py) 0.52-0.53 ms for the copy
    of 1 GiB out of an IPC mapping (as fast as a local copy) and ~0.27 ms for the sums, where this
    kernel took 0.64-0.74 ms for both. What it verifies differs, and that keeps it out:

    - the sums are of the values read from the exporter's slot, which are the values this kernel
      stores: the digest still proves the slot held the source's bytes when they were read (a slot
      reused or written too early, a wrong slot, a torn read show) and that the kernel stored
      exactly those values;
    - it does not re-read the destination: what the copy left in ``dst_words`` afterwards (a store
      that went elsewhere, a later write into the receiver's buffer, a wrong destination view) is
      not looked at, where the copy, then the checksum, hashes the receiver's bytes themselves.

    ``config`` as for row_col_sums (the same tiles and the atomic mode: the same sums)."""
    if triton is None:
        raise ImportError("Triton is not installed")
    config.check()
    _check_words(src_words, "copy_row_col_sums")
    _check_words(dst_words, "copy_row_col_sums")
    if dst_words.shape != src_words.shape or dst_words.device != src_words.device:
        raise ValueError("copy_row_col_sums copies into a tensor of the source's shape on its device")
    nbytes = src_words.numel() * 4
    a, b = src_words.data_ptr(), dst_words.data_ptr()
    if nbytes and a < b + nbytes and b < a + nbytes:  # tiles would read what others already stored
        raise ValueError("copy_row_col_sums: the source and the destination overlap")
    _check_out(out, src_words.shape[0], "copy_row_col_sums")
    _launch(src_words, dst_words, out, config)


def _launch(words: Any, dst: Any, out: Any, config: SumsConfig) -> None:
    """The sums of ``words`` into ``out`` (checked by the caller), and the copy into ``dst`` with
    them where it is not None."""
    n_rows, w = words.shape
    cols, rows = out[:w], out[w:]
    if n_rows == 0:
        cols.zero_()
        return
    col_blocks = w // config.block_c
    block_r = _block_rows(n_rows, config)
    row_blocks = triton.cdiv(n_rows, block_r)
    if config.atomic:
        out.zero_()
        rows_part, col_part = rows, cols
    else:
        # A dimension of one part is written in place: no partials, no second reduction for it.
        rows_part = rows if col_blocks == 1 else torch.empty(n_rows, col_blocks, dtype=torch.int32, device=words.device)
        col_part = cols if row_blocks == 1 else torch.empty(row_blocks, w, dtype=torch.int32, device=words.device)
    consts = dict(W=w, SUB_R=config.sub_r, BLOCK_C=config.block_c, ATOMIC=config.atomic, ACC2D=config.acc2d,
                  num_warps=config.num_warps)
    # Triton launches on the current device's stream: the tensor's device made current (a CPU
    # tensor reaches here only under Triton's interpreter).
    with torch.cuda.device(words.device) if words.is_cuda else contextlib.nullcontext():
        _kernel()[(row_blocks, col_blocks)](words, words if dst is None else dst, rows_part, col_part, n_rows, block_r,
                                            COPY=dst is not None, **consts)
    if rows_part is not rows:
        torch.sum(rows_part, 1, dtype=torch.int32, out=rows)
    if col_part is not cols:
        torch.sum(col_part, 0, dtype=torch.int32, out=cols)
