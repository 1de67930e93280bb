"""Estimator quality against ground truth: a tabular environment whose advantages are known.

Why. An advantage estimator is judged by how well A_t ranks and signs the *true* advantage
of the policy that produced the log, A(s, a) = Q^π(s, a) − V^π(s). On real rollouts that
quantity is unknown; on a small tabular environment it is one linear solve away. This module
builds such an environment, samples grouped rollouts from it in the canonical log schema,
runs `compute_advantages` for GRPO, GiGPO and GACA, and scores each estimator against the
truth. `bench/estimator_quality.py` prints the result; `gaca demo` reuses it.

The environment: forked corridors. Task k is a corridor of `corridor_length` cells; the
episode starts in cell 0 and succeeds (reward `goal_reward`) on stepping past the last cell.
Every step costs `step_cost`. Two kinds of state:

* routine cells (most of them): actions `forward` (probability `p_forward`, about 0.97, NLL
  ≈ 0.03 nats), `wait` (stay; `p_wait`) and `back` (one cell back; the rest, possibly 0). A mistake costs
  one or two steps: a little step cost and one or two factors of γ on the final reward
  (more when `back` returns to a fork, which must then be passed again).
* forks (`forks_per_task` per corridor, at layout-seeded cells): actions `left` and `right`,
  taken with probability p_good ∈ `p_good_range` for the good one (near 50/50, NLL ≈ 0.3-0.8
  nats). The good branch continues along the corridor; the bad one leads into a dead end of
  `dead_end_length` routine cells that ends the episode without reward. The fork decides
  success.
* bonus forks (`bonus_forks_per_task`, 0 by default): also near 50/50, both branches go on,
  one pays `bonus_reward` at once. They add return variance that no other step caused,
  as intermediate rewards or sub-goals do in real tasks; they count as pivotal.

Transitions and rewards are deterministic given the action; all randomness is the behaviour
policy's. With no time limit the state (task, cell) is Markov, so the anchor text (the state's
name) is exactly the state and GiGPO's step groups are exact. The behaviour policy's
per-action NLL −log π(a|s) is known exactly and logged as `nll_mean` (one "token" per action).

What makes this a fair test of GACA. For any policy,
    A(s, a) = Σ_b π(b|s) (Q(s, a) − Q(s, b)),  so  |A(s, a)| ≤ (1 − π(a|s)) · range_b Q(s, b)
and 1 − π ≤ −log π: low-NLL actions have small true advantage, whatever the state. Here the
large advantages sit at the forks (both actions, NLL ≈ 0.5) and, negatively but smaller, at
routine mistakes (NLL ≈ 4); the long routine stretches (NLL ≈ 0.03) carry advantages near 0.
GACA's premise, that high-NLL steps deserve the step-level signal, holds by construction;
the table says whether acting on it improves the estimate.

Exact values (`exact_values`): V = (I − γ P_π)^{-1} r_π over the non-terminal states (the
chain terminates with probability 1, so the solve is valid for γ = 1 too), and
Q(s, a) = r(s, a) + γ V(s'(s, a)) with V(terminal) = 0.

Scores (`score_advantages`), per seed, pooled over every step of the seed's log:
* Spearman rank correlation between estimate and truth (average ranks for ties; NaN when one
  side is constant), and sign agreement: the share of steps with A ≠ 0 whose estimate has the
  same sign (an estimate of exactly 0 counts one half). Each over all steps, over the pivotal
  steps (forks), and over slips (routine steps whose action had π < ½: the rare mistakes).
  Over all steps both are dominated by the routine `forward` steps, whose true advantage is
  tiny (about +0.0002 to +0.005): read them as "how the estimator treats steps that do not
  matter", not as overall quality.
* gradient cosine: the cosine between the REINFORCE updates Σ_t A_t ∇ log π(a_t|s_t) on the
  tabular softmax logits that the estimate and the truth produce on the same steps. This is
  the magnitude-aware summary: it is what a policy-gradient step would see.
`estimator_quality` reports mean and sample standard deviation (ddof = 1) over seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from gaca_cli.config import ConfigError, check_choices, invalid
from gaca_cli.credit.config import AdvantagesConfig, Norm
from gaca_cli.credit.run import compute_advantages
from gaca_cli.log import columns as C
from gaca_cli.log.reading import Log

TRUE_ADVANTAGE = "true_advantage"  # Q^π(s, a) − V^π(s) of the logged step
IS_PIVOTAL = "is_pivotal"  # the step was taken at a fork
TERMINAL = -1  # next-state code of the episode's end
MAX_STEPS_FACTOR = 50  # a rollout longer than this × the longest path is a bug, not bad luck


# --------------------------------------------------------------------------- the environment


@dataclass(frozen=True)
class CorridorConfig:
    """The forked-corridor environment and its behaviour policy (see the module docstring)."""

    n_tasks: int = 4
    corridor_length: int = 24
    forks_per_task: int = 3
    bonus_forks_per_task: int = 0
    bonus_reward: float = 0.5
    dead_end_length: int = 4
    p_forward: float = 0.97
    p_wait: float = 0.02
    p_good_range: tuple[float, float] = (0.5, 0.8)
    step_cost: float = 0.001
    goal_reward: float = 1.0
    gamma: float = 0.95
    layout_seed: int = 0

    def __post_init__(self) -> None:
        if self.n_tasks < 1:
            invalid(self, "n_tasks", "at least 1")
        if self.forks_per_task < 0:
            invalid(self, "forks_per_task", "0 or more")
        if self.bonus_forks_per_task < 0:
            invalid(self, "bonus_forks_per_task", "0 or more")
        n_forks = self.forks_per_task + self.bonus_forks_per_task
        if self.corridor_length < 2 * n_forks + 1:
            use = f"at least 2·(forks_per_task + bonus_forks_per_task) + 1 = {2 * n_forks + 1}"
            invalid(self, "corridor_length", use)
        if not np.isfinite(self.bonus_reward):
            invalid(self, "bonus_reward", "a finite reward, e.g. 0.5")
        if self.dead_end_length < 1:
            invalid(self, "dead_end_length", "at least 1")
        if not (0.0 < self.p_forward < 1.0 and 0.0 < self.p_wait and self.p_forward + self.p_wait <= 1.0):
            value = (self.p_forward, self.p_wait)
            use = "probabilities in (0, 1) with p_forward + p_wait ≤ 1"
            raise ConfigError("p_forward", f"p_forward/p_wait = {value!r} is not valid; use {use}")
        lo, hi = self.p_good_range
        if not (0.0 < lo <= hi < 1.0):
            invalid(self, "p_good_range", "0 < low ≤ high < 1, e.g. (0.5, 0.8)")
        if not (np.isfinite(self.step_cost) and self.step_cost >= 0.0):
            invalid(self, "step_cost", "a finite cost ≥ 0, e.g. 0.001")
        if not np.isfinite(self.goal_reward):
            invalid(self, "goal_reward", "a finite reward, e.g. 1.0")
        if not (0.0 <= self.gamma <= 1.0):
            invalid(self, "gamma", "a discount in [0, 1], e.g. 0.95")


@dataclass(frozen=True)
class TabularEnv:
    """A finite MDP with a fixed stochastic policy, as arrays (S states, up to A actions).

    state_names: S anchor texts; is_pivotal: bool [S]; task: int64 [S]; start: int64 [K]
    (start state of each task); action_names: S lists of names; prob: float64 [S, A] (π(a|s),
    0 for missing actions); next_state: int64 [S, A] (TERMINAL = episode end); reward:
    float64 [S, A]; success: bool [S, A] (the transition reaches the goal); gamma.
    """

    state_names: tuple[str, ...]
    is_pivotal: np.ndarray
    task: np.ndarray
    start: np.ndarray
    action_names: tuple[tuple[str, ...], ...]
    prob: np.ndarray
    next_state: np.ndarray
    reward: np.ndarray
    success: np.ndarray
    gamma: float
    config: CorridorConfig = field(default_factory=CorridorConfig)

    @property
    def n_states(self) -> int:
        return len(self.state_names)

    @property
    def max_steps(self) -> int:
        return MAX_STEPS_FACTOR * (self.config.corridor_length + self.config.dead_end_length)


def build_corridors(config: CorridorConfig = CorridorConfig()) -> TabularEnv:
    """Build the forked-corridor MDP (deterministic given `config`, layout from layout_seed)."""
    rng = np.random.default_rng(config.layout_seed)
    L, D = config.corridor_length, config.dead_end_length
    p_back = 1.0 - config.p_forward - config.p_wait
    p_back = p_back if p_back > 1e-12 else 0.0
    names: list[str] = []
    pivotal: list[bool] = []
    task_of: list[int] = []
    # per state: (action name, π, next state or None = episode end, reaches the goal, bonus reward)
    actions: list[list[tuple[str, float, int | None, bool, float]]] = []

    def add(name: str, fork: bool, task: int) -> int:
        names.append(name)
        pivotal.append(fork)
        task_of.append(task)
        actions.append([])
        return len(names) - 1

    starts = []
    for k in range(config.n_tasks):
        # forks at cells 1..L-1, no two adjacent: F sorted distinct draws x_i from 1..L-F,
        # moved to x_i + i (consecutive forks are then at least two cells apart)
        F = config.forks_per_task + config.bonus_forks_per_task
        draws = np.sort(rng.choice(np.arange(1, L - F + 1), size=F, replace=False))
        forks = [int(x) + i for i, x in enumerate(draws)]
        bonus: set[int] = set()
        if config.bonus_forks_per_task:
            bonus = {int(c) for c in rng.choice(forks, size=config.bonus_forks_per_task, replace=False)}
        cells = [add(f"task {k}: {'fork' if c in forks else 'corridor'} at cell {c}", c in forks, k) for c in range(L)]
        starts.append(cells[0])
        _routine(actions, cells, None, config.p_forward, config.p_wait, p_back, reached_goal=True)
        for c in forks:  # ascending: the layout draws come in cell order
            here = cells[c]
            ahead = cells[c + 1] if c + 1 < L else None
            p_good = float(rng.uniform(*config.p_good_range))
            good, wrong = ("left", "right") if rng.random() < 0.5 else ("right", "left")
            if c in bonus:
                wrong_to, wrong_wins, good_extra = ahead, ahead is None, config.bonus_reward
            else:
                dead = [add(f"task {k}: dead end after cell {c}, step {d}", False, k) for d in range(D)]
                _routine(actions, dead, None, config.p_forward, config.p_wait, p_back, reached_goal=False)
                wrong_to, wrong_wins, good_extra = dead[0], False, 0.0
            actions[here] = sorted(  # left before right, whichever is good
                [(good, p_good, ahead, ahead is None, good_extra), (wrong, 1.0 - p_good, wrong_to, wrong_wins, 0.0)]
            )

    S = len(names)
    A = max(len(a) for a in actions)
    prob = np.zeros((S, A))
    next_state = np.full((S, A), TERMINAL, dtype=np.int64)
    reward = np.zeros((S, A))
    success = np.zeros((S, A), dtype=bool)
    for s, acts in enumerate(actions):
        for a, (_, p, nxt, goal, extra) in enumerate(acts):
            prob[s, a] = p
            next_state[s, a] = TERMINAL if nxt is None else nxt
            reward[s, a] = -config.step_cost + (config.goal_reward if goal else 0.0) + extra
            success[s, a] = goal
    return TabularEnv(
        state_names=tuple(names),
        is_pivotal=np.asarray(pivotal, dtype=bool),
        task=np.asarray(task_of, dtype=np.int64),
        start=np.asarray(starts, dtype=np.int64),
        action_names=tuple(tuple(a[0] for a in acts) for acts in actions),
        prob=prob,
        next_state=next_state,
        reward=reward,
        success=success,
        gamma=config.gamma,
        config=config,
    )


def _routine(actions, cells, exit_state, p_forward, p_wait, p_back, reached_goal) -> None:
    """Fill a run of routine cells: forward to the next (the last exits to `exit_state`)."""
    for i, here in enumerate(cells):
        ahead = cells[i + 1] if i + 1 < len(cells) else exit_state
        back = cells[max(i - 1, 0)]
        actions[here] = [
            ("forward", p_forward, ahead, reached_goal and ahead is None, 0.0),
            ("wait", p_wait, here, False, 0.0),
            ("back", p_back, back, False, 0.0),
        ]


# --------------------------------------------------------------------------- exact values


def _policy_solve(env: TabularEnv, step_reward: np.ndarray, gamma: float) -> np.ndarray:
    """V with V = r_π + γ P_π V over the non-terminal states: one dense linear solve."""
    S = env.n_states
    P = np.zeros((S, S))
    rows, cols = np.nonzero(env.next_state != TERMINAL)
    np.add.at(P, (rows, env.next_state[rows, cols]), env.prob[rows, cols])
    r_pi = np.sum(env.prob * step_reward, axis=1)
    return np.linalg.solve(np.eye(S) - gamma * P, r_pi)


def exact_values(env: TabularEnv) -> tuple[np.ndarray, np.ndarray]:
    """Q^π [S, A] and V^π [S] of the behaviour policy (module docstring; NaN Q for missing
    actions). V(s) = Σ_a π(a|s) Q(s, a) holds to solver precision."""
    V = _policy_solve(env, env.reward, env.gamma)
    V_next = np.where(env.next_state == TERMINAL, 0.0, V[np.maximum(env.next_state, 0)])
    Q = env.reward + env.gamma * V_next
    Q = np.where(env.prob > 0, Q, np.nan)
    return Q, V


def success_probability(env: TabularEnv) -> np.ndarray:
    """P(reach the goal | start in s) under π, float64 [S] (the same solve, γ = 1)."""
    return _policy_solve(env, env.success.astype(np.float64), 1.0)


# --------------------------------------------------------------------------- sampling a log


def sample_log(env: TabularEnv, n_groups: int, rollouts: int, rng: np.random.Generator) -> pa.Table:
    """Grouped rollouts in the canonical log schema, one row per step.

    Group g starts from task g mod n_tasks; each group holds `rollouts` trajectories.
    Columns: group_id, traj_id, step_idx, anchor_obs (the state's name), action, reward,
    done, success, nll_mean (−log π(a|s), nats), behavior_logprobs ([log π(a|s)]),
    true_advantage (Q − V) and is_pivotal.
    """
    if n_groups < 1 or rollouts < 1:
        raise ValueError(f"n_groups = {n_groups}, rollouts = {rollouts}: both must be at least 1")
    Q, V = exact_values(env)
    cum = np.cumsum(env.prob, axis=1)
    n_act = np.sum(env.prob > 0, axis=1)
    cols: dict[str, list] = {k: [] for k in ("g", "t", "i", "s", "a", "done", "succ")}
    for g in range(n_groups):
        start = int(env.start[g % len(env.start)])
        for k in range(rollouts):
            s, i, won = start, 0, False
            first = len(cols["s"])
            while s != TERMINAL:
                a = min(int(np.searchsorted(cum[s], rng.random(), side="right")), n_act[s] - 1)
                cols["g"].append(g)
                cols["t"].append(k)
                cols["i"].append(i)
                cols["s"].append(s)
                cols["a"].append(a)
                won = bool(env.success[s, a])
                s, i = int(env.next_state[s, a]), i + 1
                if i > env.max_steps:
                    raise RuntimeError(f"rollout longer than {env.max_steps} steps: the environment does not terminate")
            n = len(cols["s"]) - first
            cols["done"].extend([False] * (n - 1) + [True])
            cols["succ"].extend([won] * n)
    group_of = np.asarray(cols["g"], dtype=np.int64)
    rollout_of = np.asarray(cols["t"], dtype=np.int64)
    state_of = np.asarray(cols["s"], dtype=np.int64)
    action_of = np.asarray(cols["a"], dtype=np.int64)
    logp = np.log(env.prob[state_of, action_of])
    group_ids = [f"g{x:04d}" for x in range(n_groups)]
    names = np.asarray(env.state_names, dtype=object)
    return pa.table(
        {
            C.GROUP_ID: pa.array([group_ids[x] for x in group_of], pa.string()),
            C.TRAJ_ID: pa.array([f"{group_ids[x]}/r{y:03d}" for x, y in zip(group_of, rollout_of)], pa.string()),
            C.STEP_IDX: pa.array(np.asarray(cols["i"], dtype=np.int32)),
            C.ANCHOR_OBS: pa.array(names[state_of].tolist(), pa.large_string()),
            C.ACTION: pa.array([env.action_names[x][y] for x, y in zip(state_of, action_of)], pa.large_string()),
            C.REWARD: pa.array(env.reward[state_of, action_of]),
            C.DONE: pa.array(cols["done"], pa.bool_()),
            C.SUCCESS: pa.array(cols["succ"], pa.bool_()),
            C.NLL_MEAN: pa.array(-logp),
            C.BEHAVIOR_LOGPROBS: pa.array([[x] for x in logp.astype(np.float32)], pa.list_(pa.float32())),
            TRUE_ADVANTAGE: pa.array(Q[state_of, action_of] - V[state_of]),
            IS_PIVOTAL: pa.array(env.is_pivotal[state_of]),
        }
    )


def as_log(table: pa.Table, source: str = "<forked corridors>") -> Log:
    """Wrap an in-memory table as a `Log`, as `read_log` would return it."""
    return Log(table=table, files=(source,), file_row_ends=np.asarray([table.num_rows], dtype=np.int64))


# --------------------------------------------------------------------------- scoring


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given the mean of the ranks they span. float64 [n]."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], len(xs)]
    ranks_sorted = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    out = np.empty(len(x))
    out[order] = ranks_sorted
    return out


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of average ranks; NaN when either side is constant or n < 2."""
    if len(x) < 2:
        return float("nan")
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = np.sqrt(np.sum(rx * rx) * np.sum(ry * ry))
    return float(np.sum(rx * ry) / den) if den > 0 else float("nan")


def sign_agreement(estimate: np.ndarray, truth: np.ndarray, tol: float = 1e-12) -> float:
    """Share of steps with |truth| > tol whose estimate has the same sign (0 counts ½)."""
    keep = np.abs(truth) > tol
    if not keep.any():
        return float("nan")
    e, t = estimate[keep], truth[keep]
    hit = np.where(e == 0.0, 0.5, (np.sign(e) == np.sign(t)).astype(np.float64))
    return float(hit.mean())


def policy_gradient(advantage: np.ndarray, state: np.ndarray, action: np.ndarray, prob: np.ndarray) -> np.ndarray:
    """The REINFORCE update on tabular softmax logits: g[s, b] = Σ_{t: s_t = s} A_t (1[a_t = b] − π(b|s)).

    advantage: float64 [N]; state, action: int64 [N]; prob: float64 [S, A]. Returns [S, A].
    """
    g = np.zeros_like(prob)
    np.add.at(g, (state, action), advantage)
    g -= np.bincount(state, advantage, minlength=len(prob))[:, None] * prob
    return g


def cosine(x: np.ndarray, y: np.ndarray) -> float:
    """x·y / (|x| |y|); NaN when either is zero."""
    x, y = x.ravel(), y.ravel()
    den = np.sqrt(np.dot(x, x) * np.dot(y, y))
    return float(np.dot(x, y) / den) if den > 0 else float("nan")


@dataclass(frozen=True)
class Truth:
    """The ground truth of one log's steps, rows in canonical (traj, step) order."""

    advantage: np.ndarray  # float64 [N] Q − V
    pivotal: np.ndarray  # bool [N]
    state: np.ndarray  # int64 [N]
    action: np.ndarray  # int64 [N]
    prob: np.ndarray  # float64 [S, A] π(a|s)

    @property
    def slip(self) -> np.ndarray:
        """bool [N]: a routine step whose action the policy takes with probability < ½."""
        return ~self.pivotal & (self.prob[self.state, self.action] < 0.5)


def score_advantages(estimate: np.ndarray, truth: Truth) -> dict[str, float]:
    """The SCORES (module docstring) of one estimate, float64 [N] in canonical order."""
    t = truth.advantage
    out = {}
    for subset, mask in (("all", slice(None)), ("pivotal", truth.pivotal), ("slips", truth.slip)):
        out[f"spearman_{subset}"] = spearman(estimate[mask], t[mask])
        out[f"sign_{subset}"] = sign_agreement(estimate[mask], t[mask])
    out["gradient_cosine"] = cosine(
        policy_gradient(estimate, truth.state, truth.action, truth.prob),
        policy_gradient(t, truth.state, truth.action, truth.prob),
    )
    return out


#: each score of `score_advantages` and its column header in the tables
SCORE_HEADERS = {
    "spearman_all": "ρ all",
    "sign_all": "sign all",
    "spearman_pivotal": "ρ forks",
    "sign_pivotal": "sign forks",
    "spearman_slips": "ρ slips",
    "sign_slips": "sign slips",
    "gradient_cosine": "grad cos",
}
SCORES = tuple(SCORE_HEADERS)


# --------------------------------------------------------------------------- the evaluation


@dataclass(frozen=True)
class QualityConfig:
    """One run of the estimator-quality evaluation.

    seeds: one sampled log per seed (numpy default_rng(seed)); groups, rollouts: episode
    groups per log and rollouts per group; betas: the GACA β values (β = 0 is GiGPO);
    step_weight: ω for gigpo and gaca; norm: normalisation of gigpo, gaca and hgpo ("mean",
    "std", or None for each one's default: mean, mean, std; grpo keeps std); hgpo: add HGPO rows
    (the recipe's defaults K = 2, α = 1, without and with the base group); include_step_only:
    add a reference row scoring the step signal A^S alone; env: the environment (its gamma is
    also the estimators' γ).
    """

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    groups: int = 32
    rollouts: int = 8
    betas: tuple[float, ...] = (0.1, 0.3, 1.0)
    step_weight: float = 1.0
    norm: Norm | None = None
    hgpo: bool = True
    include_step_only: bool = True
    env: CorridorConfig = field(default_factory=CorridorConfig)

    def __post_init__(self) -> None:
        if len(self.seeds) < 1:
            raise ConfigError("seeds", "seeds = () is not valid; use at least one seed, e.g. (0, 1, 2)")
        if self.groups < 1:
            invalid(self, "groups", "at least 1")
        if self.rollouts < 2:
            invalid(self, "rollouts", "at least 2 (a group needs a baseline)")
        for b in self.betas:
            if not (np.isfinite(b) and b > 0):
                raise ConfigError("betas", f"betas contains {b!r}; use values > 0 (β = 0 is the gigpo row)")
        if not (np.isfinite(self.step_weight) and self.step_weight >= 0):
            invalid(self, "step_weight", "a finite weight ≥ 0")
        check_choices(self)

    def estimators(self) -> list[tuple[str, AdvantagesConfig]]:
        """(label, config) of every estimator scored, in table order."""
        g = self.env.gamma
        rows = [
            ("grpo", AdvantagesConfig(method="grpo", gamma=g)),
            ("gigpo", AdvantagesConfig(method="gigpo", gamma=g, step_weight=self.step_weight, norm=self.norm)),
        ]
        for b in self.betas:
            gaca = AdvantagesConfig(method="gaca", gamma=g, step_weight=self.step_weight, norm=self.norm, beta=b)
            rows.append((f"gaca β={b:g}", gaca))
        if self.hgpo:
            rows.append(("hgpo", AdvantagesConfig(method="hgpo", gamma=g, norm=self.norm)))
            rows.append(("hgpo +base", AdvantagesConfig(method="hgpo", gamma=g, norm=self.norm, base_group=True)))
        return rows


STEP_ONLY = "A^S only (reference)"


def read_truth(log: Log, order: np.ndarray, env: TabularEnv) -> Truth:
    """The truth columns of a sampled log at the file rows `order`."""
    table = log.table
    code = {name: i for i, name in enumerate(env.state_names)}
    state = np.asarray([code[x] for x in table.column(C.ANCHOR_OBS).to_pylist()], dtype=np.int64)[order]
    names = table.column(C.ACTION).to_pylist()
    action = np.asarray([env.action_names[s].index(names[r]) for s, r in zip(state, order)], dtype=np.int64)
    return Truth(
        advantage=table.column(TRUE_ADVANTAGE).to_numpy()[order],
        pivotal=table.column(IS_PIVOTAL).to_numpy(zero_copy_only=False)[order],
        state=state,
        action=action,
        prob=env.prob,
    )


def evaluate_log(log: Log, env: TabularEnv, config: QualityConfig) -> list[dict]:
    """Score every estimator of `config` on one log sampled from `env`.

    Returns one dict per estimator, in table order: {"label", "method", "beta", *SCORES}."""
    out: list[dict] = []
    truth: Truth | None = None
    step_only: dict | None = None
    for label, adv_config in config.estimators():
        run = compute_advantages(log, adv_config)
        if truth is None:
            truth = read_truth(log, np.arange(log.table.num_rows), env)  # results come in file order
        beta = adv_config.beta if adv_config.method == "gaca" else (0.0 if adv_config.method == "gigpo" else None)
        out.append(
            {"label": label, "method": adv_config.method, "beta": beta, **score_advantages(run.result.advantage, truth)}
        )
        if adv_config.method == "gigpo":
            step_only = {
                "label": STEP_ONLY,
                "method": "reference",
                "beta": None,
                **score_advantages(run.result.adv_step, truth),
            }
    if config.include_step_only and step_only is not None:
        out.append(step_only)
    return out


def estimator_quality(
    config: QualityConfig = QualityConfig(),
    on_seed: Callable[[int], None] | None = None,
) -> list[dict]:
    """Sample one log per seed, score every estimator, and aggregate over seeds.

    Returns one dict per estimator, in table order: label, method, beta, n_seeds, and for
    each score S in SCORES the keys S_mean and S_std (sample standard deviation over seeds,
    ddof = 1; 0 with one seed; seeds where the score is undefined are left out), and
    gradient_cosine_vs_gigpo_mean / _std: the paired per-seed difference from gigpo's
    gradient cosine (same logs, so its spread is smaller than either score's).
    `on_seed(seed)` is called after each seed (for progress bars).
    """
    env = build_corridors(config.env)
    per_seed: list[list[dict]] = []
    for seed in config.seeds:
        table = sample_log(env, config.groups, config.rollouts, np.random.default_rng(seed))
        per_seed.append(evaluate_log(as_log(table), env, config))
        if on_seed is not None:
            on_seed(seed)
    rows = []
    for j, first in enumerate(per_seed[0]):
        row = {"label": first["label"], "method": first["method"], "beta": first["beta"], "n_seeds": len(per_seed)}
        for name in SCORES:
            vals = np.asarray([seed_rows[j][name] for seed_rows in per_seed], dtype=np.float64)
            vals = vals[np.isfinite(vals)]
            row[f"{name}_mean"] = float(vals.mean()) if len(vals) else float("nan")
            row[f"{name}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        rows.append(row)
    base = [r["label"] for r in per_seed[0]].index("gigpo")
    for j, row in enumerate(rows):
        diff = np.asarray([r[j]["gradient_cosine"] - r[base]["gradient_cosine"] for r in per_seed])
        diff = diff[np.isfinite(diff)]
        row["gradient_cosine_vs_gigpo_mean"] = float(diff.mean()) if len(diff) else float("nan")
        row["gradient_cosine_vs_gigpo_std"] = float(diff.std(ddof=1)) if len(diff) > 1 else 0.0
    return rows


def describe_environment(config: CorridorConfig = CorridorConfig()) -> dict:
    """Plain facts about the environment for a table header: sizes, success probabilities
    from each start, and the mean true |A| at forks and of routine `forward` steps."""
    env = build_corridors(config)
    Q, V = exact_values(env)
    A = Q - V[:, None]
    p_success = success_probability(env)[env.start]
    fork = env.is_pivotal
    return {
        "tasks": config.n_tasks,
        "states": env.n_states,
        "forks": int(fork.sum()),
        "gamma": config.gamma,
        "success_probability": [float(x) for x in p_success],
        "start_value": [float(x) for x in V[env.start]],
        "mean_abs_advantage_fork": float(np.nanmean(np.abs(A[fork]))),
        "mean_abs_advantage_routine_forward": float(np.mean(np.abs(A[~fork, 0]))),
    }


def quality_markdown(rows: list[dict], digits: int = 3) -> str:
    """The rows of `estimator_quality` as a Markdown table of `mean ± std` cells (a string);
    the last column is the paired difference of gradient cosine from gigpo's."""
    headers = {**SCORE_HEADERS, "gradient_cosine_vs_gigpo": "Δ grad cos vs gigpo"}
    lines = [
        "| " + " | ".join(["estimator", *headers.values()]) + " |",
        "|" + "|".join(["---"] + ["---:"] * len(headers)) + "|",
    ]
    for row in rows:
        cells = [row["label"]]
        for key in headers:
            mean, std = row[f"{key}_mean"], row[f"{key}_std"]
            sign = "+" if key == "gradient_cosine_vs_gigpo" else ""
            cells.append("n/a" if not np.isfinite(mean) else f"{mean:{sign}.{digits}f} ± {std:.{digits}f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
