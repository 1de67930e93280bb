"""The slow twin of `gaca advantages`: docs/estimators.md as plain loops.

Written from the spec text alone (not from gaca_cli/credit/estimators.py), so that the two can be
compared. Everything is a dict of lists keyed by trajectory or group, every loop is a plain
Python loop, and group means and deviations use exact rational arithmetic
(`fractions.Fraction`): a float64 value is an exact rational, so sums, means and deviations
below are exact and are rounded to float64 once, at the end. Only the square roots (std, std0)
and the final divisions are float64 operations, each good to an ulp or two.

The first half (the maths) imports nothing from `gaca_cli`. The second half builds seeded
random logs (rows as dicts) and runs the fast code on the same rows, for the tests.

Readings of docs/estimators.md where it is silent:
- `--episode-stats` changes A^E wherever A^E is computed (grpo, gigpo, gaca).
- `norm` left unset means std for grpo, mean for gigpo and gaca.
- `--nll-scope group` is the episode group (`group_id`), not the step group.
- nll_z is the standardised u_t for every row with a score (0 for rows without); the step-group
  rule (size 1 ⇒ λ_t = λ̄) overrides only the weight, and such rows still count in their
  scope's NLL statistics.
- hgpo's deviation "equal to 0" is exact: a value equal to its history group's mean, as a
  rational number.
- similarity ≥ θ is decided exactly: 2·LCS/(|a|+|b|) as a rational against θ read as the
  decimal the user typed (repr of the float), so 8/10 ≥ 0.8 holds.
"""

from __future__ import annotations

import math
import random
import struct
from fractions import Fraction

EPS = 1e-6  # ε of the normalisation rule
STD0_FLOOR = 1e-8  # z_t = 0 where the population std of the scope is below this

DEFAULTS = {
    "method": "gaca",
    "gamma": 0.95,
    "norm": None,  # None: std for grpo, mean for gigpo and gaca
    "step_weight": 1.0,
    "episode_stats": "trajectories",
    "anchor_similarity": None,
    "beta": 0.1,
    "nll_scope": "trajectory",
    "nll_reduce": "mean",
    "lambda_min": 0.0,
    "lambda_max": 1.0,
    "history_length": 2,
    "length_weight_alpha": 1.0,
    "base_group": False,
}


# --------------------------------------------------------------------------------------------
# The maths
# --------------------------------------------------------------------------------------------


def same_partition(a, b) -> bool:
    """True when two labelings of the same rows group them identically (ids may differ)."""
    forward, backward = {}, {}
    for x, y in zip(a, b):
        if forward.setdefault(x, y) != y or backward.setdefault(y, x) != x:
            return False
    return True


def exact_sum(values) -> Fraction:
    total = Fraction(0)
    for v in values:
        total += Fraction(v)
    return total


def normalize(values: list[float], by_std: bool) -> list[float]:
    """norm(x) for every x of one group S (the spec's normalisation rule).

    (x − mean_S) / (std_S + ε) with std the ddof = 1 sample std, or x − mean_S; a group of
    size 1 or of equal values gives 0.
    """
    n = len(values)
    if n == 1 or all(v == values[0] for v in values):
        return [0.0] * n
    xs = [Fraction(v) for v in values]
    mean = exact_sum(xs) / n
    deviations = [x - mean for x in xs]
    if not by_std:
        return [float(d) for d in deviations]
    variance = exact_sum(d * d for d in deviations) / (n - 1)
    std = math.sqrt(float(variance))
    return [float(d) / (std + EPS) for d in deviations]


def return_to_go(rewards: list[float], gamma: float) -> list[float]:
    """G_t = Σ_{k ≥ t} γ^{k−t} r_k (Eq. 5), in exact rationals, rounded once per step.

    The sum is evaluated backwards by Horner's rule, G_t = r_t + γ·G_{t+1} (G_T = 0), which
    is the same rational number; in exact arithmetic the order cannot change it.
    """
    g = Fraction(gamma)
    out = [0.0] * len(rewards)
    total = Fraction(0)
    for t in reversed(range(len(rewards))):
        total = Fraction(rewards[t]) + g * total
        out[t] = float(total)
    return out


def lcs_length(a: str, b: str) -> int:
    """Longest common subsequence of characters, by the textbook dynamic programme."""
    previous = [0] * (len(b) + 1)
    for i in range(1, len(a) + 1):
        current = [0] * (len(b) + 1)
        for j in range(1, len(b) + 1):
            if a[i - 1] == b[j - 1]:
                current[j] = previous[j - 1] + 1
            else:
                current[j] = max(previous[j], current[j - 1])
        previous = current
    return previous[len(b)]


def similarity(a: str, b: str) -> Fraction:
    """2·LCS(a, b) / (|a| + |b|) as an exact fraction; two empty strings have similarity 1."""
    if len(a) + len(b) == 0:
        return Fraction(1)
    return Fraction(2 * lcs_length(a, b), len(a) + len(b))


def cluster_anchors(anchors: list[str], theta: float) -> dict[str, int]:
    """Greedy clustering of one episode group's anchors: distinct texts in sorted order; each
    joins the first cluster whose representative (first member) has similarity ≥ θ."""
    threshold = Fraction(repr(theta))
    representatives: list[str] = []
    cluster_of: dict[str, int] = {}
    for text in sorted(set(anchors)):
        for index, rep in enumerate(representatives):
            if similarity(text, rep) >= threshold:
                cluster_of[text] = index
                break
        else:
            cluster_of[text] = len(representatives)
            representatives.append(text)
    return cluster_of


def _criticality(row: dict, columns: set, reduce: str):
    """u_t of one row, or None when the step has no action tokens (a null nll_mean: gaca score
    writes nll_sum 0 for such a step)."""
    wanted = "nll_mean" if reduce == "mean" else "nll_sum"
    if wanted in columns:
        if "nll_mean" in columns and row.get("nll_mean") is None:
            return None
        value = row.get(wanted)
        return None if value is None or math.isnan(value) else float(value)
    if "nll_mean" not in columns and "nll_sum" not in columns and "behavior_logprobs" in columns:
        logprobs = row.get("behavior_logprobs")
        if not logprobs:
            return None
        total = -exact_sum(logprobs)
        return float(total / len(logprobs)) if reduce == "mean" else float(total)
    raise ValueError("gaca needs an NLL column or behavior_logprobs: run `gaca score` first")


def reference_advantages(rows: list[dict], **params) -> dict[str, list]:
    """Every output column of `gaca advantages`, one value per input row, in input order.

    `rows` are dicts with group_id, traj_id, step_idx, reward and optionally episode_reward,
    anchor_obs / anchor_key, nll_mean / nll_sum / behavior_logprobs. `params` are the
    command's options (names as in DEFAULTS). step_group_id is this function's own dense
    numbering; compare it as a partition. For gaca the result also holds `criticality`
    (u_t per row, None where the step has no action tokens), which is not an output column.
    """
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown parameters {sorted(unknown)}")
    p = {**DEFAULTS, **params}
    method = p["method"]
    by_std = (p["norm"] or ("std" if method in ("grpo", "hgpo") else "mean")) == "std"
    omega = p["step_weight"]
    columns = set()
    for row in rows:
        columns |= set(row)

    # trajectories: row indices in step order, and the group each belongs to
    rows_of_traj: dict = {}
    group_of_traj: dict = {}
    for i, row in enumerate(rows):
        rows_of_traj.setdefault(row["traj_id"], []).append(i)
        group_of_traj[row["traj_id"]] = row["group_id"]
    for members in rows_of_traj.values():
        members.sort(key=lambda i: rows[i]["step_idx"])
    trajs_of_group: dict = {}
    for traj, group in group_of_traj.items():
        trajs_of_group.setdefault(group, []).append(traj)

    # returns: G_t per row, R(τ) per trajectory
    rtg = [0.0] * len(rows)
    episode_return: dict = {}
    for traj, members in rows_of_traj.items():
        rewards = [rows[i]["reward"] for i in members]
        for i, g in zip(members, return_to_go(rewards, p["gamma"])):
            rtg[i] = g
        if "episode_reward" in columns:
            episode_return[traj] = float(rows[members[0]]["episode_reward"])
        else:
            episode_return[traj] = float(exact_sum(rewards))

    # A^E: over the group's trajectories, or over its step rows
    adv_episode_of_traj: dict = {}
    for trajs in trajs_of_group.values():
        if p["episode_stats"] == "trajectories":
            values = normalize([episode_return[t] for t in trajs], by_std)
            for traj, value in zip(trajs, values):
                adv_episode_of_traj[traj] = value
        else:
            owners = [t for t in trajs for _ in rows_of_traj[t]]
            values = normalize([episode_return[t] for t in owners], by_std)
            for traj, value in zip(owners, values):
                adv_episode_of_traj[traj] = value  # equal for every row of traj
    adv_episode = [adv_episode_of_traj[row["traj_id"]] for row in rows]

    out: dict[str, list] = {"return_to_go": rtg, "adv_episode": adv_episode}
    if method == "grpo":
        out["adv_step"] = [0.0] * len(rows)
        out["advantage"] = list(adv_episode)
        return out

    # step groups: (episode group, anchor) or (episode group, anchor cluster)
    anchor_column = "anchor_key" if "anchor_key" in columns else "anchor_obs"
    step_key = [None] * len(rows)
    if p["anchor_similarity"] is None:
        for i, row in enumerate(rows):
            step_key[i] = (row["group_id"], row[anchor_column])
    else:
        anchors_of_group: dict = {}
        for row in rows:
            anchors_of_group.setdefault(row["group_id"], []).append(row[anchor_column])
        cluster_of = {g: cluster_anchors(a, p["anchor_similarity"]) for g, a in anchors_of_group.items()}
        for i, row in enumerate(rows):
            step_key[i] = (row["group_id"], cluster_of[row["group_id"]][row[anchor_column]])
    if method == "hgpo":
        out.update(hgpo_advantages(rows_of_traj, step_key, rtg, adv_episode, p, by_std))
        return out
    members_of_step_group: dict = {}
    for i, key in enumerate(step_key):
        members_of_step_group.setdefault(key, []).append(i)
    adv_step = [0.0] * len(rows)
    step_group_id = [0] * len(rows)
    step_group_size = [0] * len(rows)
    for number, members in enumerate(members_of_step_group.values()):
        for i, value in zip(members, normalize([rtg[i] for i in members], by_std)):
            adv_step[i] = value
            step_group_id[i] = number
            step_group_size[i] = len(members)
    out.update(adv_step=adv_step, step_group_id=step_group_id, step_group_size=step_group_size)
    if method == "gigpo":
        out["advantage"] = [adv_episode[i] + omega * adv_step[i] for i in range(len(rows))]
        return out

    # GACA: criticality, z within the scope, λ, mixed advantage
    u = [_criticality(row, columns, p["nll_reduce"]) for row in rows]
    scope_key = {
        "trajectory": lambda row: ("traj", row["traj_id"]),
        "group": lambda row: ("group", row["group_id"]),
        "batch": lambda row: "batch",
    }[p["nll_scope"]]
    members_of_scope: dict = {}
    for i, row in enumerate(rows):
        if u[i] is not None:
            members_of_scope.setdefault(scope_key(row), []).append(i)
    nll_z = [0.0] * len(rows)
    for members in members_of_scope.values():
        xs = [Fraction(u[i]) for i in members]
        mean = exact_sum(xs) / len(xs)
        variance0 = exact_sum((x - mean) ** 2 for x in xs) / len(xs)
        std0 = math.sqrt(float(variance0))
        if std0 < STD0_FLOOR:
            continue
        for i, x in zip(members, xs):
            nll_z[i] = float(x - mean) / std0
    lambda_bar = omega / (1.0 + omega)
    weight = [0.0] * len(rows)
    advantage = [0.0] * len(rows)
    for i in range(len(rows)):
        if step_group_size[i] == 1:
            lam = lambda_bar
        else:
            lam = min(max(lambda_bar + p["beta"] * nll_z[i], p["lambda_min"]), p["lambda_max"])
        weight[i] = lam
        advantage[i] = (1.0 + omega) * ((1.0 - lam) * adv_episode[i] + lam * adv_step[i])
    out.update(nll_z=nll_z, gaca_weight=weight, advantage=advantage, criticality=u)
    return out


def hgpo_advantages(rows_of_traj: dict, step_key: list, rtg: list, adv_episode: list, p: dict, by_std: bool) -> dict:
    """HGPO (docs/estimators.md) as loops: the history group of window k of step t holds the
    steps whose last k step keys (episode group and anchor) equal step t's, k = 1..K+1 and
    k ≤ t + 1. In a group of two or more, a step's item is d = G − mean (exact), divided by
    (std0 + ε) with --norm std, std0 the population std; d = 0 gives the item 0. The advantage
    is Σ w·a / (Σ w + ε) over the non-zero items (w = (k+1)^α; with base_group also A^E,
    w = 1), exact and rounded once; 0 when no item is non-zero."""
    windows: dict = {}
    for members in rows_of_traj.values():
        for t, i in enumerate(members):
            for k in range(1, min(p["history_length"] + 1, t + 1) + 1):
                key = (k, tuple(step_key[j] for j in members[t - k + 1 : t + 1]))
                windows.setdefault(key, []).append(i)
    items: dict = {i: [] for i in range(len(rtg))}
    if p["base_group"]:
        for i in items:
            items[i].append((1.0, adv_episode[i]))
    for (k, _), members in windows.items():
        if len(members) < 2:
            continue
        xs = [Fraction(rtg[i]) for i in members]
        mean = exact_sum(xs) / len(xs)
        std0 = math.sqrt(float(exact_sum((x - mean) ** 2 for x in xs) / len(xs)))
        for i, x in zip(members, xs):
            d = x - mean
            value = 0.0 if d == 0 else (float(d) / (std0 + EPS) if by_std else float(d))
            items[i].append((float(k + 1) ** p["length_weight_alpha"], value))
    advantage, history_groups = [], []
    for i in range(len(rtg)):
        used = [(Fraction(w), Fraction(a)) for w, a in items[i] if a != 0.0]
        total, weight = exact_sum(w * a for w, a in used), exact_sum(w for w, _ in used)
        advantage.append(float(total / (weight + Fraction(EPS))) if used else 0.0)
        history_groups.append(len(items[i]) - (1 if p["base_group"] else 0))
    return {"advantage": advantage, "history_groups": history_groups}


# --------------------------------------------------------------------------------------------
# Seeded random logs, and the fast code run on the same rows
# --------------------------------------------------------------------------------------------

ALPHABET = "abcd"


def _anchor_pool(rng: random.Random, size: int) -> list[str]:
    pool = {"".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 5))) for _ in range(size)}
    return sorted(pool)


def random_rows(
    seed: int,
    *,
    min_groups: int = 1,
    max_groups: int = 4,
    max_trajs: int = 4,
    max_steps: int = 5,
    ids: str | None = None,
    rewards: str | None = None,
    criticality: str | None = None,
    anchor_key: bool | None = None,
    episode_reward: bool | None = None,
    shuffle: bool = True,
) -> list[dict]:
    """A seeded random log as a list of row dicts.

    ids: "int" | "str"; rewards: "dense" | "sparse" | "ints" | "near_constant";
    criticality: "nll" (nll_mean and nll_sum, some null, some tied) | "logprobs"
    (behavior_logprobs lists, some empty or null). None picks at random. Singleton episode
    groups, one-step trajectories and singleton step groups all occur; anchors repeat within
    and across trajectories of a group.
    """
    rng = random.Random(seed)
    ids = ids or rng.choice(["int", "str"])
    rewards = rewards or rng.choice(["dense", "sparse", "ints", "near_constant"])
    criticality = criticality or rng.choice(["nll", "logprobs"])
    anchor_key = rng.random() < 0.2 if anchor_key is None else anchor_key
    episode_reward = rng.random() < 0.2 if episode_reward is None else episode_reward
    n_groups = rng.randint(min_groups, max_groups)
    group_numbers = rng.sample(range(1000), n_groups)
    traj_numbers = iter(rng.sample(range(100_000), n_groups * max_trajs))
    tied_u = [round(rng.uniform(0.0, 3.0), 2) for _ in range(3)]
    rows: list[dict] = []
    for g in group_numbers:
        pool = _anchor_pool(rng, rng.randint(1, 6))
        group_id = g if ids == "int" else f"task-{g:03d}"
        for _ in range(rng.randint(1, max_trajs)):
            t = next(traj_numbers)
            traj_id = t if ids == "int" else f"{t:05x}.{g}"
            length = rng.randint(1, max_steps)
            ep_value = round(rng.uniform(-2.0, 2.0), 3)
            for step in range(length):
                last = step == length - 1
                if rewards == "dense":
                    r = rng.gauss(0.0, 1.0)
                elif rewards == "sparse":
                    r = float(rng.choice([0.0, 1.0, 10.0])) if last else 0.0
                elif rewards == "ints":
                    r = float(rng.randint(-1, 2))
                else:  # near-constant returns: 1e9 + k·1e-3 on the last step
                    r = 1e9 + rng.randint(0, 3) * 1e-3 if last else 0.0
                anchor = rng.choice(pool)
                row = {"group_id": group_id, "traj_id": traj_id, "step_idx": step, "reward": r}
                row["anchor_obs"] = anchor
                if anchor_key:
                    # a coarser key than the text: the key must win
                    row["anchor_key"] = f"k{len(anchor)}"
                if episode_reward:
                    row["episode_reward"] = ep_value
                if criticality == "nll":
                    kind = rng.random()
                    if kind < 0.1:  # no action tokens: nll_sum 0 as gaca score writes it, or null
                        row["nll_mean"], row["nll_sum"] = None, rng.choice([None, 0.0])
                    else:
                        n_tokens = rng.randint(1, 20)
                        mean = rng.choice(tied_u) if kind < 0.35 else rng.uniform(0.0, 4.0)
                        row["nll_mean"], row["nll_sum"] = mean, mean * n_tokens
                else:
                    kind = rng.random()
                    if kind < 0.05:
                        row["behavior_logprobs"] = None
                    elif kind < 0.1:
                        row["behavior_logprobs"] = []
                    else:
                        row["behavior_logprobs"] = [_float32(-rng.expovariate(1.0)) for _ in range(rng.randint(1, 6))]
                rows.append(row)
    if shuffle:
        rng.shuffle(rows)
    return rows


def _float32(x: float) -> float:
    """x rounded to float32 (behavior_logprobs are list<float32>), as a Python float."""
    return struct.unpack("f", struct.pack("f", x))[0]


def rows_to_table(rows: list[dict]):
    """An Arrow table with the log schema's types (ids as int64 or string)."""
    import pyarrow as pa

    names: list[str] = []
    for row in rows:
        for name in row:
            if name not in names:
                names.append(name)
    types = {
        "step_idx": pa.int64(),
        "reward": pa.float64(),
        "episode_reward": pa.float64(),
        "anchor_obs": pa.large_string(),
        "anchor_key": pa.string(),
        "nll_mean": pa.float64(),
        "nll_sum": pa.float64(),
        "behavior_logprobs": pa.list_(pa.float32()),
    }
    arrays = {}
    for name in names:
        values = [row.get(name) for row in rows]
        if name in ("group_id", "traj_id"):
            typ = pa.string() if isinstance(values[0], str) else pa.int64()
        else:
            typ = types.get(name)
        arrays[name] = pa.array(values, type=typ)
    return pa.table(arrays)


def run_fast(rows: list[dict], **params):
    """The fast code on the same rows: `compute_advantages` on an in-memory log.

    Returns (dict of numpy arrays in input row order, AdvantagesRun)."""
    import numpy as np

    from gaca_cli.credit.config import AdvantagesConfig
    from gaca_cli.credit.run import compute_advantages
    from gaca_cli.log.reading import Log

    table = rows_to_table(rows)
    log = Log(table=table, files=("<memory>",), file_row_ends=np.array([table.num_rows], dtype=np.int64))
    run = compute_advantages(log, AdvantagesConfig(**params))
    out = {}
    for name in (
        "return_to_go",
        "adv_episode",
        "adv_step",
        "step_group_id",
        "step_group_size",
        "nll_z",
        "gaca_weight",
        "history_groups",
        "advantage",
    ):
        if name in run.table.column_names:
            out[name] = run.table.column(name).to_numpy()
    return out, run
