"""A vectorised reader for the regular form of a safetensors header (the planner's fast path).

Every safetensors writer in practice (the Rust library behind ``safetensors``, and ``json.dumps``
with compact separators) writes the header in one shape::

    {"__metadata__":{...},"NAME":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]},...}   + spaces

The general reader (``weights.parse_safetensors_columns``) builds a dict and two lists per tensor
with the stdlib JSON parser: about 3 CPU-s for a million tensors. Here the header is scanned as a
numpy byte array instead: every quote is located, each entry's fixed text (``":{"dtype":"`` and so
on) is compared at the positions the quotes imply, and the numbers are parsed column by column.
No Python object is made per tensor but its name.

Hostile input cannot get further here than through the general reader: this reader accepts only
headers it has checked byte for byte to be in the regular form (no escapes, no whitespace, no
control characters, no leading zeros, numbers of at most 18 digits, every entry's keys in that
order, no duplicate names) and that satisfy every check the general reader makes (known dtype,
at most 64 dims, offsets inside the file matching dtype and shape, no two tensors overlapping).
Anything else returns ``None`` and the general reader decides, so an irregular but valid header
is read the slow way and a bad one gets the general reader's one-line error, exactly as before.
The tests compare both readers on generated and corrupted headers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hwtui.engine.replication.weights import (
    DTYPE_NAMES,
    DTYPES,
    MAX_HEADER,
    SafetensorsColumns,
    _read_header_bytes,
    parse_safetensors_columns,
)

_MAX_DIMS = 64  # as the general reader
_MAX_DIGITS = 18  # 10**18 < 2**63: a column of such numbers never wraps int64
MAX_KEY_BYTES = 256  # longest name kept as a fixed-width sort key (longer: the planner sorts the strings)

# A flat object of strings to strings, no whitespace: the regular __metadata__. Possessive
# quantifiers: linear on any input, no backtracking.
_STR = rb'"(?:[^"\\\x00-\x1f]++|\\.)*+"'
_META = re.compile(rb'\{"__metadata__":(\{(?:' + _STR + b":" + _STR + b"(?:," + _STR + b":" + _STR + rb")*+)?\})")

_OPEN = np.frombuffer(b'":{"dtype":"', dtype=np.uint8)  # name's closing quote .. dtype's opening quote
_SHAPE = np.frombuffer(b'","shape":[', dtype=np.uint8)  # dtype's closing quote .. the dims
_OFFSETS = np.frombuffer(b'],"data_offsets":[', dtype=np.uint8)  # after the dims .. the offsets
_NEXT = np.frombuffer(b']},"', dtype=np.uint8)  # after the offsets .. the next name's opening quote
_LAST = np.frombuffer(b"]}", dtype=np.uint8)  # after the last entry's offsets, before the header's "}"


def _dtype_keys() -> tuple[np.ndarray, np.ndarray]:
    """Each dtype name as a little-endian u8 of its bytes zero-padded to 8, sorted, with its code."""
    keys = np.asarray([int.from_bytes(d.encode().ljust(8, b"\0"), "little") for d in DTYPE_NAMES], dtype=np.uint64)
    order = np.argsort(keys)
    return keys[order], order.astype(np.uint8)


_DT_KEYS, _DT_CODES = _dtype_keys()
_META_KEY = np.frombuffer(b"__metadata__\0", dtype=np.uint8)  # as a key row begins (NUL: the name ends)
_ITEMSIZE = np.asarray([DTYPES[d][0] for d in DTYPE_NAMES], dtype=np.int64)


@dataclass
class Header:
    """A parsed header as columns, in header order.

    The fast path gives each name as a row of ``sort_keys`` (its UTF-8 bytes zero-padded, see
    :func:`name_keys`) with the order that sorts them, and no str at all (``names`` is None): the
    planner decodes the names once, already sorted. The general reader gives ``names``."""

    names: list[str] | None
    dtype: np.ndarray  # u1 codes into DTYPE_NAMES
    ndims: np.ndarray  # i8
    dims: np.ndarray  # i8, all shapes end to end
    nbytes: np.ndarray  # i8
    offset: np.ndarray  # i8, absolute offset in the file
    sort_keys: np.ndarray | None = None
    name_order: np.ndarray | None = None  # stable argsort of sort_keys' rows

    @staticmethod
    def of(c: SafetensorsColumns) -> Header:
        return Header(c.names, c.dtype, c.ndims, c.dims, c.nbytes, c.offset)

    def name_list(self) -> list[str]:
        """The names in header order (decoded from the keys when the fast path read them)."""
        if self.names is None:
            assert self.sort_keys is not None
            self.names = sorted_names(self.sort_keys, np.arange(len(self.sort_keys)))[0]
        return self.names


class _Irregular(Exception):
    """Not in the regular form, or not valid: the general reader decides."""


def _windows(buf: np.ndarray, at: np.ndarray, lit: np.ndarray) -> None:
    """Every ``buf[at[k]:at[k] + len(lit)]`` equals ``lit`` (else irregular)."""
    w = len(lit)
    if len(at) and (at.min() < 0 or at.max() > len(buf) - w):
        raise _Irregular
    if len(at) and not (sliding_window_view(buf, w)[at] == lit).all():
        raise _Irregular


def regular_header(raw: bytes, start: int, size: int) -> Header | None:
    """The header's columns when it is in the regular form and valid; None otherwise."""
    try:
        return _scan(raw, start, size)
    except _Irregular:
        return None
    except (IndexError, ValueError, OverflowError, MemoryError):
        # A shape of hostile header the scan did not foresee: the general reader validates every
        # header it declines, so declining is always safe (the tests call _scan directly and
        # fail on these, so a gap is still found).
        return None


def read_columns(raw: bytes, start: int, size: int, where: str) -> Header:
    """The regular form the fast way, anything else through the general reader (its errors)."""
    fast = regular_header(raw, start, size)
    if fast is not None:
        return fast
    return Header.of(parse_safetensors_columns(raw, start, size, where))


def safetensors_header(path: str) -> tuple[Header, bytes, int]:
    """-> (the header's columns, its exact bytes, the data start) of a safetensors file."""
    raw, start, size = _read_header_bytes(path)
    return read_columns(raw, start, size, str(path)), raw, start


def header_bytes(path: str) -> bytes:
    """The exact header bytes of a safetensors file, not parsed (what preflight compares)."""
    return _read_header_bytes(path)[0]


def _body_bounds(raw: bytes) -> tuple[int, int]:
    """[p0, p1): the tensor entries, between the metadata (or the opening brace) and the closing brace."""
    e = len(raw)
    tail = np.frombuffer(raw, dtype=np.uint8, count=min(e, 64), offset=e - min(e, 64))
    pad = np.flatnonzero(tail != 0x20)
    if not len(pad):
        raise _Irregular
    e -= len(tail) - 1 - int(pad[-1])  # the header may be padded with spaces (to 8 bytes) after the brace
    if e < 2 or raw[0] != 0x7B or raw[e - 1] != 0x7D:
        raise _Irregular
    p0 = 1
    if raw.startswith(b'{"__metadata__":'):
        m = _META.match(raw)
        if m is None or raw[m.end():m.end() + 1] != b",":
            raise _Irregular
        try:
            json.loads(m.group(1))  # its escapes and UTF-8; values are strings by the pattern
        except (ValueError, RecursionError):
            raise _Irregular from None
        p0 = m.end() + 1
    return p0, e - 1


def _scan(raw: bytes, start: int, size: int) -> Header:
    if len(raw) > MAX_HEADER:
        raise _Irregular
    p0, p1 = _body_bounds(raw)
    if raw.find(b"\\", p0, p1) >= 0:  # an escape anywhere in the entries: the general reader
        raise _Irregular
    body = np.frombuffer(raw, dtype=np.uint8, count=p1 - p0, offset=p0)
    if not len(body) or body.min() < 0x20:
        raise _Irregular
    q = np.flatnonzero(body == 0x22)
    if len(q) % 10 or not len(q) or q[0] != 0:
        raise _Irregular
    n = len(q) // 10
    quotes = q.reshape(n, 10)
    name_lo, name_hi = quotes[:, 0] + 1, quotes[:, 1]  # [lo, hi): the name's bytes
    dt_lo, dt_hi = quotes[:, 4] + 1, quotes[:, 5]
    dims_lo, dims_hi = quotes[:, 5] + len(_SHAPE), quotes[:, 8] - 2
    off_lo = quotes[:, 8] + len(_OFFSETS) - 2
    off_hi = np.empty(n, dtype=np.int64)
    off_hi[:-1] = quotes[1:, 0] - 3
    off_hi[-1] = len(body) - 2
    del q, quotes
    # The fixed text at the positions the quotes imply (each literal's quotes are then exactly the
    # ones counted: the ten quotes of an entry are its name, "dtype", the dtype, "shape", "data_offsets").
    _windows(body, name_hi, _OPEN)
    _windows(body, dt_hi, _SHAPE)
    _windows(body, dims_hi, _OFFSETS)
    _windows(body, off_hi[:-1], _NEXT)
    _windows(body, off_hi[-1:], _LAST)
    if (dims_hi < dims_lo).any() or (off_hi < off_lo).any():
        raise _Irregular

    codes = _dtype_codes(body, dt_lo, dt_hi)
    ndims, dims, a, b = _numbers(body, dims_lo, dims_hi, off_lo, off_hi)
    if body.max() >= 0x80:  # names beyond ASCII (all else is checked ASCII): they must be UTF-8
        try:
            raw[p0:p1].decode("utf-8")
        except UnicodeDecodeError:
            raise _Irregular from None
    names, keys = _names(body, name_lo, name_hi)
    return _validated(names, codes, ndims, dims, a, b, start, size, keys)


def _gather(body: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The byte ranges [lo, hi) of ``body`` (in increasing order, disjoint) end to end.

    The index of every byte is one running sum over steps of 1 that jump to each next range:
    a single int32 array (a header is at most 100 MB), no index arithmetic temporaries."""
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if not len(lo):
        return body[:0]
    length = hi - lo
    out_start = np.cumsum(length) - length
    idx = np.ones(int(out_start[-1] + length[-1]), dtype=np.int32)
    idx[0] = lo[0]
    idx[out_start[1:]] = lo[1:] - hi[:-1] + 1
    np.cumsum(idx, out=idx)
    return body[idx]


def _dtype_codes(body: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    length = hi - lo
    if length.min() < 1 or length.max() > 8:
        raise _Irregular
    win = sliding_window_view(body, 8)[lo].copy()  # in range: 11 bytes of fixed text follow a dtype
    win[np.arange(8) >= length[:, None]] = 0
    key = win.view("<u8").ravel()
    pos = np.minimum(np.searchsorted(_DT_KEYS, key), len(_DT_KEYS) - 1)
    if not (_DT_KEYS[pos] == key).all():
        raise _Irregular
    codes: np.ndarray = _DT_CODES[pos]
    return codes


def _numbers(body: np.ndarray, dims_lo: np.ndarray, dims_hi: np.ndarray, off_lo: np.ndarray,
             off_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Parse every entry's dims and its two offsets: (ndims, dims end to end, begin, end)."""
    n = len(dims_lo)
    seg_lo = np.empty(2 * n, dtype=np.int64)  # segments alternate: dims of entry k, offsets of entry k
    seg_lo[0::2], seg_lo[1::2] = dims_lo, off_lo
    seg_hi = np.empty(2 * n, dtype=np.int64)
    seg_hi[0::2], seg_hi[1::2] = dims_hi, off_hi
    seg_len = seg_hi - seg_lo
    # Every segment with the "]" that closes it (the fixed text checked that one does).
    text = _gather(body, seg_lo, seg_hi + 1)
    close_at = np.cumsum(seg_len + 1) - 1  # each segment's "]" in ``text``
    digit = (text - np.uint8(0x30)) < 10
    comma = text == 0x2C
    if not (digit | comma | (text == 0x5D)).all() or np.count_nonzero(text == 0x5D) != len(seg_lo):
        raise _Irregular  # only digits and commas inside: no sign, fraction, exponent, space or bracket
    # A comma between two digits (no leading, trailing or double comma, none in an empty list); no
    # number with a leading zero (not JSON). Every segment starts after a "]" or at 0 and ends at one.
    if len(text) < 2 or comma[0] or (comma[1:-1] & ~(digit[:-2] & digit[2:])).any():
        raise _Irregular
    zero = text == 0x30
    if (zero[0] & digit[1]) or (zero[1:-1] & ~digit[:-2] & digit[2:]).any():
        raise _Irregular
    del zero
    commas = np.bincount(np.searchsorted(close_at, np.flatnonzero(comma)), minlength=len(seg_lo))
    count = (commas + 1) * (seg_len > 0)
    del digit, comma
    ndims = count[0::2]
    if (count[1::2] != 2).any() or ndims.max() > _MAX_DIMS:
        raise _Irregular
    # numpy's C text reader, once the text is known to be digits and commas: each "]" becomes the
    # comma that ends its segment's last number (a space for an empty segment, which has none).
    text[close_at] = 0x2C
    text[close_at[seg_len == 0]] = 0x20
    values = np.fromstring(text.tobytes(), dtype=np.int64, sep=",")
    del text
    if len(values) != int(count.sum()) or (len(values) and values.max() >= 10**_MAX_DIGITS):
        raise _Irregular  # 19 digits or more (the reader saturates): the general reader's big-int checks
    is_off = np.repeat(np.tile(np.array([False, True]), n), count)
    offs = values[is_off].reshape(n, 2)
    return ndims.astype(np.int64), values[~is_off], offs[:, 0].copy(), offs[:, 1].copy()


def _names(body: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[list[str] | None, np.ndarray | None]:
    """The names as fixed-width sort keys (no str made); as str when one is too long for a key."""
    blen = hi - lo
    width = (int(blen.max()) // 8 + 1) * 8  # at least one NUL after every name
    if width <= MAX_KEY_BYTES:
        # Each key is the `width` bytes from a name's start (masked after the name). A short name
        # near the end of a header with one long name elsewhere can need more bytes than follow
        # it (hypothesis found it): then read from a zero-padded copy, never past the end.
        if len(lo) and int(lo.max()) + width > len(body):
            body = np.concatenate([body, np.zeros(width, dtype=body.dtype)])
        keys = sliding_window_view(body, width)[lo].copy()
        keys[np.arange(width) >= blen[:, None]] = 0
        return None, keys
    joined = _gather(body, lo, hi + 1).tobytes()  # each closing quote comes along: it separates the names
    return joined[:-1].decode("utf-8").split('"'), None


def name_keys(names: list[str]) -> np.ndarray | None:
    """Each name's UTF-8 bytes (lone surrogates passed through) as one row of a zero-padded
    ``(n, 8k)`` byte matrix with at least one NUL after every name: rows in byte order are the names in ``sorted()`` order (UTF-8 keeps
    code point order). None when a name is longer than ``MAX_KEY_BYTES`` or holds a NUL."""
    raw = [n.encode("utf-8", "surrogatepass") for n in names]
    width = (max(map(len, raw), default=0) // 8 + 1) * 8  # at least one NUL after every name
    if width > MAX_KEY_BYTES or any(b"\0" in r for r in raw):
        return None
    keys = np.zeros((len(raw), width), dtype=np.uint8)
    if raw:
        keys.view(f"S{width}").ravel()[:] = raw
    return keys


def sort_order(keys: np.ndarray) -> np.ndarray:
    """The stable order that sorts the rows of a ``name_keys`` matrix bytewise.

    The rows are read as big-endian 8-byte integers and sorted column by column (``lexsort``):
    several times faster than comparing byte strings, and columns every row shares (a common
    prefix such as ``model.layers.``) are skipped."""
    cols = np.ascontiguousarray(keys).view(">u8")
    varying = [j for j in range(cols.shape[1]) if len(cols) and not (cols[:, j] == cols[0, j]).all()]
    if not varying:
        return np.arange(len(keys), dtype=np.int64)
    return np.lexsort([cols[:, j].astype(np.uint64) for j in reversed(varying)]).astype(np.int64)


def sorted_names(keys: np.ndarray, order: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The names of the rows in ``order``: (the str list, their UTF-8 text end to end, the end of
    each name in that text counted in code points). Decoded in one call and split in one call: new
    str objects side by side in memory, not a million scattered ones picked one by one."""
    rows = keys[order]
    nonzero = rows != 0
    blen = np.count_nonzero(nonzero, axis=1)
    text = rows[nonzero].tobytes()
    nonzero[np.arange(len(rows)), blen] = True  # each name's first NUL: the separator
    names = rows[nonzero].tobytes().decode("utf-8", "surrogatepass").split("\0")[:-1]
    if len(text) == int(blen.sum()) and text.isascii():
        chars = blen
    else:  # code points: every byte that is not a UTF-8 continuation byte
        chars = np.count_nonzero(nonzero & (rows & 0xC0 != 0x80) & (rows != 0), axis=1)
    return names, np.frombuffer(text, dtype=np.uint8), np.cumsum(chars, dtype=np.int64)


def first_duplicate(keys: np.ndarray, order: np.ndarray) -> int | None:
    """The index (into ``keys``) of a row equal to the row sorted before it, or None."""
    cols = np.ascontiguousarray(keys).view(">u8")[order]
    same = (cols[1:] == cols[:-1]).all(axis=1)
    hit = np.flatnonzero(same)
    return int(order[hit[0] + 1]) if len(hit) else None


def _validated(names: list[str] | None, codes: np.ndarray, ndims: np.ndarray, dims: np.ndarray, a: np.ndarray,
               b: np.ndarray, start: int, size: int, keys: np.ndarray | None) -> Header:
    """The general reader's checks, vectorised; any failure lets the general reader word the error."""
    n = len(a)
    if keys is not None and keys.shape[1] > len(_META_KEY):
        if (keys[:, :len(_META_KEY)] == _META_KEY).all(axis=1).any():
            raise _Irregular
    elif names is not None and "__metadata__" in names:
        raise _Irregular
    ends = np.cumsum(ndims)
    begins = ends - ndims
    cum = np.concatenate(([0.0], np.cumsum(np.log2(dims.astype(np.float64) + 1))))
    if len(dims) and (cum[ends] - cum[begins]).max() > 58:  # the product could reach 2**62 x itemsize
        raise _Irregular
    prods = np.ones(n, dtype=np.int64)
    nz = ndims > 0
    if nz.any():
        prods[nz] = np.multiply.reduceat(dims, begins[nz])
    nbytes = prods * _ITEMSIZE[codes]
    if not ((a >= 0) & (a <= b) & (b <= size - start) & (b - a == nbytes)).all() or nbytes.max() >= 1 << 62:
        raise _Irregular
    if (a[1:] >= a[:-1] + nbytes[:-1]).all():  # a writer's usual order: by offset
        o, m = a, nbytes
    else:
        order = np.argsort(a, kind="stable")
        o, m = a[order], nbytes[order]
    if (o[1:] < o[:-1] + m[:-1]).any():
        raise _Irregular  # overlapping tensors: the general reader names them
    # Duplicate names: a JSON object keeps the last one; the general reader decides what that means.
    # Sorting the fixed-width keys (timsort: a writer's already sorted runs cost one pass) also
    # gives the planner its name order.
    name_order = None
    if keys is not None:
        name_order = sort_order(keys)
        if first_duplicate(keys, name_order) is not None:
            raise _Irregular
    elif names is None or len(set(names)) != n:
        raise _Irregular
    return Header(names, codes.astype(np.uint8), ndims, dims, nbytes, a + start, keys, name_order)
