"""The invariants of docs/estimators.md, checked on the fast code.

Seeded random logs (tests/credit/reference.py:random_rows) with random options, plus Hypothesis for
the properties that benefit from adversarial inputs (shuffles and renaming, no NaN/inf).
Where the spec says "changes no value" the check is bit-exact (the implementation sums within
a group in a canonical order, so this is achievable); where floating-point arithmetic makes
the statement approximate (shifting rewards, ε in the std normalisation) the tolerance is
stated and explained.
"""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gaca_cli.errors import GacaError
from tests.credit.reference import random_rows, run_fast, same_partition

METHODS = ("grpo", "gigpo", "gaca", "hgpo")
FLOATS = ("return_to_go", "adv_episode", "adv_step", "nll_z", "gaca_weight", "advantage")
# derandomize: the same examples on every run (tests must be deterministic); no example database
HYPOTHESIS = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def params_for(rng: random.Random, method: str) -> dict:
    omega = rng.choice([0.0, 0.5, 1.0, 2.0])
    return {
        "method": method,
        "gamma": rng.choice([0.0, 0.5, 0.9, 0.95, 1.0]),
        "norm": rng.choice([None, "std", "mean"]),
        "step_weight": omega,
        "episode_stats": rng.choice(["trajectories", "steps"]),
        "anchor_similarity": rng.choice([None, None, 0.5, 0.75]),
        "beta": rng.choice([0.0, 0.1, 0.7]),
        "nll_scope": rng.choice(["trajectory", "group", "batch"]),
        "nll_reduce": rng.choice(["mean", "sum"]),
        **(
            {
                "history_length": rng.choice([0, 1, 2, 4]),
                "length_weight_alpha": rng.choice([0.0, 1.0, 2.0]),
                "base_group": rng.random() < 0.5,
            }
            if method == "hgpo"
            else {}
        ),
    }


def by_key(rows, out) -> dict:
    """Output arrays re-indexed by (traj_id, step_idx), so differently ordered runs align."""
    order = sorted(range(len(rows)), key=lambda i: (str(rows[i]["traj_id"]), rows[i]["step_idx"]))
    return {name: values[order] for name, values in out.items()}


def assert_bit_equal(a: dict, b: dict, names=FLOATS + ("step_group_size", "history_groups")):
    for name in names:
        if name in a or name in b:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name, strict=True)


def case(seed: int, method: str, **shape):
    rng = random.Random(seed * 7 + METHODS.index(method))
    rows = random_rows(seed, **shape)
    return rows, params_for(rng, method)


SEEDS = range(12)


# ---------------------------------------------------------------- row order and ids


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", SEEDS)
def test_row_shuffle_changes_nothing(method, seed):
    """Shuffling the input rows changes no row's values, step_group_id included (bit-exact)."""
    rows, params = case(seed, method)
    out, _ = run_fast(rows, **params)
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    out2, _ = run_fast(shuffled, **params)
    a, b = by_key(rows, out), by_key(shuffled, out2)
    assert_bit_equal(a, b)
    if method in ("gigpo", "gaca"):
        np.testing.assert_array_equal(a["step_group_id"], b["step_group_id"])


def rename_ids(rows, rng: random.Random):
    """A random injective renaming of group and trajectory ids, switching int <-> str and
    scrambling their sort order."""
    groups = sorted({r["group_id"] for r in rows}, key=str)
    trajs = sorted({r["traj_id"] for r in rows}, key=str)
    as_int = not isinstance(rows[0]["group_id"], int)
    new_g = rng.sample(range(10**6), len(groups))
    new_t = rng.sample(range(10**6), len(trajs))
    gmap = {g: (n if as_int else f"G{n}") for g, n in zip(groups, new_g)}
    tmap = {t: (n if as_int else f"T{n}") for t, n in zip(trajs, new_t)}
    renamed = [{**r, "group_id": gmap[r["group_id"]], "traj_id": tmap[r["traj_id"]]} for r in rows]
    return renamed


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", SEEDS)
def test_renaming_ids_changes_no_value(method, seed):
    """Renaming group / trajectory ids changes no numeric value (bit-exact); step_group_id may
    be renumbered but must induce the same partition of the rows."""
    rows, params = case(seed, method)
    renamed = rename_ids(rows, random.Random(seed))
    out, _ = run_fast(rows, **params)
    out2, _ = run_fast(renamed, **params)  # same row order: arrays align directly
    assert_bit_equal(out, out2)
    if method in ("gigpo", "gaca"):
        assert same_partition(out["step_group_id"], out2["step_group_id"])


@st.composite
def logs(draw, extreme: bool = False):
    """Small logs: 1-3 groups of 1-4 trajectories of 1-4 steps, anchors from a tiny pool,
    rewards from a few values (ties) or arbitrary floats, NLL or null."""
    rewards = (
        st.floats(allow_nan=False, allow_infinity=False, width=64)
        if extreme
        else st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.5]), st.floats(-100, 100))
    )
    nll = st.one_of(st.none(), st.sampled_from([0.5, 1.0]), st.floats(0, 1e6 if extreme else 20))
    rows = []
    n_groups = draw(st.integers(1, 3))
    int_ids = draw(st.booleans())
    t = 0
    for g in range(n_groups):
        for _ in range(draw(st.integers(1, 4))):
            length = draw(st.integers(1, 4))
            for s in range(length):
                rows.append(
                    {
                        "group_id": g if int_ids else f"g{g}",
                        "traj_id": t if int_ids else f"t{t}",
                        "step_idx": s,
                        "reward": draw(rewards),
                        "anchor_obs": draw(st.sampled_from(["", "a", "ab", "abc", "b"])),
                        "nll_mean": draw(nll),
                    }
                )
            t += 1
    perm = draw(st.permutations(range(len(rows))))
    return [rows[i] for i in perm]


@HYPOTHESIS
@given(rows=logs(), method=st.sampled_from(METHODS), seed=st.integers(0, 2**16))
def test_hypothesis_shuffle_and_rename(rows, method, seed):
    params = {**params_for(random.Random(seed), method), "nll_reduce": "mean"}  # the logs carry nll_mean only
    out, _ = run_fast(rows, **params)
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    out2, _ = run_fast(shuffled, **params)
    assert_bit_equal(by_key(rows, out), by_key(shuffled, out2))
    renamed = rename_ids(rows, random.Random(seed))
    out3, _ = run_fast(renamed, **params)
    assert_bit_equal(out, out3)
    if method in ("gigpo", "gaca"):
        assert same_partition(out["step_group_id"], out3["step_group_id"])


# ---------------------------------------------------------------- reductions


@pytest.mark.parametrize("seed", SEEDS)
def test_beta_zero_is_gigpo(seed):
    """β = 0: λ_t = λ̄ everywhere and gaca writes GiGPO's numbers, bit for bit."""
    rows, params = case(seed, "gaca")
    params["beta"] = 0.0
    gaca, _ = run_fast(rows, **params)
    gigpo, _ = run_fast(rows, **{**params, "method": "gigpo"})
    assert_bit_equal(gaca, gigpo, names=("return_to_go", "adv_episode", "adv_step", "advantage", "step_group_size"))
    np.testing.assert_array_equal(gaca["step_group_id"], gigpo["step_group_id"])
    omega = params["step_weight"]
    assert np.all(gaca["gaca_weight"] == omega / (1 + omega))


@pytest.mark.parametrize("norm", [None, "std", "mean"])
@pytest.mark.parametrize("seed", SEEDS)
def test_omega_zero_gigpo_is_grpo(seed, norm):
    """ω = 0: gigpo's advantage equals grpo's under the same normalisation (bit-exact).
    norm=None compares the two methods' defaults only through an explicit norm (their
    defaults differ: std for grpo, mean for gigpo)."""
    rows, params = case(seed, "gigpo")
    resolved = norm or random.Random(seed).choice(["std", "mean"])
    params.update(step_weight=0.0, norm=resolved)
    gigpo, _ = run_fast(rows, **params)
    grpo, _ = run_fast(rows, **{**params, "method": "grpo"})
    np.testing.assert_array_equal(gigpo["advantage"], grpo["advantage"], strict=True)
    np.testing.assert_array_equal(gigpo["adv_episode"], grpo["adv_episode"], strict=True)
    np.testing.assert_array_equal(gigpo["return_to_go"], grpo["return_to_go"], strict=True)
    assert np.all(grpo["adv_step"] == 0.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_hgpo_of_one_window_is_the_step_signal(seed):
    """K = 0 with mean normalisation and no base group: one item, G_t − mean over the step
    group, so A_t = w·A^S / (w + ε), w = 2^α, with GiGPO's A^S (0 for groups of one or of
    equal returns, which HGPO leaves out), to an ulp or two."""
    rows, params = case(seed, "hgpo")
    params.update(history_length=0, norm="mean", base_group=False, anchor_similarity=None)
    hgpo, _ = run_fast(rows, **params)
    gigpo, _ = run_fast(rows, **{**params, "method": "gigpo"})
    w = 2.0 ** params["length_weight_alpha"]
    np.testing.assert_allclose(hgpo["advantage"], w * gigpo["adv_step"] / (w + 1e-6), rtol=1e-14, atol=0)
    np.testing.assert_array_equal(hgpo["history_groups"], (gigpo["step_group_size"] > 1).astype(np.int64))


def test_hgpo_steps_alone_in_every_history_group_get_the_episode_signal():
    """With --base-group a step in no history group of two or more has the single item A^E
    (weight 1): A_t = A^E / (1 + ε); without it, 0. α changes neither."""
    n_alone = 0
    for seed in SEEDS:
        rows, params = case(seed, "hgpo", max_groups=3, max_trajs=5)
        for base in (True, False):
            out, _ = run_fast(rows, **{**params, "base_group": base})
            alone = out["history_groups"] == 0
            want = out["adv_episode"][alone] / (1 + 1e-6) if base else 0.0
            np.testing.assert_array_equal(out["advantage"][alone], want)
            n_alone += int(alone.sum())
    assert n_alone > 20


# ---------------------------------------------------------------- reward transformations


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", SEEDS)
def test_constant_on_last_rewards_of_a_group_changes_no_adv_episode(method, seed):
    """Adding c_g to the last reward of every trajectory of group g shifts every R(τ) of the
    group by c_g, which no normalisation sees. Exact in real arithmetic; in float64 R + c is
    rounded, so the check is to 1e-9 of the column's scale. With dyadic rewards and
    constants every sum is exact and the result must be bit-exact."""
    rng = random.Random(seed)
    dyadic = seed % 2 == 0
    rows, params = case(seed, method, rewards="ints" if dyadic else "dense", episode_reward=False)
    if method == "hgpo":
        params["base_group"] = True  # its A^E
    length = {}
    for r in rows:
        length[r["traj_id"]] = max(length.get(r["traj_id"], 0), r["step_idx"] + 1)
    shift = {g: (rng.randint(-8, 8) / 4 if dyadic else rng.uniform(-50, 50)) for g in {r["group_id"] for r in rows}}
    shifted = [
        {**r, "reward": r["reward"] + shift[r["group_id"]]} if r["step_idx"] == length[r["traj_id"]] - 1 else r
        for r in rows
    ]
    a, _ = run_fast(rows, **params)
    b, _ = run_fast(shifted, **params)
    if dyadic:
        np.testing.assert_array_equal(a["adv_episode"], b["adv_episode"], strict=True)
    else:
        scale = max(float(np.abs(a["adv_episode"]).max()), 1e-300)
        np.testing.assert_allclose(b["adv_episode"], a["adv_episode"], rtol=0, atol=1e-9 * scale)


@pytest.mark.parametrize("k", [2.0, 0.25, 3.0, 1000.0])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", range(8))
def test_scaling_rewards(seed, method, k):
    """Multiplying every reward (and episode_reward) by k > 0: mean-normalised values scale by
    k (bit-exact when k is a power of two, else to 1e-12 relative); std-normalised values are
    unchanged up to ε: d/(s+ε) against kd/(ks+ε) differ by about ε/s relative, so the check
    is to 1e-4 relative on logs whose group spreads are ≥ 0.01. return_to_go scales by k; the
    criticality side (nll_z, λ) does not move at all."""
    rows, params = case(seed, method, rewards=random.Random(seed).choice(["dense", "ints", "sparse"]))
    scaled = [
        {
            **r,
            "reward": r["reward"] * k,
            **({"episode_reward": r["episode_reward"] * k} if "episode_reward" in r else {}),
        }
        for r in rows
    ]
    a, _ = run_fast(rows, **params)
    b, _ = run_fast(scaled, **params)
    exact = k in (2.0, 0.25)
    by_std = (params["norm"] or ("std" if method in ("grpo", "hgpo") else "mean")) == "std"

    def check(name, expected):
        got = b[name]
        if exact:
            np.testing.assert_array_equal(got, expected, err_msg=name, strict=True)
        else:
            scale = float(np.abs(expected).max())
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12 * scale, err_msg=name)

    check("return_to_go", a["return_to_go"] * k)
    for name in ("adv_episode", "adv_step", "advantage"):
        if name not in a:
            continue
        if by_std:  # hgpo: smaller groups (windows), population std: ε/s up to 1e-3
            scale = float(np.abs(a[name]).max())
            rtol = 1e-3 if method == "hgpo" else 1e-4
            np.testing.assert_allclose(b[name], a[name], rtol=rtol, atol=1e-9 * scale, err_msg=name)
        else:
            check(name, a[name] * k)
    if method == "gaca":
        np.testing.assert_array_equal(b["nll_z"], a["nll_z"])
        np.testing.assert_array_equal(b["gaca_weight"], a["gaca_weight"])


# ---------------------------------------------------------------- the criticality weight


def scope_of(row, scope):
    return {"trajectory": ("t", row["traj_id"]), "group": ("g", row["group_id"]), "batch": "all"}[scope]


def u_of(row, reduce):
    """u_t, None for a step without action tokens (null nll_mean; its nll_sum may be 0)."""
    return None if row["nll_mean"] is None else row["nll_mean"] if reduce == "mean" else row["nll_sum"]


@pytest.mark.parametrize("scope", ["trajectory", "group", "batch"])
@pytest.mark.parametrize("seed", SEEDS)
def test_lambda_follows_nll(seed, scope):
    """Within a scope (fixed statistics), λ_t is non-decreasing in u_t; above-average NLL gives
    λ_t ≥ λ̄ and below-average λ_t ≤ λ̄ (the average taken exactly); singleton step groups and
    rows without NLL get λ̄."""
    rng = random.Random(seed)
    rows = random_rows(seed, criticality="nll", max_groups=3, max_trajs=5, max_steps=6)
    omega = rng.choice([0.5, 1.0, 3.0])
    reduce = rng.choice(["mean", "sum"])
    params = {
        "method": "gaca",
        "nll_scope": scope,
        "nll_reduce": reduce,
        "step_weight": omega,
        "beta": rng.choice([0.05, 0.3, 2.0]),
    }
    if rng.random() < 0.5:
        params.update(lambda_min=0.1 * omega / (1 + omega), lambda_max=0.5 + 0.5 * omega / (1 + omega))
    out, _ = run_fast(rows, **params)
    lam, size = out["gaca_weight"], out["step_group_size"]
    lam_bar = omega / (1 + omega)
    members: dict = {}
    for i, row in enumerate(rows):
        if u_of(row, reduce) is None or size[i] == 1:
            assert lam[i] == lam_bar
        if u_of(row, reduce) is not None:
            members.setdefault(scope_of(row, scope), []).append(i)
    for idx in members.values():
        mean = sum(Fraction(u_of(rows[i], reduce)) for i in idx) / len(idx)
        for i in idx:
            u = Fraction(u_of(rows[i], reduce))
            if u > mean:
                assert lam[i] >= lam_bar
            elif u < mean:
                assert lam[i] <= lam_bar
        shared = sorted((u_of(rows[i], reduce), lam[i]) for i in idx if size[i] > 1)
        for (u1, l1), (u2, l2) in zip(shared, shared[1:]):
            assert l1 <= l2, f"λ decreases from u={u1} to u={u2}"
    assert np.all((lam >= params.get("lambda_min", 0.0)) & (lam <= params.get("lambda_max", 1.0)))


@pytest.mark.parametrize("scope", ["trajectory", "group", "batch"])
def test_lambda_of_a_step_never_falls_as_its_nll_rises(scope):
    """Raising one step's NLL (everything else fixed, the scope's statistics included) never
    lowers that step's λ: its standardised score (u − mean)/std0 is increasing in u."""
    rows = random_rows(3, criticality="nll", max_groups=2, max_trajs=4, max_steps=5, shuffle=False)
    out, _ = run_fast(rows, method="gaca", nll_scope=scope, beta=0.4)
    target = next(i for i, r in enumerate(rows) if out["step_group_size"][i] > 1 and r["nll_mean"] is not None)
    previous = -np.inf
    for u in np.linspace(0.0, 8.0, 33):
        changed = [dict(r) for r in rows]
        changed[target]["nll_mean"] = float(u)
        lam = run_fast(changed, method="gaca", nll_scope=scope, beta=0.4)[0]["gaca_weight"][target]
        assert lam >= previous
        previous = lam


# ---------------------------------------------------------------- finiteness


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", SEEDS)
def test_no_nan_or_inf_on_random_logs(method, seed):
    rows, params = case(seed, method)
    out, _ = run_fast(rows, **params)
    for name in FLOATS:
        if name in out:
            assert np.all(np.isfinite(out[name])), name


@pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)
@HYPOTHESIS
@given(
    rows=logs(extreme=True),
    method=st.sampled_from(METHODS),
    norm=st.sampled_from(["std", "mean"]),
    steps=st.booleans(),
    scope=st.sampled_from(["trajectory", "group", "batch"]),
)
def test_no_nan_or_inf_with_extreme_values(rows, method, norm, steps, scope):
    """Any finite rewards (up to ±1.8e308, subnormals) and NLLs up to 1e6: the code either
    writes finite numbers everywhere or refuses with a GacaError (overflow); never NaN/inf."""
    params = {"method": method, "norm": norm, "episode_stats": "steps" if steps else "trajectories", "nll_scope": scope}
    try:
        out, run = run_fast(rows, **params)
    except GacaError:
        return
    for name in FLOATS:
        if name in out:
            assert np.all(np.isfinite(out[name])), name
    for name in run.table.column_names:
        col = run.table.column(name)
        if col.type == "double":
            assert np.all(np.isfinite(col.to_numpy(zero_copy_only=False)[~np.asarray(col.is_null())])), name
