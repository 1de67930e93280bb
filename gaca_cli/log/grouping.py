"""Integer codes for ids: `id_codes` numbers them roughly by first appearance (cheap, local
in memory) and ranks them in sorted order (`sorted_distinct`), so that nothing written out or shown
depends on the order of rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def contiguous_decoded(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array, dictionaries decoded and strings widened to large_string."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if pa.types.is_string(arr.type) or pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.large_string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr


def id_codes(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Integer codes of the values of `arr`, numbered roughly by first appearance (cheap to
    compute, good memory locality), with each code's rank in sorted order.

    Returns (codes int64 [N] in 0..K-1, rank int64 [K]: position of each code's value in
    sorted order, values [K]: the distinct value of each code). Strings sort by code point
    (byte order of UTF-8), integers numerically. No nulls allowed.

    Works chunk by chunk (a column is never concatenated): each chunk is dictionary-encoded
    (dictionary chunks as they are), and only the chunks' small dictionaries are sorted
    (`sorted_distinct`); equal neighbours in that order are one value.
    """
    chunks = [arr] if isinstance(arr, pa.Array) else [c for c in arr.chunks if len(c)]
    if not chunks:
        empty = contiguous_decoded(arr if isinstance(arr, pa.Array) else pa.array([], type=arr.type)).slice(0, 0)
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
            dictionaries.append(contiguous_decoded(d))
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


def sorted_distinct(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The stable argsort of `values` by pyarrow (strings and binaries by their bytes, for UTF-8
    code point order; integers numerically) and, along it, which values differ from the one
    before (the first of each run of equal values). Returns (order int64 [K], first bool [K])."""
    order = pc.sort_indices(values).to_numpy().astype(np.int64, copy=False)
    first = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        ordered = values.take(pa.array(order))
        first[1:] = ~pc.equal(ordered.slice(1), ordered.slice(0, len(order) - 1)).to_numpy(zero_copy_only=False)
    return order, first
