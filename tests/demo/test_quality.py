"""The estimator-quality environment (gaca_cli/demo/quality.py): exact values against Monte Carlo,
the sampled log against the schema checks, and the evaluation on a tiny configuration."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.compute as pc
import pytest

from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.demo.quality import (
    IS_PIVOTAL,
    SCORES,
    STEP_ONLY,
    TERMINAL,
    TRUE_ADVANTAGE,
    CorridorConfig,
    QualityConfig,
    as_log,
    average_ranks,
    build_corridors,
    cosine,
    estimator_quality,
    evaluate_log,
    exact_values,
    policy_gradient,
    quality_markdown,
    sample_log,
    sign_agreement,
    spearman,
    success_probability,
)
from gaca_cli.log import columns as C
from gaca_cli.log.checks import prepare_log
from gaca_cli.log.reading import read_log
from gaca_cli.log.writing import write_parquet_atomic

# a small corridor with frequent slips, so Monte Carlo sees every kind of transition
SMALL = CorridorConfig(n_tasks=2, corridor_length=8, forks_per_task=2, dead_end_length=2, p_forward=0.8, p_wait=0.12)


def mc_return(env, state: int, action: int | None, n: int, rng: np.random.Generator) -> tuple[float, float]:
    """Slow twin of exact_values: mean and standard error of the discounted return of n
    rollouts from `state` (first action forced when given), sampled step by step."""
    cum = np.cumsum(env.prob, axis=1).tolist()
    reward, next_state = env.reward.tolist(), env.next_state.tolist()
    returns = []
    for _ in range(n):
        s, g, discount, a = state, 0.0, 1.0, action
        while s != TERMINAL:
            if a is None:  # first action whose cumulative probability exceeds u
                u = rng.random()
                a = next((i for i, c in enumerate(cum[s]) if u < c), len(cum[s]) - 1)
            g += discount * reward[s][a]
            discount *= env.gamma
            s, a = next_state[s][a], None
        returns.append(g)
    r = np.asarray(returns)
    return float(r.mean()), float(r.std(ddof=1) / math.sqrt(n))


@pytest.mark.parametrize("gamma, bonus", [(0.95, 0), (1.0, 0), (0.95, 1)])
def test_exact_values_match_monte_carlo(gamma, bonus):
    env = build_corridors(CorridorConfig(**{**SMALL.__dict__, "gamma": gamma, "bonus_forks_per_task": bonus}))
    Q, V = exact_values(env)
    rng = np.random.default_rng(123)
    forks = [int(s) for s in np.flatnonzero(env.is_pivotal & (env.task == 0))]
    assert len(forks) == 2 + bonus
    fatal = [f for f in forks if env.next_state[f, 0] != env.next_state[f, 1]]
    after_fork = fatal[0] + 1  # a routine cell whose `back` returns to the fork
    assert env.task[after_fork] == 0 and not env.is_pivotal[after_fork]
    dead = env.state_names.index(f"task 0: dead end after cell {env.state_names[fatal[0]].split()[-1]}, step 0")
    checks = [(int(s), None) for s in env.start] + [(f, a) for f in forks for a in (0, 1)]
    checks += [(after_fork, a) for a in (0, 1, 2)] + [(dead, None)]
    for state, action in checks:
        exact = V[state] if action is None else Q[state, action]
        mean, se = mc_return(env, state, action, 3000, rng)
        assert abs(mean - exact) < 4 * se + 1e-3, (env.state_names[state], action, mean, exact, se)


def test_values_are_consistent_and_bounded():
    env = build_corridors(CorridorConfig())
    Q, V = exact_values(env)
    # V(s) = Σ_a π(a|s) Q(s, a)
    np.testing.assert_allclose(np.nansum(env.prob * Q, axis=1), V, atol=1e-12)
    # |A(s, a)| ≤ (1 − π(a|s)) · range_b Q(s, b) ≤ −log π(a|s) · range_b Q(s, b)
    A = Q - V[:, None]
    spread = np.nanmax(Q, axis=1) - np.nanmin(Q, axis=1)
    have = env.prob > 0
    bound = (1 - env.prob) * spread[:, None]
    assert np.all(np.abs(A[have]) <= bound[have] + 1e-12)
    assert np.all(bound[have] <= -np.log(env.prob[have]) * spread[:, None].repeat(env.prob.shape[1], 1)[have] + 1e-12)
    # the forks carry the big advantages, routine `forward` tiny ones
    assert np.nanmean(np.abs(A[env.is_pivotal])) > 50 * np.mean(np.abs(A[~env.is_pivotal, 0]))


def test_success_probability_is_the_product_of_the_forks():
    """Without `back` (p_forward + p_wait = 1) a fork is met once, so P(success from the
    start) = Π over the task's forks of π(good branch), the branch that avoids the dead end."""
    env = build_corridors(CorridorConfig(**{**SMALL.__dict__, "p_forward": 0.8, "p_wait": 0.2}))
    p = success_probability(env)
    for task, start in enumerate(env.start):
        forks = np.flatnonzero(env.is_pivotal & (env.task == task))
        product = 1.0
        for s in forks:
            good = [
                a
                for a in range(2)
                if env.next_state[s, a] == TERMINAL or "dead end" not in env.state_names[env.next_state[s, a]]
            ]
            assert len(good) == 1
            product *= env.prob[s, good[0]]
        assert p[start] == pytest.approx(product, abs=1e-12)


def test_sampled_log_passes_the_checks(tmp_path):
    env = build_corridors(SMALL)
    table = sample_log(env, n_groups=4, rollouts=5, rng=np.random.default_rng(0))
    path = tmp_path / "corridors.parquet"
    write_parquet_atomic(table, path, {})
    log = read_log([path])
    for command in ("validate", "advantages:grpo", "advantages:gigpo", "advantages:gaca"):
        _, warnings = prepare_log(log, command)
        assert warnings["singleton_groups"] == 0 and warnings["differing_initial_anchors"] == 0
    t = log.table
    assert t.column(C.GROUP_ID).unique().to_pylist() == [f"g{g:04d}" for g in range(4)]
    assert len(t.column(C.TRAJ_ID).unique()) == 20
    # the NLL is the behaviour policy's, and true_advantage is Q − V of the logged (state, action)
    Q, V = exact_values(env)
    states = [env.state_names.index(x) for x in t.column(C.ANCHOR_OBS).to_pylist()]
    actions = [env.action_names[s].index(a) for s, a in zip(states, t.column(C.ACTION).to_pylist())]
    nll = t.column(C.NLL_MEAN).to_numpy()
    np.testing.assert_allclose(nll, -np.log(env.prob[states, actions]), rtol=1e-15)
    lp = pc.list_flatten(t.column(C.BEHAVIOR_LOGPROBS)).to_numpy()
    np.testing.assert_allclose(lp, -nll, rtol=1e-6)
    np.testing.assert_allclose(t.column(TRUE_ADVANTAGE).to_numpy(), Q[states, actions] - V[states], atol=1e-15)
    assert t.column(IS_PIVOTAL).to_pylist() == [env.is_pivotal[s] for s in states]
    # rollouts of a group revisit the same anchors (GiGPO's step groups are not singletons)
    assert len(set(zip(t.column(C.GROUP_ID).to_pylist(), states))) < t.num_rows / 3
    # each trajectory ends with done, and its success flag matches the last reward
    done = t.column(C.DONE).to_numpy(zero_copy_only=False)
    assert done.sum() == 20


def test_sampling_is_seeded():
    env = build_corridors(SMALL)
    a = sample_log(env, 3, 4, np.random.default_rng(5))
    b = sample_log(env, 3, 4, np.random.default_rng(5))
    c = sample_log(env, 3, 4, np.random.default_rng(6))
    assert a.equals(b)
    assert not a.equals(c)


def _ranks_slow(x):
    return [sum(1.0 for y in x if y < v) + (sum(1.0 for y in x if y == v) + 1) / 2 for v in x]


@pytest.mark.parametrize("seed", range(4))
def test_spearman_against_a_loop(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 5, size=30).astype(float)  # many ties
    y = x + rng.normal(size=30)
    np.testing.assert_allclose(average_ranks(x), _ranks_slow(list(x)))
    rx, ry = np.asarray(_ranks_slow(list(x))), np.asarray(_ranks_slow(list(y)))
    assert spearman(x, y) == pytest.approx(np.corrcoef(rx, ry)[0, 1], abs=1e-12)
    assert math.isnan(spearman(np.ones(5), y[:5]))


def test_sign_agreement_counts_zero_as_half():
    truth = np.array([1.0, -2.0, 3.0, 0.0, -1.0])
    est = np.array([0.5, -1.0, 0.0, 9.0, 1.0])  # agree, agree, zero (½), skipped, disagree
    assert sign_agreement(est, truth) == pytest.approx(2.5 / 4)


def test_policy_gradient_against_a_loop():
    rng = np.random.default_rng(0)
    prob = rng.dirichlet(np.ones(3), size=5)
    state = rng.integers(0, 5, size=40)
    action = rng.integers(0, 3, size=40)
    adv = rng.normal(size=40)
    slow = np.zeros_like(prob)
    for s, a, x in zip(state, action, adv):
        onehot = np.eye(3)[a]
        slow[s] += x * (onehot - prob[s])
    np.testing.assert_allclose(policy_gradient(adv, state, action, prob), slow, atol=1e-12)
    assert cosine(slow, slow) == pytest.approx(1.0)


def test_evaluation_on_a_tiny_configuration():
    config = QualityConfig(seeds=(0, 1), groups=8, rollouts=4, betas=(0.3,), env=SMALL)
    rows = estimator_quality(config)
    assert [r["label"] for r in rows] == ["grpo", "gigpo", "gaca β=0.3", "hgpo", "hgpo +base", STEP_ONLY]
    assert [r["method"] for r in rows[3:5]] == ["hgpo", "hgpo"] and rows[3]["beta"] is None
    for r in rows:
        assert r["n_seeds"] == 2
        for name in SCORES:
            mean, std = r[f"{name}_mean"], r[f"{name}_std"]
            assert np.isfinite(mean) and std >= 0
            assert (0 <= mean <= 1) if name.startswith("sign") else (-1 <= mean <= 1)
        # every estimator points the right way at the forks, and the update is aligned
        assert r["spearman_pivotal_mean"] > 0.2
        assert r["sign_pivotal_mean"] > 0.5
        assert r["gradient_cosine_mean"] > 0.3
    gigpo = rows[1]
    assert gigpo["gradient_cosine_vs_gigpo_mean"] == 0.0 and gigpo["gradient_cosine_vs_gigpo_std"] == 0.0
    for r in rows:
        assert r["gradient_cosine_vs_gigpo_mean"] == pytest.approx(
            r["gradient_cosine_mean"] - gigpo["gradient_cosine_mean"]
        )
    text = quality_markdown(rows)
    assert text.count("\n") == 1 + len(rows) and "| gaca β=0.3 |" in text


def test_hgpo_rows_take_the_recipe_defaults_and_the_norm():
    default = dict(QualityConfig().estimators())
    assert (default["hgpo"].history_length, default["hgpo"].length_weight_alpha, default["hgpo"].norm) == (2, 1.0, None)
    assert default["hgpo +base"].base_group and not default["hgpo"].base_group
    mean = dict(QualityConfig(norm="mean").estimators())
    assert mean["hgpo"].norm == mean["hgpo +base"].norm == mean["gigpo"].norm == "mean"
    assert "hgpo" not in dict(QualityConfig(hgpo=False).estimators())


class _HgpoWindowOne(QualityConfig):
    """GiGPO and HGPO with only the window of the last anchor (K = 0), mean normalisation."""

    def estimators(self) -> list[tuple[str, AdvantagesConfig]]:
        g = self.env.gamma
        hgpo = AdvantagesConfig(method="hgpo", gamma=g, norm="mean", history_length=0)
        return [("gigpo", AdvantagesConfig(method="gigpo", gamma=g)), ("hgpo", hgpo)]


def test_hgpo_with_one_window_scores_like_the_step_signal():
    """K = 0, no base group, mean norm: HGPO's A_t is GiGPO's A^S times w/(w + ε), a positive
    scale, so every score (ranks, signs, cosine) equals the A^S-only reference row."""
    config = _HgpoWindowOne(seeds=(5,), groups=6, rollouts=4, env=SMALL)
    env = build_corridors(SMALL)
    rows = evaluate_log(as_log(sample_log(env, 6, 4, np.random.default_rng(5))), env, config)
    assert [r["label"] for r in rows] == ["gigpo", "hgpo", STEP_ONLY]
    for name in SCORES:
        assert rows[1][name] == pytest.approx(rows[2][name], abs=1e-9), name
    assert rows[1]["gradient_cosine"] != pytest.approx(rows[0]["gradient_cosine"], abs=1e-6)


def test_gaca_with_a_tiny_beta_scores_like_gigpo():
    config = QualityConfig(seeds=(3,), groups=4, rollouts=4, betas=(1e-12,), include_step_only=False, env=SMALL)
    rows = estimator_quality(config)
    gigpo, gaca = rows[1], rows[2]
    for name in SCORES:
        assert gaca[f"{name}_mean"] == pytest.approx(gigpo[f"{name}_mean"], abs=1e-9)


def test_configs_reject_bad_values():
    with pytest.raises(ValueError, match="rollouts"):
        QualityConfig(rollouts=1)
    with pytest.raises(ValueError, match="betas"):
        QualityConfig(betas=(0.0,))
    with pytest.raises(ValueError, match="norm"):
        QualityConfig(norm="max")
    with pytest.raises(ValueError, match="p_good_range"):
        CorridorConfig(p_good_range=(0.6, 0.4))
    with pytest.raises(ValueError, match="corridor_length"):
        CorridorConfig(corridor_length=4, forks_per_task=3)
