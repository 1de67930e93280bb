"""GACA as an advantage estimator of verl-agent's trainer (docs/verl-agent.md).

`compute_gaca_outcome_advantage` takes the arguments of verl-agent's
`compute_gigpo_outcome_advantage` (gigpo/core_gigpo.py, read at commit c23d586 of the fork
johnhaofu/verl-agent, whose history holds upstream commit 796ed31; upstream's function returns
`(scores, scores)`, the fork adds a third value) plus the batch's `old_log_prob`, and returns
what that function returns. It is an adapter, not a second implementation: the batch's rows
are handed to `gaca_cli.compute_advantages` (method gaca), the code `gaca advantages` runs,
checks included.

How a batch maps onto a log (one row per batch row, in batch order): docs/verl-agent.md. Note
γ = 0: verl-agent hands over G_t already discounted (`step_rewards`), and G_t = r_t + 0·G_{t+1}
= r_t exactly.

verl-agent's conventions are the defaults here (episode statistics over step rows, episode
groups of one keep their raw score, difflib similarity in batch order); each is an option of
`gaca advantages` too, so an offline run can match an online one.

Imports torch (the rest of gaca does not).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gaca_cli.credit import config as cfg
from gaca_cli.errors import GacaError

__all__ = ["compute_gaca_outcome_advantage"]

SOURCE = "verl-agent batch"  # what errors name as the file

# verl-agent's `mode` -> gaca's --norm (mean_norm: remove_std = True)
NORM_OF_MODE: dict[str, cfg.Norm] = {"mean_norm": "mean", "mean_std_norm": "std"}


def compute_gaca_outcome_advantage(  # noqa: PLR0913 (verl-agent's arguments, then GACA's)
    token_level_rewards: torch.Tensor,
    step_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    anchor_obs: np.ndarray,
    index: np.ndarray,
    traj_index: np.ndarray,
    epsilon: float = 1e-6,
    step_advantage_w: float = 1.0,
    mode: str = "mean_norm",
    enable_similarity: bool = False,
    similarity_thresh: float = 0.95,
    *,
    old_log_prob: torch.Tensor,
    beta: float = 0.1,
    nll_scope: cfg.NllScope = "trajectory",
    nll_reduce: cfg.NllReduce = "mean",
    lambda_min: float = 0.0,
    lambda_max: float = 1.0,
    episode_stats: cfg.EpisodeStats = "steps",
    singleton_groups: cfg.SingletonGroups = "raw",
    similarity_metric: cfg.SimilarityMetric = "difflib",
    similarity_order: cfg.SimilarityOrder = "rows",
) -> tuple[torch.Tensor, torch.Tensor]:
    """GACA's advantage of every row of a verl-agent batch, on the response tokens.

        A_t = A^E + ω·A^S_t + (1+ω)(λ_t − λ̄)(A^S_t − A^E),  λ_t = clip(λ̄ + β·z_t, λ_min, λ_max)

    (docs/estimators.md), with A^E from each row's Σ token_level_rewards, A^S_t from
    step_rewards (G_t) over its step group, z_t the standardised criticality u_t. β = 0 gives
    verl-agent's GiGPO, A^E + ω·A^S_t.

    token_level_rewards: [B, L] (any float dtype; the output is on its device, in the dtype that
                         torch promotes it and step_rewards' to, as verl-agent's sum is)
    step_rewards:        [B]    G_t of each row (verl-agent's compute_step_discounted_returns)
    response_mask:       [B, L] 1 on response tokens
    anchor_obs, index, traj_index: [B] anchor, episode-group uid, trajectory uid of each row
    epsilon, step_advantage_w (ω), mode, enable_similarity, similarity_thresh: as verl-agent's
    old_log_prob:        [B, L] per-token log-probabilities (verl's `old_log_probs`)
    beta, nll_scope, nll_reduce, lambda_min, lambda_max, episode_stats, singleton_groups,
    similarity_metric, similarity_order: the options of `gaca advantages` of those names

    Returns (advantages, returns): the same [B, L] tensor twice, A_t on the response mask and
    0 elsewhere, as verl-agent's GiGPO returns it. A bad option raises ConfigError (a
    ValueError); a batch that breaks a rule raises GacaError.
    """
    if mode not in NORM_OF_MODE:
        raise ValueError(f"mode = {mode!r} is not valid; use {' | '.join(NORM_OF_MODE)}")
    from gaca_cli.integrations.arrays import compute_advantages

    n = _check_shapes(token_level_rewards, step_rewards, response_mask, old_log_prob, anchor_obs, index, traj_index)
    with torch.no_grad():
        on_response = response_mask.bool()
        log_prob = torch.where(on_response, old_log_prob, 0.0)  # masked values never count, not even NaN
        nll = -log_prob.sum(dim=-1, dtype=torch.float64)
        n_tokens = on_response.sum(dim=-1).to(torch.float64)
        u = nll / n_tokens if nll_reduce == "mean" else nll
        u[n_tokens == 0] = float("nan")  # no action tokens: z_t = 0
        row_score = token_level_rewards.sum(dim=-1)  # verl-agent's episode score, summed in its dtype
    similarity = {"anchor_similarity": float(similarity_thresh), "similarity_metric": similarity_metric}
    result = compute_advantages(
        group_id=index,
        traj_id=traj_index,
        step_idx=_steps_in_batch_order(np.asarray(traj_index).reshape(-1)),
        reward=step_rewards.reshape(n),
        anchor=_anchors(anchor_obs, enable_similarity),
        nll=u,
        episode_reward=row_score,
        method="gaca",
        gamma=0.0,
        norm=NORM_OF_MODE[mode],
        step_weight=float(step_advantage_w),
        episode_stats=episode_stats,
        singleton_groups=singleton_groups,
        epsilon=float(epsilon),
        beta=float(beta),
        nll_scope=nll_scope,
        nll_reduce=nll_reduce,
        lambda_min=float(lambda_min),
        lambda_max=float(lambda_max),
        **({**similarity, "similarity_order": similarity_order} if enable_similarity else {}),
    )
    scores = result["advantage"].to(token_level_rewards.device).unsqueeze(-1) * on_response
    return scores, scores


def _steps_in_batch_order(traj: np.ndarray) -> np.ndarray:
    """Each row's rank among its trajectory's rows, in batch order."""
    _, code = np.unique(traj.astype(str), return_inverse=True)
    by_traj = np.argsort(code, kind="stable")
    count = np.bincount(code)
    step = np.empty(len(traj), dtype=np.int64)
    step[by_traj] = np.arange(len(traj), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    return step


def _anchors(anchor_obs: Any, text_needed: bool) -> np.ndarray:
    """Text anchors as they are; other values (arrays, numbers, dicts) as integer keys, equal
    values sharing one, as verl-agent groups them."""
    anchors = np.asarray(anchor_obs, dtype=object).reshape(-1)
    if all(isinstance(a, str) for a in anchors):
        return anchors
    if text_needed:
        raise GacaError(
            "similarity grouping compares text anchors; anchor_obs holds other values", file=SOURCE, column="anchor_obs"
        )
    keys: dict[object, int] = {}
    return np.array([keys.setdefault(_hashable(a), len(keys)) for a in anchors], dtype=np.int64)


def _hashable(value: Any) -> object:
    """A hashable stand-in for an anchor: numpy values as Python ones, arrays and sequences as
    tuples of their elements, dicts as sorted (key, value) tuples."""
    if isinstance(value, np.ndarray):
        return tuple(_hashable(v) for v in value.reshape(-1).tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _check_shapes(
    token_level_rewards: torch.Tensor,
    step_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_prob: torch.Tensor,
    *per_row: Any,
) -> int:
    """The batch size B, after checking that every argument has B rows (and [B, L] where a
    tensor has tokens)."""
    if token_level_rewards.dim() != 2:
        raise ValueError(f"token_level_rewards must be [batch, response_length], not {list(token_level_rewards.shape)}")
    n = token_level_rewards.shape[0]
    for name, tensor in (("response_mask", response_mask), ("old_log_prob", old_log_prob)):
        if tensor.shape != token_level_rewards.shape:
            raise ValueError(f"{name} is {list(tensor.shape)}, token_level_rewards {list(token_level_rewards.shape)}")
    if step_rewards.numel() != n:
        raise ValueError(f"step_rewards has {step_rewards.numel()} values for {n} rows")
    for name, values in zip(("anchor_obs", "index", "traj_index"), per_row):
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} values for {n} rows")
    return n
