"""Compiled loops (numba) for the passes over every row that numpy would split into many
full-array temporaries.

Each kernel does the same floating-point operations, in the same order, as the plain numpy
expression in its docstring, so results are bit for bit those of the numpy formulation
(numba does not reorder float arithmetic unless asked to with fastmath, which is not used
here; error_model="numpy" gives IEEE inf/NaN instead of ZeroDivisionError). The slow twins
in tests/reference.py check the maths; tests/test_kernels.py checks each kernel against its
numpy formulation. Kernels are compiled on first use and cached next to this file (or in
numba's user cache when that is not writable); importing numba and loading the cache takes
about a second, which `gaca advantages` overlaps with reading the log (`warm_up`), and which
commands that only check a log never pay (they do not use these kernels).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_SMALL = 24  # groups up to this size are sorted by insertion (no allocation)

jit = njit(cache=True, nogil=True, error_model="numpy")


@jit
def discounted_returns(reward: np.ndarray, traj_start: np.ndarray, traj_len: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = r_t + γ·G_{t+1} backwards within each trajectory, G = r at its last step.

    reward: float64 [N], trajectories contiguous, steps ascending; traj_start, traj_len:
    int64 [T]. Returns float64 [N]."""
    out = np.empty_like(reward)
    for t in range(len(traj_start)):
        a = traj_start[t]
        k = a + traj_len[t] - 1
        g = reward[k]
        out[k] = g
        for i in range(k - 1, a - 1, -1):
            g = reward[i] + gamma * g
            out[i] = g
    return out


@jit
def group_order(codes: np.ndarray, values: np.ndarray, n_codes: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions grouped by code (groups in code order), ascending by value within a group;
    and the size of each group. The same as np.lexsort((values, codes)) up to the order of
    equal values, which is moot for sums. codes: int64 [M] in 0..n_codes−1; values: float64 [M]
    without NaN. Returns (order int64 [M], count int64 [n_codes])."""
    m = len(codes)
    count = np.zeros(n_codes, dtype=np.int64)
    for i in range(m):
        count[codes[i]] += 1
    fill = np.empty(n_codes, dtype=np.int64)
    acc = 0
    for c in range(n_codes):
        fill[c] = acc
        acc += count[c]
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
def shifted_moments(
    xs: np.ndarray, count: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Shifted two-pass moments of consecutive groups of xs (group c holds count[c] values).

    With cs the group of each value and lo/hi the group minimum/maximum, this is exactly
        shifted = xs − lo[cs];  mean = bincount(cs, shifted) / count
        dev = shifted − mean[cs];  m2 = bincount(cs, dev·dev)
    and, for groups whose m2 overflowed, scale = max |dev| and m2 = Σ (dev / scale)².
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
            low = xs[a]
            high = xs[a]
            for i in range(a + 1, b):  # as np.minimum/np.maximum: NaN wins, ties take the later
                if not (low < xs[i] or np.isnan(low)):
                    low = xs[i]
                if not (high > xs[i] or np.isnan(high)):
                    high = xs[i]
            lo[c] = low
            hi[c] = high
            s = 0.0
            for i in range(a, b):
                s += xs[i] - low
            mean = s / count[c]
            q = 0.0
            for i in range(a, b):
                d = (xs[i] - low) - mean
                dev[i] = d
                q += d * d
            if not np.isfinite(q):  # squares overflowed (|dev| beyond ~1e154)
                peak = 0.0
                for i in range(a, b):
                    peak = np.maximum(peak, abs(dev[i]))  # NaN propagates, as in numpy
                q = 0.0
                for i in range(a, b):
                    r = dev[i] / peak
                    q += r * r
                scale[c] = peak
            m2[c] = q
        a = b
    return dev, m2, scale, lo, hi


@jit
def normalize_in_groups(
    values: np.ndarray, codes: np.ndarray, n_codes: int, normalize_by_std: bool, eps: float
) -> tuple[np.ndarray, int, int]:
    """norm(x) within each group, from `shifted_moments` over the values in `group_order`:
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
    dev, m2, scale, lo, hi = shifted_moments(values[order], sub_count)
    n_constant = 0
    a = 0
    for c in range(n_shared):
        b = a + sub_count[c]
        if hi[c] == lo[c]:
            n_constant += 1
        elif normalize_by_std:
            denom = scale[c] * np.sqrt(m2[c] / (sub_count[c] - 1)) + eps
            for i in range(a, b):
                out[order[i]] = dev[i] / denom
        else:
            for i in range(a, b):
                out[order[i]] = dev[i]
        a = b
    return out, n_singleton, n_constant


@jit
def standardize_in_scopes(
    values: np.ndarray, codes: np.ndarray, n_codes: int, in_order: bool, floor: float
) -> tuple[np.ndarray, int]:
    """z = dev / std0 within each scope, std0 = scale·sqrt(m2 / count) (ddof = 0), from
    `shifted_moments` over the non-NaN values; z = 0 where std0 < floor and where u is NaN.
    in_order: the values already come scope by scope (codes non-decreasing) in an order that
    does not depend on the file (steps of a trajectory); else they are visited in
    `group_order`. Returns (z float64 [N], number of scopes with values whose std0 < floor)."""
    n = len(values)
    valid = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        if not np.isnan(values[i]):
            valid[m] = i
            m += 1
    valid = valid[:m]
    if in_order:
        order = valid
        count = np.zeros(n_codes, dtype=np.int64)
        for i in range(m):
            count[codes[valid[i]]] += 1
    else:
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
def sorted_runs(key: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of equal keys in sorted order. order: int64 [N], positions sorted by key.
    Returns (run int64 [N]: run number of each position, numbered in sorted order; rows and
    reps int64 [P]: every member of a run of two or more but its first, with that first
    member, the pairs whose anchors must be compared)."""
    n = len(order)
    run = np.empty(n, dtype=np.int64)
    rows = np.empty(n, dtype=np.int64)
    reps = np.empty(n, dtype=np.int64)
    p = 0
    r = -1
    rep = -1
    for i in range(n):
        row = order[i]
        if i == 0 or key[row] != key[order[i - 1]]:
            r += 1
            rep = row
        else:
            rows[p] = row
            reps[p] = rep
            p += 1
        run[row] = r
    return run, rows[:p], reps[:p]


@jit
def renumber_by_first_position(codes: np.ndarray, position: np.ndarray, n_codes: int) -> np.ndarray:
    """Codes renumbered 0..K'−1 in order of each code's smallest `position` (a permutation of
    0..N−1): the numbering a reader sees walking the rows in that order. Unused codes are
    skipped. codes: int64 [N] in 0..n_codes−1. Returns int64 [N]."""
    n = len(codes)
    first = np.full(n_codes, n, dtype=np.int64)
    for i in range(n):
        c = codes[i]
        if position[i] < first[c]:
            first[c] = position[i]
    owner = np.full(n, -1, dtype=np.int64)  # position -> the code first seen there
    for c in range(n_codes):
        if first[c] < n:
            owner[first[c]] = c
    new = np.empty(n_codes, dtype=np.int64)
    k = 0
    for pos in range(n):
        if owner[pos] >= 0:
            new[owner[pos]] = k
            k += 1
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        out[i] = new[codes[i]]
    return out


@jit
def trajectory_sums(
    x: np.ndarray, u: np.ndarray, start: np.ndarray, length: np.ndarray, mx: float, mu: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-trajectory sums, in step order, over the steps where u is not NaN, of
    x, u, (x − mx)², (u − mu)² and (x − mx)(u − mu); and the number of such steps.
    Returns six float64 [T] arrays (sx, su, sxx, suu, sxu, count)."""
    n_traj = len(start)
    sx = np.zeros(n_traj)
    su = np.zeros(n_traj)
    sxx = np.zeros(n_traj)
    suu = np.zeros(n_traj)
    sxu = np.zeros(n_traj)
    count = np.zeros(n_traj)
    for t in range(n_traj):
        for i in range(start[t], start[t] + length[t]):
            if not np.isnan(u[i]):
                dx = x[i] - mx
                du = u[i] - mu
                sx[t] += x[i]
                su[t] += u[i]
                sxx[t] += dx * dx
                suu[t] += du * du
                sxu[t] += dx * du
                count[t] += 1.0
    return sx, su, sxx, suu, sxu, count


def warm_up() -> None:
    """Compile (the first time) or load every kernel's machine code, calling each with tiny
    inputs of the types the library passes. `gaca advantages` runs this in a background
    thread while it reads the log, so numba's start-up overlaps the read."""
    f = np.zeros(2)
    i = np.zeros(2, dtype=np.int64)
    start = np.zeros(1, dtype=np.int64)
    length = np.full(1, 2, dtype=np.int64)
    discounted_returns(f, start, length, 0.5)
    normalize_in_groups(f, i, 1, True, 1e-6)
    standardize_in_scopes(f, i, 1, True, 1e-8)
    standardize_in_scopes(f, i, 1, False, 1e-8)
    sorted_runs(np.zeros(2, dtype=np.uint64), np.arange(2, dtype=np.int64))
    renumber_by_first_position(i, np.arange(2, dtype=np.int64), 1)
    trajectory_sums(f, f, start, length, 0.0, 0.0)
