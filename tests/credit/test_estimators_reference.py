"""The fast estimators against their slow twin (tests/credit/reference.py) on seeded random logs.

Every output column is compared row by row (step_group_id as a partition) within 1e-9 of the
column's scale. The random logs vary group counts and lengths, repeat anchors within and
across trajectories, have ties, singleton episode and step groups, one-step trajectories,
integer and string ids, null NLL rows and behavior_logprobs-derived criticality; the
parameters cover every option of `gaca advantages`.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest

from tests.credit.reference import (
    lcs_length,
    random_rows,
    reference_advantages,
    rows_to_table,
    run_fast,
    same_partition,
    similarity,
)

RTOL = 1e-9
METHODS = ("grpo", "gigpo", "gaca", "hgpo")
FLOAT_COLUMNS = ("return_to_go", "adv_episode", "adv_step", "nll_z", "gaca_weight", "advantage")


def assert_matches(rows, params, scale: dict | None = None):
    """Fast vs reference on every column the method writes."""
    ref = reference_advantages(rows, **params)
    fast, _ = run_fast(rows, **params)
    method = params.get("method", "gaca")
    expected = {"return_to_go", "adv_episode", "adv_step", "advantage"}
    if method in ("gigpo", "gaca"):
        expected |= {"step_group_id", "step_group_size"}
    if method == "gaca":
        expected |= {"nll_z", "gaca_weight"}
    if method == "hgpo":
        expected = {"return_to_go", "advantage", "history_groups"} | (
            {"adv_episode"} if params.get("base_group") else set()
        )
    assert set(fast) == expected, f"columns written for {method}"
    for name in FLOAT_COLUMNS:
        if name not in fast:
            continue
        want = np.asarray(ref[name], dtype=np.float64)
        got = fast[name]
        assert got.dtype == np.float64, name
        col_scale = (scale or {}).get(name, float(np.max(np.abs(want))))
        tol = RTOL * np.maximum(np.abs(want), col_scale)
        bad = np.flatnonzero(~(np.abs(got - want) <= tol))
        assert bad.size == 0, (
            f"{name} differs at rows {bad[:5].tolist()} (params {params}): "
            f"fast {got[bad[:5]].tolist()} vs reference {want[bad[:5]].tolist()}"
        )
    if method in ("gigpo", "gaca"):
        assert same_partition(fast["step_group_id"], ref["step_group_id"]), f"step groups differ ({params})"
        np.testing.assert_array_equal(fast["step_group_size"], ref["step_group_size"])
    if method == "hgpo":
        np.testing.assert_array_equal(fast["history_groups"], ref["history_groups"], err_msg=str(params))
    return ref, fast


def random_params(rng: random.Random, method: str, rewards: str) -> dict:
    omega = rng.choice([0.0, 0.5, 1.0, 2.5])
    lam_bar = omega / (1 + omega)
    lam_min, lam_max = 0.0, 1.0
    if rng.random() < 0.3:
        lam_min = round(rng.uniform(0.0, lam_bar), 3)
        lam_max = round(rng.uniform(lam_bar, 1.0), 3)
        lam_min, lam_max = min(lam_min, lam_bar), max(lam_max, lam_bar)
    # near-constant returns: only discounts for which G_t is exact in float64 (see module doc
    # of test_near_constant_returns); otherwise any discount
    gammas = [0.0, 0.5, 1.0] if rewards == "near_constant" else [0.0, 0.5, 0.9, 0.95, 1.0, round(rng.random(), 4)]
    return {
        "method": method,
        "gamma": rng.choice(gammas),
        "norm": rng.choice([None, "std", "mean"]),
        "step_weight": omega,
        "episode_stats": rng.choice(["trajectories", "steps"]),
        "anchor_similarity": rng.choice([None, None, None, 0.3, 0.5, 0.6, 0.75, 0.8, 0.9]),
        "beta": rng.choice([0.0, 0.1, 0.5, 3.0]),
        "nll_scope": rng.choice(["trajectory", "group", "batch"]),
        "nll_reduce": rng.choice(["mean", "sum"]),
        "lambda_min": lam_min,
        "lambda_max": lam_max,
        **(hgpo_params(rng) if method == "hgpo" else {}),
    }


def hgpo_params(rng: random.Random) -> dict:
    return {
        "history_length": rng.choice([0, 1, 2, 3, 4]),
        "length_weight_alpha": rng.choice([0.0, 1.0, 2.0, -0.5, 1.7]),
        "base_group": rng.random() < 0.5,
    }


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", range(40))
def test_random_logs_match_reference(method, seed):
    rng = random.Random(1000 * seed + METHODS.index(method))
    rewards = rng.choice(["dense", "sparse", "ints", "near_constant"])
    rows = random_rows(seed, rewards=rewards, max_groups=rng.choice([1, 3, 6]), max_trajs=rng.choice([1, 3, 6]))
    assert_matches(rows, random_params(rng, method, rewards))


@pytest.mark.parametrize("method", METHODS)
def test_larger_log_matches_reference(method):
    """About a thousand rows (30-40 groups, trajectories up to 12 steps), options at random."""
    rng = random.Random(77)
    rows = random_rows(77, min_groups=30, max_groups=40, max_trajs=8, max_steps=12, rewards="dense")
    assert len(rows) > 800
    assert_matches(rows, random_params(rng, method, "dense"))


def test_reference_reproduces_the_golden_hand_numbers():
    """The reference itself on the tiny log of tests/credit/test_golden.py, whose numbers are checked
    by hand there: the slow twin and the hand arithmetic agree."""
    import json

    from tests.credit.record_golden import CASES, FIELDS, GOLDEN_DIR, TINY_LOG

    rows = [{k: v for k, v in zip(FIELDS, row)} for row in TINY_LOG]
    for case, params in CASES.items():
        ref = reference_advantages(rows, **params)
        golden = json.loads((GOLDEN_DIR / f"{case}.json").read_text())["columns"]
        for name in FLOAT_COLUMNS:
            if name in golden:
                np.testing.assert_allclose(ref[name], golden[name], rtol=1e-12, atol=1e-15, err_msg=f"{case}: {name}")
        if "step_group_id" in golden:
            assert same_partition(ref["step_group_id"], golden["step_group_id"])


# Each option value on its own, the others at their defaults, on logs of every kind.
OPTION_VALUES = [
    {},
    {"gamma": 0.0},
    {"gamma": 1.0},
    {"gamma": 0.5},
    {"norm": "std"},
    {"norm": "mean"},
    {"step_weight": 0.0},
    {"step_weight": 3.0},
    {"episode_stats": "steps"},
    {"anchor_similarity": 0.5},
    {"anchor_similarity": 0.8},
    {"beta": 0.0},
    {"beta": 5.0},
    {"nll_scope": "group"},
    {"nll_scope": "batch"},
    {"nll_reduce": "sum"},
    {"lambda_min": 0.4, "lambda_max": 0.6},
    {"lambda_min": 0.5, "lambda_max": 0.5},
]


@pytest.mark.parametrize(
    "option", OPTION_VALUES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults"
)
@pytest.mark.parametrize("method", METHODS)
def test_each_option_matches_reference(method, option):
    for seed, rewards, criticality, ids in [
        (1, "dense", "nll", "int"),
        (2, "sparse", "logprobs", "str"),
        (3, "ints", "nll", "str"),
    ]:
        rows = random_rows(100 + seed, rewards=rewards, criticality=criticality, ids=ids, max_groups=3, max_trajs=5)
        assert_matches(rows, {"method": method, **option})


HGPO_OPTION_VALUES = [
    {"history_length": 0},
    {"history_length": 1},
    {"history_length": 4},
    {"length_weight_alpha": 0.0},
    {"length_weight_alpha": 2.5},
    {"base_group": True},
    {"base_group": True, "episode_stats": "steps", "norm": "mean"},
    {"base_group": True, "history_length": 3, "length_weight_alpha": 2.0, "norm": "std"},
]


@pytest.mark.parametrize("option", HGPO_OPTION_VALUES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_each_hgpo_option_matches_reference(option):
    for seed, rewards, ids in [(1, "dense", "int"), (2, "sparse", "str"), (3, "ints", "str"), (4, "ints", "int")]:
        rows = random_rows(200 + seed, rewards=rewards, ids=ids, max_groups=3, max_trajs=5, max_steps=7)
        assert_matches(rows, {"method": "hgpo", **option})


def test_hgpo_history_groups_by_hand():
    """One group, anchors a b a b / a b b / b a: windows of k = 1..3 anchors (K = 2).
        k = 1: {a: x0, x2, y0, z1}, {b: x1, x3, y1, y2, z0}
        k = 2: {ab: x1, x3, y1}, {ba: x2, z1}, {bb: y2} (alone)
        k = 3: {aba: x2}, {bab: x3}, {abb: y2} (all alone)
    so the steps are in 1, 2, 2, 2 | 1, 2, 1 | 1, 2 groups of two or more."""
    anchors = {"x": "abab", "y": "abb", "z": "ba"}
    rows = [
        {"group_id": 0, "traj_id": t, "step_idx": s, "reward": float(s + len(t)), "anchor_obs": a}
        for t, seq in anchors.items()
        for s, a in enumerate(seq)
    ]
    ref, fast = assert_matches(rows, {"method": "hgpo"})
    assert fast["history_groups"].tolist() == [1, 2, 2, 2, 1, 2, 1, 1, 2]


@pytest.mark.parametrize("method", METHODS)
def test_anchor_key_wins_and_episode_reward_is_used(method):
    rows = random_rows(7, anchor_key=True, episode_reward=True, max_groups=3, max_trajs=5)
    ref, fast = assert_matches(rows, {"method": method})
    returns = {r["traj_id"]: r["episode_reward"] for r in rows}
    assert len(set(returns.values())) > 1
    if method in ("gigpo", "gaca"):
        keys = [(r["group_id"], r["anchor_key"]) for r in rows]
        assert same_partition(fast["step_group_id"], keys)


def test_singletons_and_one_step_trajectories():
    """One trajectory per group, one step per trajectory: no baseline anywhere, so A^E = A^S = 0
    and λ = λ̄ on every row; the advantage is 0."""
    rows = [
        {"group_id": g, "traj_id": f"t{g}", "step_idx": 0, "reward": float(g), "anchor_obs": "s", "nll_mean": 1.0 + g}
        for g in range(4)
    ]
    for method in METHODS:
        ref, fast = assert_matches(rows, {"method": method, "norm": "std"})
        assert np.all(fast["advantage"] == 0.0)
        if method == "gaca":
            assert np.all(fast["gaca_weight"] == 0.5)


@pytest.mark.parametrize("magnitude", [1e9, 1e12])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("norm", ["std", "mean"])
@pytest.mark.parametrize("episode_reward", [False, True])
def test_near_constant_returns_keep_their_precision(magnitude, method, norm, episode_reward):
    """Returns magnitude + k·1e-3: the spread is 1e-12 (resp. 1e-15) of the value. A one-pass
    or naive mean loses it; the spec asks for stable statistics. The rewards sit on the last
    step and γ ∈ {1, 0.5}, so R(τ) and every G_t are exact in float64 and any correct
    implementation has the same inputs to the statistics; they must then agree with the exact
    rational reference to 1e-9 of the deviations' scale."""
    rows = []
    spreads = [0, 1, 3, 2, 0]
    for g, group in enumerate(["a", "b"]):
        for j, k in enumerate(spreads[: 3 + g]):
            value = magnitude + k * 1e-3
            for step in range(2):
                row = {
                    "group_id": group,
                    "traj_id": f"{group}{j}",
                    "step_idx": step,
                    "reward": value if step == 1 else 0.0,
                    "anchor_obs": f"s{step}",
                    "nll_mean": 0.5 + 0.1 * j + 0.05 * step,
                }
                if episode_reward:
                    row["episode_reward"] = value
                rows.append(row)
    for gamma in (1.0, 0.5):
        params = {"method": method, "norm": norm, "gamma": gamma}
        ref = reference_advantages(rows, **params)
        dev_scale = {
            "adv_episode": max(abs(x) for x in ref["adv_episode"]),
            "advantage": max(abs(x) for x in ref["advantage"]),
        }
        dev_scale["adv_step"] = max(abs(x) for x in ref["adv_step"]) if method in ("gigpo", "gaca") else 0.0
        assert dev_scale["adv_episode"] > 0
        assert_matches(rows, params, scale=dev_scale)


def test_return_to_go_long_trajectory():
    """G_t over 400 steps with γ = 0.99 and rewards of mixed sign and size: a backward
    recursion is good to a few ulps; scaling by γ^-t (a cumsum trick) is not."""
    rng = random.Random(5)
    rows = []
    for t in range(400):
        rows.append(
            {"group_id": 0, "traj_id": 0, "step_idx": t, "reward": rng.choice([1.0, -1.0]) * 10 ** rng.uniform(-3, 3)}
        )
    rows.append({"group_id": 0, "traj_id": 1, "step_idx": 0, "reward": 1.0})
    for gamma in (0.99, 0.5, 0.1):
        ref = reference_advantages(rows, method="grpo", gamma=gamma)
        fast, _ = run_fast(rows, method="grpo", gamma=gamma)
        want = np.array(ref["return_to_go"])
        np.testing.assert_allclose(fast["return_to_go"], want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


# ---------------------------------------------------------------- anchor similarity


def _anchor_rows(anchors_by_group: dict) -> list[dict]:
    rows = []
    for g, anchors in anchors_by_group.items():
        for i, anchor in enumerate(anchors):
            rows.append({"group_id": g, "traj_id": f"{g}-{i}", "step_idx": 0, "reward": float(i), "anchor_obs": anchor})
    return rows


@pytest.mark.parametrize(
    "a, b, theta, merged",
    [
        ("abcde", "abcdx", 0.8, True),  # 2·4/10 = 0.8 exactly: ≥ θ
        ("abcde", "abcdx", 0.81, False),
        ("abc", "abd", 2 / 3, True),  # 2·2/6, the float θ = 2/3 rounds below
        ("ab", "a", 0.6, True),  # 2·1/3 = 0.667
        ("ab", "a", 0.7, False),
        ("abcd", "abce", 0.75, True),  # 6/8
        ("abcdefghij", "abcdefghiz", 0.9, True),  # 18/20
        ("aaa", "", 0.1, False),  # empty vs non-empty: 0
        ("", "", 0.99, True),  # two empty strings: 1 (but they are also equal)
        ("abcd", "dcba", 0.3, False),  # LCS 1: 2/8 = 0.25
        ("abcd", "dcba", 0.25, True),
        ("ab\u00e9c", "ab\u00e8c", 0.78, False),  # characters (6/8), not UTF-8 bytes (8/10)
    ],
)
def test_similarity_threshold_boundaries(a, b, theta, merged):
    rows = _anchor_rows({"g": [a, b]})
    assert (similarity(a, b) >= Fraction(repr(theta))) == merged  # the reference's reading of "≥ θ"
    fast, _ = run_fast(rows, method="gigpo", anchor_similarity=theta)
    assert (fast["step_group_id"][0] == fast["step_group_id"][1]) == merged


def test_similarity_clusters_join_the_first_representative_not_a_chain():
    """Sorted: aaaa, aaab, aabb. sim(aaab, aaaa) = 6/8 → joins aaaa's cluster. sim(aabb, aaaa) =
    4/8 < 0.75, so aabb founds a cluster although sim(aabb, aaab) = 6/8 (no chaining). Then
    abbb: sim with aaaa 2/8, with aabb 6/8 → joins aabb's cluster."""
    rows = _anchor_rows({"g": ["aabb", "abbb", "aaab", "aaaa"], "h": ["aabb", "aaab"]})
    fast, _ = run_fast(rows, method="gigpo", anchor_similarity=0.75)
    sg = fast["step_group_id"]
    assert sg[0] == sg[1] and sg[2] == sg[3] and sg[0] != sg[2]  # {aabb, abbb}, {aaab, aaaa}
    assert sg[4] == sg[5] and sg[4] not in (sg[0], sg[2])  # group h: aaab then aabb (6/8), own ids
    assert_matches(rows, {"method": "gigpo", "anchor_similarity": 0.75})


@pytest.mark.parametrize("seed", range(12))
def test_similarity_clustering_random(seed):
    rng = random.Random(seed)
    theta = rng.choice([0.3, 0.5, 0.6, 0.75, 0.8, 0.9])
    rows = random_rows(seed, max_groups=2, max_trajs=6, max_steps=6)
    assert_matches(rows, {"method": rng.choice(["gigpo", "gaca"]), "anchor_similarity": theta})


def test_reference_lcs_against_brute_force():
    """The reference's own LCS against an exhaustive subsequence search on short strings."""
    from itertools import combinations

    def brute(a, b):
        subs = {"".join(c) for n in range(len(a) + 1) for c in combinations(a, n)}
        return max(len(s) for s in subs if _is_subsequence(s, b))

    rng = random.Random(0)
    for _ in range(200):
        a = "".join(rng.choice("abc") for _ in range(rng.randint(0, 6)))
        b = "".join(rng.choice("abc") for _ in range(rng.randint(0, 6)))
        assert lcs_length(a, b) == brute(a, b)


def _is_subsequence(s, b):
    it = iter(b)
    return all(ch in it for ch in s)


def test_reference_similarity_is_rapidfuzz_indel():
    """The ratio the fast code is told to use (rapidfuzz Indel.normalized_similarity) is the
    spec's 2·LCS/(|a|+|b|)."""
    from rapidfuzz.distance import Indel

    rng = random.Random(1)
    for _ in range(300):
        a = "".join(rng.choice("abcd") for _ in range(rng.randint(0, 8)))
        b = "".join(rng.choice("abcd") for _ in range(rng.randint(0, 8)))
        assert math.isclose(Indel.normalized_similarity(a, b), float(similarity(a, b)), rel_tol=1e-12)


# ---------------------------------------------------------------- criticality sources


@pytest.mark.parametrize("reduce", ["mean", "sum"])
@pytest.mark.parametrize("scope", ["trajectory", "group", "batch"])
def test_behavior_logprobs_criticality(reduce, scope):
    """u_t derived from behavior_logprobs (no NLL column): −mean or −sum of the token
    log-probabilities; empty and null lists are steps without action tokens (z = 0)."""
    rows = random_rows(11, criticality="logprobs", max_groups=3, max_trajs=5)
    assert any(not r["behavior_logprobs"] for r in rows)
    ref, fast = assert_matches(rows, {"method": "gaca", "nll_reduce": reduce, "nll_scope": scope, "beta": 0.3})
    for i, row in enumerate(rows):
        if not row["behavior_logprobs"]:
            assert fast["nll_z"][i] == 0.0


def test_empty_actions_leave_the_sum_statistics_alone():
    """With --nll-reduce sum, a step with no action tokens as gaca score writes it (nll_sum 0,
    nll_mean null) is left out like a null: z = -1, 0, +1 for nll_sum 4, (0), 8, and
    λ = λ̄ + β·z = 0.4, 0.5, 0.6."""
    rows = [
        {"group_id": 0, "traj_id": t, "step_idx": s, "reward": float(s), "anchor_obs": f"s{s}"}
        for t in ("a", "b")
        for s in range(3)
    ]
    for row, nll_sum, nll_mean in zip(rows, [4.0, 0.0, 8.0] * 2, [2.0, None, 4.0] * 2):
        row["nll_sum"], row["nll_mean"] = nll_sum, nll_mean
    ref, fast = assert_matches(rows, {"method": "gaca", "nll_reduce": "sum"})
    np.testing.assert_allclose(fast["nll_z"], [-1.0, 0.0, 1.0] * 2, rtol=1e-12)
    np.testing.assert_allclose(fast["gaca_weight"], [0.4, 0.5, 0.6] * 2, rtol=1e-12)


def test_null_nll_rows_leave_the_statistics_alone():
    """A null nll_mean gets z = 0 and is not counted: the other rows' z is what it would be
    without that row (compared with the same log minus that row, the last step of its
    trajectory, so the rest of the log is unchanged)."""
    base = [
        {
            "group_id": 0,
            "traj_id": t,
            "step_idx": s,
            "reward": float(t + s),
            "anchor_obs": f"s{s}",
            "nll_mean": 1.0 + t * 0.3 + s,
        }
        for t in range(3)
        for s in range(3)
    ]
    with_null = [dict(r) for r in base]
    with_null[5]["nll_mean"] = None  # trajectory 1, step 2 (its last step)
    for scope in ("trajectory", "group", "batch"):
        ref, fast = assert_matches(with_null, {"method": "gaca", "nll_scope": scope})
        assert fast["nll_z"][5] == 0.0
        others = [r for i, r in enumerate(base) if i != 5]
        ref_without, fast_without = assert_matches(others, {"method": "gaca", "nll_scope": scope})
        np.testing.assert_allclose(np.delete(fast["nll_z"], 5), fast_without["nll_z"], rtol=1e-12, atol=1e-15)


def test_gaca_without_any_criticality_says_to_score_first():
    from gaca_cli.errors import GacaError

    rows = [{k: v for k, v in r.items() if k not in ("nll_mean", "nll_sum")} for r in random_rows(4, criticality="nll")]
    with pytest.raises(GacaError, match="gaca score"):
        run_fast(rows, method="gaca")
    with pytest.raises(ValueError, match="gaca score"):
        reference_advantages(rows, method="gaca")


# ---------------------------------------------------------------- through files and the CLI


def test_cli_matches_reference(tmp_path):
    """`gaca advantages` end to end: Parquet in, Parquet out, values equal the reference."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from gaca_cli.cli import app

    rows = random_rows(21, ids="str", criticality="nll", max_groups=3, max_trajs=4)
    src, out = tmp_path / "log.parquet", tmp_path / "out.parquet"
    pq.write_table(rows_to_table(rows), src)
    args = [
        "advantages",
        str(src),
        "--method",
        "gaca",
        "--beta",
        "0.4",
        "--norm",
        "std",
        "--step-weight",
        "2",
        "--gamma",
        "0.9",
        "--nll-scope",
        "group",
        "--episode-stats",
        "steps",
        "-o",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    ref = reference_advantages(
        rows, method="gaca", beta=0.4, norm="std", step_weight=2.0, gamma=0.9, nll_scope="group", episode_stats="steps"
    )
    for name in FLOAT_COLUMNS:
        np.testing.assert_allclose(table.column(name).to_numpy(), ref[name], rtol=1e-9, atol=1e-12)
    assert same_partition(table.column("step_group_id").to_pylist(), ref["step_group_id"])
