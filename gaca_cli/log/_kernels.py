"""The compiled twin (numba) of the row index, for large logs: the structure rules of the log
schema and the placement of every row in (trajectory, step) order in one pass each, where the
numpy code of gaca_cli.log.checks (the definition, and the one that reports offending rows)
takes several. Chosen by the caller (`prepare_log(..., CheckOptions.COMPILED)`: `gaca advantages` on a
large log, see gaca_cli/credit/_compiled.py); same conventions as
gaca_cli.credit._kernels (cached next to this file, no fastmath)."""

from __future__ import annotations

import numpy as np
from numba import njit

jit = njit(cache=True, nogil=True, error_model="numpy")


@jit
def counts_and_starts(codes: np.ndarray, n_codes: int) -> tuple[np.ndarray, np.ndarray]:
    """How many entries of `codes` (int64 in 0..n_codes−1) hold each code, and where each code's
    block starts when the entries are laid out grouped by code (exclusive prefix sums of the
    counts). Returns (count, start), int64 [n_codes] each."""
    count = np.zeros(n_codes, dtype=np.int64)
    for i in range(len(codes)):
        count[codes[i]] += 1
    start = np.empty(n_codes, dtype=np.int64)
    acc = 0
    for c in range(n_codes):
        start[c] = acc
        acc += count[c]
    return count, start


@jit
def trajectory_index(
    traj: np.ndarray, step: np.ndarray, group: np.ndarray, done: np.ndarray, episode_reward: np.ndarray, n_traj: int
) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """checks._structure_checks: the structure rules of log-schema.md and the row index, in
    three passes: whether every trajectory's steps are 0..T−1 without duplicates, all its rows
    have one group, `episode_reward` (when given) is constant and `done` (when given) is true
    at most on its last step. When a rule is broken the checks' numpy code finds and reports
    the offending rows; the index is then not valid.

    traj: int64 [N] in 0..n_traj−1; step, group: int64 [N]; done: bool [N] or empty;
    episode_reward: float64 [N] or empty. Returns (every rule holds, order int64 [N] file row
    of each position (trajectories by code, steps ascending), start, length, group int64 [T])."""
    n = len(traj)
    length, start = counts_and_starts(traj, n_traj)
    order = np.empty(n, dtype=np.int64)
    traj_group = np.empty(n_traj, dtype=np.int64)
    filled = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        t = traj[i]
        s = step[i]
        if s < 0 or s >= length[t] or filled[start[t] + s]:
            return False, order, start, length, traj_group
        filled[start[t] + s] = True
        order[start[t] + s] = i
    check_done = len(done) > 0
    check_reward = len(episode_reward) > 0
    for t in range(n_traj):
        first = order[start[t]]
        traj_group[t] = group[first]
        last = start[t] + length[t] - 1
        for p in range(start[t], last + 1):
            r = order[p]
            if group[r] != traj_group[t]:
                return False, order, start, length, traj_group
            if check_reward and not (episode_reward[r] == episode_reward[first]):
                return False, order, start, length, traj_group
            if check_done and done[r] and p != last:
                return False, order, start, length, traj_group
    return True, order, start, length, traj_group
