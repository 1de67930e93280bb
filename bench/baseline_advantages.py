"""The per-row baseline that bench/advantages.py compares `gaca advantages` with.

A straightforward Python implementation in the style of the public verl-agent reference code
for GiGPO (gigpo/core_gigpo.py): ids kept as Python strings in object arrays, dicts of lists
keyed by uid, `np.where` over the batch for every trajectory and every group, and per-row
loops for the normalisation. It follows docs/estimators.md (the same edge-case rules
as gaca_cli: singleton or constant groups give 0, std is ddof = 1, NLL z-scores use the
population std), so its numbers agree with the fast code; the benchmark checks that.

Like the reference, it works one training batch at a time (`batch_groups` episode groups,
default 16 groups of 8 rollouts, a common verl-agent `train_batch_size`), so its cost grows
linearly with the number of rows and extrapolating it linearly is fair. It is deliberately
kinder than the reference in one place: results are scattered back with the row indices it
already holds, not with one `np.where` per row over the batch as the reference does in
`compute_step_discounted_returns`. `recombine_per_row=True` does that, as the reference code
does; bench/advantages.py uses it by default (`--baseline-style reference`, the baseline the
issue names) and the kinder form with `--baseline-style kind`.

    python bench/baseline_advantages.py LOG.parquet --method gaca -o OUT.parquet
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

EPS = 1e-6
Z_STD_FLOOR = 1e-8


# --------------------------------------------------------------------- per-batch functions


def step_discounted_returns(
    rewards: np.ndarray, traj_uids: np.ndarray, steps: np.ndarray, gamma: float, recombine_per_row: bool = False
) -> np.ndarray:
    """G_t = r_t + γ·G_{t+1}, trajectory by trajectory, found with np.where over the batch.

    `recombine_per_row` scatters the results back as the reference code does: for every row,
    one np.where over the batch to find its trajectory, and one to find its place in it."""
    all_returns = np.zeros(len(rewards), dtype=np.float64)
    if recombine_per_row:
        returns_by_traj = {}
        for uid in np.unique(traj_uids):
            traj_indices = np.where(traj_uids == uid)[0]
            traj_indices = traj_indices[np.argsort(steps[traj_indices], kind="stable")]
            traj_returns = np.zeros(len(traj_indices))
            running = 0.0
            for t in reversed(range(len(traj_indices))):
                running = rewards[traj_indices[t]] + gamma * running
                traj_returns[t] = running
            returns_by_traj[uid] = (traj_indices, traj_returns)
        for i, uid in enumerate(traj_uids):
            traj_indices = np.where(traj_uids == uid)[0]
            traj_indices = traj_indices[np.argsort(steps[traj_indices], kind="stable")]
            idx_in_traj = np.where(traj_indices == i)[0][0]
            all_returns[i] = returns_by_traj[uid][1][idx_in_traj]
        return all_returns
    for uid in np.unique(traj_uids):
        traj_indices = np.where(traj_uids == uid)[0]
        traj_indices = traj_indices[np.argsort(steps[traj_indices], kind="stable")]
        running = 0.0
        for i in reversed(traj_indices.tolist()):
            running = rewards[i] + gamma * running
            all_returns[i] = running
    return all_returns


def _normalize(id2score: dict, keys: list, values: list, by_std: bool) -> np.ndarray:
    """Per-row (x − mean) / (std + ε) or x − mean with each row's key; singleton and
    constant groups give 0."""
    id2mean, id2std, id2flat = {}, {}, {}
    for key, scores in id2score.items():
        arr = np.array(scores, dtype=np.float64)
        id2mean[key] = float(np.mean(arr))
        id2std[key] = float(np.std(arr, ddof=1)) if len(arr) > 1 else 1.0
        id2flat[key] = len(arr) == 1 or bool(arr.max() == arr.min())
    out = np.zeros(len(keys), dtype=np.float64)
    for i in range(len(keys)):
        key = keys[i]
        if id2flat[key]:
            out[i] = 0.0
        elif by_std:
            out[i] = (values[i] - id2mean[key]) / (id2std[key] + EPS)
        else:
            out[i] = values[i] - id2mean[key]
    return out


def episode_norm_reward(rewards: np.ndarray, group_uids: np.ndarray, traj_uids: np.ndarray, by_std: bool) -> np.ndarray:
    """A^E: R(τ) = Σ_t r_t per trajectory, normalised over the trajectories of its group."""
    traj_return: dict = defaultdict(float)
    for i in range(len(rewards)):
        traj_return[traj_uids[i]] += float(rewards[i])
    id2score: dict = defaultdict(list)
    seen = set()
    for i in range(len(rewards)):
        pair = (group_uids[i], traj_uids[i])
        if pair in seen:
            continue
        seen.add(pair)
        id2score[group_uids[i]].append(traj_return[traj_uids[i]])
    # one value per row: its trajectory's return
    row_values = [traj_return[traj_uids[i]] for i in range(len(rewards))]
    return _normalize(id2score, list(group_uids), row_values, by_std)


def build_step_group(anchor_obs: np.ndarray, group_uids: np.ndarray, first_id: int) -> tuple[np.ndarray, int]:
    """Cluster identical anchors inside each group (np.where per group); integer ids."""
    step_group = np.empty(len(anchor_obs), dtype=np.int64)
    next_id = first_id
    for idx in np.unique(group_uids):
        indices = np.where(group_uids == idx)[0]
        clusters: dict = defaultdict(list)
        for i in indices.tolist():
            clusters[anchor_obs[i]].append(i)
        for members in clusters.values():
            for i in members:
                step_group[i] = next_id
            next_id += 1
    return step_group, next_id


def step_norm_reward(returns: np.ndarray, step_group: np.ndarray, by_std: bool) -> tuple[np.ndarray, np.ndarray]:
    """A^S: the return-to-go normalised within its step group; also each row's group size."""
    id2score: dict = defaultdict(list)
    keys = step_group.tolist()
    values = returns.tolist()
    for i in range(len(keys)):
        id2score[keys[i]].append(values[i])
    size = np.array([len(id2score[k]) for k in keys], dtype=np.int64)
    return _normalize(id2score, keys, values, by_std), size


def nll_z_scores(nll: np.ndarray, traj_uids: np.ndarray) -> np.ndarray:
    """z = (u − mean) / std0 within each trajectory (np.where per trajectory); 0 for null u
    and for trajectories whose std0 < 1e-8."""
    z = np.zeros(len(nll), dtype=np.float64)
    for uid in np.unique(traj_uids):
        traj_indices = np.where(traj_uids == uid)[0]
        values = [float(nll[i]) for i in traj_indices if not np.isnan(nll[i])]
        if not values:
            continue
        mean = float(np.mean(values))
        std0 = float(np.std(values))
        if not std0 >= Z_STD_FLOOR:
            continue
        for i in traj_indices:
            if not np.isnan(nll[i]):
                z[i] = (nll[i] - mean) / std0
    return z


# --------------------------------------------------------------------- whole log


def compute(
    table: pa.Table,
    method: str,
    gamma: float = 0.95,
    norm: str | None = None,
    step_weight: float = 1.0,
    beta: float = 0.1,
    lambda_min: float = 0.0,
    lambda_max: float = 1.0,
    batch_groups: int = 16,
    recombine_per_row: bool = False,
) -> dict[str, np.ndarray]:
    """Every output column of `gaca advantages`, rows in the table's order.

    `recombine_per_row=True` follows the reference code more literally (see
    `step_discounted_returns`); it costs about one np.where over the batch per row."""
    by_std = (method == "grpo") if norm is None else norm == "std"
    group_uids = np.array(table.column("group_id").to_pylist(), dtype=object)
    traj_uids = np.array(table.column("traj_id").to_pylist(), dtype=object)
    steps = np.array(table.column("step_idx").to_pylist(), dtype=np.int64)
    rewards = np.array(table.column("reward").to_pylist(), dtype=np.float64)
    anchors = np.array(table.column("anchor_obs").to_pylist(), dtype=object) if method != "grpo" else None
    nll = None
    if method == "gaca":
        nll = np.array([np.nan if v is None else v for v in table.column("nll_mean").to_pylist()], dtype=np.float64)

    n = len(rewards)
    out = {k: np.zeros(n, dtype=np.float64) for k in ("return_to_go", "adv_episode", "adv_step", "advantage")}
    if method != "grpo":
        out["step_group_id"] = np.zeros(n, dtype=np.int64)
        out["step_group_size"] = np.zeros(n, dtype=np.int64)
    if method == "gaca":
        out["nll_z"] = np.zeros(n, dtype=np.float64)
        out["gaca_weight"] = np.zeros(n, dtype=np.float64)

    rows_of_group: dict = defaultdict(list)
    for i in range(n):
        rows_of_group[group_uids[i]].append(i)
    uids = list(rows_of_group)
    next_step_group = 0
    lam_bar = step_weight / (1.0 + step_weight)
    for b in range(0, len(uids), batch_groups):
        idx = np.array([i for g in uids[b : b + batch_groups] for i in rows_of_group[g]], dtype=np.int64)
        g_b, t_b = group_uids[idx], traj_uids[idx]
        rtg = step_discounted_returns(rewards[idx], t_b, steps[idx], gamma, recombine_per_row)
        adv_e = episode_norm_reward(rewards[idx], g_b, t_b, by_std)
        out["return_to_go"][idx] = rtg
        out["adv_episode"][idx] = adv_e
        if method == "grpo":
            out["advantage"][idx] = adv_e
            continue
        assert anchors is not None
        sg, next_step_group = build_step_group(anchors[idx], g_b, next_step_group)
        adv_s, size = step_norm_reward(rtg, sg, by_std)
        out["step_group_id"][idx] = sg
        out["step_group_size"][idx] = size
        out["adv_step"][idx] = adv_s
        if method == "gigpo":
            out["advantage"][idx] = [adv_e[i] + step_weight * adv_s[i] for i in range(len(idx))]
            continue
        assert nll is not None
        z = nll_z_scores(nll[idx], t_b)
        lam = np.zeros(len(idx))
        adv = np.zeros(len(idx))
        for i in range(len(idx)):
            if size[i] == 1:
                lam[i] = lam_bar
            else:
                lam[i] = min(max(lam_bar + beta * z[i], lambda_min), lambda_max)
            adv[i] = (1.0 + step_weight) * ((1.0 - lam[i]) * adv_e[i] + lam[i] * adv_s[i])
        out["nll_z"][idx] = z
        out["gaca_weight"][idx] = lam
        out["advantage"][idx] = adv
    return out


def run(path_in: str, path_out: str, method: str, **params) -> dict[str, np.ndarray]:
    """Read a Parquet log, compute, write every input column plus the outputs."""
    table = pq.read_table(path_in)
    cols = compute(table, method, **params)
    for name, values in cols.items():
        table = table.append_column(name, pa.array(values))
    table = table.append_column("adv_method", pa.array([method] * table.num_rows))
    pq.write_table(table, path_out, compression="zstd")
    return cols


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Per-row baseline of `gaca advantages` (for benchmarks).")
    parser.add_argument("log")
    parser.add_argument("--method", default="gaca", choices=("grpo", "gigpo", "gaca"))
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--norm", default=None, choices=("std", "mean"))
    args = parser.parse_args(argv)
    run(args.log, args.output, args.method, norm=args.norm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
