"""Step groups (Eqs. 4, 6): the rows of one episode group that share an anchor state, by exact
equality or, with --anchor-similarity, by greedy clustering of similar anchor texts.

Codes are dense and numbered by first appearance in canonical (group_id, traj_id, step_idx)
order, so the step_group_id written out never depends on the order of rows.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from gaca_cli.credit import _compiled
from gaca_cli.log.anchors import Anchors
from gaca_cli.log.index import TrajectoryIndex


def step_group_codes(index: TrajectoryIndex, anchors: Anchors) -> np.ndarray:
    """Step-group codes of every row: same episode group and same anchor ⇔ same code; dense,
    and numbered by first appearance in canonical (group_id, traj_id, step_idx) order, so they
    are the step_group_id written out and do not depend on the order of rows.

    Anchors are grouped by their hashes (`hash_codes`), then every row of a multi-row code is
    compared with the code's first row, exactly: codes that mix anchors (a hash collision) are
    split, so the result never depends on the hash. (A column left on disk makes those
    comparisons while it hashes, told the groups beforehand.)
    """
    if index.n_rows == 0:
        return np.zeros(0, dtype=np.int64)
    if not anchors.read_whole:
        anchors.expect_groups(index.traj_group[index.row_traj])
    codes, rows, reps = hash_codes(anchors.file_hashes(), index)
    if len(rows):
        same = anchors.equal_rows(rows, reps)
        if not same.all():
            codes = _split_collisions(codes, index, anchors, np.unique(codes[rows[~same]]))
    return codes


def hash_codes(hashes: np.ndarray, index: TrajectoryIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of one episode group with equal hashes share a code, numbered by first appearance
    in canonical order; and the pairs of rows to compare exactly: every row of a multi-row code
    with the code's first row in the file.

    hashes: uint64 [N] per row. Returns (codes int64 [N] per row; rows, representatives int64
    [P]: the pairs).
    """
    if kernels := _compiled.kernels():
        return kernels.step_groups_by_hash(np.require(hashes, np.uint64, ("C", "W")), kernels.Index.of(index))
    n = index.n_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    row_at = np.empty(n, dtype=np.int64)  # the file row at each canonical position
    row_at[index.canonical_row_position] = np.arange(n, dtype=np.int64)
    group = index.traj_group[index.row_traj[row_at]]
    _, hash_code = np.unique(hashes[row_at], return_inverse=True)
    key = group * (int(hash_code.max()) + 1) + hash_code  # one integer per (episode group, hash)
    _, first, key_code = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)  # keys numbered by first appearance
    rank[np.argsort(first)] = np.arange(len(first), dtype=np.int64)
    codes = np.empty(n, dtype=np.int64)
    codes[row_at] = rank[key_code]
    first_row = np.full(len(first), n, dtype=np.int64)
    np.minimum.at(first_row, codes, np.arange(n, dtype=np.int64))
    size = np.bincount(codes, minlength=len(first))
    rows = np.flatnonzero((size[codes] > 1) & (first_row[codes] != np.arange(n)))
    return codes, rows, first_row[codes[rows]]


def _split_collisions(codes: np.ndarray, index: TrajectoryIndex, anchors: Anchors, bad: np.ndarray) -> np.ndarray:
    """Give every distinct anchor inside the colliding codes (each within one episode group)
    a code of its own, then renumber all codes canonically."""
    codes = codes.copy()
    rows = np.flatnonzero(np.isin(codes, bad))
    values = anchors.values(rows).to_pylist()
    fresh = int(codes.max()) + 1
    seen: dict[tuple[int, object], int] = {}
    kept: set[int] = set()
    for row, value in zip(rows.tolist(), values):
        k = (int(codes[row]), value)
        if k not in seen:
            if k[0] not in kept:
                kept.add(k[0])
                seen[k] = k[0]
            else:
                seen[k] = fresh
                fresh += 1
        codes[row] = seen[k]
    return first_appearance_codes(codes, index.canonical_row_position)


def first_appearance_codes(codes: np.ndarray, position: np.ndarray | None = None) -> np.ndarray:
    """Renumber non-negative integer codes 0..K-1 in order of first appearance: of the row
    with the smallest `position` (a permutation of 0..N-1, by default the row's own index).
    Codes that do not occur are skipped. int64 [N]."""
    codes = np.asarray(codes, dtype=np.int64)
    n = len(codes)
    if n == 0:
        return codes
    if position is None:
        position = np.arange(n, dtype=np.int64)
    first = np.full(int(codes.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, codes, position)  # each code's first position (n: unused)
    used = np.flatnonzero(first < n)
    new = np.empty(len(first), dtype=np.int64)
    new[used[np.argsort(first[used])]] = np.arange(len(used), dtype=np.int64)
    return new[codes]


def _exact_fraction(threshold: float) -> Fraction:
    """θ as the decimal the user wrote (0.8 means 4/5, not the binary double nearest to it)."""
    return Fraction(repr(float(threshold)))


def cluster_anchors(texts: list[str], threshold: float, metric: str = "lcs", order: str = "sorted") -> list[int]:
    """Greedy clustering of the distinct anchor texts of one episode group.

    Texts are visited in sorted order (order="sorted"), or in the order given (order="rows":
    the caller passes them by first appearance); each joins the first existing cluster whose
    representative (its first member) has similarity ≥ threshold, else founds a new one.
    The test is exact, in integers, for θ = p/q:
      metric="lcs":     with d the Indel distance (|a| + |b| − 2·LCS) and n = |a| + |b|,
                        similarity ≥ θ ⇔ (n − d)·q ≥ p·n;
      metric="difflib": difflib's SequenceMatcher(None, text, representative).ratio() = 2M/n,
                        M its matched characters (autojunk as difflib's default; the ratio is
                        not symmetric, so the newcomer comes first, as in verl-agent), so
                        similarity ≥ θ ⇔ 2M·q ≥ p·n; two empty texts have ratio 1.
    Returns, for each text in `texts`, the index of its cluster in founding order.
    """
    theta = _exact_fraction(threshold)
    p, q = theta.numerator, theta.denominator
    visit = sorted(range(len(texts)), key=lambda i: texts[i]) if order == "sorted" else range(len(texts))
    similar = _lcs_hits if metric == "lcs" else _difflib_hits
    reps: list[str] = []
    cluster = [0] * len(texts)
    for i in visit:
        text = texts[i]
        found = similar(text, reps, p, q) if reps else -1
        if found < 0:
            reps.append(text)
            found = len(reps) - 1
        cluster[i] = found
    return cluster


def _lcs_hits(text: str, reps: list[str], p: int, q: int) -> int:
    """The first representative whose 2·LCS/(|a|+|b|) with `text` is ≥ p/q, or −1."""
    from rapidfuzz import process  # imported on use: only --anchor-similarity needs it
    from rapidfuzz.distance import Indel

    dist = process.cdist([text], reps, scorer=Indel.distance, dtype=np.int64)[0]
    total = np.fromiter((len(r) for r in reps), dtype=np.int64, count=len(reps)) + len(text)
    hits = np.flatnonzero((total - dist) * q >= p * total)
    return int(hits[0]) if len(hits) else -1


def _difflib_hits(text: str, reps: list[str], p: int, q: int) -> int:
    """The first representative whose SequenceMatcher(None, text, rep).ratio() is ≥ p/q, or −1."""
    from difflib import SequenceMatcher

    for k, rep in enumerate(reps):
        total = len(text) + len(rep)
        matched = sum(block.size for block in SequenceMatcher(None, text, rep).get_matching_blocks())
        if total == 0 or 2 * matched * q >= p * total:
            return k
    return -1


def similarity_key_codes(
    index: TrajectoryIndex, anchors: Anchors, threshold: float, metric: str = "lcs", order: str = "sorted"
) -> np.ndarray:
    """Like `step_group_codes`, but anchors of an episode group whose similarity to a
    cluster's representative is ≥ threshold share that cluster (see `cluster_anchors`; with
    order="rows" each group's distinct anchors are visited by their first row in the file);
    codes per row, numbered by first appearance in canonical order (see
    `first_appearance_codes`)."""
    exact = step_group_codes(index, anchors)
    k = int(exact.max()) + 1
    rep_row = np.full(k, len(exact), dtype=np.int64)
    np.minimum.at(rep_row, exact, np.arange(len(exact), dtype=np.int64))  # each anchor's first row
    key_group = index.traj_group[index.row_traj[rep_row]]
    key_text = [str(t) for t in anchors.values(rep_row).to_pylist()]
    merged = np.empty(k, dtype=np.int64)
    by_group = np.lexsort((rep_row, key_group))  # grouped, each group's anchors by first row
    bounds = np.flatnonzero(np.diff(key_group[by_group])) + 1
    next_code = 0
    for members in np.split(by_group, bounds):
        clusters = cluster_anchors([key_text[m] for m in members], threshold, metric, order)
        merged[members] = next_code + np.asarray(clusters, dtype=np.int64)
        next_code += max(clusters) + 1
    return first_appearance_codes(merged[exact], index.canonical_row_position)
