"""Integer codes for ids: `id_codes` numbers them roughly by first appearance (cheap, local
in memory) and ranks them in sorted order (`sort_order`), so that nothing written out or shown
depends on the order of rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def plain(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array, dictionaries decoded and strings widened to large_string."""
    if isinstance(arr, pa.ChunkedArray):
        t = arr.type
        if pa.types.is_dictionary(t):
            arr = arr.cast(t.value_type)
            t = t.value_type
        if pa.types.is_string(t) or pa.types.is_string_view(t):
            arr = arr.cast(pa.large_string())
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    else:
        if pa.types.is_dictionary(arr.type):
            arr = arr.cast(arr.type.value_type)
        if pa.types.is_string(arr.type) or pa.types.is_string_view(arr.type):
            arr = arr.cast(pa.large_string())
    return arr


def id_codes(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Integer codes of the values of `arr`, numbered roughly by first appearance (cheap to
    compute, good memory locality), with each code's rank in sorted order.

    Returns (codes int64 [N] in 0..K-1, rank int64 [K]: position of each code's value in
    sorted order, values [K]: the distinct value of each code). Strings sort by code point
    (byte order of UTF-8), integers numerically. No nulls allowed.

    Works chunk by chunk (a column is never concatenated): each chunk is dictionary-encoded
    (dictionary chunks as they are), and only the chunks' small dictionaries are sorted
    (`sort_order`); equal neighbours in that order are one value.
    """
    chunks = [arr] if isinstance(arr, pa.Array) else [c for c in arr.chunks if len(c)]
    if not chunks:
        empty = plain(arr if isinstance(arr, pa.Array) else pa.array([], type=arr.type)).slice(0, 0)
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), empty
    dictionaries: list[pa.Array] = []
    offset_of: dict[tuple, int] = {}  # the chunks of one row group share their dictionary
    seen: list[pa.Array] = []  # keeps every dictionary alive, so no buffer address is reused
    pieces: list[tuple[np.ndarray, int]] = []  # each chunk's indices and its dictionary's offset
    total = 0
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        d = chunk.dictionary
        seen.append(d)
        key = (tuple(0 if b is None else b.address for b in d.buffers()), d.offset, len(d))
        if key not in offset_of:
            offset_of[key] = total
            dictionaries.append(plain(d))
            total += len(d)
        pieces.append((chunk.indices.to_numpy(zero_copy_only=False), offset_of[key]))
    values = pa.concat_arrays(dictionaries) if len(dictionaries) > 1 else dictionaries[0]
    used = np.zeros(len(values), dtype=bool)
    for idx, offset in pieces:
        used[offset:][idx] = True
    used_rows = np.flatnonzero(used)
    # the distinct values: sort the used entries, equal neighbours share a rank
    entries = values if len(used_rows) == len(values) else values.take(pa.array(used_rows))
    by_value, new = sorted_distinct(entries)
    rank_of_entry = np.empty(len(by_value), dtype=np.int64)
    rank_of_entry[by_value] = np.cumsum(new) - 1
    # codes numbered by first appearance among the entries (row group by row group)
    _, first = np.unique(rank_of_entry, return_index=True)
    code_of_rank = np.empty(len(first), dtype=np.int64)
    code_of_rank[np.argsort(first)] = np.arange(len(first), dtype=np.int64)
    entry_code = np.zeros(len(values), dtype=np.int64)
    entry_code[used_rows] = code_of_rank[rank_of_entry]
    rank = np.empty(len(first), dtype=np.int64)
    rank[code_of_rank] = np.arange(len(first), dtype=np.int64)
    distinct = entries.take(pa.array(by_value[new][rank]))
    codes = np.empty(sum(len(idx) for idx, _ in pieces), dtype=np.int64)
    at = 0
    for idx, offset in pieces:
        np.take(entry_code[offset:], idx, out=codes[at : at + len(idx)])
        at += len(idx)
    return codes, rank, distinct


def sort_order(values: pa.Array) -> np.ndarray:
    """Stable argsort of `values`: strings and binaries by their bytes (for UTF-8, code point
    order), anything else as pyarrow sorts it. int64 [len(values)]. See `sorted_distinct`."""
    return sorted_distinct(values)[0]


def sorted_distinct(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """`sort_order` of `values` and, along it, which values differ from the one before (the
    first of each run of equal values). Returns (order int64 [K], first bool [K]).

    Text is sorted most significant bytes first, 8 at a time: the values still tied are
    re-sorted by their next 8 bytes (big-endian, zero padded, shorter first on equal words),
    so ids that differ early (uuids, hashes) cost one pass over a small key, not a string sort;
    values still tied when they end are equal. A prefix shared by every value is skipped; when
    most values are still tied after a pass, the values are sorted as text instead."""
    t = values.type
    k = len(values)
    if not (
        pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
    ):
        return _sorted_by_pyarrow(values)
    text = values.cast(pa.large_binary())
    order = np.arange(k, dtype=np.int64)
    first = np.zeros(k, dtype=bool)
    if k < 2:
        first[:] = True
        return order, first
    _, offsets_buffer, data_buffer = text.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[text.offset : text.offset + k + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    padded = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
    start, length = offsets[:-1], np.diff(offsets)
    lanes = np.arange(8, dtype=np.int64)
    active = np.arange(k, dtype=np.int64)  # positions of `order` still tied with a neighbour
    tie = np.zeros(k, dtype=np.int64)  # the tie group of each active position (non-decreasing)
    depth = 0
    shortest = int(length.min())
    while depth + 8 <= shortest:  # skip a prefix every value shares ("run-2026-11-30-…")
        word = padded[(start + depth)[:, None] + lanes].view(">u8").ravel()
        if not np.all(word == word[0]):
            break
        depth += 8
    while len(active):
        items = order[active]
        remaining = length[items] - depth
        chunk = padded[np.minimum((start[items] + depth)[:, None] + lanes, len(data))]
        chunk[lanes >= remaining[:, None]] = 0
        word = chunk.view(">u8").ravel()
        ends = np.minimum(remaining, 9)  # ≤ 8: the value ends in this word (a prefix sorts first)
        by = np.lexsort((ends, word, tie))  # stable; keeps every tie group in its positions
        items, word, ends, tie = items[by], word[by], ends[by], tie[by]
        order[active] = items
        new = np.ones(len(items), dtype=bool)
        new[1:] = (tie[1:] != tie[:-1]) | (word[1:] != word[:-1]) | (ends[1:] != ends[:-1])
        first[active] = new  # a tie group's first position follows a smaller value
        tie = np.cumsum(new) - 1
        still = (np.bincount(tie)[tie] > 1) & (ends == 9)
        active, tie = active[still], tie[still]
        depth += 8
        if 2 * len(active) > k:  # structured ids ("worker-03-traj-0000123"): sort them as text
            return _sorted_by_pyarrow(text)
    return order, first


def _sorted_by_pyarrow(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """`sorted_distinct` by pyarrow's stable sort, equal neighbours found by comparing them."""
    order = pc.sort_indices(values).to_numpy().astype(np.int64, copy=False)
    first = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        ordered = values.take(pa.array(order))
        first[1:] = ~pc.equal(ordered.slice(1), ordered.slice(0, len(order) - 1)).to_numpy(zero_copy_only=False)
    return order, first


def dense_rank(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Codes 0..K-1 of the values of `arr` in sorted order, and the K sorted distinct values
    (see `id_codes`)."""
    codes, rank, values = id_codes(arr)
    return rank[codes], values.take(pa.array(np.argsort(rank)))
