"""The advantages of a batch given as arrays (numpy or torch), for a trainer's own loop.

`compute_advantages` (also `gaca_cli.compute_advantages`) runs the checks and estimators of
`gaca advantages` on aligned per-row arrays held in memory: no file is read or written. The
verl-agent adapter (`gaca_cli.integrations.verl_agent`) is a call of it. torch is never
imported here: tensors come from a caller that has it loaded.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pyarrow as pa

from gaca_cli.config import options_config
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.run import compute_advantages as run_estimator
from gaca_cli.credit.run import gc_paused
from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.reading import memory_log

ARRAYS = "<arrays>"  # how errors name the input (GacaError.file)


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _numpy(x: Any) -> np.ndarray:
    """A flat numpy array (a float tensor as float64)."""
    if _is_tensor(x):
        x = x.detach().cpu()
        x = (x.double() if x.is_floating_point() else x).numpy()
    return np.asarray(x).reshape(-1)


def _ids(values: np.ndarray, name: str) -> pa.Array:
    """Ids or anchors as an Arrow column: text or integers, none missing."""
    try:
        ids = pa.array(values if values.dtype.kind in "iuU" else list(values))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        ids = None
    if ids is None or not (pa.types.is_string(ids.type) or pa.types.is_integer(ids.type)) or ids.null_count:
        raise GacaError(f"{name} must hold text or integer values, none missing", file=ARRAYS, column=name)
    return ids


def compute_advantages(  # noqa: PLR0913
    *,
    group_id: Any,
    traj_id: Any,
    step_idx: Any,
    reward: Any,
    anchor: Any = None,
    nll: Any = None,
    episode_reward: Any = None,
    method: str,
    **options: Any,
) -> dict[str, Any]:
    """The advantages of one batch of steps given as aligned arrays [N] (numpy arrays or torch
    tensors, one value per step row, in any order), for a trainer: no file is read or written.

    group_id, traj_id: text or integer ids; step_idx: integers 0..T-1 per trajectory;
    reward: r_t; anchor: text or integer anchor state (gigpo, gaca); nll: u_t, the action's
    NLL per token (nll_reduce="mean") or summed ("sum"), NaN for a step without action tokens
    (gaca); episode_reward: R(τ) per row (default Σ r_t); with episode_stats="steps" the rows
    of a trajectory may differ (an online trainer's per-row score, as verl-agent's).

    Returns {column: values [N]} for the columns `gaca advantages` writes (advantage,
    adv_episode, adv_step, return_to_go; step_group_id, step_group_size for gigpo and gaca;
    nll_z, gaca_weight for gaca), rows as given: float64 numpy arrays (int64 for the step-group
    columns), the bits of `gaca advantages` on the same rows; when `reward` is a torch tensor,
    tensors on its device, the float ones in the dtype torch promotes reward's and
    episode_reward's to (a float type), as verl-agent's sums are."""
    config = options_config(AdvantagesConfig, options, method=method)
    given = {"group_id": group_id, "traj_id": traj_id, "step_idx": step_idx, "reward": reward, "anchor": anchor}
    given |= {"nll": nll, "episode_reward": episode_reward}
    a = {name: _numpy(values) for name, values in given.items() if values is not None}
    n = len(a["reward"])
    for name, values in a.items():
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} values for {n} rewards")
    columns = {C.GROUP_ID: _ids(a["group_id"], "group_id"), C.TRAJ_ID: _ids(a["traj_id"], "traj_id")}
    columns |= {C.STEP_IDX: pa.array(a["step_idx"].astype(np.int64)), C.REWARD: pa.array(a["reward"].astype(float))}
    if anchor is not None:
        anchors = _ids(a["anchor"], "anchor")
        columns[C.ANCHOR_OBS if pa.types.is_string(anchors.type) else C.ANCHOR_KEY] = anchors
    if nll is not None:
        u = a["nll"].astype(np.float64)
        columns[C.NLL_MEAN if config.nll_reduce == "mean" else C.NLL_SUM] = pa.array(u, mask=np.isnan(u))
    row_return = None if episode_reward is None else a["episode_reward"].astype(np.float64)
    log = memory_log(pa.table(columns), None, ARRAYS)
    with gc_paused():
        run = run_estimator(log, config, row_return=row_return)
    out = {
        name: column.to_numpy(zero_copy_only=False)
        for name, column in zip(run.new_columns.column_names, run.new_columns.columns)
        if name != C.ADV_METHOD
    }
    if not _is_tensor(reward):
        return out
    torch = sys.modules["torch"]  # loaded: reward is a tensor
    dtype = reward.dtype if reward.dtype.is_floating_point else torch.get_default_dtype()
    if _is_tensor(episode_reward):
        dtype = torch.promote_types(dtype, episode_reward.dtype)
    return {
        k: torch.tensor(v, device=reward.device, dtype=dtype if v.dtype == np.float64 else None) for k, v in out.items()
    }
