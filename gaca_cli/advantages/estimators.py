"""Advantage estimators: GRPO, GiGPO and GACA (docs/estimators.md).

Pure maths on aligned numpy arrays: no files, no printing, no randomness. Every estimator
has the same signature, `(StepArrays, AdvantagesConfig) -> Advantages`, and `ESTIMATORS` maps
method names to them (the command line's choices come from that dict).

Precision. Group statistics use a shifted two-pass algorithm: values are shifted by the
group minimum (exact for near-equal values, Sterbenz), the mean of the shifted values is
taken, and the squared deviations are summed in a second pass. All sums within a group run
over the values in ascending order, so the result depends only on the multiset of values:
shuffling rows or renaming ids cannot change a single bit. The passes over every row run as
compiled loops (gaca_cli.advantages._kernels) doing exactly these operations in this order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gaca_cli.advantages.config import EPS, Z_STD_FLOOR, AdvantagesConfig


@dataclass(frozen=True)
class StepArrays:
    """One log, one entry per row, rows in any order (the file's); `rows` lists each
    trajectory's rows in step order, so sums over a trajectory run in step order and nothing
    depends on the order of rows in the file.

    rows:           int64 [N]  the rows of each trajectory in step order, trajectories one
                               after another (empty: the rows are already in that order)
    traj_start:     int64 [T]  where each trajectory starts in `rows`
    traj_len:       int64 [T]  its number of steps
    traj:           int64 [N]  trajectory code of each row, 0..T-1
    traj_group:     int64 [T]  episode-group code of each trajectory, 0..G-1
    walk:           int64 [T]  the trajectories grouped by episode group (grouping.group_walk)
    reward:         float64 [N] per-step reward r_t
    episode_reward: float64 [T] logged R(τ), or None to use Σ_t r_t
    step_group:     int64 [N]  step-group code (same episode group and anchor), or None
    criticality:    float64 [N] u_t (action NLL), NaN where the step has no action tokens
    """

    rows: np.ndarray
    traj_start: np.ndarray
    traj_len: np.ndarray
    traj: np.ndarray
    traj_group: np.ndarray
    walk: np.ndarray
    n_groups: int
    reward: np.ndarray
    episode_reward: np.ndarray | None = None
    step_group: np.ndarray | None = None
    criticality: np.ndarray | None = None

    @property
    def n_traj(self) -> int:
        return len(self.traj_group)


@dataclass(frozen=True)
class Advantages:
    """Per-row outputs (float64 [N], rows as in StepArrays) and diagnostic counts."""

    advantage: np.ndarray
    return_to_go: np.ndarray
    adv_episode: np.ndarray
    adv_step: np.ndarray
    step_group_size: np.ndarray | None = None
    nll_z: np.ndarray | None = None
    gaca_weight: np.ndarray | None = None
    diagnostics: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- building blocks


def discounted_returns(arrays: StepArrays, gamma: float) -> np.ndarray:
    """G_t = Σ_{k≥t} γ^{k−t} r_k within each trajectory (Eq. 5).

    Computed backwards as G_t = r_t + γ·G_{t+1} (G = r at the last step), the same
    arithmetic as a plain loop (kernels.discounted_returns). Returns float64 [N] per row.
    """
    from gaca_cli.advantages import _kernels as kernels  # numba: imported on use, not by `gaca --help`

    reward = np.ascontiguousarray(arrays.reward, dtype=np.float64)
    return kernels.discounted_returns(reward, arrays.rows, arrays.traj_start, arrays.traj_len, float(gamma))


def normalize_in_groups(
    values: np.ndarray, codes: np.ndarray, n_codes: int, normalize_by_std: bool
) -> tuple[np.ndarray, int, int]:
    """norm(x) within each group: (x − mean) / (std + ε) with std unbiased (ddof = 1), or
    x − mean. Groups of size 1 and groups whose values are all equal give 0.

    values: float64 [M]; codes: int64 [M] in 0..n_codes−1. Returns (float64 [M], number of
    singleton groups, number of constant groups of size ≥ 2). Computed in one compiled pass
    (kernels.normalize_in_groups).
    """
    from gaca_cli.advantages import _kernels as kernels  # numba: imported on use, not by `gaca --help`

    values = np.ascontiguousarray(values, dtype=np.float64)
    codes = np.ascontiguousarray(codes, dtype=np.int64)
    out, n_singleton, n_constant = kernels.normalize_in_groups(values, codes, n_codes, normalize_by_std, EPS)
    return out, int(n_singleton), int(n_constant)


def standardize_in_scopes(values: np.ndarray, codes: np.ndarray, n_codes: int) -> tuple[np.ndarray, int]:
    """z = (u − mean) / std0 within each scope, std0 the population std (ddof = 0); z = 0
    where std0 < 1e-8 (constant or one-value scopes) and where u is NaN (no action tokens;
    such values are left out of the statistics).

    values: float64 [N] (NaN allowed); codes: int64 [N]. Returns (float64 [N], number of
    scopes with values whose std0 is below the floor). Values are visited in ascending order
    within a scope, so the order of rows does not matter. One compiled pass
    (kernels.standardize_in_scopes; per trajectory in step order: standardize_in_trajectories).
    """
    from gaca_cli.advantages import _kernels as kernels  # numba: imported on use, not by `gaca --help`

    values = np.ascontiguousarray(values, dtype=np.float64)
    codes = np.ascontiguousarray(codes, dtype=np.int64)
    z, n_flat = kernels.standardize_in_scopes(values, codes, n_codes, Z_STD_FLOOR)
    return z, int(n_flat)


def trajectory_totals(values: np.ndarray, arrays: StepArrays, scale: float = 1.0, absolute: bool = False) -> np.ndarray:
    """Σ scale·x (or Σ |scale·x|) over each trajectory's steps, added in step order. float64 [T]."""
    from gaca_cli.advantages import _kernels as kernels  # numba: imported on use, not by `gaca --help`

    values = np.ascontiguousarray(values, dtype=np.float64)
    return kernels.trajectory_totals(values, arrays.rows, arrays.traj_start, arrays.traj_len, float(scale), absolute)


def episode_returns(arrays: StepArrays) -> np.ndarray:
    """R(τ): the logged episode_reward, else Σ_t r_t in step order. float64 [T]."""
    if arrays.episode_reward is not None:
        return arrays.episode_reward
    return trajectory_totals(arrays.reward, arrays)


def episode_advantage(arrays: StepArrays, normalize_by_std: bool, stats_over: str) -> tuple[np.ndarray, dict]:
    """A^E(τ) = norm(R(τ)) over the trajectories of the episode group (Eq. 3), broadcast to
    every step: float64 [N]. With stats_over="steps" the group's mean/std run over its step
    rows (each trajectory weighted by its length, as in the verl-agent reference code)."""
    ret = episode_returns(arrays)
    if stats_over == "trajectories":
        per_traj, single, const = normalize_in_groups(ret, arrays.traj_group, arrays.n_groups, normalize_by_std)
        adv = per_traj[arrays.traj]
    else:
        adv, single, const = normalize_in_groups(
            ret[arrays.traj], arrays.traj_group[arrays.traj], arrays.n_groups, normalize_by_std
        )
    return adv, {"episode_singleton_groups": single, "episode_constant_groups": const}


def step_advantage(
    arrays: StepArrays, returns_to_go: np.ndarray, normalize_by_std: bool
) -> tuple[np.ndarray, np.ndarray, dict]:
    """A^S_t = norm(G_t) over the step group of the row (Eq. 7); singleton step groups give 0.
    Returns (A^S float64 [N], step-group size int64 [N], diagnostics)."""
    from gaca_cli.advantages import _kernels as kernels  # numba: imported on use, not by `gaca --help`

    codes = arrays.step_group
    assert codes is not None, "gigpo and gaca need step groups"
    n_codes = int(codes.max()) + 1
    # episode group by episode group (step groups never span two), local in memory
    by_group, adv, size, n_singleton, const = kernels.normalize_step_groups(
        np.ascontiguousarray(returns_to_go, dtype=np.float64), np.ascontiguousarray(codes, dtype=np.int64), n_codes,
        arrays.rows, arrays.traj_start, arrays.traj_len, arrays.traj_group, arrays.walk, normalize_by_std, EPS,
    )
    if not by_group:  # codes that span episode groups: the general pass
        adv, n_singleton, const = normalize_in_groups(returns_to_go, codes, n_codes, normalize_by_std)
        size = np.bincount(codes, minlength=n_codes)[codes].astype(np.int64)
    diag = {"step_groups": n_codes, "step_singleton_groups": int(n_singleton), "step_constant_groups": int(const)}
    return adv, size, diag


# --------------------------------------------------------------------------- estimators


def grpo(arrays: StepArrays, config: AdvantagesConfig) -> Advantages:
    """GRPO: A_t = A^E(τ) = norm(R(τ)) over the group's trajectories (Eq. 3); A^S = 0."""
    rtg = discounted_returns(arrays, config.gamma)
    adv_e, diag = episode_advantage(arrays, config.normalize_by_std, config.episode_stats)
    return Advantages(
        advantage=adv_e.copy(),
        return_to_go=rtg,
        adv_episode=adv_e,
        adv_step=np.zeros_like(adv_e),
        diagnostics=diag,
    )


def gigpo(arrays: StepArrays, config: AdvantagesConfig) -> Advantages:
    """GiGPO: A_t = A^E(τ) + ω·A^S_t (Eq. 8), with A^S_t = norm(G_t) over the step group."""
    rtg = discounted_returns(arrays, config.gamma)
    adv_e, diag = episode_advantage(arrays, config.normalize_by_std, config.episode_stats)
    adv_s, size, step_diag = step_advantage(arrays, rtg, config.normalize_by_std)
    return Advantages(
        advantage=adv_e + config.step_weight * adv_s,
        return_to_go=rtg,
        adv_episode=adv_e,
        adv_step=adv_s,
        step_group_size=size,
        diagnostics={**diag, **step_diag},
    )


def gaca(arrays: StepArrays, config: AdvantagesConfig) -> Advantages:
    """GACA: criticality-gated blend of the episode and step signals.

        z_t = (u_t − mean_scope u) / std0_scope(u)          (0 where std0 < 1e-8 or u is null)
        λ_t = clip(λ̄ + β·z_t, λ_min, λ_max),  λ̄ = ω/(1+ω)   (λ̄ where the step group is a singleton)
        A_t = (1+ω)·[(1−λ_t)·A^E + λ_t·A^S]

    A_t is evaluated in the algebraically equal form A^E + ω·A^S + (1+ω)(λ_t − λ̄)(A^S − A^E),
    so that λ_t = λ̄ (β = 0, singleton step groups) gives GiGPO's A_t bit for bit.
    """
    base = gigpo(arrays, config)
    u = arrays.criticality
    assert u is not None, "gaca needs a criticality score"
    from gaca_cli.advantages import _kernels as kernels  # numba: imported on use, not by `gaca --help`

    u = np.ascontiguousarray(u, dtype=np.float64)
    if config.nll_scope == "trajectory":  # each trajectory's steps in step order (canonical): no sort
        z, flat_scopes = kernels.standardize_in_trajectories(u, arrays.rows, arrays.traj_start, arrays.traj_len,
                                                              Z_STD_FLOOR)
        flat_scopes = int(flat_scopes)
    elif config.nll_scope == "group":
        z, flat_scopes = standardize_in_scopes(u, arrays.traj_group[arrays.traj], arrays.n_groups)
    else:
        z, flat_scopes = standardize_in_scopes(u, np.zeros(len(u), dtype=np.int64), 1)
    assert base.step_group_size is not None
    # λ and A in one compiled pass, the float operations of
    #   lam = clip(λ̄ + β·z, λ_min, λ_max); lam[size == 1] = λ̄
    #   adv = A_gigpo + (1 + ω)·(lam − λ̄)·(A^S − A^E)
    lam, adv = kernels.gaca_blend(
        z, base.step_group_size, base.adv_episode, base.adv_step, base.advantage, config.lambda_bar, config.beta,
        config.lambda_min, config.lambda_max, config.step_weight,
    )
    diag = {**base.diagnostics, "nll_missing": int(np.sum(np.isnan(u))), "nll_flat_scopes": flat_scopes}
    return Advantages(
        advantage=adv,
        return_to_go=base.return_to_go,
        adv_episode=base.adv_episode,
        adv_step=base.adv_step,
        step_group_size=base.step_group_size,
        nll_z=z,
        gaca_weight=lam,
        diagnostics=diag,
    )


Estimator = Callable[[StepArrays, AdvantagesConfig], Advantages]

ESTIMATORS: dict[str, Estimator] = {"grpo": grpo, "gigpo": gigpo, "gaca": gaca}
