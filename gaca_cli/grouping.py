"""Integer codes for ids and anchor states, and similarity clustering of anchors.

Partitions never depend on row order, and every code that is written out or shown is
numbered independently of it too: ids are ranked in sorted order, and step groups are
numbered by (episode group, first step in sorted order) (`first_appearance_codes`). Working
codes (`id_codes`, `step_group_codes`) are numbered for memory locality instead. Hashes are
only used to find equal keys quickly; every hash match is verified, so a collision can never
merge two different anchors.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from rapidfuzz import process
from rapidfuzz.distance import Indel


_MIX = np.uint64(0x9E3779B97F4A7C15)


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
    (dictionary chunks as they are), the chunks' small dictionaries are merged, and only the
    distinct values are sorted.
    """
    chunks = [arr] if isinstance(arr, pa.Array) else [c for c in arr.chunks if len(c)]
    if not chunks:
        empty = plain(arr if isinstance(arr, pa.Array) else pa.array([], type=arr.type)).slice(0, 0)
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), empty
    dictionaries: list[pa.Array] = []
    offset_of: dict[tuple, int] = {}  # the chunks of one row group share their dictionary
    seen: list[pa.Array] = []  # keeps every dictionary alive, so no buffer address is reused
    entries_parts: list[np.ndarray] = []
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
        idx = chunk.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        idx += offset_of[key]
        entries_parts.append(idx)
    entries = np.concatenate(entries_parts) if len(entries_parts) > 1 else entries_parts[0]
    values = pa.concat_arrays(dictionaries) if len(dictionaries) > 1 else dictionaries[0]
    used = np.zeros(len(values), dtype=bool)
    used[entries] = True
    used_rows = np.flatnonzero(used)
    merged = pc.dictionary_encode(values.take(pa.array(used_rows)))
    entry_code = np.zeros(len(values), dtype=np.int64)
    entry_code[used_rows] = merged.indices.to_numpy(zero_copy_only=False)
    order = pc.sort_indices(merged.dictionary).to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return entry_code[entries], rank, merged.dictionary


def dense_rank(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Codes 0..K-1 of the values of `arr` in sorted order, and the K sorted distinct values
    (see `id_codes`)."""
    codes, rank, values = id_codes(arr)
    return rank[codes], values.take(pa.array(np.argsort(rank)))


def anchor_series(column: pa.ChunkedArray) -> pl.Series:
    """An anchor column as one polars Series in file order (string views: gathers move
    16-byte views, not the text)."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    # one chunk: polars gathers from a many-chunk series ~30x slower
    return pl.from_arrow(column).rechunk()


@dataclass(frozen=True)
class Anchors:
    """An anchor column in the file's row order (`series`, see `anchor_series`), seen in
    index order through `order` (index position -> file row; None when the two agree).
    Nothing is copied: hashes are computed in file order and only 8-byte values are permuted,
    and text is fetched only for the rows that need an exact comparison."""

    series: pl.Series
    order: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.series)

    def hashes(self) -> np.ndarray:
        """uint64 [N] hash of each row's anchor, index order (only used to find equals)."""
        h = self.series.hash(seed=0).to_numpy().astype(np.uint64, copy=False)
        return h if self.order is None else h[self.order]

    def equal_pairs(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """bool [len(a)]: anchor at index position a[i] == anchor at b[i], exactly."""
        rows_a = a if self.order is None else self.order[a]
        rows_b = b if self.order is None else self.order[b]
        series = self.series
        return (series.gather(rows_a) == series.gather(rows_b)).to_numpy()

    def take(self, positions: np.ndarray) -> pa.Array:
        """The anchors at the given index positions, as one plain array."""
        rows = positions if self.order is None else self.order[positions]
        return plain(self.series.gather(rows).to_arrow())

    def empty_count(self) -> int | None:
        """Rows whose anchor is the empty string (None for integer anchors)."""
        series = self.series
        if series.dtype != pl.String:
            return None
        return int((series.str.len_bytes() == 0).sum())


def step_group_codes(group: np.ndarray, anchors: Anchors) -> np.ndarray:
    """Dense step-group codes (same episode group and same anchor ⇔ same code), numbered in
    an order that keeps each episode group's codes together; use `first_appearance_codes` for
    the numbering that is written out.

    Method: sort a 64-bit key (the group in the high bits, a hash of the anchor below), so
    equal (group, anchor) rows become neighbours; then compare every member of a multi-row
    run with the run's first row, exactly. Runs that mix anchors (a hash collision) are split
    exactly; the result never depends on the hash.
    """
    from gaca_cli import kernels  # numba: imported on use, not by `gaca --help`

    n = len(group)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    group_bits = max(int(group.max()).bit_length(), 1)
    h = anchors.hashes()
    if group_bits <= 32:
        key = (group.astype(np.uint64) << np.uint64(64 - group_bits)) | (h >> np.uint64(group_bits))
    else:  # pragma: no cover - more than 4e9 groups
        with np.errstate(over="ignore"):
            key = h ^ (group.astype(np.uint64) * _MIX)
    del h
    order = pl.Series(key).arg_sort().to_numpy().astype(np.int64, copy=False)
    codes, rows, reps = kernels.sorted_runs(key, order)
    del key, order
    # exact verification of every multi-row run against its first row
    if len(rows):
        same = anchors.equal_pairs(rows, reps)
        same &= group[rows] == group[reps]
        if not same.all():
            codes = _split_collisions(codes, group, anchors, np.unique(codes[rows[~same]]))
    return codes


def _split_collisions(codes: np.ndarray, group: np.ndarray, anchors: Anchors, bad: np.ndarray) -> np.ndarray:
    """Give every distinct (group, anchor) inside the colliding runs a code of its own."""
    codes = codes.copy()
    rows = np.flatnonzero(np.isin(codes, bad))
    values = anchors.take(rows).to_pylist()
    fresh = int(codes.max()) + 1
    seen: dict[tuple[int, int, object], int] = {}
    kept: set[int] = set()
    for row, value in zip(rows.tolist(), values):
        k = (int(codes[row]), int(group[row]), value)
        if k not in seen:
            if k[0] not in kept:
                kept.add(k[0])
                seen[k] = k[0]
            else:
                seen[k] = fresh
                fresh += 1
        codes[row] = seen[k]
    return codes


def first_appearance_codes(codes: np.ndarray, position: np.ndarray | None = None) -> np.ndarray:
    """Renumber non-negative integer codes 0..K-1 in order of first appearance: of the row
    with the smallest `position` (a permutation of 0..N-1, by default the row's own index)."""
    from gaca_cli import kernels  # numba: imported on use, not by `gaca --help`

    codes = np.ascontiguousarray(codes, dtype=np.int64)
    if len(codes) == 0:
        return codes
    if position is None:
        position = np.arange(len(codes), dtype=np.int64)
    position = np.ascontiguousarray(position, dtype=np.int64)
    return kernels.renumber_by_first_position(codes, position, int(codes.max()) + 1)


def _exact_fraction(threshold: float) -> Fraction:
    """θ as the decimal the user wrote (0.8 means 4/5, not the binary double nearest to it)."""
    return Fraction(repr(float(threshold)))


def cluster_anchors(texts: list[str], threshold: float) -> list[int]:
    """Greedy clustering of the distinct anchor texts of one episode group.

    Texts are visited in sorted order; each joins the first existing cluster whose
    representative (its first member) has similarity ≥ threshold, else founds a new one.
    The test is exact, in integers: with d the Indel distance (|a| + |b| − 2·LCS) and
    n = |a| + |b|, similarity ≥ θ ⇔ (n − d)·q ≥ p·n for θ = p/q.
    Returns, for each text in `texts` (any order), the index of its cluster in founding order.
    """
    theta = _exact_fraction(threshold)
    p, q = theta.numerator, theta.denominator
    order = sorted(range(len(texts)), key=lambda i: texts[i])
    reps: list[str] = []
    rep_len = np.zeros(0, dtype=np.int64)
    cluster = [0] * len(texts)
    for i in order:
        text = texts[i]
        found = -1
        if reps:
            dist = process.cdist([text], reps, scorer=Indel.distance, dtype=np.int64)[0]
            total = rep_len + len(text)
            hits = np.flatnonzero((total - dist) * q >= p * total)
            if len(hits):
                found = int(hits[0])
        if found < 0:
            reps.append(text)
            rep_len = np.append(rep_len, len(text))
            found = len(reps) - 1
        cluster[i] = found
    return cluster


def similarity_key_codes(
    group: np.ndarray, anchors: Anchors, threshold: float, position: np.ndarray | None = None
) -> np.ndarray:
    """Like `step_group_codes`, but anchors of an episode group whose similarity to a
    cluster's representative is ≥ threshold share that cluster (see `cluster_anchors`); codes
    numbered by first appearance in canonical order (`position`, see `first_appearance_codes`)."""
    exact = step_group_codes(group, anchors)
    k = int(exact.max()) + 1
    rep_row = np.empty(k, dtype=np.int64)
    rep_row[exact] = np.arange(len(exact), dtype=np.int64)
    key_group = group[rep_row]
    key_text = anchors.take(rep_row).to_pylist()
    key_text = [str(t) for t in key_text]
    merged = np.empty(k, dtype=np.int64)
    order = np.argsort(key_group, kind="stable")
    bounds = np.flatnonzero(np.diff(key_group[order])) + 1
    next_code = 0
    for members in np.split(order, bounds):
        clusters = cluster_anchors([key_text[m] for m in members], threshold)
        merged[members] = next_code + np.asarray(clusters, dtype=np.int64)
        next_code += max(clusters) + 1
    return first_appearance_codes(merged[exact], position)
