"""GACA as an advantage estimator of verl-agent's trainer (docs/verl-agent.md).

`compute_gaca_outcome_advantage` takes the arguments of verl-agent's
`compute_gigpo_outcome_advantage` (gigpo/core_gigpo.py, read at commit c23d586 of the fork
johnhaofu/verl-agent, whose history holds upstream commit 796ed31; upstream's function returns
`(scores, scores)`, the fork adds a third value) plus the batch's `old_log_prob`, and returns
what that function returns. It is an adapter, not a second implementation: the batch's rows
become the rows of an in-memory log, checked by the same code as a log file
(`gaca_cli.log.checks.prepare_log`), grouped by the same step-group code, and the advantage is
`gaca_cli.credit.estimators.gaca`, the code `gaca advantages` runs.

How a batch maps onto a log (one row per batch row, in batch order):

| log                | from the batch                                                        |
|--------------------|-----------------------------------------------------------------------|
| group_id, traj_id  | `index` (verl-agent's `uid`), `traj_index` (`traj_uid`), as text      |
| step_idx           | the row's rank among its trajectory's rows in batch order             |
| reward, γ = 0      | `step_rewards`: verl-agent hands over G_t already discounted, and     |
|                    | G_t = r_t + 0·G_{t+1} = r_t exactly                                   |
| R per row          | Σ `token_level_rewards` over the row (verl-agent's episode score)     |
| anchor             | `anchor_obs`: text as `anchor_obs`, other values as integer keys      |
| u_t                | mean (or sum) of −`old_log_prob` over the row's response mask; none   |
|                    | for an empty response                                                 |

verl-agent's conventions are the defaults here (episode statistics over step rows, episode
groups of one keep their raw score, difflib similarity in batch order); each is an option of
`gaca advantages` too, so an offline run can match an online one.

Imports torch (the rest of gaca does not).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from gaca_cli.credit import config as cfg
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.estimators import Rollouts, gaca
from gaca_cli.credit.run import step_groups
from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.checks import CheckOptions, prepare_log
from gaca_cli.log.reading import Log

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
    config = AdvantagesConfig(
        method="gaca",
        gamma=0.0,
        norm=NORM_OF_MODE[mode],
        step_weight=float(step_advantage_w),
        episode_stats=episode_stats,
        anchor_similarity=float(similarity_thresh) if enable_similarity else None,
        similarity_metric=similarity_metric,
        similarity_order=similarity_order,
        singleton_groups=singleton_groups,
        epsilon=float(epsilon),
        beta=float(beta),
        nll_scope=nll_scope,
        nll_reduce=nll_reduce,
        lambda_min=float(lambda_min),
        lambda_max=float(lambda_max),
    )
    n = _check_shapes(token_level_rewards, step_rewards, response_mask, old_log_prob, anchor_obs, index, traj_index)
    with torch.no_grad():
        row_score = _f64(token_level_rewards.sum(dim=-1))  # verl-agent's episode score, summed in its dtype
        on_response = response_mask.bool()
        log_prob = torch.where(on_response, old_log_prob, 0.0)  # masked values never count, not even NaN
        nll = -_f64(log_prob.sum(dim=-1, dtype=torch.float64))
        n_tokens = _f64(on_response.sum(dim=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        u = nll / n_tokens if nll_reduce == "mean" else nll
    u[n_tokens == 0] = np.nan  # no action tokens: z_t = 0
    returns_to_go = _f64(step_rewards.reshape(n))

    log = _batch_log(returns_to_go, anchor_obs, index, traj_index, enable_similarity)
    rows, _ = prepare_log(log, "advantages:gigpo", CheckOptions.NONE)
    first_rows = rows.rows(rows.traj_start)
    if episode_stats == "trajectories" and not np.array_equal(row_score, row_score[first_rows][rows.row_traj]):
        raise GacaError(
            "episode statistics over trajectories need one score per trajectory, but the rows of a trajectory "
            "have different sums of token_level_rewards; use episode_stats='steps' (verl-agent's)",
            file=SOURCE,
            column="token_level_rewards",
        )
    rollouts = Rollouts(
        index=rows,
        reward=returns_to_go,
        episode_reward=row_score[first_rows],
        step_group=step_groups(log, rows, config),
        criticality=u,
        row_return=row_score if episode_stats == "steps" else None,
    )
    advantage = torch.from_numpy(gaca(rollouts, config).advantage)
    # verl-agent's A^E (token_level_rewards' dtype) + ω·A^S (step_rewards'): the promoted dtype
    dtype = torch.promote_types(token_level_rewards.dtype, step_rewards.dtype)
    advantage = advantage.to(device=token_level_rewards.device, dtype=dtype)
    scores = advantage.unsqueeze(-1) * on_response
    return scores, scores


def _batch_log(returns_to_go: np.ndarray, anchor_obs: Any, index: Any, traj_index: Any, text_needed: bool) -> Log:
    """The batch as an in-memory log (see the module's table): rows in batch order."""
    traj = _ids(traj_index, "traj_index")
    traj_code = pc.dictionary_encode(traj).indices.to_numpy()
    by_traj = np.argsort(traj_code, kind="stable")  # each trajectory's rows in batch order
    count = np.bincount(traj_code)
    step = np.empty(len(traj), dtype=np.int64)
    step[by_traj] = np.arange(len(traj), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    columns = {
        C.GROUP_ID: _ids(index, "index"),
        C.TRAJ_ID: traj,
        C.STEP_IDX: pa.array(step),
        C.REWARD: pa.array(returns_to_go),
    }
    anchors = list(np.asarray(anchor_obs, dtype=object).reshape(-1))
    try:
        columns[C.ANCHOR_OBS] = pa.array(anchors, pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        if text_needed:
            raise GacaError(
                "similarity grouping compares text anchors; anchor_obs holds other values",
                file=SOURCE,
                column="anchor_obs",
            ) from None
        keys: dict[object, int] = {}  # arrays, numbers, dicts: equal values share a key, as verl-agent groups them
        columns[C.ANCHOR_KEY] = pa.array([keys.setdefault(_hashable(a), len(keys)) for a in anchors], pa.int64())
    table = pa.table(columns)
    return Log(table=table, files=(SOURCE,), file_row_ends=np.array([table.num_rows], dtype=np.int64))


def _ids(values: Any, name: str) -> pa.Array:
    """uids as an Arrow column: text (verl-agent's uuids) or integers."""
    try:
        ids = pa.array(list(np.asarray(values, dtype=object).reshape(-1)))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        ids = None
    if ids is None or not (pa.types.is_string(ids.type) or pa.types.is_integer(ids.type)) or ids.null_count:
        raise GacaError(f"{name} must hold text or integer ids, none missing", file=SOURCE, column=name)
    return ids


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


def _f64(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(device="cpu", dtype=torch.float64).numpy()


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
