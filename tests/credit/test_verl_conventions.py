"""The options that reproduce verl-agent's conventions (docs/estimators.md, "verl-agent's
conventions"): each one's effect on small logs worked out by hand, the compiled path agreeing
with the numpy path bit for bit, and which of them keep results independent of row order.

The tiny log is the golden one (tests/credit/test_golden.py has its arithmetic):
R(a1) = 1, R(a2) = 2, R(a3) = 0 in group A; R(b1) = 3, R(b2) = 1 in group B; c1 alone in
group C with R = 5; γ = 0.5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gaca_cli.credit.config import AdvantagesConfig
from tests.credit.record_golden import TINY_LOG, compute
from tests.credit.reference import random_rows, rows_to_table, run_fast
from tests.credit.test_paths import assert_same_run, run_both

ROWS = [f"{r[1]}/{r[2]}" for r in TINY_LOG]


def at(columns: dict, row: str, name: str = "adv_episode") -> float:
    return columns[name][ROWS.index(row)]


# --------------------------------------------------------------------------- --singleton-groups


def test_singleton_groups_raw_keeps_a_lone_trajectorys_return(tmp_path):
    """c1 is alone in group C: A^E = 0 by default; with raw, mean 0 and std 1, so A^E = R = 5
    (mean normalisation) or 5 / (1 + ε) (std). Every other row is untouched."""
    base = {"method": "gigpo", "gamma": 0.5}
    zero = compute(base, tmp_path)
    raw = compute({**base, "singleton_groups": "raw"}, tmp_path)
    assert at(zero, "c1/0") == 0.0 and at(raw, "c1/0") == 5.0
    assert at(raw, "c1/0", "advantage") == 5.0  # A^S of C/x is 0 (a step group of one)
    for name in ("adv_episode", "adv_step", "advantage"):
        assert zero[name][:-1] == raw[name][:-1], name
    std = compute({**base, "norm": "std", "singleton_groups": "raw"}, tmp_path)
    assert at(std, "c1/0") == 5.0 / (1.0 + 1e-6)


def test_singleton_groups_raw_with_statistics_over_steps(tmp_path):
    """Over step rows, group A holds R = 1, 1 | 2, 2, 2 | 0, 0 (mean 8/7) and group B 3, 3 | 1
    (mean 7/3); C holds one row, raw: 5."""
    raw = compute({"method": "gigpo", "gamma": 0.5, "episode_stats": "steps", "singleton_groups": "raw"}, tmp_path)
    assert at(raw, "a1/0") == pytest.approx(-1 / 7, abs=1e-15)
    assert at(raw, "a2/2") == pytest.approx(6 / 7, abs=1e-15)
    assert at(raw, "a3/1") == pytest.approx(-8 / 7, abs=1e-15)
    assert at(raw, "b1/1") == pytest.approx(2 / 3, abs=1e-15)
    assert at(raw, "b2/0") == pytest.approx(-4 / 3, abs=1e-15)
    assert at(raw, "c1/0") == 5.0


def test_a_lone_trajectory_of_several_steps_is_not_a_singleton_over_steps():
    """Group G has one trajectory of two steps (R = 3): over trajectories it is a group of one
    (raw: A^E = 3); over steps a group of two equal values (A^E = 0, raw or not)."""
    rows = [
        {"group_id": "G", "traj_id": "g1", "step_idx": 0, "reward": 1.0, "anchor_obs": "s"},
        {"group_id": "G", "traj_id": "g1", "step_idx": 1, "reward": 2.0, "anchor_obs": "t"},
    ]
    by_traj, _ = run_fast(rows, method="grpo", norm="mean", singleton_groups="raw")
    by_step, _ = run_fast(rows, method="grpo", norm="mean", singleton_groups="raw", episode_stats="steps")
    assert by_traj["adv_episode"].tolist() == [3.0, 3.0]
    assert by_step["adv_episode"].tolist() == [0.0, 0.0]


# --------------------------------------------------------------------------- --epsilon


def test_epsilon_is_the_normalisations_epsilon(tmp_path):
    """--norm std with ε = 0.5: group A (R 1, 2, 0: mean 1, std 1) gives a2 = 1 / 1.5; group B
    (3, 1: std √2) gives b1 = 1 / (√2 + 0.5); step group B/x (G 1.5, 1: deviations ±0.25, std
    √2/4) gives b1/0 = 0.25 / (√2/4 + 0.5)."""
    out = compute({"method": "gigpo", "gamma": 0.5, "norm": "std", "epsilon": 0.5}, tmp_path)
    assert at(out, "a2/0") == pytest.approx(1 / 1.5, rel=1e-15)
    assert at(out, "b1/0") == pytest.approx(1 / (math.sqrt(2) + 0.5), rel=1e-15)
    assert at(out, "b1/0", "adv_step") == pytest.approx(0.25 / (math.sqrt(2) / 4 + 0.5), rel=1e-15)
    default = compute({"method": "gigpo", "gamma": 0.5, "norm": "std", "epsilon": 1e-6}, tmp_path)
    assert default == compute({"method": "gigpo", "gamma": 0.5, "norm": "std"}, tmp_path)


# --------------------------------------------------------------------------- --similarity-metric, --similarity-order


def one_step_rows(anchors: list[str]) -> list[dict]:
    """One episode group, one single-step trajectory per anchor, rewards 1, 0, 0, ... ."""
    return [
        {"group_id": "G", "traj_id": f"t{i}", "step_idx": 0, "reward": float(i == 0), "anchor_obs": a}
        for i, a in enumerate(anchors)
    ]


def test_difflib_similarity_differs_from_lcs():
    """'baba' and 'bba': LCS = 3 ('bba'), so 2·3/7 = 6/7 ≥ 0.7 merges them (A^S = ±1/2 of G
    = 1, 0); difflib matches the block 'ba' and nothing either side of it, M = 2, ratio 4/7 <
    0.7: two step groups of one (A^S = 0)."""
    rows = one_step_rows(["baba", "bba"])
    lcs, _ = run_fast(rows, method="gigpo", anchor_similarity=0.7)
    difflib, _ = run_fast(rows, method="gigpo", anchor_similarity=0.7, similarity_metric="difflib")
    assert lcs["step_group_size"].tolist() == [2, 2] and lcs["adv_step"].tolist() == [0.5, -0.5]
    assert difflib["step_group_size"].tolist() == [1, 1] and difflib["adv_step"].tolist() == [0.0, 0.0]


def test_difflib_ratio_puts_the_newcomer_first_and_rows_order_visits_the_file():
    """SequenceMatcher(None, 'abc', 'cac') matches 'a' then 'c' (ratio 4/6), but
    SequenceMatcher(None, 'cac', 'abc') only 'c' (2/6). θ = 1/2.

    rows order, 'cac' in the first row: 'cac' founds a cluster, the newcomer 'abc' scores
    4/6 against it and joins. sorted order: 'abc' founds, 'cac' scores 2/6 and founds its
    own. LCS ('ac', 4/6 both ways) merges them in either order."""
    rows = one_step_rows(["cac", "abc"])
    options = {"method": "gigpo", "anchor_similarity": 0.5, "similarity_metric": "difflib"}
    by_rows, _ = run_fast(rows, **options, similarity_order="rows")
    by_sort, _ = run_fast(rows, **options, similarity_order="sorted")
    assert by_rows["step_group_size"].tolist() == [2, 2]
    assert by_sort["step_group_size"].tolist() == [1, 1]
    swapped, _ = run_fast(rows[::-1], **options, similarity_order="rows")  # 'abc' now first
    assert swapped["step_group_size"].tolist() == [1, 1]
    for order in ("rows", "sorted"):
        lcs, _ = run_fast(rows, method="gigpo", anchor_similarity=0.5, similarity_order=order)
        assert lcs["step_group_size"].tolist() == [2, 2]


def test_rows_order_with_lcs():
    """'aaaa'~'aaab' = 3/4, 'aaab'~'aabb' = 3/4, 'aaaa'~'aabb' = 1/2; θ = 0.7. Sorted: 'aaaa'
    founds, 'aaab' joins it, 'aabb' (1/2 to 'aaaa') founds a second. Rows ('aaab' first):
    'aaab' founds, 'aaaa' and 'aabb' (3/4 each) join it."""
    rows = one_step_rows(["aaab", "aaaa", "aabb"])
    by_sort, _ = run_fast(rows, method="gigpo", anchor_similarity=0.7)
    by_rows, _ = run_fast(rows, method="gigpo", anchor_similarity=0.7, similarity_order="rows")
    assert by_sort["step_group_size"].tolist() == [2, 2, 1]
    assert by_rows["step_group_size"].tolist() == [3, 3, 3]


def test_sorted_order_keeps_difflib_grouping_independent_of_row_order():
    for seed in range(6):
        rows = random_rows(seed)
        options = {"method": "gigpo", "anchor_similarity": 0.6, "similarity_metric": "difflib"}
        a, _ = run_fast(rows, **options)
        perm = np.random.default_rng(seed).permutation(len(rows))
        b, _ = run_fast([rows[i] for i in perm], **options)
        for name in ("adv_step", "advantage", "step_group_size"):
            assert np.array_equal(a[name][perm], b[name]), (seed, name)


# --------------------------------------------------------------------------- both paths


VERL_CONFIGS = [
    {"method": "gaca", "episode_stats": "steps", "singleton_groups": "raw", "norm": "std", "epsilon": 0.01},
    {"method": "gigpo", "singleton_groups": "raw", "epsilon": 0.0, "norm": "std"},
    {
        "method": "gaca",
        "anchor_similarity": 0.6,
        "similarity_metric": "difflib",
        "similarity_order": "rows",
        "singleton_groups": "raw",
        "episode_stats": "steps",
    },
]


@pytest.mark.parametrize("params", VERL_CONFIGS)
@pytest.mark.parametrize("seed", [1, 2, 3])  # 1 and 2 have an episode group of one trajectory
def test_compiled_path_agrees_bit_for_bit(monkeypatch, params, seed):
    table = rows_to_table(random_rows(seed, min_groups=3, max_groups=6))
    numpy_run, compiled_run = run_both(monkeypatch, table, AdvantagesConfig(**params))
    assert_same_run(numpy_run, compiled_run)
