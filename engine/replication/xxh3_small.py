"""XXH3-64 (seed 0) of many short byte ranges at once, in numpy.

A model of a million tiny tensors (biases, norms, scalars) spends most of its planning time calling
``xxhash.xxh3_64_intdigest`` a million times: the call, not the hash, is the cost. For inputs of at
most 16 bytes XXH3 is a handful of 64-bit multiplies and shifts, so here it runs column-wise over
every such tensor in one pass. The results are the reference algorithm's exactly (the tests compare
every length from 0 to 16 with the ``xxhash`` package on random bytes); longer inputs go to
``xxhash`` as before.

Reference: the XXH3 specification, ``XXH3_len_0to16_64b`` and the functions it calls (xxhash.h).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MAX_LEN = 16

# The first 72 bytes of the reference implementation's default secret (kSecret): the short paths
# read no further.
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb")
_U64 = np.uint64
_PRIME64_2 = _U64(0xC2B2AE3D27D4EB4F)
_PRIME64_3 = _U64(0x165667B19E3779F9)
_PRIME_MX1 = _U64(0x165667919E3779F9)
_PRIME_MX2 = _U64(0x9FB21C651E98DF25)
_MASK32 = _U64(0xFFFFFFFF)


def _le(offset: int, size: int) -> np.uint64:
    return _U64(int.from_bytes(_SECRET[offset:offset + size], "little"))


def _sh(n: int) -> np.uint64:
    return _U64(n)


def _xxh64_avalanche(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _sh(33))
    h = h * _PRIME64_2
    h = h ^ (h >> _sh(29))
    h = h * _PRIME64_3
    out: np.ndarray = h ^ (h >> _sh(32))
    return out


def _xxh3_avalanche(h: np.ndarray) -> np.ndarray:
    h ^= h >> _sh(37)
    h *= _PRIME_MX1
    h ^= h >> _sh(32)
    return h


def _rotl(h: np.ndarray, r: int) -> np.ndarray:
    return (h << _sh(r)) | (h >> _sh(64 - r))


def _mul128_fold64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Low xor high half of the 128-bit product, from 32-bit halves (uint64 arithmetic wraps)."""
    a_lo, a_hi, b_lo, b_hi = a & _MASK32, a >> _sh(32), b & _MASK32, b >> _sh(32)
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    cross = a_lo * b_hi  # lo_hi
    hi_hi = a_hi
    hi_hi *= b_hi
    cross += lo_lo >> _sh(32)
    cross += hi_lo & _MASK32
    upper = hi_lo
    upper >>= _sh(32)
    upper += cross >> _sh(32)
    upper += hi_hi
    lo_lo &= _MASK32
    cross <<= _sh(32)
    cross |= lo_lo  # lower
    cross ^= upper
    return cross


def _read(buf: np.ndarray, at: np.ndarray, size: int) -> np.ndarray:
    """Little-endian integers of ``size`` bytes (4 or 8) at every offset in ``at``."""
    win = sliding_window_view(buf, size)[at]  # fancy indexing: already a fresh contiguous copy
    out: np.ndarray = win.view("<u4" if size == 4 else "<u8").ravel().astype(np.uint64, copy=False)
    return out


def xxh3_64_short(buf: np.ndarray, offset: np.ndarray, length: np.ndarray) -> np.ndarray:
    """XXH3-64 of ``buf[offset[k]:offset[k] + length[k]]`` for every k; every length at most 16."""
    if len(length) and int(length.max()) > MAX_LEN:
        raise ValueError(f"xxh3_64_short hashes inputs of at most {MAX_LEN} bytes")
    offset = np.asarray(offset, dtype=np.int64)
    n = np.asarray(length, dtype=np.int64)
    out = np.empty(len(n), dtype=np.uint64)
    if not len(n):
        return out
    nn = n.astype(np.uint64)

    k = np.flatnonzero(n == 0)
    if len(k):
        out[k] = _xxh64_avalanche(np.full(len(k), _le(56, 8) ^ _le(64, 8), dtype=np.uint64))

    k = np.flatnonzero((n >= 1) & (n <= 3))
    if len(k):
        o, m = offset[k], n[k]
        c1, c2, c3 = (buf[o].astype(np.uint64), buf[o + (m >> 1)].astype(np.uint64),
                      buf[o + m - 1].astype(np.uint64))
        combined = (c1 << _sh(16)) | (c2 << _sh(24)) | c3 | (nn[k] << _sh(8))
        out[k] = _xxh64_avalanche(combined ^ (_le(0, 4) ^ _le(4, 4)))

    k = np.flatnonzero((n >= 4) & (n <= 8))
    if len(k):
        o, m = offset[k], n[k]
        input64 = _read(buf, o + m - 4, 4) + (_read(buf, o, 4) << _sh(32))
        h = input64 ^ (_le(8, 8) ^ _le(16, 8))
        h = h ^ _rotl(h, 49) ^ _rotl(h, 24)
        h = h * _PRIME_MX2
        h = h ^ ((h >> _sh(35)) + nn[k])
        h = h * _PRIME_MX2
        out[k] = h ^ (h >> _sh(28))

    k = np.flatnonzero(n >= 9)
    if len(k):
        o, m = offset[k], n[k]
        lo = _read(buf, o, 8)
        lo ^= _le(24, 8) ^ _le(32, 8)
        hi = _read(buf, o + m - 8, 8)
        hi ^= _le(40, 8) ^ _le(48, 8)
        acc = _mul128_fold64(lo, hi)
        acc += nn[k]
        acc += lo.byteswap()
        acc += hi
        out[k] = _xxh3_avalanche(acc)
    return out
