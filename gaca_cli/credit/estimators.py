"""Advantage estimators: GRPO, GiGPO, GACA and HGPO (docs/estimators.md).

Pure maths on numpy arrays: no files, no printing, no randomness. Every estimator has the
same signature, `(Rollouts, AdvantagesConfig) -> Advantages`, and `ESTIMATORS` maps method
names to them (the command line's choices come from that dict).

Layout. Per-row arrays are in the file's order. Sums along a trajectory run over its steps in
step order, through the row index (`TrajectoryIndex.in_step_order`); group statistics visit a
group's values in ascending order. So the results depend only on the log's content: shuffling
its rows or renaming its ids cannot change a single bit.

Precision. Group statistics use a shifted two-pass algorithm (`shifted_moments`): values are
shifted by the group minimum (exact for near-equal values, Sterbenz), the mean of the shifted
values is taken, and the squared deviations are summed in a second pass.

Large logs. In a run that uses them (chosen once per run by gaca_cli.credit._compiled), a
building block that passes over every row hands its work to its compiled twin
(gaca_cli.credit._kernels), which does the same float operations in the same order: the same
bits, sooner. The numpy code that follows each such hand-over is the definition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from gaca_cli.credit import _compiled
from gaca_cli.credit.config import EPS, Z_STD_FLOOR, AdvantagesConfig
from gaca_cli.log.index import TrajectoryIndex


@dataclass(frozen=True)
class Rollouts:
    """What every estimator reads: one log's per-row inputs, rows in the file's order, and the
    index that walks each trajectory's rows in step order (N rows, T trajectories, G groups).

    index:          the row index (gaca_cli.log.index.TrajectoryIndex)
    reward:         float64 [N] per-step reward r_t
    episode_reward: float64 [T] logged R(τ), or None to use Σ_t r_t
    step_group:     int64 [N]   step-group code (same episode group and anchor), or None
    criticality:    float64 [N] u_t (action NLL), NaN where the step has no action tokens
    row_return:     float64 [N] a return per row, or None. With episode statistics over steps
                    it replaces R(τ) row by row: an online trainer such as verl-agent gives
                    each step row its own episode score (its invalid-action penalty can make
                    the rows of one trajectory differ); a log has R(τ) per trajectory.
    """

    index: TrajectoryIndex
    reward: np.ndarray
    episode_reward: np.ndarray | None = None
    step_group: np.ndarray | None = None
    criticality: np.ndarray | None = None
    row_return: np.ndarray | None = None


@dataclass(frozen=True)
class Advantages:
    """Per-row outputs (float64 [N], rows in the file's order) and diagnostic counts."""

    advantage: np.ndarray
    return_to_go: np.ndarray
    adv_episode: np.ndarray
    adv_step: np.ndarray
    step_group_size: np.ndarray | None = None
    nll_z: np.ndarray | None = None
    gaca_weight: np.ndarray | None = None
    history_groups: np.ndarray | None = None
    diagnostics: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- building blocks


def discounted_returns(reward: np.ndarray, index: TrajectoryIndex, gamma: float) -> np.ndarray:
    """G_t = Σ_{k≥t} γ^{k−t} r_k within each trajectory (Eq. 5).

    Computed backwards as G_t = r_t + γ·G_{t+1} from G = r at the last step, the arithmetic of
    a plain loop, for every trajectory at once: pass k sets the k-th step from the end of each
    trajectory longer than k. reward: float64 [N] per row. Returns float64 [N] per row.
    """
    if kernels := _compiled.kernels():
        return kernels.discounted_returns(_f64(reward), kernels.Index.of(index), gamma)
    r = index.in_step_order(reward)
    g = np.empty_like(r, dtype=np.float64)
    by_length = np.argsort(-index.traj_len, kind="stable")  # longest first
    length = index.traj_len[by_length]
    last = (index.traj_start + index.traj_len - 1)[by_length]  # position of each last step
    g[last] = r[last]
    longest = int(length[0]) if len(length) else 0
    n_longer = np.searchsorted(-length, -np.arange(longest), side="left")  # trajectories longer than k
    with np.errstate(over="ignore"):  # huge rewards overflow to inf; the run refuses them
        for k in range(1, longest):
            at = last[: n_longer[k]] - k
            g[at] = r[at] + gamma * g[at + 1]
    return index.in_file_order(g)


def shifted_moments(
    xs: np.ndarray, count: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Two-pass moments of consecutive groups of xs: group c holds the next count[c] values.

    With lo and hi the group's minimum and maximum:
        shifted = x − lo;  mean = Σ shifted / count;  dev = shifted − mean;  m2 = Σ dev²
    every sum running through the group in the order given. Where the squares overflow
    (|dev| beyond ~1e154), scale = max |dev| and m2 = Σ (dev / scale)², else scale = 1.
    ±inf and NaN propagate as IEEE arithmetic says.

    xs: float64 [M]; count: int64 [K]. Returns (dev float64 [M]; m2, scale, lo, hi float64
    [K]); an empty group has m2 = lo = hi = 0.
    """
    k = len(count)
    group = np.repeat(np.arange(k, dtype=np.int64), count)
    used = count > 0
    start = (np.cumsum(count) - count)[used]
    lo, hi = np.zeros(k), np.zeros(k)
    if len(xs):
        lo[used] = np.minimum.reduceat(xs, start)
        hi[used] = np.maximum.reduceat(xs, start)
    with np.errstate(all="ignore"):
        shifted = xs - lo[group]
        mean = np.bincount(group, shifted, minlength=k) / count
        dev = shifted - mean[group]
        m2 = np.bincount(group, dev * dev, minlength=k).astype(np.float64, copy=False)
        scale = np.ones(k)
        big = ~np.isfinite(m2)
        if big.any():
            peak = np.zeros(k)
            np.maximum.at(peak, group, np.abs(dev))
            scale[big] = peak[big]
            ratio = dev / scale[group]
            m2[big] = np.bincount(group, ratio * ratio, minlength=k)[big]
    return dev, m2, scale, lo, hi


def normalize_in_groups(
    values: np.ndarray, codes: np.ndarray, n_codes: int, normalize_by_std: bool, eps: float = EPS
) -> tuple[np.ndarray, int, int]:
    """norm(x) within each group: (x − mean) / (std + ε) with std unbiased (ddof = 1), or
    x − mean. Groups of size 1 and groups whose values are all equal give 0.

    Each group's values are visited in ascending order (`shifted_moments`). values: float64
    [M]; codes: int64 [M] in 0..n_codes−1. Returns (float64 [M], number of singleton groups,
    number of constant groups of size ≥ 2).
    """
    if kernels := _compiled.kernels():
        out, n_single, n_constant = kernels.normalize_in_groups(
            _f64(values), _i64(codes), n_codes, normalize_by_std, eps
        )
        return out, int(n_single), int(n_constant)
    order = np.lexsort((values, codes))  # grouped by code, ascending within a group
    group = codes[order]
    count = np.bincount(group, minlength=n_codes)
    dev, m2, scale, lo, hi = shifted_moments(values[order], count)
    if normalize_by_std:
        with np.errstate(all="ignore"):
            std = scale * np.sqrt(m2 / (count - 1))
            normalized = dev / (std[group] + eps)
    else:
        normalized = dev
    constant = hi == lo
    normalized[(count == 1)[group] | constant[group]] = 0.0  # no baseline to compare with
    out = np.empty(len(values))
    out[order] = normalized
    return out, int(np.sum(count == 1)), int(np.sum(constant & (count >= 2)))


def standardize_in_scopes(values: np.ndarray, codes: np.ndarray, n_codes: int) -> tuple[np.ndarray, int]:
    """z = (u − mean) / std0 within each scope, std0 the population std (ddof = 0); z = 0
    where std0 < 1e-8 (constant or one-value scopes) and where u is NaN (no action tokens;
    such values are left out of the statistics).

    Each scope's values are visited in ascending order, so the order of rows does not matter.
    values: float64 [N] (NaN allowed); codes: int64 [N] in 0..n_codes−1. Returns (float64 [N],
    number of scopes with values whose std0 is below the floor).
    """
    if kernels := _compiled.kernels():
        z, n_flat = kernels.standardize_in_scopes(_f64(values), _i64(codes), n_codes, Z_STD_FLOOR)
        return z, int(n_flat)
    valid = np.flatnonzero(~np.isnan(values))
    order = valid[np.lexsort((values[valid], codes[valid]))]
    z, n_flat = _standardize(values[order], np.bincount(codes[order], minlength=n_codes))
    out = np.zeros(len(values))
    out[order] = z
    return out, n_flat


def standardize_in_trajectories(values: np.ndarray, index: TrajectoryIndex) -> tuple[np.ndarray, int]:
    """`standardize_in_scopes` with one scope per trajectory, its values visited in step order
    (an order that does not depend on the file's). values: float64 [N] per row (NaN allowed).
    Returns (z float64 [N] per row, trajectories with values whose std0 is below the floor)."""
    if kernels := _compiled.kernels():
        z, n_flat = kernels.standardize_in_trajectories(_f64(values), kernels.Index.of(index), Z_STD_FLOOR)
        return z, int(n_flat)
    u = index.in_step_order(values)
    valid = np.flatnonzero(~np.isnan(u))
    z, n_flat = _standardize(u[valid], np.bincount(index.traj[valid], minlength=index.n_traj))
    out = np.zeros(len(u))
    out[valid] = z
    return index.in_file_order(out), n_flat


def _standardize(xs: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, int]:
    """z of consecutive scopes of xs (scope c holds the next count[c] values, none NaN) and the
    number of non-empty scopes whose std0 is below the floor (their z is 0)."""
    dev, m2, scale, _, _ = shifted_moments(xs, count)
    with np.errstate(all="ignore"):
        std0 = scale * np.sqrt(m2 / count)
    flat = ~(std0 >= Z_STD_FLOOR)  # below the floor, or no values (NaN)
    scope = np.repeat(np.arange(len(count), dtype=np.int64), count)
    z = np.where(flat[scope], 0.0, dev / np.where(flat, 1.0, std0)[scope])
    return z, int(np.sum(flat & (count > 0)))


def trajectory_totals(values: np.ndarray, index: TrajectoryIndex) -> np.ndarray:
    """Σ x over each trajectory's steps, added in step order. values: float64 [N] per row.
    Returns float64 [T]."""
    if kernels := _compiled.kernels():
        return kernels.trajectory_totals(_f64(values), kernels.Index.of(index))
    return np.bincount(index.traj, index.in_step_order(values), minlength=index.n_traj)


def episode_returns(rollouts: Rollouts) -> np.ndarray:
    """R(τ): the logged episode_reward, else Σ_t r_t in step order. float64 [T]."""
    if rollouts.episode_reward is not None:
        return rollouts.episode_reward
    return trajectory_totals(rollouts.reward, rollouts.index)


def episode_advantage(rollouts: Rollouts, config: AdvantagesConfig) -> tuple[np.ndarray, dict]:
    """A^E(τ) = norm(R(τ)) over the trajectories of the episode group (Eq. 3), broadcast to
    every step: float64 [N] per row. With episode_stats="steps" the group's mean/std run over
    its step rows (each trajectory weighted by its length, as in the verl-agent reference code;
    R per row from `row_return` when given).

    A group of one member gives 0, or with singleton_groups="raw" its own value with mean 0
    and std 1: R, or R / (1 + ε) under std normalisation (verl-agent's rule)."""
    index, by_std, eps = rollouts.index, config.normalize_by_std, config.epsilon
    if config.episode_stats == "trajectories":
        values, codes = episode_returns(rollouts), index.traj_group
        per_traj, single, const = normalize_in_groups(values, codes, index.n_groups, by_std, eps)
        adv = per_traj[index.row_traj]
    else:
        given = rollouts.row_return
        values = episode_returns(rollouts)[index.row_traj] if given is None else given
        codes = index.traj_group[index.row_traj]
        adv, single, const = normalize_in_groups(values, codes, index.n_groups, by_std, eps)
    if config.singleton_groups == "raw" and single:  # mean 0, std 1: the member's own value
        own = values / (1.0 + eps) if by_std else values
        row_member = index.row_traj if config.episode_stats == "trajectories" else np.arange(index.n_rows)
        alone = (np.bincount(codes, minlength=index.n_groups) == 1)[codes][row_member]
        adv[alone] = own[row_member[alone]]
    return adv, {"episode_singleton_groups": single, "episode_constant_groups": const}


def step_advantage(
    rollouts: Rollouts, returns_to_go: np.ndarray, normalize_by_std: bool, eps: float = EPS
) -> tuple[np.ndarray, np.ndarray, dict]:
    """A^S_t = norm(G_t) over the step group of the row (Eq. 7); singleton step groups give 0.
    Returns (A^S float64 [N], step-group size int64 [N], diagnostics)."""
    codes, index = rollouts.step_group, rollouts.index
    assert codes is not None, "gigpo and gaca need step groups"
    n_codes = int(codes.max()) + 1
    if kernels := _compiled.kernels():  # episode group by episode group, local in memory
        done, adv, size, single, const = kernels.normalize_step_groups(
            _f64(returns_to_go), _i64(codes), n_codes, kernels.Index.of(index), normalize_by_std, eps
        )
        if done:  # (else codes shared between episode groups: the general pass below)
            diag = {"step_groups": n_codes, "step_singleton_groups": int(single), "step_constant_groups": int(const)}
            return adv, size, diag
    adv, single, const = normalize_in_groups(returns_to_go, codes, n_codes, normalize_by_std, eps)
    size = np.bincount(codes, minlength=n_codes)[codes]
    diag = {"step_groups": n_codes, "step_singleton_groups": single, "step_constant_groups": const}
    return adv, size.astype(np.int64, copy=False), diag


def gaca_blend(z: np.ndarray, gigpo: Advantages, config: AdvantagesConfig) -> tuple[np.ndarray, np.ndarray]:
    """The weight λ_t = clip(λ̄ + β·z_t, λ_min, λ_max), λ̄ = ω/(1+ω) where the step group is a
    singleton (no step signal to shift weight to), and the advantage
        A_t = A^E + ω·A^S + (1+ω)(λ_t − λ̄)(A^S − A^E)
    from GiGPO's A^E + ω·A^S (its `advantage`). Returns (λ, A) float64 [N]."""
    assert gigpo.step_group_size is not None
    lam_bar, omega = config.lambda_bar, config.step_weight
    with np.errstate(over="ignore"):  # β·z past the float range (β = 1e308) is ±inf: clipped to a bound
        lam = np.clip(lam_bar + config.beta * z, config.lambda_min, config.lambda_max)
    lam[gigpo.step_group_size == 1] = lam_bar
    adv = gigpo.advantage + (1.0 + omega) * (lam - lam_bar) * (gigpo.adv_step - gigpo.adv_episode)
    return lam, adv


# --------------------------------------------------------------------------- estimators


def grpo(rollouts: Rollouts, config: AdvantagesConfig) -> Advantages:
    """GRPO: A_t = A^E(τ) = norm(R(τ)) over the group's trajectories (Eq. 3); A^S = 0."""
    rtg = discounted_returns(rollouts.reward, rollouts.index, config.gamma)
    adv_e, diag = episode_advantage(rollouts, config)
    return Advantages(
        advantage=adv_e.copy(),
        return_to_go=rtg,
        adv_episode=adv_e,
        adv_step=np.zeros_like(adv_e),
        diagnostics=diag,
    )


def gigpo(rollouts: Rollouts, config: AdvantagesConfig) -> Advantages:
    """GiGPO: A_t = A^E(τ) + ω·A^S_t (Eq. 8), with A^S_t = norm(G_t) over the step group."""
    rtg = discounted_returns(rollouts.reward, rollouts.index, config.gamma)
    adv_e, diag = episode_advantage(rollouts, config)
    adv_s, size, step_diag = step_advantage(rollouts, rtg, config.normalize_by_std, config.epsilon)
    return Advantages(
        advantage=adv_e + config.step_weight * adv_s,
        return_to_go=rtg,
        adv_episode=adv_e,
        adv_step=adv_s,
        step_group_size=size,
        diagnostics={**diag, **step_diag},
    )


def gaca(rollouts: Rollouts, config: AdvantagesConfig) -> Advantages:
    """GACA: criticality-gated blend of the episode and step signals.

        z_t = (u_t − mean_scope u) / std0_scope(u)          (0 where std0 < 1e-8 or u is null)
        λ_t = clip(λ̄ + β·z_t, λ_min, λ_max),  λ̄ = ω/(1+ω)   (λ̄ where the step group is a singleton)
        A_t = (1+ω)·[(1−λ_t)·A^E + λ_t·A^S]

    A_t is evaluated in the algebraically equal form A^E + ω·A^S + (1+ω)(λ_t − λ̄)(A^S − A^E),
    so that λ_t = λ̄ (β = 0, singleton step groups) gives GiGPO's A_t bit for bit.
    """
    base = gigpo(rollouts, config)
    u, index = rollouts.criticality, rollouts.index
    assert u is not None and base.step_group_size is not None, "gaca needs a criticality score and step groups"
    if config.nll_scope == "trajectory":
        z, flat_scopes = standardize_in_trajectories(u, index)
    elif config.nll_scope == "group":
        z, flat_scopes = standardize_in_scopes(u, index.traj_group[index.row_traj], index.n_groups)
    else:
        z, flat_scopes = standardize_in_scopes(u, np.zeros(len(u), dtype=np.int64), 1)
    lam, adv = gaca_blend(z, base, config)
    diag = {**base.diagnostics, "nll_missing": int(np.sum(np.isnan(u))), "nll_flat_scopes": flat_scopes}
    return dataclasses.replace(base, advantage=adv, nll_z=z, gaca_weight=lam, diagnostics=diag)


def history_group_codes(step_group: np.ndarray, index: TrajectoryIndex, windows: int) -> Iterator[np.ndarray]:
    """The history groups of windows k = 1..`windows`: two positions share the code of window k
    when they lie in the same episode group and their last k anchors are equal, step for step
    (in any trajectories of the group, the same one included); −1 where the trajectory has
    had fewer than k steps.

    Window 1 is the step group; window k pairs the code of window k − 1 with the step group
    k − 1 steps back, numbered densely (np.unique). step_group: int64 [N] per position (step
    order). Yields one int64 [N] per window, per position.
    """
    step, window = index.step, step_group
    yield window
    base = int(step_group.max(initial=-1)) + 1
    for k in range(2, windows + 1):
        at = np.flatnonzero(step >= k - 1)
        pair = window[at] * base + step_group[at - (k - 1)]
        window = np.full(len(step), -1, dtype=np.int64)
        window[at] = np.unique(pair, return_inverse=True)[1].reshape(-1)
        yield window


def center_in_groups(values: np.ndarray, codes: np.ndarray, normalize_by_std: bool, eps: float) -> np.ndarray:
    """HGPO's normalisation within each group: (x − mean) / (std0 + ε), std0 the population
    std (ddof = 0), or x − mean; exactly 0 where x equals the mean (a singleton, a tie).

    Each group's values are visited in ascending order (`shifted_moments`). values: float64
    [M]; codes: int64 [M], ≥ 0. Returns float64 [M].
    """
    order = np.lexsort((values, codes))
    count = np.bincount(codes)
    dev, m2, scale, _, _ = shifted_moments(values[order], count)
    if normalize_by_std:
        with np.errstate(all="ignore"):
            dev = np.where(dev == 0.0, 0.0, dev / (scale * np.sqrt(m2 / count) + eps)[codes[order]])
    out = np.empty(len(values))
    out[order] = dev
    return out


def hgpo(rollouts: Rollouts, config: AdvantagesConfig) -> Advantages:
    """HGPO, hierarchy-of-groups credit (verl-agent's recipe/hgpo):

        a_{t,k} = norm0(G_t) over the steps of the episode group whose last k anchors equal
                  step t's, k = 1..K+1 (groups of two or more; norm0 with the population std)
        A_t     = Σ_i w_i·a_i / (Σ_i w_i + ε)   over the items i with a_i ≠ 0,
                  w = (k+1)^α for a_{t,k}; with base_group also a_0 = A^E(τ), w_0 = 1
        A_t     = 0 where no item is non-zero

    The items are added base first, then k ascending. `history_groups`: the number of
    groups of two or more each step is in. `adv_step` is 0; `adv_episode` A^E with
    base_group, else 0.
    """
    index, n = rollouts.index, rollouts.index.n_rows
    assert rollouts.step_group is not None, "hgpo needs step groups"
    rtg = discounted_returns(rollouts.reward, index, config.gamma)
    total, weight, joined = np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64)

    def add(item: np.ndarray, w: float) -> None:  # the non-zero rule
        used = item != 0.0
        total[used] += w * item[used]
        weight[used] += w

    adv_e, diag = np.zeros(n), dict[str, int]()
    if config.base_group:
        adv_e, diag = episode_advantage(rollouts, config)
        add(index.in_step_order(adv_e), 1.0)
    g, n_groups = index.in_step_order(rtg), 0
    windows = min(config.history_length + 1, int(index.traj_len.max()) if n else 1)  # none past the longest
    for k, code in enumerate(history_group_codes(index.in_step_order(rollouts.step_group), index, windows), 1):
        at = np.flatnonzero(code >= 0)
        size = np.bincount(code[at])
        shared = at[size[code[at]] > 1]  # a group of one gives no item
        item = np.zeros(n)
        item[shared] = center_in_groups(g[shared], code[shared], config.normalize_by_std, config.epsilon)
        add(item, float(k + 1) ** config.length_weight_alpha)
        joined[shared] += 1
        n_groups += int(np.sum(size > 1))
    with np.errstate(all="ignore"):
        adv = np.where(weight > 0.0, total / (weight + config.epsilon), 0.0)
    diag |= {"history_groups": n_groups, "steps_without_history_group": int(np.sum(joined == 0))}
    return Advantages(
        advantage=index.in_file_order(adv),
        return_to_go=rtg,
        adv_episode=adv_e,
        adv_step=np.zeros(n),
        history_groups=index.in_file_order(joined),
        diagnostics=diag,
    )


Estimator = Callable[[Rollouts, AdvantagesConfig], Advantages]

ESTIMATORS: dict[str, Estimator] = {"grpo": grpo, "gigpo": gigpo, "gaca": gaca, "hgpo": hgpo}


def _f64(values: np.ndarray) -> np.ndarray:
    """float64, contiguous, writable: the one array type the compiled loops are loaded for."""
    return np.require(values, np.float64, ("C", "W"))


def _i64(values: np.ndarray) -> np.ndarray:
    return np.require(values, np.int64, ("C", "W"))
