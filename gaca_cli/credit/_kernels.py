"""Compiled twins (numba) of the passes over every row, for large logs (see _compiled.py).

The numpy code in estimators.py, step_groups.py and summary.py defines every number; each
kernel here names the function it stands in for and does the same floating-point operations
in the same order, so it gives the same bits (numba does not reorder float arithmetic unless
asked to with fastmath, which is not used here; error_model="numpy" gives IEEE inf/NaN
instead of ZeroDivisionError). tests/credit/test_kernels.py compares every kernel with
its numpy definition, bit for bit. What the loops buy: no sort where the numpy code sorts
(step groups by hash, values ordered within small groups by insertion), no full-array
temporaries, and walks through `rows` instead of gathers.

Kernels that walk trajectories take the row index as one argument (`Index`). Each is
compiled for one signature (arrays contiguous and writable: numba types read-only arrays
apart) and cached next to this file (or in numba's user cache when that is not writable):
`warm_up` compiles or loads them all, `cached` tells whether the cache holds them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numba import njit

from gaca_cli.log._kernels import counts_and_starts, trajectory_index
from gaca_cli.log.index import TrajectoryIndex

_SMALL = 24  # groups up to this size are sorted by insertion (no allocation)

jit = njit(cache=True, nogil=True, error_model="numpy")


class Index(NamedTuple):
    """The row index (TrajectoryIndex) as the kernels take it, int64 arrays. rows [N]: the rows
    of each trajectory in step order, trajectories one after another (empty: the file's order);
    start, length, group [T]: each trajectory's place in `rows`, its steps, its episode group;
    row_traj [N]: each row's trajectory; walk [T], group_rank [G]: TrajectoryIndex.group_walk."""

    rows: np.ndarray
    start: np.ndarray
    length: np.ndarray
    group: np.ndarray
    row_traj: np.ndarray
    walk: np.ndarray
    group_rank: np.ndarray

    @classmethod
    def of(cls, index: TrajectoryIndex) -> Index:
        walk = index.group_walk if index.n_traj else (index.traj_start, index.traj_start)  # (none: empty)
        arrays = (index.rows_or_empty, index.traj_start, index.traj_len, index.traj_group, index.row_traj, *walk)
        return cls(*(np.require(a, np.int64, ("C", "W")) for a in arrays))


@jit
def discounted_returns(reward: np.ndarray, index: Index, gamma: float) -> np.ndarray:
    """estimators.discounted_returns: G_t = r_t + γ·G_{t+1} backwards within each trajectory,
    G = r at its last step. reward: float64 [N] per row. Returns float64 [N] per row."""
    rows = index.rows
    identity = len(rows) == 0
    out = np.empty_like(reward)
    for t in range(len(index.start)):
        a = index.start[t]
        k = a + index.length[t] - 1
        r = k if identity else rows[k]
        g = reward[r]
        out[r] = g
        for i in range(k - 1, a - 1, -1):
            r = i if identity else rows[i]
            g = reward[r] + gamma * g
            out[r] = g
    return out


@jit
def group_order(codes: np.ndarray, values: np.ndarray, n_codes: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions grouped by code (groups in code order), ascending by value within a group;
    and the size of each group. The same as np.lexsort((values, codes)) up to the order of
    equal values, which is moot for sums. codes: int64 [M] in 0..n_codes−1; values: float64 [M]
    without NaN. Returns (order int64 [M], count int64 [n_codes])."""
    m = len(codes)
    count, fill = counts_and_starts(codes, n_codes)
    order = np.empty(m, dtype=np.int64)
    for i in range(m):
        c = codes[i]
        order[fill[c]] = i
        fill[c] += 1
    a = 0
    for c in range(n_codes):
        b = a + count[c]
        if b - a > _SMALL:
            seg = order[a:b].copy()
            order[a:b] = seg[np.argsort(values[seg])]
        else:
            for i in range(a + 1, b):  # insertion sort by value
                row = order[i]
                v = values[row]
                j = i - 1
                while j >= a and values[order[j]] > v:
                    order[j + 1] = order[j]
                    j -= 1
                order[j + 1] = row
        a = b
    return order, count


@jit
def group_moments(xs: np.ndarray, a: int, b: int, dev: np.ndarray) -> tuple[float, float, float, float]:
    """Shifted two-pass moments of xs[a:b] (b > a): writes dev[a:b] = (x − lo) − mean of the
    shifted values and returns (m2 = Σ dev², scale, lo, hi); when the squares overflow,
    scale = max |dev| and m2 = Σ (dev / scale)², else scale = 1. `shifted_moments` for one group."""
    low = xs[a]
    high = xs[a]
    for i in range(a + 1, b):  # as np.minimum/np.maximum: NaN wins, ties take the later
        if not (low < xs[i] or np.isnan(low)):
            low = xs[i]
        if not (high > xs[i] or np.isnan(high)):
            high = xs[i]
    s = 0.0
    for i in range(a, b):
        s += xs[i] - low
    mean = s / (b - a)
    q = 0.0
    for i in range(a, b):
        d = (xs[i] - low) - mean
        dev[i] = d
        q += d * d
    scale = 1.0
    if not np.isfinite(q):  # squares overflowed (|dev| beyond ~1e154)
        peak = 0.0
        for i in range(a, b):
            peak = np.maximum(peak, abs(dev[i]))  # NaN propagates, as in numpy
        q = 0.0
        for i in range(a, b):
            r = dev[i] / peak
            q += r * r
        scale = peak
    return q, scale, low, high


@jit
def shifted_moments(
    xs: np.ndarray, count: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """estimators.shifted_moments: two-pass moments of consecutive groups of xs (group c holds
    count[c] values), `group_moments` group by group.
    Returns (dev float64 [M], m2, scale, lo, hi float64 [n_codes]); empty groups get 0."""
    n_codes = len(count)
    dev = np.empty_like(xs)
    m2 = np.zeros(n_codes)
    scale = np.ones(n_codes)
    lo = np.zeros(n_codes)
    hi = np.zeros(n_codes)
    a = 0
    for c in range(n_codes):
        b = a + count[c]
        if b > a:
            m2[c], scale[c], lo[c], hi[c] = group_moments(xs, a, b, dev)
        a = b
    return dev, m2, scale, lo, hi


@jit
def normalize_in_groups(
    values: np.ndarray, codes: np.ndarray, n_codes: int, normalize_by_std: bool, eps: float
) -> tuple[np.ndarray, int, int]:
    """estimators.normalize_in_groups, from `shifted_moments` over the values in `group_order`:
        out = dev / (scale·sqrt(m2 / (count − 1)) + eps)   (normalize_by_std)
        out = dev                                          (otherwise)
    and 0 for groups of one value and groups whose values are all equal. Groups of one value
    (most step groups) are set aside first and cost one pass.
    Returns (out float64 [M], number of singleton groups, number of constant groups ≥ 2)."""
    m = len(values)
    count = np.zeros(n_codes, dtype=np.int64)
    for i in range(m):
        count[codes[i]] += 1
    shared = np.full(n_codes, -1, dtype=np.int64)  # code -> its number among groups of ≥ 2
    n_singleton = 0
    n_shared = 0
    for c in range(n_codes):
        if count[c] == 1:
            n_singleton += 1
        elif count[c] >= 2:
            shared[c] = n_shared
            n_shared += 1
    out = np.zeros(m)
    rows = np.empty(m, dtype=np.int64)
    k = 0
    for i in range(m):
        if shared[codes[i]] >= 0:
            rows[k] = i
            k += 1
    rows = rows[:k]
    sub_codes = np.empty(k, dtype=np.int64)
    for j in range(k):
        sub_codes[j] = shared[codes[rows[j]]]
    sub, sub_count = group_order(sub_codes, values[rows], n_shared)
    order = rows[sub]
    n_constant = scatter_normalized(out, order, values[order], sub_count, normalize_by_std, eps)
    return out, n_singleton, n_constant


@jit
def scatter_normalized(
    out: np.ndarray,
    targets: np.ndarray,
    sorted_values: np.ndarray,
    count: np.ndarray,
    normalize_by_std: bool,
    eps: float,
) -> int:
    """Normalise groups laid out one after another (`count` values each, ascending within a
    group, from `group_order`) and write position i's result to out[targets[i]]: (x − mean) /
    (std + eps) with ddof = 1, or x − mean, from `shifted_moments`; a constant group is left as
    `out` holds it. Returns the number of constant groups."""
    dev, m2, scale, lo, hi = shifted_moments(sorted_values, count)
    n_constant = 0
    a = 0
    for c in range(len(count)):
        b = a + count[c]
        if hi[c] == lo[c]:
            n_constant += 1
        elif normalize_by_std:
            denom = scale[c] * np.sqrt(m2[c] / (count[c] - 1)) + eps
            for i in range(a, b):
                out[targets[i]] = dev[i] / denom
        else:
            for i in range(a, b):
                out[targets[i]] = dev[i]
        a = b
    return n_constant


@jit
def group_end(index: Index, i: int) -> tuple[int, int]:
    """The episode group that starts at index.walk[i] (trajectories grouped by episode group):
    the position after its last trajectory in `walk`, and its number of rows."""
    walk = index.walk
    g = index.group[walk[i]]
    j = i
    total = 0
    while j < len(walk) and index.group[walk[j]] == g:
        total += index.length[walk[j]]
        j += 1
    return j, total


@jit
def largest_group(index: Index) -> int:
    """The number of rows of the largest episode group (sizes the per-group buffers)."""
    biggest = 0
    i = 0
    while i < len(index.walk):
        i, total = group_end(index, i)
        biggest = max(biggest, total)
    return biggest


@jit
def normalize_step_groups(
    values: np.ndarray, codes: np.ndarray, n_codes: int, index: Index, normalize_by_std: bool, eps: float
) -> tuple[bool, np.ndarray, np.ndarray, int, int]:
    """estimators.step_advantage: `normalize_in_groups` over the step groups, one episode group
    at a time, and each row's step-group size: the same values per row, bit for bit, but
    every group's work stays in a few small buffers, so the pass is local in memory.

    Walks the episode groups in the order of `index.walk`. Each group's codes must lie in a
    range no wider than its rows, and no code may occur in two groups (both are checked; step
    groups never span episode groups). values: float64 [N] per row; codes: int64 [N] per row
    in 0..n_codes−1. Returns (whether the codes were so: else nothing else is valid and the caller
    uses `normalize_in_groups`; out float64 [N]; size int64 [N], the rows in each row's step
    group; singleton groups; constant groups of two or more)."""
    n = len(values)
    rows, walk, traj_start, traj_len = index.rows, index.walk, index.start, index.length
    identity = len(rows) == 0
    out = np.zeros(n)
    size = np.empty(n, dtype=np.int64)
    biggest = largest_group(index)
    claimed = np.zeros(n_codes, dtype=np.bool_)
    count = np.zeros(max(biggest, 1), dtype=np.int64)
    shared = np.empty(max(biggest, 1), dtype=np.int64)
    member_row = np.empty(max(biggest, 1), dtype=np.int64)
    member_code = np.empty(max(biggest, 1), dtype=np.int64)
    member_value = np.empty(max(biggest, 1))
    n_singleton = 0
    n_constant = 0
    i = 0
    while i < len(walk):
        j, total = group_end(index, i)
        lo = n_codes
        hi = -1
        for q in range(i, j):
            t = walk[q]
            for p in range(traj_start[t], traj_start[t] + traj_len[t]):
                c = codes[p if identity else rows[p]]
                lo = min(lo, c)
                hi = max(hi, c)
        if hi - lo >= total:
            return False, out, size, 0, 0
        for q in range(i, j):
            t = walk[q]
            for p in range(traj_start[t], traj_start[t] + traj_len[t]):
                count[codes[p if identity else rows[p]] - lo] += 1
        n_shared = 0
        for c in range(hi - lo + 1):
            if count[c] > 0:
                if claimed[lo + c]:  # the code also occurs in an earlier group
                    return False, out, size, 0, 0
                claimed[lo + c] = True
            if count[c] == 1:
                n_singleton += 1
            if count[c] >= 2:
                shared[c] = n_shared
                n_shared += 1
        m = 0
        for q in range(i, j):
            t = walk[q]
            for p in range(traj_start[t], traj_start[t] + traj_len[t]):
                r = p if identity else rows[p]
                c = codes[r] - lo
                size[r] = count[c]
                if count[c] >= 2:
                    member_row[m] = r
                    member_code[m] = shared[c]
                    member_value[m] = values[r]
                    m += 1
        if m:
            sub, sub_count = group_order(member_code[:m], member_value[:m], n_shared)
            n_constant += scatter_normalized(
                out, member_row[:m][sub], member_value[:m][sub], sub_count, normalize_by_std, eps
            )
        for c in range(hi - lo + 1):
            count[c] = 0
        i = j
    return True, out, size, n_singleton, n_constant


@jit
def standardize_in_scopes(values: np.ndarray, codes: np.ndarray, n_codes: int, floor: float) -> tuple[np.ndarray, int]:
    """estimators.standardize_in_scopes: z = dev / std0 within each scope,
    std0 = scale·sqrt(m2 / count) (ddof = 0), from
    `shifted_moments` over the non-NaN values visited in `group_order` (ascending value, so
    the order of rows does not matter); z = 0 where std0 < floor and where u is NaN. Returns
    (z float64 [N], number of scopes with values whose std0 < floor)."""
    n = len(values)
    valid = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        if not np.isnan(values[i]):
            valid[m] = i
            m += 1
    valid = valid[:m]
    sub, count = group_order(codes[valid], values[valid], n_codes)
    order = valid[sub]
    dev, m2, scale, lo, hi = shifted_moments(values[order], count)
    z = np.zeros(n)
    n_flat = 0
    a = 0
    for c in range(n_codes):
        b = a + count[c]
        if count[c] > 0:
            std0 = scale[c] * np.sqrt(m2[c] / count[c])
            if not (std0 >= floor):
                n_flat += 1
            else:
                for i in range(a, b):
                    z[order[i]] = dev[i] / std0
        a = b
    return z, n_flat


@jit
def standardize_in_trajectories(values: np.ndarray, index: Index, floor: float) -> tuple[np.ndarray, int]:
    """estimators.standardize_in_trajectories: `standardize_in_scopes` with one scope per
    trajectory, its values visited in step order, one trajectory at a time in a small
    buffer. Returns (z float64 [N] per row, trajectories with values whose std0 < floor)."""
    rows, traj_start, traj_len = index.rows, index.start, index.length
    identity = len(rows) == 0
    z = np.zeros(len(values))
    longest = 1
    for t in range(len(traj_start)):
        longest = max(longest, traj_len[t])
    xs = np.empty(longest)
    at = np.empty(longest, dtype=np.int64)
    dev = np.empty(longest)
    n_flat = 0
    for t in range(len(traj_start)):
        m = 0
        for p in range(traj_start[t], traj_start[t] + traj_len[t]):
            r = p if identity else rows[p]
            if not np.isnan(values[r]):
                xs[m] = values[r]
                at[m] = r
                m += 1
        if m == 0:
            continue
        m2, scale, lo, hi = group_moments(xs, 0, m, dev)
        std0 = scale * np.sqrt(m2 / m)
        if not (std0 >= floor):
            n_flat += 1
        else:
            for i in range(m):
                z[at[i]] = dev[i] / std0
    return z, n_flat


@jit
def step_groups_by_hash(hashes: np.ndarray, index: Index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """step_groups.hash_codes: rows of one episode group with equal hashes share a code,
    numbered by first appearance in canonical order (the step_group_id written out); and the
    pairs of rows to compare exactly.

    The episode groups are taken one at a time, in the order of `index.walk` (trajectories grouped by
    episode group, each group's in canonical order: groups in the order the file holds them,
    so the rows visited stay close in memory). Within a group a small open-addressing table
    (linear probing) finds the code of a hash; codes count from 0 in the group, by first
    appearance in its canonical order; a last pass adds to each group's codes those of the
    groups before it in canonical order (`index.group_rank`). The pairs to compare exactly are found
    on the way: every row of a multi-row code, with the code's first row in file order.

    hashes: uint64 [N] per row. Returns (codes int64 [N] per row, pair rows, pair
    representatives int64 [P])."""
    n = len(hashes)
    rows, walk, traj_start, traj_len, traj_group = index.rows, index.walk, index.start, index.length, index.group
    group_rank = index.group_rank
    n_groups = len(group_rank)
    identity = len(rows) == 0
    codes = np.empty(n, dtype=np.int64)
    biggest = largest_group(index)
    cap = 16
    while cap < 2 * biggest:
        cap *= 2
    keys = np.empty(cap, dtype=np.uint64)
    slot_code = np.full(cap, -1, dtype=np.int64)
    size = np.zeros(max(biggest, 1), dtype=np.int64)
    rep = np.empty(max(biggest, 1), dtype=np.int64)
    codes_in_group = np.zeros(n_groups, dtype=np.int64)
    pair_rows = np.empty(n, dtype=np.int64)  # untouched pages cost nothing
    pair_reps = np.empty(n, dtype=np.int64)
    m = 0
    i = 0
    while i < len(walk):
        g = traj_group[walk[i]]
        j, total = group_end(index, i)
        width = 16
        while width < 2 * total:
            width *= 2
        mask = np.uint64(width - 1)
        k = 0
        for q in range(i, j):
            t = walk[q]
            for p in range(traj_start[t], traj_start[t] + traj_len[t]):
                row = p if identity else rows[p]
                h = hashes[row]
                s = np.int64((h ^ (h >> np.uint64(29))) & mask)
                while slot_code[s] >= 0 and keys[s] != h:
                    s = (s + 1) & (width - 1)
                c = slot_code[s]
                if c < 0:
                    c = k
                    keys[s] = h
                    slot_code[s] = c
                    size[c] = 0
                    rep[c] = row
                    k += 1
                codes[row] = c
                size[c] += 1
                if row < rep[c]:
                    rep[c] = row
        for q in range(i, j):
            t = walk[q]
            for p in range(traj_start[t], traj_start[t] + traj_len[t]):
                row = p if identity else rows[p]
                c = codes[row]
                if size[c] > 1 and row != rep[c]:
                    pair_rows[m] = row
                    pair_reps[m] = rep[c]
                    m += 1
        for slot in range(width):
            slot_code[slot] = -1
        codes_in_group[g] = k
        i = j
    by_rank = np.empty(n_groups, dtype=np.int64)
    for g in range(n_groups):
        by_rank[group_rank[g]] = g
    base = np.empty(n_groups, dtype=np.int64)
    acc = 0
    for r in range(n_groups):
        base[by_rank[r]] = acc
        acc += codes_in_group[by_rank[r]]
    for row in range(n):
        codes[row] += base[traj_group[index.row_traj[row]]]
    return codes, pair_rows[:m], pair_reps[:m]


@jit
def trajectory_sums(
    x: np.ndarray, u: np.ndarray, index: Index, mx: float, mu: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """summary.centred_sums: the second pass of the summary's correlation, per trajectory, in
    step order, over the steps where u is not NaN: the sums of (x − mx)², (u − mu)² and
    (x − mx)(u − mu). Returns three float64 [T] arrays (sxx, suu, sxu)."""
    rows, start, length = index.rows, index.start, index.length
    identity = len(rows) == 0
    n_traj = len(start)
    sxx = np.zeros(n_traj)
    suu = np.zeros(n_traj)
    sxu = np.zeros(n_traj)
    for t in range(n_traj):
        for i in range(start[t], start[t] + length[t]):
            r = i if identity else rows[i]
            if not np.isnan(u[r]):
                dx = x[r] - mx
                du = u[r] - mu
                sxx[t] += dx * dx
                suu[t] += du * du
                sxu[t] += dx * du
    return sxx, suu, sxu


@jit
def trajectory_summary(
    adv_episode: np.ndarray,
    adv_step: np.ndarray,
    step_weight: float,
    lam: np.ndarray,
    u: np.ndarray,
    index: Index,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """summary.trajectory_sums in one pass, each sum added in step order: Σ |A^E|,
    Σ |ω·A^S|, Σ λ, and over the steps where u is not NaN Σ λ, Σ u and their number.
    `lam` and `u` may be empty (no λ: those sums are 0). Returns six float64 [T] arrays."""
    rows, start, length = index.rows, index.start, index.length
    identity = len(rows) == 0
    with_lam = len(lam) > 0
    n_traj = len(start)
    abs_e = np.zeros(n_traj)
    abs_s = np.zeros(n_traj)
    lam_sum = np.zeros(n_traj)
    sx = np.zeros(n_traj)
    su = np.zeros(n_traj)
    count = np.zeros(n_traj)
    for t in range(n_traj):
        for i in range(start[t], start[t] + length[t]):
            r = i if identity else rows[i]
            abs_e[t] += abs(adv_episode[r])
            abs_s[t] += abs(step_weight * adv_step[r])
            if with_lam:
                lam_sum[t] += lam[r]
                if not np.isnan(u[r]):
                    sx[t] += lam[r]
                    su[t] += u[r]
                    count[t] += 1.0
    return abs_e, abs_s, lam_sum, sx, su, count


@jit
def trajectory_totals(x: np.ndarray, index: Index) -> np.ndarray:
    """estimators.trajectory_totals: per-trajectory sums of x added in step order.
    Returns float64 [T]."""
    rows, start, length = index.rows, index.start, index.length
    identity = len(rows) == 0
    out = np.zeros(len(start))
    for t in range(len(start)):
        acc = 0.0
        for i in range(start[t], start[t] + length[t]):
            acc += x[i if identity else rows[i]]
        out[t] = acc
    return out


def warm_up() -> None:
    """Compile (the first time) or load every kernel's machine code, calling each with tiny
    inputs of the types the library passes (`gaca advantages` runs this in a background
    thread while it reads the log, so that loading overlaps the read)."""
    f, i, b = np.zeros(2), np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.bool_)
    one = np.zeros(1, dtype=np.int64)
    index = Index(i[:0], one, np.full(1, 2, dtype=np.int64), one, np.zeros(2, dtype=np.int64), one, one)
    discounted_returns(f, index, 0.5)
    trajectory_totals(f, index)
    trajectory_index(i, i, i, b, f, 1)
    normalize_in_groups(f, i, 1, True, 1e-6)
    normalize_step_groups(f, i, 1, index, True, 1e-6)
    standardize_in_scopes(f, i, 1, 1e-8)
    standardize_in_trajectories(f, index, 1e-8)
    step_groups_by_hash(np.zeros(2, dtype=np.uint64), index)
    trajectory_sums(f, f, index, 0.0, 0.0)
    trajectory_summary(f, f, 1.0, f, f, index)


ENTRY_POINTS: tuple[Any, ...] = (
    discounted_returns,
    trajectory_totals,
    trajectory_index,
    normalize_in_groups,
    normalize_step_groups,
    standardize_in_scopes,
    standardize_in_trajectories,
    step_groups_by_hash,
    trajectory_sums,
    trajectory_summary,
)


def cached() -> bool:
    """Whether numba's cache on disk holds the machine code of every kernel the library calls,
    for these sources, this numba and this processor (read through numba's cache index, a
    private interface: a numba that changes it reads as "not cached", and `warm_up` fills it)."""
    try:
        magic = ENTRY_POINTS[0].targetctx.codegen().magic_tuple()
        return all(any(key[1] == magic for key in k._cache._cache_file._load_index()) for k in ENTRY_POINTS)
    except Exception:  # noqa: BLE001 - an interface that changed, an unreadable index: not cached
        return False
