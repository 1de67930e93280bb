"""The run summary of `gaca advantages` (printed on stderr, and by --json on stdout).

Every figure is the same whatever the order of rows in the file: sums run over each
trajectory's steps in step order, then over the trajectories in canonical order.
"""

from __future__ import annotations

import numpy as np

from gaca_cli.credit import _compiled
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.estimators import Advantages, Rollouts
from gaca_cli.log.index import TrajectoryIndex

#: the step-group sizes the summaries count steps by: (smallest, largest or None, label)
SIZE_BUCKETS = ((1, 1, "1"), (2, 2, "2"), (3, 4, "3-4"), (5, 8, "5-8"), (9, 16, "9-16"), (17, None, "17+"))


def summarize(rollouts: Rollouts, result: Advantages, config: AdvantagesConfig, warnings: dict[str, int]) -> dict:
    """The JSON-ready summary of one run: sizes, mean |A^E| and |ω·A^S|, the step groups' sizes
    (hgpo: the steps by their number of history groups), λ's mean, range and correlation with
    u, the diagnostics and the warnings' counts."""
    index = rollouts.index
    n = index.n_rows
    order = index.canonical_traj_order

    def total(per_traj: np.ndarray) -> float:
        return float(np.sum(per_traj[order]))

    lam, u = result.gaca_weight, rollouts.criticality
    with_lam = lam is not None and u is not None
    lam_u = (lam, u) if with_lam else (None, None)
    abs_e, abs_s, lam_sum, sum_lam_kept, sum_u_kept, n_kept = trajectory_sums(
        result.adv_episode, result.adv_step, config.step_weight, *lam_u, index
    )
    traj_per_group = np.bincount(index.traj_group, minlength=index.n_groups)
    summary: dict = {
        "method": config.method,
        "params": config.as_metadata(),
        "rows": n,
        "trajectories": index.n_traj,
        "groups": index.n_groups,
        "singleton_groups": int(np.sum(traj_per_group == 1)),
        "mean_abs_adv_episode": total(abs_e) / n,
        "mean_abs_weighted_adv_step": total(abs_s) / n,
        "diagnostics": dict(result.diagnostics),
        "warnings": dict(warnings),
    }
    if result.step_group_size is not None:
        top = SIZE_BUCKETS[-1][0]
        by_size = np.bincount(np.minimum(result.step_group_size, top), minlength=top + 1)
        counts = [int(by_size[lo : top + 1 if hi is None else hi + 1].sum()) for lo, hi, _ in SIZE_BUCKETS]
        summary["steps_by_step_group_size"] = {label: int(c) for (_, _, label), c in zip(SIZE_BUCKETS, counts)}
        summary["step_signal_share"] = float((n - counts[0]) / n)
    elif result.history_groups is not None:  # hgpo: steps by the number of history groups they are in
        joined = np.bincount(result.history_groups)
        summary["steps_by_history_groups"] = {str(k): int(c) for k, c in enumerate(joined)}
        summary["step_signal_share"] = float((n - joined[0]) / n) if n else 0.0
    else:
        summary["step_signal_share"] = 0.0
    if with_lam:
        assert lam is not None and u is not None
        k = total(n_kept)
        corr = None
        if k >= 2:
            means = (total(sum_lam_kept) / k, total(sum_u_kept) / k)
            corr = correlation(*(total(s) for s in centred_sums(lam, u, *means, index)))
        summary["lambda"] = {
            "bar": config.lambda_bar,
            "mean": total(lam_sum) / n,
            "min": float(lam.min()),
            "max": float(lam.max()),
            "corr_with_nll": corr,
        }
    return summary


def trajectory_sums(
    adv_episode: np.ndarray,
    adv_step: np.ndarray,
    step_weight: float,
    lam: np.ndarray | None,
    u: np.ndarray | None,
    index: TrajectoryIndex,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The summary's sums per trajectory, each added over its steps in step order:
    Σ |A^E|, Σ |ω·A^S|, Σ λ, and over the steps where u is not NaN Σ λ, Σ u and their number
    (the first pass of the correlation; 0 without λ). Arrays: float64 [N] per row.
    Returns six float64 [T]."""
    if kernels := _compiled.kernels():
        lam_u = (np.zeros(0), np.zeros(0)) if lam is None or u is None else (lam, u)
        return kernels.trajectory_summary(adv_episode, adv_step, float(step_weight), *lam_u, kernels.Index.of(index))

    def per_traj(traj: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(traj, values, minlength=index.n_traj).astype(np.float64, copy=False)

    traj = index.traj
    abs_e = per_traj(traj, np.abs(index.in_step_order(adv_episode)))
    abs_s = per_traj(traj, np.abs(step_weight * index.in_step_order(adv_step)))
    if lam is None or u is None:
        zero = np.zeros(index.n_traj)
        return abs_e, abs_s, zero, zero, zero, zero
    lam_steps, u_steps = index.in_step_order(lam), index.in_step_order(u)
    kept = ~np.isnan(u_steps)
    return (
        abs_e,
        abs_s,
        per_traj(traj, lam_steps),
        per_traj(traj[kept], lam_steps[kept]),
        per_traj(traj[kept], u_steps[kept]),
        per_traj(traj[kept]),
    )


def centred_sums(
    x: np.ndarray, u: np.ndarray, mean_x: float, mean_u: float, index: TrajectoryIndex
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The correlation's second pass: per trajectory, over its steps where u is not NaN in step
    order, Σ (x − mean_x)², Σ (u − mean_u)² and Σ (x − mean_x)(u − mean_u). x, u: float64 [N]
    per row. Returns three float64 [T]."""
    if kernels := _compiled.kernels():
        return kernels.trajectory_sums(x, u, kernels.Index.of(index), mean_x, mean_u)
    u_steps = index.in_step_order(u)
    kept = ~np.isnan(u_steps)
    traj = index.traj[kept]
    dx, du = index.in_step_order(x)[kept] - mean_x, u_steps[kept] - mean_u
    n = index.n_traj
    return (
        np.bincount(traj, dx * dx, minlength=n),
        np.bincount(traj, du * du, minlength=n),
        np.bincount(traj, dx * du, minlength=n),
    )


def correlation(sxx: float, suu: float, sxu: float) -> float | None:
    """Pearson's r from the centred sums; None when either side is constant (or not finite)."""
    if not (sxx > 0 and suu > 0):
        return None
    r = np.clip(sxu / np.sqrt(sxx * suu), -1.0, 1.0)
    return float(r) if np.isfinite(r) else None
