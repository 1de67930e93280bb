"""verl-agent's GiGPO advantage, written again for the tests from a reading of its source, and
the batches its rollout loop builds.

`gigpo_reference` follows `compute_gigpo_outcome_advantage` of gigpo/core_gigpo.py (verl-agent,
read at commit c23d586 of the fork johnhaofu/verl-agent, whose history holds upstream 796ed31;
upstream returns `(scores, scores)`, which is what this returns) step by step, in float32 torch
as it computes, with per-row Python loops as it has:

1. mode "mean_norm" subtracts the group mean only; "mean_std_norm" also divides by
   (std + epsilon), std being torch.std (unbiased).
2. Episode level: each row's score is the sum of its token_level_rewards. The statistics of
   an episode group (`index`) run over all its rows (compute_mean_std_cross_steps=True, the
   default the trainer keeps): a trajectory weighs as many times as it has rows. A group with
   a single row gets mean 0 and std 1, so it keeps its raw score (divided by 1 + epsilon with
   std).
3. Step groups: within each episode group, rows whose anchors are equal (compared as hashable
   values); with similarity on, rows are visited in batch order and each joins the first
   cluster whose first member's text has SequenceMatcher(None, row_text, first_text).ratio()
   ≥ threshold, else founds a cluster.
4. Step level: step_rewards normalised within each step group; a group of one has its own
   value as mean (and std 1), so 0.
5. Each level's per-row value is written into a float32 tensor, broadcast over the response
   and multiplied by response_mask; the result is episode + step_advantage_w * step.

Only for the tests (not a part of gaca), and written from the description above, not copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np
import torch


def gigpo_reference(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    divide_by_std = {"mean_norm": False, "mean_std_norm": True}[mode]
    episode_score = token_level_rewards.sum(dim=-1)
    episode = _normalise(episode_score, list(index), epsilon, divide_by_std, alone_mean_is_zero=True)
    groups = step_groups(anchor_obs, index, enable_similarity, similarity_thresh)
    step = _normalise(step_rewards.clone(), groups, epsilon, divide_by_std, alone_mean_is_zero=False)
    length = response_mask.shape[-1]
    episode_tokens = episode.unsqueeze(-1).tile([1, length]) * response_mask
    step_tokens = step.unsqueeze(-1).tile([1, length]) * response_mask
    scores = episode_tokens + step_advantage_w * step_tokens
    return scores, scores


def _normalise(
    values: torch.Tensor, keys: list, epsilon: float, divide_by_std: bool, alone_mean_is_zero: bool
) -> torch.Tensor:
    """Per-row (value − mean) [/ (std + ε)] over the rows sharing a key, one row at a time."""
    members: dict[object, list[torch.Tensor]] = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(values[i])
    mean, std = {}, {}
    for key, group in members.items():
        stacked = torch.stack(group)
        if len(group) == 1:
            mean[key] = torch.tensor(0.0) if alone_mean_is_zero else stacked.mean()
            std[key] = torch.tensor(1.0)
        else:
            mean[key] = stacked.mean()
            std[key] = stacked.std()  # unbiased
    out = values.clone()
    for i, key in enumerate(keys):
        centred = values[i] - mean[key]
        out[i] = centred / (std[key] + epsilon) if divide_by_std else centred
    return out


def _key(anchor: object) -> object:
    if isinstance(anchor, np.ndarray):
        return tuple(anchor.reshape(-1).tolist())
    if isinstance(anchor, list):
        return tuple(anchor)
    return anchor


def step_groups(anchor_obs: np.ndarray, index: np.ndarray, enable_similarity: bool, threshold: float) -> list:
    """A step-group label per row: (episode group, cluster number within it)."""
    labels: list = [None] * len(index)
    for group in np.unique(index):
        rows = [int(r) for r in np.flatnonzero(index == group)]
        if not enable_similarity:
            cluster_of: dict[object, int] = {}
            for r in rows:
                labels[r] = (group, cluster_of.setdefault(_key(anchor_obs[r]), len(cluster_of)))
            continue
        firsts: list[str] = []
        for r in rows:
            text = anchor_obs[r]
            for k, first in enumerate(firsts):
                if SequenceMatcher(None, text, first).ratio() >= threshold:
                    labels[r] = (group, k)
                    break
            else:
                firsts.append(text)
                labels[r] = (group, len(firsts) - 1)
    return labels


# --------------------------------------------------------------------------- batches


@dataclass
class Batch:
    """A verl-agent training batch (rows in batch order), with what a log of it needs."""

    token_level_rewards: torch.Tensor  # [B, L]
    step_rewards: torch.Tensor  # [B]   G_t
    response_mask: torch.Tensor  # [B, L]
    old_log_prob: torch.Tensor  # [B, L]
    anchor_obs: np.ndarray  # [B] object
    index: np.ndarray  # [B] object: episode-group uid
    traj_index: np.ndarray  # [B] object: trajectory uid
    step: np.ndarray  # [B] int: the row's step in its trajectory
    reward: np.ndarray  # [B] float64 r_t (before any penalty)
    episode_reward: np.ndarray  # [B] float64 R(τ) of the row's trajectory

    def gigpo_args(self) -> dict:
        return {
            "token_level_rewards": self.token_level_rewards,
            "step_rewards": self.step_rewards,
            "response_mask": self.response_mask,
            "anchor_obs": self.anchor_obs,
            "index": self.index,
            "traj_index": self.traj_index,
        }


ROOMS = ["You are in the kitchen. ", "You are in the hall. ", "You are in the cellar. ", "You are in a maze. "]
ITEMS = ["You hold a key.", "You hold nothing.", "You hold a lamp.", "You hold a key and a lamp."]


def make_batch(  # noqa: PLR0913
    seed: int,
    n_groups: int = 3,
    rollouts: int = 4,
    max_steps: int = 5,
    length: int = 8,
    gamma: float = 0.95,
    penalty: float = 0.0,
    dtype: torch.dtype = torch.float32,
    shuffle: bool = True,
    single_groups: bool = True,
    text_anchors: bool = True,
) -> Batch:
    """A batch as verl-agent's rollout loop builds it: each group's rollouts start from the
    same task (uid), every step is a row whose response is right-padded (some empty), the
    episode reward sits on the last response token of every row of the trajectory (on the last
    position when the response is empty, where verl-agent's index −1 puts it), step_rewards
    are the discounted returns G_t, and the invalid-action penalty (`penalty` > 0) comes off
    the score and G_t of the rows whose action was invalid. `shuffle` reorders the rows as
    balance_batch does (rows of one trajectory not adjacent). `single_groups` adds a group of
    one one-step trajectory and a group of one longer trajectory. Rewards are multiples of 1/4.
    """
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    plan = [(f"uid-{seed}-{g}", rollouts) for g in range(n_groups)]
    if single_groups:
        plan += [(f"uid-{seed}-alone1", 1), (f"uid-{seed}-alone2", 1)]
    for g, (uid, n) in enumerate(plan):
        for k in range(n):
            traj = f"traj-{seed}-{g}-{k}"
            steps = 1 if uid.endswith("alone1") else int(rng.integers(1, max_steps + 1))
            if uid.endswith("alone2"):
                steps = max(steps, 2)
            rewards = rng.integers(0, 3, steps) / 4.0
            G = np.zeros(steps)
            running = 0.0
            for t in reversed(range(steps)):
                running = rewards[t] + gamma * running
                G[t] = running
            for t in range(steps):
                room, item = ROOMS[rng.integers(0, 3 if t == 0 else 4)], ITEMS[rng.integers(0, 4)]
                rows.append(
                    {
                        "uid": uid,
                        "traj": traj,
                        "step": t,
                        "reward": rewards[t],
                        "G": G[t],
                        "R": rewards.sum(),
                        "anchor": room + item if text_anchors else np.array([rng.integers(0, 3), t % 2]),
                        "valid": int(rng.integers(0, length + 1)) if rng.random() > 0.1 else 0,
                        "invalid": bool(penalty and rng.random() < 0.3),
                    }
                )
    order = rng.permutation(len(rows)) if shuffle else np.arange(len(rows))
    rows = [rows[i] for i in order]
    n = len(rows)
    tlr = torch.zeros(n, length, dtype=dtype)
    mask = torch.zeros(n, length, dtype=torch.int64)
    step_rewards = torch.zeros(n, dtype=dtype)
    for i, row in enumerate(rows):
        mask[i, : row["valid"]] = 1
        tlr[i, row["valid"] - 1] = row["R"] - penalty * row["invalid"]
        step_rewards[i] = row["G"] - penalty * row["invalid"]
    log_prob = -torch.from_numpy(rng.gamma(1.0, 0.7, (n, length))).to(dtype)
    anchors = np.empty(n, dtype=object)
    for i, row in enumerate(rows):
        anchors[i] = row["anchor"]
    return Batch(
        token_level_rewards=tlr,
        step_rewards=step_rewards,
        response_mask=mask,
        old_log_prob=log_prob,
        anchor_obs=anchors,
        index=np.array([row["uid"] for row in rows], dtype=object),
        traj_index=np.array([row["traj"] for row in rows], dtype=object),
        step=np.array([row["step"] for row in rows]),
        reward=np.array([row["reward"] for row in rows]),
        episode_reward=np.array([row["R"] for row in rows]),
    )
