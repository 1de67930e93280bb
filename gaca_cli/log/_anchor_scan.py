"""Hash a text column of Parquet files page by page, without materialising it.

`gaca advantages` groups steps by their anchor text. Reading the whole anchor column (about
1.8 GB of text for 10M rows) only to hash it costs more in fresh memory than in hashing, so
`scan_anchors` walks the column chunks itself: it parses each page header (Thrift compact, with
the decoder of `parquet_splice`), decompresses the page into a buffer (`pyarrow.Codec`, which
releases the GIL) and hashes its values with a numba kernel (`nogil`). Two threads work on
different column chunks. While a chunk is read, its values are also appended to a buffer the
thread reuses for its next chunks, and a hash table over the chunk's rows (every match
confirmed by comparing bytes) finds, for each row, the first row of the chunk with the same
bytes. Kept per row: the 8-byte hash and that 4-byte chunk-relative row.

`AnchorScan.equal` answers a pair from these without reading: different hashes differ, and two
rows of one chunk are equal exactly when their first equal rows are the same row. Only pairs
of rows in different chunks with equal hashes are compared by a second streaming pass, which
decompresses only the pages holding them and keeps only their bytes; `AnchorScan.values`
fetches the text of a few rows the same way.

Supported (anything else makes `scan_anchors` return None, and the caller reads the column the
ordinary way): unencrypted files; a flat BYTE_ARRAY column, required or optional without nulls;
codecs UNCOMPRESSED, SNAPPY, GZIP, BROTLI, ZSTD, LZ4_RAW (not Parquet's old Hadoop-framed LZ4);
data pages v1 and v2; PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY (with a PLAIN dictionary page),
DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY values. Formats: apache/parquet-format
(parquet.thrift, Encodings.md).

The hash of a value is a pure function of its bytes: 0 for the empty string, otherwise a 64-bit
mix of the length and of the bytes read 8 at a time in four independent lanes (never 0).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from gaca_cli.log import _splice as ps
from gaca_cli.errors import GacaError

# Thrift field ids and enum values (apache/parquet-format, src/main/thrift/parquet.thrift).
SE_TYPE, SE_REPETITION, SE_NAME, SE_NUM_CHILDREN = 1, 3, 4, 5
REQUIRED, OPTIONAL = 0, 1
BYTE_ARRAY = 6
CMD_TYPE, CMD_CODEC, CMD_NUM_VALUES = 1, 4, 5
PH_TYPE, PH_UNCOMPRESSED_SIZE, PH_COMPRESSED_SIZE = 1, 2, 3
PH_DATA_PAGE, PH_DICTIONARY_PAGE, PH_DATA_PAGE_V2 = 5, 7, 8
DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
DP_NUM_VALUES, DP_ENCODING, DP_DEF_ENCODING = 1, 2, 3
DICT_NUM_VALUES, DICT_ENCODING = 1, 2
V2_NUM_VALUES, V2_NUM_NULLS, V2_NUM_ROWS, V2_ENCODING = 1, 2, 3, 4
V2_DEF_LENGTH, V2_REP_LENGTH, V2_IS_COMPRESSED = 5, 6, 7
PLAIN, PLAIN_DICTIONARY, RLE, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY, RLE_DICTIONARY = 0, 2, 3, 6, 7, 8
# CompressionCodec -> pyarrow codec name (3 = LZO and 5 = Hadoop-framed LZ4 are not supported).
CODECS = {0: None, 1: "snappy", 2: "gzip", 4: "brotli", 6: "zstd", 7: "lz4_raw"}

THREADS = 2

jit = njit(cache=True, nogil=True)


class ScanUnsupported(Exception):
    """The files cannot be scanned (reason in the message); `scan_anchors` returns None."""


# --------------------------------------------------------------------------- numba kernels

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xC2B2AE3D27D4EB4F)
_M3 = np.uint64(0x165667B19E3779F9)
_F1 = np.uint64(0xFF51AFD7ED558CCD)
_F2 = np.uint64(0xC4CEB9FE1A85EC53)
_S1, _S7, _S8, _S12, _S16, _S18 = (np.uint64(s) for s in (1, 7, 8, 12, 16, 18))
_S29, _S32, _S33, _S35, _S64 = (np.uint64(s) for s in (29, 32, 33, 35, 64))
_ONE = np.uint64(1)


def _unaligned_load(bits: int):
    """An intrinsic reading the `bits`-bit unsigned integer stored little-endian at buf[pos] (a
    uint8 array) with one unaligned load, as uint64 (64) or int64 (32); the caller checks
    bounds."""

    def load(typingctx, buf, pos):
        def codegen(context, builder, sig, args):
            array = context.make_array(sig.args[0])(context, builder, args[0])
            ptr = builder.bitcast(builder.gep(array.data, [args[1]]), ir.IntType(bits).as_pointer())
            value = builder.load(ptr, align=1)
            return value if bits == 64 else builder.zext(value, ir.IntType(64))

        return (types.uint64 if bits == 64 else types.int64)(buf, types.int64), codegen

    load.__name__ = f"_u{bits}"
    return intrinsic(load)


_u32 = _unaligned_load(32)
_u64 = _unaligned_load(64)


@intrinsic
def _prefetch(typingctx, arr, pos):
    """Hint that arr[pos] will be read soon (llvm.prefetch: read, keep in all cache levels).
    Unlike a load, it never stalls and never faults, so pos need not be in bounds."""

    def codegen(context, builder, sig, args):
        array = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(array.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [ptr.type], fnty)
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.none(arr, types.int64), codegen


@jit
def _rotl(x, r):
    return (x << r) | (x >> (_S64 - r))


@jit
def _lane(acc, w):
    """(acc xor w)·M1 rotated left by 29: one multiply per 8 bytes, a bijection of acc for a
    given w and of w for a given acc."""
    acc = (acc ^ w) * _M1
    return (acc << _S29) | (acc >> _S35)


@jit
def _hash_bytes(buf, start, n):
    """64-bit hash of buf[start:start+n]: 0 when n == 0, never 0 otherwise.

    The length seeds the state. 32 bytes and more: four lanes take 32-byte stripes, the last
    stripe being the final 32 bytes (overlapping the previous one), and are summed rotated;
    8-31 bytes: 8-byte words, the last word being the final 8 bytes; 1-7 bytes: one word made
    of the first and last 4 bytes, or of the first, middle and last byte. A xor-shift-multiply
    avalanche finishes. Every path depends only on the length and the bytes."""
    if n == 0:
        return np.uint64(0)
    end = start + n
    h = _M3 ^ (np.uint64(n) * _M1)
    if n >= 32:
        a = h + _M1
        b = h + _M2
        c = h ^ _M3
        d = h - _M1
        p = start
        last = end - 32
        while True:
            if p > last:
                p = last
            a = _lane(a, _u64(buf, p))
            b = _lane(b, _u64(buf, p + 8))
            c = _lane(c, _u64(buf, p + 16))
            d = _lane(d, _u64(buf, p + 24))
            if p == last:
                break
            p += 32
        h = _lane(h, _rotl(a, _S1) + _rotl(b, _S7) + _rotl(c, _S12) + _rotl(d, _S18))
    elif n >= 8:
        p = start
        while p + 8 < end:
            h = _lane(h, _u64(buf, p))
            p += 8
        h = _lane(h, _u64(buf, end - 8))
    elif n >= 4:
        h = _lane(h, np.uint64(_u32(buf, start)) | (np.uint64(_u32(buf, end - 4)) << _S32))
    else:
        w = np.uint64(buf[start]) | (np.uint64(buf[start + (n >> 1)]) << _S8) | (np.uint64(buf[end - 1]) << _S16)
        h = _lane(h, w)
    h ^= h >> _S33
    h *= _F1
    h ^= h >> _S29
    h *= _F2
    h ^= h >> _S32
    if h == 0:
        h = _ONE
    return h


@jit
def hash_values(buf, starts, lens):
    """The hash of each value buf[starts[i]:starts[i]+lens[i]] (uint64 [n]); a test helper."""
    out = np.empty(len(starts), dtype=np.uint64)
    for i in range(len(starts)):
        out[i] = _hash_bytes(buf, starts[i], lens[i])
    return out


@jit
def _uleb(buf, pos, end):
    """(value, new pos) of an unsigned LEB128 varint at pos; pos -1 when malformed."""
    v = np.int64(0)
    shift = 0
    while True:
        if pos >= end or shift > 56:
            return np.int64(0), np.int64(-1)
        b = np.int64(buf[pos])
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, np.int64(pos)
        shift += 7


@jit
def _bits(buf, pos, limit, bit, width):
    """`width` (<= 56) bits starting `bit` bits after buf[pos], LSB first; bytes at or past
    `limit` read as 0."""
    p = pos + (bit >> 3)
    shift = bit & 7
    nbytes = (shift + width + 7) >> 3
    v = np.uint64(0)
    for k in range(nbytes):
        if p + k < limit:
            v |= np.uint64(buf[p + k]) << np.uint64(8 * k)
    v >>= np.uint64(shift)
    if width < 64:
        v &= (np.uint64(1) << np.uint64(width)) - np.uint64(1)
    return np.int64(v)


@jit
def _rle_hybrid(buf, pos, end, width, n, out):
    """Decode n values of the RLE / bit-packed hybrid (Encodings.md) of bit width `width` (<= 32)
    from buf[pos:end] into out[:n]. Returns the position after the last run read, -1 if
    malformed."""
    i = 0
    nb = (width + 7) >> 3
    while i < n:
        header, pos = _uleb(buf, pos, end)
        if pos < 0:
            return -1
        if header & 1 == 0:  # RLE run: count, then the value in ceil(width / 8) bytes
            count = header >> 1
            if pos + nb > end or count == 0:
                return -1
            v = np.int64(0)
            for k in range(nb):
                v |= np.int64(buf[pos + k]) << (8 * k)
            pos += nb
            m = min(count, n - i)
            for j in range(m):
                out[i + j] = v
            i += m
        else:  # bit-packed run: groups of 8 values, LSB first
            groups = header >> 1
            if groups > (1 << 40):  # more than any page holds (and groups * width cannot overflow)
                return -1
            nbytes = groups * width
            avail = min(nbytes, end - pos)
            count = groups * 8 if width == 0 else min(groups * 8, (avail * 8) // width)
            if count == 0:
                return -1
            m = min(count, n - i)
            for j in range(m):
                out[i + j] = _bits(buf, pos, pos + avail, j * width, width)
            pos += avail
            i += m
    return pos


@jit
def _all_defined(buf, pos, end, n):
    """True when the n definition levels (bit width 1, RLE hybrid) in buf[pos:end] are all 1."""
    levels = np.empty(n, dtype=np.int64)
    if _rle_hybrid(buf, pos, end, 1, n, levels) < 0:
        return False
    for i in range(n):
        if levels[i] != 1:
            return False
    return True


@jit
def _plain_refs(buf, pos, end, n, starts, lens):
    """Locate n PLAIN byte arrays (u32 length + bytes) in buf[pos:end]. Returns the end
    position, -1 if they run past `end`."""
    for i in range(n):
        if pos + 4 > end:
            return -1
        ln = _u32(buf, pos)
        if pos + 4 + ln > end:
            return -1
        starts[i] = pos + 4
        lens[i] = ln
        pos += 4 + ln
    return pos


@jit
def _append(store, state, buf, lo, hi):
    """Copy buf[lo:hi] after the used part of `store` (state[1] bytes), replaced by a larger
    copy when full (the caller keeps the new one). Returns (store, where buf[lo] now is)."""
    used = state[1]
    size = hi - lo
    if used + size > len(store):
        grown = np.empty(max(2 * len(store), used + size), dtype=np.uint8)
        grown[:used] = store[:used]
        store = grown
    dst = store[used:used + size]
    src = buf[lo:hi]
    for k in range(size):  # a plain loop compiles to a memcpy; a slice assignment is slower
        dst[k] = src[k]
    state[1] = used + size
    return store, used


@jit
def _first_equals(store, starts, lens, hashes, rows, reps, fold, table, info, state):
    """For each value store[starts[i]:starts[i]+lens[i]] (hash hashes[i], chunk-relative row
    rows[i], rows in ascending order), the first row of the chunk with the same bytes: into
    reps[i], rows[i] itself when no row before it has the same bytes (the value then becoming
    a distinct value of the chunk).

    `store` holds the chunk's values read so far (`_append`); its distinct values are
    info[d] = (start in store, length << 32 | first row); state[0] counts them. `table`
    (length a power of two, 0 = free slot) finds them by key = hash & fold (`fold` is all ones
    except in tests, which fold hashes together to force collisions): open addressing with
    linear probing from slot key mod len(table), a slot holding (key >> 32) << 32 | (d + 1)
    for distinct value d. A slot whose key bits match holds a candidate only: it is the answer
    when its length and bytes equal.

    Memory latency, not arithmetic, sets the pace (a chunk's table and values are megabytes),
    so the rows are taken in passes of independent memory reads: every slot where a lookup
    starts is prefetched; the lookups then take the first candidate whose key bits match as
    the answer (new values are added); the candidates' entries are prefetched, then their
    first bytes, and then compared. When every candidate is equal (nearly always) that is the
    answer; otherwise the values this call added are taken out again (the latest insertions
    into a linear-probing table: clearing their slots restores it exactly) and
    `_first_equals_exact` does the rows one at a time."""
    n = len(starts)
    mask = np.uint64(len(table) - 1)
    low = np.uint64(0xFFFFFFFF)
    nd0 = state[0]
    nd = nd0
    for i in range(n):
        _prefetch(table, np.int64(hashes[i] & fold & mask))
    cand = np.empty(n, dtype=np.int64)  # the distinct value taken for row i, -1 when added
    slots = np.empty(n, dtype=np.int64)  # the slot of each value added
    for i in range(n):
        key = hashes[i] & fold
        tag = (key >> _S32) << _S32
        b = key & mask
        d = -1
        while True:
            e = table[b]
            if e == 0:
                break
            if e & ~low == tag:
                d = np.int64(e & low) - 1
                break
            b = (b + _ONE) & mask
        cand[i] = d
        if d < 0:
            info[nd, 0] = starts[i]
            info[nd, 1] = (lens[i] << 32) | rows[i]
            table[b] = tag | np.uint64(nd + 1)
            slots[nd - nd0] = b
            nd += 1
    for i in range(n):
        if cand[i] >= 0:
            _prefetch(info, 2 * cand[i])
    for i in range(n):
        if cand[i] >= 0:
            s = info[cand[i], 0]
            for k in range(0, min(lens[i], 256), 64):
                _prefetch(store, s + k)
    for i in range(n):
        d = cand[i]
        if d < 0:
            reps[i] = rows[i]
        elif info[d, 1] >> 32 == lens[i] and _same_bytes(store, starts[i], store, info[d, 0], lens[i]):
            reps[i] = info[d, 1] & low
        else:
            for k in range(nd - nd0):
                table[slots[k]] = 0
            _first_equals_exact(store, starts, lens, hashes, rows, reps, fold, table, info, state)
            return
    state[0] = nd


@jit
def _first_equals_exact(store, starts, lens, hashes, rows, reps, fold, table, info, state):
    """`_first_equals` one row at a time, each candidate compared before the next."""
    mask = np.uint64(len(table) - 1)
    low = np.uint64(0xFFFFFFFF)
    nd = state[0]
    for i in range(len(starts)):
        s = starts[i]
        ln = lens[i]
        key = hashes[i] & fold
        tag = (key >> _S32) << _S32
        b = key & mask
        rep = np.int64(-1)
        while True:
            e = table[b]
            if e == 0:
                break
            if e & ~low == tag:
                d = np.int64(e & low) - 1
                if info[d, 1] >> 32 == ln and _same_bytes(store, s, store, info[d, 0], ln):
                    rep = info[d, 1] & low
                    break
            b = (b + _ONE) & mask
        if rep < 0:
            rep = rows[i]
            info[nd, 0] = s
            info[nd, 1] = (ln << 32) | rep
            table[b] = tag | np.uint64(nd + 1)
            nd += 1
        reps[i] = rep
    state[0] = nd


@jit
def _scan_plain(buf, pos, end, n, hashes, reps, at, row, fold, table, info, store, state):
    """n PLAIN byte arrays in buf[pos:end], the chunk-relative rows row..row+n-1 (global
    at..at+n-1): their hashes into hashes[at:], the first row of the chunk with equal bytes
    into reps[at:] (`_first_equals`, after the page's values are appended to `store`).
    Returns (end position or -1, number of empty values, store)."""
    starts = np.empty(n, dtype=np.int64)
    lens = np.empty(n, dtype=np.int64)
    empty = 0
    p = pos
    for i in range(n):
        if p + 4 > end:
            return -1, empty, store
        ln = _u32(buf, p)
        if p + 4 + ln > end:
            return -1, empty, store
        h = _hash_bytes(buf, p + 4, ln)
        hashes[at + i] = h
        empty += h == 0
        starts[i] = p + 4
        lens[i] = ln
        p += 4 + ln
    store, shift = _append(store, state, buf, pos, p)
    starts += shift - pos
    _first_equals(store, starts, lens, hashes[at:at + n], np.arange(row, row + n), reps[at:at + n], fold, table,
                  info, state)
    return p, empty, store


@jit
def _scan_refs(buf, starts, lens, hashes, reps, at, row, fold, table, info, store, state):
    """`_scan_plain` for values already located in buf (starts, lens; all of buf is appended
    to `store`). Returns (number of empty values, store)."""
    empty = 0
    n = len(starts)
    for i in range(n):
        h = _hash_bytes(buf, starts[i], lens[i])
        hashes[at + i] = h
        empty += h == 0
    store, shift = _append(store, state, buf, 0, len(buf))
    _first_equals(store, starts + shift, lens, hashes[at:at + n], np.arange(row, row + n), reps[at:at + n], fold,
                  table, info, state)
    return empty, store


@jit
def _scan_indices(buf, pos, end, n, dict_starts, dict_lens, dict_hash, dict_rep, hashes, reps, at, row,
                  fold, table, info, store, state):
    """`_scan_plain` for n dictionary indices (bit-width byte + RLE hybrid) in buf[pos:end]:
    the dictionary's entries are in store (dict_starts, dict_lens); an entry's hash is
    dict_hash[index]; its first equal row is looked up once, at its first use, and kept in
    dict_rep[index] (-1 before). Returns (ok, number of empty values)."""
    if pos >= end:
        return False, 0
    width = np.int64(buf[pos])
    if width > 32:
        return False, 0
    idx = np.empty(n, dtype=np.int64)
    if _rle_hybrid(buf, pos + 1, end, width, n, idx) < 0:
        return False, 0
    empty = 0
    nd = len(dict_hash)
    first = np.empty(n, dtype=np.int64)  # the rows (page-relative) where entries are first used
    n_first = 0
    for i in range(n):
        k = idx[i]
        if k < 0 or k >= nd:
            return False, 0
        h = dict_hash[k]
        hashes[at + i] = h
        empty += h == 0
        if dict_rep[k] == -1:
            dict_rep[k] = -2
            first[n_first] = i
            n_first += 1
    first = first[:n_first]
    entries = idx[first]
    found = np.empty(n_first, dtype=np.int32)
    _first_equals(store, dict_starts[entries], dict_lens[entries], dict_hash[entries], row + first, found, fold,
                  table, info, state)
    dict_rep[entries] = found
    for i in range(n):
        reps[at + i] = dict_rep[idx[i]]
    return True, empty


@jit
def _index_refs(buf, pos, end, n, dict_starts, dict_lens, starts, lens):
    """Decode n dictionary indices into the dictionary entries' locations. Returns ok."""
    if pos >= end:
        return False
    width = np.int64(buf[pos])
    if width > 32:
        return False
    idx = np.empty(n, dtype=np.int64)
    if _rle_hybrid(buf, pos + 1, end, width, n, idx) < 0:
        return False
    nd = len(dict_starts)
    for i in range(n):
        k = idx[i]
        if k < 0 or k >= nd:
            return False
        starts[i] = dict_starts[k]
        lens[i] = dict_lens[k]
    return True


@jit
def _delta_binary_packed(buf, pos, end, n, out):
    """Decode n integers of DELTA_BINARY_PACKED (Encodings.md) from buf[pos:end] into out[:n].
    Returns the position after the last miniblock used, -1 if malformed or unsupported (a
    miniblock bit width above 56)."""
    block, pos = _uleb(buf, pos, end)
    if pos < 0:
        return -1
    minis, pos = _uleb(buf, pos, end)
    if pos < 0:
        return -1
    total, pos = _uleb(buf, pos, end)
    if pos < 0:
        return -1
    zz, pos = _uleb(buf, pos, end)
    if pos < 0 or total != n or not 0 < block <= (1 << 24) or minis <= 0 or block % minis != 0:
        return -1
    if (block // minis) % 8 != 0:
        return -1
    per_mini = block // minis
    value = (zz >> 1) ^ -(zz & 1)
    if n == 0:
        return pos
    out[0] = value
    i = 1
    while i < n:
        zz, pos = _uleb(buf, pos, end)
        if pos < 0:
            return -1
        min_delta = (zz >> 1) ^ -(zz & 1)
        widths = pos
        pos += minis
        if pos > end:
            return -1
        for mb in range(minis):
            if i >= n:
                break
            width = np.int64(buf[widths + mb])
            if width > 56:
                return -1
            nbytes = per_mini * width // 8
            if pos + nbytes > end:
                return -1
            m = min(per_mini, n - i)
            for j in range(m):
                value = value + min_delta + _bits(buf, pos, pos + nbytes, j * width, width)
                out[i + j] = value
            i += m
            pos += nbytes
    return pos


@jit
def _delta_length_refs(buf, pos, end, n, starts, lens):
    """Locate n DELTA_LENGTH_BYTE_ARRAY values (delta-packed lengths, then the bytes one after
    another). Returns the end position, -1 if malformed."""
    lengths = np.empty(n, dtype=np.int64)
    pos = _delta_binary_packed(buf, pos, end, n, lengths)
    if pos < 0:
        return -1
    for i in range(n):
        ln = lengths[i]
        if ln < 0 or ln > end - pos:
            return -1
        starts[i] = pos
        lens[i] = ln
        pos += ln
    return pos


@jit
def _delta_byte_array(buf, pos, end, n, starts, lens):
    """Decode n DELTA_BYTE_ARRAY values (delta-packed prefix lengths, then the suffixes as
    DELTA_LENGTH_BYTE_ARRAY; value i = the first prefix[i] bytes of value i-1 + suffix i) into
    a new buffer, located by starts/lens. Returns (buffer, ok)."""
    prefix = np.empty(n, dtype=np.int64)
    out = np.empty(0, dtype=np.uint8)
    pos = _delta_binary_packed(buf, pos, end, n, prefix)
    if pos < 0:
        return out, False
    if _delta_length_refs(buf, pos, end, n, starts, lens) < 0:
        return out, False
    total = 0
    prev = 0
    for i in range(n):
        if prefix[i] < 0 or prefix[i] > prev:
            return out, False
        prev = prefix[i] + lens[i]
        total += prev
    out = np.empty(total, dtype=np.uint8)
    at = 0
    prev_start = 0
    for i in range(n):
        p = prefix[i]
        for k in range(p):
            out[at + k] = out[prev_start + k]
        s = starts[i]
        for k in range(lens[i]):
            out[at + p + k] = buf[s + k]
        prev_start = at
        starts[i] = at
        lens[i] = p + lens[i]
        at += lens[i]
    return out, True


@jit
def _same_bytes(x, i, y, j, n):
    """x[i:i+n] == y[j:j+n], compared 8 bytes at a time."""
    k = 0
    while k + 8 <= n:
        if _u64(x, i + k) != _u64(y, j + k):
            return False
        k += 8
    while k < n:
        if x[i + k] != y[j + k]:
            return False
        k += 1
    return True


@jit
def _chunk_plan(n_rows, req_rows, pair_lo, pair_hi):
    """Per-chunk work list for `_collect_page`. req_rows: chunk-relative rows whose bytes are
    kept (repeats allowed); pairs (lo <= hi, lo also in req_rows): compare row hi with row lo.

    Returns store_rows (sorted distinct req_rows), the pairs in ascending order of hi as
    (pair order, hi, slot of lo in store_rows), and the last hi compared with each stored row
    (-1 for none)."""
    slot = np.full(n_rows, -1, dtype=np.int32)  # int32: chunk-relative rows, pairs of one chunk
    for r in req_rows:
        slot[r] = 0
    k = 0
    for r in range(n_rows):
        if slot[r] == 0:
            slot[r] = k
            k += 1
    store_rows = np.empty(k, dtype=np.int64)
    k = 0
    for r in range(n_rows):
        if slot[r] >= 0:
            store_rows[k] = r
            k += 1
    m = len(pair_hi)
    count = np.zeros(n_rows + 1, dtype=np.int32)
    for i in range(m):
        count[pair_hi[i] + 1] += 1
    for r in range(n_rows):
        count[r + 1] += count[r]
    order = np.empty(m, dtype=np.int64)
    for i in range(m):
        order[count[pair_hi[i]]] = i
        count[pair_hi[i]] += 1
    hi = np.empty(m, dtype=np.int64)
    lo_slot = np.empty(m, dtype=np.int64)
    last_hi = np.full(k, -1, dtype=np.int64)
    for j in range(m):
        hi[j] = pair_hi[order[j]]
        lo_slot[j] = slot[pair_lo[order[j]]]
        last_hi[lo_slot[j]] = hi[j]  # pairs in ascending order of hi: the last one is the largest
    return store_rows, order, hi, lo_slot, last_hi


@jit
def _collect_page(buf, starts, lens, row0, store_rows, sp, store, used, store_start, store_len, keep, last_hi,
                  in_page, cmp_hi, cmp_slot, cp, same):
    """One page (values located by starts/lens, its first row `row0`, chunk-relative).

    For each row store_rows[sp:] in the page: copy its bytes into `store` (grown when full) when
    it is kept past the chunk (keep) or compared with a row of a later page (last_hi), else only
    note where it is in the page (in_page). Then compare the rows cmp_hi[cp:] in the page with
    their rows cmp_slot, writing same[cp:]. Returns (sp, cp, store, used)."""
    row_end = row0 + len(starts)
    while sp < len(store_rows) and store_rows[sp] < row_end:
        i = store_rows[sp] - row0
        s = starts[i]
        ln = lens[i]
        store_len[sp] = ln
        in_page[sp] = not keep[sp] and last_hi[sp] < row_end
        if in_page[sp]:
            store_start[sp] = s
        else:
            if used + ln > len(store):
                grown = np.empty(max(2 * len(store), used + ln), dtype=np.uint8)
                grown[:used] = store[:used]
                store = grown
            store[used:used + ln] = buf[s:s + ln]
            store_start[sp] = used
            used += ln
        sp += 1
    while cp < len(cmp_hi) and cmp_hi[cp] < row_end:
        i = cmp_hi[cp] - row0
        k = cmp_slot[cp]
        ln = lens[i]
        if ln != store_len[k]:
            same[cp] = False
        elif in_page[k]:
            same[cp] = _same_bytes(buf, starts[i], buf, store_start[k], ln)
        else:
            same[cp] = _same_bytes(buf, starts[i], store, store_start[k], ln)
        cp += 1
    return sp, cp, store, used


@jit
def _compare_stored(buf, start, lens, ia, ib):
    """bytes of entry ia[i] == bytes of entry ib[i] for entries of one buffer."""
    out = np.empty(len(ia), dtype=np.bool_)
    for i in range(len(ia)):
        a = ia[i]
        b = ib[i]
        out[i] = lens[a] == lens[b] and _same_bytes(buf, start[a], buf, start[b], lens[a])
    return out


@jit
def _triage(a, b, hashes, reps, bounds):
    """Answer the pairs (a[i], b[i]) of global rows that need no reading (chunk c holds rows
    bounds[c]..bounds[c+1]-1; reps: each row's first equal row in its chunk, chunk-relative):
    two rows of one chunk (a row with itself included), rows of different chunks with
    different hashes. Returns (same bool [m], the other pairs' indices, their rows each
    replaced by its first equal row (global))."""
    m = len(a)
    same = np.empty(m, dtype=np.bool_)
    cross = np.empty(m, dtype=np.int64)
    ra = np.empty(m, dtype=np.int64)
    rb = np.empty(m, dtype=np.int64)
    n = 0
    ca = cb = 0  # chunks of the previous pair's rows: pairs often come in runs of one chunk
    for i in range(m):
        x = a[i]
        y = b[i]
        if not bounds[ca] <= x < bounds[ca + 1]:
            ca = np.searchsorted(bounds, x, side="right") - 1
        if not bounds[cb] <= y < bounds[cb + 1]:
            cb = np.searchsorted(bounds, y, side="right") - 1
        if ca == cb:
            same[i] = reps[x] == reps[y]
        elif hashes[x] != hashes[y]:
            same[i] = False
        else:
            same[i] = False
            cross[n] = i
            ra[n] = bounds[ca] + reps[x]
            rb[n] = bounds[cb] + reps[y]
            n += 1
    return same, cross[:n], ra[:n], rb[:n]


@jit
def _bucket_pairs(a, b, bounds):
    """Sort the pairs (a[i], b[i]) of global rows by chunk (chunk c holds rows
    bounds[c]..bounds[c+1]-1). With lo = min, hi = max of a pair: a pair with lo == hi is
    trivially equal; a local pair (both in chunk c) goes to chunk c, its lo to c's stored rows;
    a cross pair is answered from the persistent stores, its lo and hi stored by their chunks.

    Returns (pair_idx grouped by chunk, pair_off [C+1], req_rows grouped by chunk (global rows),
    req_persist, req_off [C+1], cross pair indices)."""
    m = len(a)
    nc = len(bounds) - 1
    lo = np.minimum(a, b)
    hi = np.maximum(a, b)
    c_lo = np.searchsorted(bounds, lo, side="right") - 1  # the chunk of each pair's lo, and of its hi
    c_hi = np.searchsorted(bounds, hi, side="right") - 1
    pair_off = np.zeros(nc + 1, dtype=np.int64)
    req_off = np.zeros(nc + 1, dtype=np.int64)
    n_cross = 0
    for i in range(m):
        if lo[i] == hi[i]:
            continue
        cl, ch = c_lo[i], c_hi[i]
        req_off[cl + 1] += 1
        if cl == ch:
            pair_off[ch + 1] += 1
        else:
            req_off[ch + 1] += 1
            n_cross += 1
    for c in range(nc):
        pair_off[c + 1] += pair_off[c]
        req_off[c + 1] += req_off[c]
    pair_fill = pair_off[:-1].copy()
    req_fill = req_off[:-1].copy()
    pair_idx = np.empty(pair_off[nc], dtype=np.int64)
    req_rows = np.empty(req_off[nc], dtype=np.int64)
    req_persist = np.empty(req_off[nc], dtype=np.bool_)
    cross = np.empty(n_cross, dtype=np.int64)
    n_cross = 0
    for i in range(m):
        if lo[i] == hi[i]:
            continue
        cl, ch = c_lo[i], c_hi[i]
        req_rows[req_fill[cl]] = lo[i]
        req_persist[req_fill[cl]] = cl != ch
        req_fill[cl] += 1
        if cl == ch:
            pair_idx[pair_fill[ch]] = i
            pair_fill[ch] += 1
        else:
            req_rows[req_fill[ch]] = hi[i]
            req_persist[req_fill[ch]] = True
            req_fill[ch] += 1
            cross[n_cross] = i
            n_cross += 1
    return pair_idx, pair_off, req_rows, req_persist, req_off, cross


@jit
def _gather(buf, starts, lens, keep):
    """The entries `keep` of a store, compacted: (bytes, offsets int64 [len(keep)+1])."""
    offsets = np.zeros(len(keep) + 1, dtype=np.int64)
    for j in range(len(keep)):
        offsets[j + 1] = offsets[j] + lens[keep[j]]
    out = np.empty(offsets[-1], dtype=np.uint8)
    for j in range(len(keep)):
        s = starts[keep[j]]
        out[offsets[j]:offsets[j + 1]] = buf[s:s + lens[keep[j]]]
    return out, offsets


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels with the argument types real files give
    them (read-only decompressed pages, writable uncompressed ones): scan four tiny files."""
    import tempfile

    values = pa.array(["", "ab", "ab", "a longer anchor text, more than 32 bytes long"] * 4)
    table = pa.table({"a": values})
    with tempfile.TemporaryDirectory(prefix="gaca-warm-up-") as tmp:
        paths = [os.path.join(tmp, f"{k}.parquet") for k in range(4)]
        # dictionary then PLAIN pages; two row groups in each file, so that pairs cross chunks
        pq.write_table(table, paths[0], compression="zstd", dictionary_pagesize_limit=1, row_group_size=8)
        pq.write_table(table, paths[1], compression="none", data_page_version="2.0", use_dictionary=False,
                       row_group_size=8)
        for path, encoding in zip(paths[2:], ("DELTA_BYTE_ARRAY", "DELTA_LENGTH_BYTE_ARRAY")):
            pq.write_table(table, path, compression="zstd", use_dictionary=False, column_encoding={"a": encoding},
                           row_group_size=8)
        rows = np.arange(len(values) * len(paths))
        for group in ([p] for p in paths):
            scan = scan_anchors(group, "a")
            if scan is not None:
                scan.equal(rows[: scan.n_rows], rows[: scan.n_rows][::-1])
                scan.values(rows[:2])
    lengths = np.zeros(1, dtype=np.int64)
    hash_values(np.zeros(1, dtype=np.uint8), lengths, lengths)


# --------------------------------------------------------------------------- file layout


@dataclass(frozen=True)
class _Chunk:
    """One column chunk of the scanned column: where it is and which rows it holds."""

    file: int  # index into AnchorScan.files
    start: int  # byte range in the file: first page header ..
    end: int  # .. end of the last page
    codec: int  # CompressionCodec
    optional: bool  # definition levels present (max definition level 1)
    row0: int  # global index of its first row
    n_rows: int
    uncompressed: int = 0  # the footer's total_uncompressed_size: sizes the thread's buffer


def _column_layout(path: str, column: str, file: int, row0: int) -> tuple[list[_Chunk], bool, tuple[int, int]]:
    """The column's chunks in `path`, whether the column is binary (not text), and the file's
    (size, mtime_ns). Raises ScanUnsupported."""
    try:
        inp = ps.read_footer(path)
    except ps.SpliceUnsupported as exc:
        raise ScanUnsupported(str(exc)) from None
    meta = inp.meta
    schema = meta.get(ps.FMD_SCHEMA).items
    leaf, element = _find_leaf(schema, column)
    if element.get(SE_TYPE) != BYTE_ARRAY or element.get(SE_REPETITION) not in (REQUIRED, OPTIONAL):
        raise ScanUnsupported(f"{path}: {column!r} is not a required or optional BYTE_ARRAY column")
    arrow_type = pq.read_schema(path).field(column).type
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if any(check(arrow_type) for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)):
        binary = False
    elif any(check(arrow_type) for check in (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)):
        binary = True
    else:
        raise ScanUnsupported(f"{path}: {column!r} is read as {arrow_type}")
    chunks = []
    for rg in meta.get(ps.FMD_ROW_GROUPS).items:
        n_rows = rg.get(ps.RG_NUM_ROWS)
        if n_rows == 0:
            continue
        try:
            piece = ps.chunk_piece(inp, rg.get(ps.RG_COLUMNS).items[leaf])
        except ps.SpliceUnsupported as exc:
            raise ScanUnsupported(str(exc)) from None
        md = piece.chunk.get(ps.CC_META_DATA)
        if not isinstance(n_rows, int) or not 0 < n_rows < 2**31:  # chunk-relative rows fit int32
            raise ScanUnsupported(f"{path}: row group with {n_rows} rows")
        if md.get(CMD_TYPE) != BYTE_ARRAY or md.get(CMD_NUM_VALUES) != n_rows:
            raise ScanUnsupported(f"{path}: column chunk type or value count unexpected")
        if md.get(CMD_CODEC) not in CODECS:
            raise ScanUnsupported(f"{path}: compression codec {md.get(CMD_CODEC)} not supported")
        optional = element.get(SE_REPETITION) == OPTIONAL
        usize = md.get(ps.CMD_TOTAL_UNCOMPRESSED_SIZE)
        usize = usize if isinstance(usize, int) and 0 <= usize < 2**34 else 0  # only a hint
        chunks.append(_Chunk(file, piece.start, piece.start + piece.length, md.get(CMD_CODEC), optional, row0, n_rows,
                             usize))
        row0 += n_rows
    stat = os.stat(path)
    return chunks, binary, (stat.st_size, stat.st_mtime_ns)


def _find_leaf(schema: list, column: str):
    """(leaf column index, SchemaElement) of the top-level leaf field named `column`."""
    try:
        fields = ps.top_level_fields(schema)
    except (ValueError, AttributeError) as exc:  # a malformed schema list (or undecodable names)
        raise ScanUnsupported(f"schema: {exc}") from None
    element, leaf = 1, 0
    for name, n_elements, leaves in fields:
        if name == column:
            if n_elements != 1 or schema[element].get(SE_NUM_CHILDREN) is not None:
                raise ScanUnsupported(f"column {column!r} is nested")
            return leaf, schema[element]
        element, leaf = element + n_elements, leaf + leaves
    raise ScanUnsupported(f"no column {column!r}")


# --------------------------------------------------------------------------- page walking


class _Page:
    """A decoded data page: n values (rows row0..row0+n-1 of its chunk), encoded with
    `encoding` in buf[pos:end]."""

    __slots__ = ("row0", "n", "encoding", "buf", "pos", "end")

    def __init__(self, row0, n, encoding, buf, pos, end):
        self.row0, self.n, self.encoding, self.buf, self.pos, self.end = row0, n, encoding, buf, pos, end


def _walk(files: _Files, chunk: _Chunk, on_dictionary, on_page, wanted=None) -> None:
    """Parse every page of `chunk` in order; decompress the dictionary page (on_dictionary(buf,
    pos, end, n)) and each data page (on_page(_Page)), skipping data pages for which
    wanted(row0, row_end) is false. Raises ScanUnsupported on anything unexpected."""
    name = CODECS[chunk.codec]
    codec = pa.Codec(name) if name else None
    raw, data = files.read(chunk)
    pos, row, end = 0, 0, len(data)
    while pos < end:
        decoder = ps.ThriftDecoder(raw, pos)
        header = decoder.read_struct()
        body = decoder.pos
        size = header.get(PH_COMPRESSED_SIZE)
        usize = header.get(PH_UNCOMPRESSED_SIZE)
        kind = header.get(PH_TYPE)
        if not isinstance(size, int) or not isinstance(usize, int) or size < 0 or usize < 0 or body + size > end:
            raise ScanUnsupported("page header with bad sizes")
        pos = body + size
        if kind == DICTIONARY_PAGE:
            dh = header.get(PH_DICTIONARY_PAGE)
            n = dh.get(DICT_NUM_VALUES)
            if row or dh.get(DICT_ENCODING) not in (PLAIN, PLAIN_DICTIONARY) or not isinstance(n, int) or n < 0:
                raise ScanUnsupported("unsupported dictionary page")
            buf = _decompress(codec, data[body:pos], usize)
            on_dictionary(buf, 0, len(buf), n)
        elif kind == DATA_PAGE:
            dh = header.get(PH_DATA_PAGE)
            n, encoding = dh.get(DP_NUM_VALUES), dh.get(DP_ENCODING)
            if not isinstance(n, int) or n < 0 or row + n > chunk.n_rows:
                raise ScanUnsupported("page value counts do not add up")
            if wanted is None or wanted(row, row + n):
                buf = _decompress(codec, data[body:pos], usize)
                start = 0
                if chunk.optional:
                    if dh.get(DP_DEF_ENCODING) != RLE or len(buf) < 4:
                        raise ScanUnsupported("definition levels not RLE")
                    start = 4 + int.from_bytes(bytes(buf[:4]), "little")
                    if start > len(buf) or not _all_defined(buf, 4, start, n):
                        raise ScanUnsupported("null values or malformed definition levels")
                on_page(_Page(row, n, encoding, buf, start, len(buf)))
            row += n
        elif kind == DATA_PAGE_V2:
            dh = header.get(PH_DATA_PAGE_V2)
            n, encoding = dh.get(V2_NUM_VALUES), dh.get(V2_ENCODING)
            def_len, rep_len = dh.get(V2_DEF_LENGTH), dh.get(V2_REP_LENGTH)
            if not isinstance(n, int) or n < 0 or row + n > chunk.n_rows or dh.get(V2_NUM_ROWS) != n:
                raise ScanUnsupported("page value counts do not add up")
            if dh.get(V2_NUM_NULLS) != 0 or rep_len != 0 or not isinstance(def_len, int) or not 0 <= def_len <= size:
                raise ScanUnsupported("null values or repetition levels")
            if wanted is None or wanted(row, row + n):
                if chunk.optional and not _all_defined(data, body, body + def_len, n):
                    raise ScanUnsupported("null values or malformed definition levels")
                values = data[body + def_len : pos]
                if dh.get(V2_IS_COMPRESSED, True) and codec is not None:
                    buf = _decompress(codec, values, usize - def_len)
                else:
                    buf = values
                on_page(_Page(row, n, encoding, buf, 0, len(buf)))
            row += n
        else:
            raise ScanUnsupported(f"page type {kind}")
    if pos != end or row != chunk.n_rows:
        raise ScanUnsupported("pages do not add up to the column chunk")


def _decompress(codec, raw: np.ndarray, usize: int) -> np.ndarray:
    if codec is None:
        return raw
    if usize < 0:
        raise ScanUnsupported("negative uncompressed size")
    out = codec.decompress(pa.py_buffer(raw), decompressed_size=usize)
    return np.frombuffer(out, dtype=np.uint8)


class _Dictionary:
    """The current dictionary of a chunk: located entries and (lazily) their hashes and the
    first row of the chunk equal to each (-1 until an entry is used), with where the entries
    are in the thread's `_Distinct.store` (`stored`)."""

    def __init__(self):
        self.buf = None
        self.starts = self.lens = self.hashes = self.reps = self.stored = None

    def load(self, buf, pos, end, n):
        if n > (end - pos) // 4:  # a PLAIN value takes at least 4 bytes
            raise ScanUnsupported("malformed dictionary page")
        self.buf = buf
        self.starts = np.empty(n, dtype=np.int64)
        self.lens = np.empty(n, dtype=np.int64)
        if _plain_refs(buf, pos, end, n, self.starts, self.lens) < 0:
            raise ScanUnsupported("malformed dictionary page")
        self.hashes = self.reps = self.stored = None


def _locate(page: _Page, dictionary: _Dictionary):
    """(buffer, starts, lens) of the page's values."""
    n = page.n
    starts = np.empty(n, dtype=np.int64)
    lens = np.empty(n, dtype=np.int64)
    buf = page.buf
    if page.encoding == PLAIN:
        ok = _plain_refs(buf, page.pos, page.end, n, starts, lens) >= 0
    elif page.encoding in (RLE_DICTIONARY, PLAIN_DICTIONARY):
        if dictionary.buf is None:
            raise ScanUnsupported("dictionary-encoded page without a dictionary")
        ok = _index_refs(buf, page.pos, page.end, n, dictionary.starts, dictionary.lens, starts, lens)
        buf = dictionary.buf
    elif page.encoding == DELTA_LENGTH_BYTE_ARRAY:
        ok = _delta_length_refs(buf, page.pos, page.end, n, starts, lens) >= 0
    elif page.encoding == DELTA_BYTE_ARRAY:
        buf, ok = _delta_byte_array(buf, page.pos, page.end, n, starts, lens)
    else:
        raise ScanUnsupported(f"encoding {page.encoding} not supported")
    if not ok:
        raise ScanUnsupported("malformed data page")
    return buf, starts, lens


# Keys of the table of a chunk's distinct values are hash & _KEY_FOLD. Tests set few bits here,
# so that different values share keys and must be told apart by their bytes.
_KEY_FOLD = np.uint64(0xFFFFFFFFFFFFFFFF)


class _Distinct:
    """A thread's record of the chunk it hashes (`_first_equals`), reused for its next chunks
    (fresh memory is slow to fault in): the bytes of the chunk's values (`store`: each page's
    values appended; replaced by a larger copy when a chunk needs more, and kept), the
    distinct values' entries (start in store, length, first row) and the hash table."""

    def __init__(self, max_rows: int, store_bytes: int):
        cap = 16
        while cap < 2 * max_rows:
            cap *= 2
        self.table = np.zeros(cap, dtype=np.uint64)
        self.info = np.empty((max_rows, 2), dtype=np.int64)
        self.store = np.empty(max(store_bytes, 1 << 16), dtype=np.uint8)
        self.state = np.zeros(2, dtype=np.int64)  # distinct values, bytes used in store

    def start(self, n_rows: int) -> np.ndarray:
        """Empty the table and the store for a chunk of n_rows rows; returns the part of the
        table to use (a power of two at least twice n_rows)."""
        cap = 16
        while cap < 2 * n_rows:
            cap *= 2
        table = self.table[:cap]
        table[:] = 0
        self.state[:] = 0
        return table


def _hash_chunk(files: _Files, chunk: _Chunk, hashes: np.ndarray, reps: np.ndarray, sizes: tuple[int, int]) -> int:
    """Hash every row of `chunk` into hashes[chunk.row0:], write the chunk-relative row of the
    first row of the chunk with the same bytes into reps[chunk.row0:], and return the chunk's
    number of empty values. sizes: the most rows and uncompressed bytes of a chunk (to size the
    thread's `_Distinct` once)."""
    d = getattr(files.local, "distinct", None)
    if d is None:
        d = files.local.distinct = _Distinct(*sizes)
    table = d.start(chunk.n_rows)
    fold = _KEY_FOLD
    dictionary = _Dictionary()
    empty = 0

    def on_page(page: _Page) -> None:
        nonlocal empty
        at = chunk.row0 + page.row0
        if page.encoding == PLAIN:
            common = (hashes, reps, at, page.row0, fold, table, d.info, d.store, d.state)
            end, e, d.store = _scan_plain(page.buf, page.pos, page.end, page.n, *common)
            if end < 0:
                raise ScanUnsupported("malformed PLAIN page")
        elif page.encoding in (RLE_DICTIONARY, PLAIN_DICTIONARY) and dictionary.buf is not None:
            if dictionary.hashes is None:
                dictionary.hashes = hash_values(dictionary.buf, dictionary.starts, dictionary.lens)
                dictionary.reps = np.full(len(dictionary.hashes), -1, dtype=np.int64)
                d.store, shift = _append(d.store, d.state, dictionary.buf, 0, len(dictionary.buf))
                dictionary.stored = dictionary.starts + shift
            common = (hashes, reps, at, page.row0, fold, table, d.info, d.store, d.state)
            ok, e = _scan_indices(page.buf, page.pos, page.end, page.n, dictionary.stored, dictionary.lens,
                                  dictionary.hashes, dictionary.reps, *common)
            if not ok:
                raise ScanUnsupported("malformed dictionary-encoded page")
        else:
            buf, starts, lens = _locate(page, dictionary)
            common = (hashes, reps, at, page.row0, fold, table, d.info, d.store, d.state)
            e, d.store = _scan_refs(buf, starts, lens, *common)
        empty += e

    _walk(files, chunk, dictionary.load, on_page)
    return empty


class _Files:
    """The scanned files, open for reading, checked against the sizes and mtimes the scan saw.
    `read(chunk)` reads a column chunk into a buffer reused by the calling thread (fresh
    memory is slow to fault in; a chunk is a few MB)."""

    def __init__(self, paths, stats=None):
        self.paths, self.fds = paths, []
        self.local = threading.local()
        try:
            for k, path in enumerate(paths):
                self.fds.append(os.open(path, os.O_RDONLY))
                st = os.fstat(self.fds[-1])
                if stats is not None and (st.st_size, st.st_mtime_ns) != stats[k]:
                    raise ScanUnsupported(f"{path}: size or modification time changed")
        except BaseException:
            self.close()
            raise

    def read(self, chunk: _Chunk) -> tuple[memoryview, np.ndarray]:
        """The bytes of `chunk` (a memoryview, and a uint8 array on the same memory)."""
        size = chunk.end - chunk.start
        raw = getattr(self.local, "raw", None)
        if raw is None or len(raw) < size:
            raw = self.local.raw = bytearray(max(size, 2 * len(raw or b"")))
        view = memoryview(raw)[:size]
        if os.preadv(self.fds[chunk.file], [view], chunk.start) != size:
            raise ScanUnsupported(f"{self.paths[chunk.file]}: column chunk runs past the end of the file")
        return view, np.frombuffer(raw, dtype=np.uint8, count=size)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _run(tasks, fn):
    """fn(task) for each task, on THREADS threads; results in task order. After a task fails,
    the tasks not yet started are skipped and the first failure is raised."""
    if len(tasks) <= 1:
        return [fn(t) for t in tasks]
    failed = threading.Event()

    def guarded(task):
        if failed.is_set():
            return None
        try:
            return fn(task)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(guarded, tasks))


# --------------------------------------------------------------------------- the scan


@dataclass(frozen=True)
class AnchorScan:
    """Per-row hashes of a BYTE_ARRAY column of Parquet files, computed page by page.

    hashes: uint64 [n_rows], rows in file order (files in the given order, row groups in
    order); a pure function of each row's bytes (0 for the empty string, never 0 otherwise).
    empty: the number of rows whose value is the empty string.
    _reps: int32 [n_rows], for each row the first row of its column chunk (chunk-relative)
    whose bytes equal its bytes (the row itself when none before it does), found exactly
    during the scan: two rows of one chunk are equal if and only if their _reps are."""

    files: tuple[str, ...]
    column: str
    n_rows: int
    hashes: np.ndarray
    empty: int
    _binary: bool = field(default=False, repr=False)
    _chunks: tuple = field(default=(), repr=False, compare=False)
    _stats: tuple = field(default=(), repr=False, compare=False)
    _reps: np.ndarray | None = field(default=None, repr=False, compare=False)

    def equal(self, rows_a: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
        """bool [len(rows_a)]: bytes of row rows_a[i] == bytes of row rows_b[i], exactly.

        Without reading the files for most pairs: a row with itself is equal; different
        hashes mean different bytes; two rows of one column chunk are equal if and only if
        their first equal rows in the chunk (`_reps`, exact) are the same. Only pairs of rows
        in different chunks with equal hashes are compared by a streaming pass
        (`_equal_streamed`), each row replaced by its first equal row in its chunk and only
        the pages holding those rows decompressed. The files are checked (size, modification
        time) against the scan's even when nothing is read."""
        a = self._rows(rows_a)
        b = self._rows(rows_b)
        if len(a) != len(b):
            raise ValueError("rows_a and rows_b differ in length")
        if not len(a):
            return np.ones(0, dtype=np.bool_)
        self._check_files()
        if self._reps is None:
            return self._equal_streamed(a, b)
        same, cross, cross_a, cross_b = _triage(a, b, self.hashes, self._reps, self._bounds())
        if len(cross):
            same[cross] = self._equal_streamed(cross_a, cross_b)
        return same

    def _check_files(self) -> None:
        """GacaError when a file's size or modification time differs from the scan's."""
        for path, stat in zip(self.files, self._stats):
            try:
                st = os.stat(path)
                now = (st.st_size, st.st_mtime_ns)
            except OSError as exc:
                now = exc
            if now != stat:
                reason = now if isinstance(now, OSError) else f"{path}: size or modification time changed"
                raise GacaError(f"a file changed while gaca was reading it ({reason})", file=", ".join(self.files))

    def _equal_streamed(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """`equal` by one streaming pass over the chunks that hold any of the rows (pages
        without any are not decompressed), for any pairs (a, b: int64 rows in range). For each
        pair, the earlier row's bytes are kept while its chunk is read and the later row is
        compared against them in place; for a pair whose rows lie in different chunks both
        rows' bytes are kept until the end. Memory: the kept bytes."""
        same = np.ones(len(a), dtype=np.bool_)
        if not len(a):
            return same
        bounds = self._bounds()
        pair_idx, pair_off, req_rows, req_persist, req_off, cross = _bucket_pairs(a, b, bounds)

        def work(files: _Files, c: int):
            chunk = self._chunks[c]
            pairs = pair_idx[pair_off[c] : pair_off[c + 1]]
            if req_off[c] == req_off[c + 1]:
                return None
            reqs = req_rows[req_off[c] : req_off[c + 1]] - chunk.row0
            persist = reqs[req_persist[req_off[c] : req_off[c + 1]]]
            pa_, pb = a[pairs] - chunk.row0, b[pairs] - chunk.row0
            got = self._collect(files, chunk, reqs, np.minimum(pa_, pb), np.maximum(pa_, pb), persist)
            same[pairs[got[0]]] = got[1]
            return got[2]

        kept = self._stream(work)
        if len(cross):
            rows, store, offsets = _concat_kept(kept)
            ia = np.searchsorted(rows, a[cross])
            ib = np.searchsorted(rows, b[cross])
            same[cross] = _compare_stored(store, offsets[:-1], np.diff(offsets), ia, ib)
        return same

    def values(self, rows: np.ndarray) -> pa.Array:
        """The values at `rows` (any order, repeats allowed) as one large_string array
        (large_binary for a binary column), in the order of `rows`."""
        r = self._rows(rows)
        typ = pa.large_binary() if self._binary else pa.large_string()
        bounds = self._bounds()
        order = np.argsort(r, kind="stable")
        chunk_of = np.searchsorted(bounds, r[order], side="right") - 1
        req_off = np.searchsorted(chunk_of, np.arange(len(bounds)), side="left")
        req_rows = r[order]
        no_pairs = np.zeros(0, dtype=np.int64)

        def work(files: _Files, c: int):
            if req_off[c] == req_off[c + 1]:
                return None
            chunk = self._chunks[c]
            reqs = req_rows[req_off[c] : req_off[c + 1]] - chunk.row0
            return self._collect(files, chunk, reqs, no_pairs, no_pairs, reqs)[2]

        kept = self._stream(work)
        distinct, store, offsets = _concat_kept(kept)
        table = pa.Array.from_buffers(typ, len(distinct), [None, pa.py_buffer(offsets), pa.py_buffer(store)])
        return table.take(pa.array(np.searchsorted(distinct, r)))

    def _stream(self, work) -> list:
        """work(files, c) for every chunk c, on THREADS threads; a file that no longer reads as
        it did during the scan is a GacaError."""
        try:
            with _Files(self.files, self._stats) as files:
                return _run(range(len(self._chunks)), lambda c: work(files, c))
        except ScanUnsupported as exc:
            raise GacaError(f"a file changed while gaca was reading it ({exc})", file=", ".join(self.files)) from None

    def _rows(self, rows) -> np.ndarray:
        r = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)  # one compiled kernel variant
        if len(r) and (r.min() < 0 or r.max() >= self.n_rows):
            raise IndexError(f"row index out of range 0..{self.n_rows - 1}")
        return r

    def _bounds(self) -> np.ndarray:
        return np.array([c.row0 for c in self._chunks] + [self.n_rows], dtype=np.int64)

    def _collect(self, files: _Files, chunk: _Chunk, reqs, pair_lo, pair_hi, persist):
        """Stream `chunk`, keeping the bytes of rows `reqs` and comparing row pair_hi[i] with
        row pair_lo[i] (chunk-relative). Returns (pair order, equal in that order,
        (global rows, bytes, offsets) of the distinct `persist` rows)."""
        store_rows, order, cmp_hi, cmp_slot, last_hi = _chunk_plan(chunk.n_rows, reqs, pair_lo, pair_hi)
        same = np.zeros(len(order), dtype=np.bool_)
        store_start = np.zeros(len(store_rows), dtype=np.int64)
        store_len = np.zeros(len(store_rows), dtype=np.int64)
        keep = np.isin(store_rows, persist)
        in_page = np.zeros(len(store_rows), dtype=np.bool_)
        store = getattr(files.local, "store", None)  # reused by the thread's next chunk
        state = [0, 0, store if store is not None else np.empty(1 << 20, dtype=np.uint8), 0]  # sp, cp, store, used
        dictionary = _Dictionary()

        def wanted(row0: int, row_end: int) -> bool:
            sp, cp = state[0], state[1]
            return (sp < len(store_rows) and store_rows[sp] < row_end) or (cp < len(cmp_hi) and cmp_hi[cp] < row_end)

        def on_page(page: _Page) -> None:
            buf, starts, lens = _locate(page, dictionary)
            state[:] = _collect_page(buf, starts, lens, page.row0, store_rows, state[0], state[2], state[3],
                                     store_start, store_len, keep, last_hi, in_page, cmp_hi, cmp_slot, state[1], same)

        _walk(files, chunk, dictionary.load, on_page, wanted)
        files.local.store = state[2]
        if state[0] != len(store_rows) or state[1] != len(cmp_hi):
            raise ScanUnsupported("fewer rows than during the scan")
        kept = np.flatnonzero(keep)
        store, offsets = _gather(state[2], store_start, store_len, kept)
        return order, same, (store_rows[kept] + chunk.row0, store, offsets)


def _concat_kept(kept: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Join the chunks' kept rows (ascending global rows, bytes, offsets [n+1])."""
    kept = [k for k in kept if k is not None]
    if not kept:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64)
    rows = np.concatenate([k[0] for k in kept])
    store = np.concatenate([k[1] for k in kept])
    sizes = np.concatenate([np.diff(k[2]) for k in kept])
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return rows, store, offsets


def scan_anchors(files: Sequence[str | os.PathLike], column: str) -> AnchorScan | None:
    """Hash every row of `column` in `files` (one streaming pass, THREADS threads); None when
    the files cannot be scanned (the caller then reads the column the ordinary way, which also
    reports damaged files)."""
    try:
        return _scan(tuple(os.fspath(f) for f in files), column)
    except Exception:  # noqa: BLE001 - anything unexpected: let the ordinary reader handle it
        return None


def _scan(paths: tuple[str, ...], column: str) -> AnchorScan:
    chunks, stats, kinds, n_rows = [], [], set(), 0
    for k, path in enumerate(paths):
        file_chunks, binary, stat = _column_layout(path, column, k, n_rows)
        chunks += file_chunks
        stats.append(stat)
        kinds.add(binary)
        n_rows += sum(c.n_rows for c in file_chunks)
    if len(kinds) > 1:
        raise ScanUnsupported("text in some files, binary in others")
    hashes = np.empty(n_rows, dtype=np.uint64)
    reps = np.empty(n_rows, dtype=np.int32)
    sizes = (max((c.n_rows for c in chunks), default=0), max((c.uncompressed for c in chunks), default=0))
    with _Files(paths, stats) as files:
        empty = sum(_run(chunks, lambda c: _hash_chunk(files, c, hashes, reps, sizes)))
    binary = kinds.pop() if kinds else False
    return AnchorScan(paths, column, n_rows, hashes, int(empty), binary, tuple(chunks), tuple(stats), reps)


if __name__ == "__main__":  # benchmark: python -m gaca_cli.log._anchor_scan [LOG] [COLUMN]
    import sys
    import time

    log = sys.argv[1] if len(sys.argv) > 1 else "bench/data/synth-v1-10000000-s0.parquet"
    col = sys.argv[2] if len(sys.argv) > 2 else "anchor_obs"

    def timed(label, fn):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{label:<18} wall {wall:6.3f} s  cpu {cpu:6.3f} s", file=sys.stderr)
        return result

    def workload(scan):
        """Rows grouped by hash; each non-first row of a run against the run's first row."""
        order = np.argsort(scan.hashes, kind="stable")
        h = scan.hashes[order]
        first = np.r_[True, h[1:] != h[:-1]]
        run_first = order[np.maximum.accumulate(np.where(first, np.arange(len(h)), 0))]
        return order[~first], run_first[~first]

    def step_groups(scan):
        """What `gaca advantages` asks: rows grouped by (group_id, hash); each non-first row of
        a group against its first row in file order."""
        groups = pq.read_table(log, columns=["group_id"]).column(0).combine_chunks()
        g = np.asarray(groups.dictionary_encode().indices, dtype=np.int64)
        order = np.lexsort((scan.hashes, g))  # stable: rows of a group in file order
        key_g, key_h = g[order], scan.hashes[order]
        first = np.r_[True, (key_g[1:] != key_g[:-1]) | (key_h[1:] != key_h[:-1])]
        run_first = order[np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))]
        return order[~first], run_first[~first]

    timed("warm_up", warm_up)
    scan = timed("scan_anchors", lambda: scan_anchors([log], col))
    for name, (rows_a, rows_b) in (("hash groups", workload(scan)), ("step groups", step_groups(scan))):
        bounds = scan._bounds()
        across = int((np.searchsorted(bounds, rows_a, "right") != np.searchsorted(bounds, rows_b, "right")).sum())
        print(f"{name}: rows {scan.n_rows}, pairs {len(rows_a)}, across chunks {across}, "
              f"representatives {len(np.unique(rows_b))}", file=sys.stderr)
        same = timed("equal", lambda a=rows_a, b=rows_b: scan.equal(a, b))
        print(f"unequal pairs (hash collisions) {int((~same).sum())}", file=sys.stderr)
    timed("values(1000)", lambda: scan.values(rows_b[:: max(1, len(rows_b) // 1000)][:1000]))
