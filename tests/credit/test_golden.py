"""Golden values on a tiny log, computed by hand, for each method.

The log (tests/credit/record_golden.py: TINY_LOG), γ = 0.5, ε = 1e-6:

    group  traj  step  reward  anchor  nll_mean   G_t (= r_t + 0.5·G_{t+1})
    A      a1    0     0       start   1.0        0.5
    A      a1    1     1       door    3.0        1
    A      a2    0     0       start   2.0        0.5
    A      a2    1     0       key     null       1
    A      a2    2     2       door    4.0        2
    A      a3    0     0       start   1.5        0
    A      a3    1     0       door    1.5        0
    B      b1    0     0       x       0.5        1.5
    B      b1    1     3       y       2.5        3
    B      b2    0     1       x       3.0        1
    C      c1    0     5       x       1.0        5

Episode returns R: a1 = 1, a2 = 2, a3 = 0 (group A: mean 1, std 1); b1 = 3, b2 = 1
(group B: mean 2, std √2); c1 = 5 (group C has one trajectory: A^E = 0).

Step groups (same episode group, same anchor), with their G values:
    A/start {a1:0.5, a2:0.5, a3:0}  mean 1/3, deviations +1/6, +1/6, −1/3, std √(1/12) = 1/(2√3)
    A/door  {a1:1, a2:2, a3:0}      mean 1, deviations 0, +1, −1, std 1
    A/key   {a2:1}                  singleton → A^S = 0
    B/x     {b1:1.5, b2:1}          mean 1.25, deviations ±0.25, std 0.5/√2 = √2/4
    B/y     {b1:3}                  singleton → 0
    C/x     {c1:5}                  singleton → 0 (a different episode group from B/x)

Each test checks the code (a) against the numbers written out here and (b) against the
recorded tests/credit/golden/<case>.json (re-record with `python -m tests.credit.record_golden`).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.credit.record_golden import CASES, FIELDS, GOLDEN_DIR, TINY_LOG, compute
from tests.credit.reference import same_partition

EPS = 1e-6
ROWS = [f"{r[1]}/{r[2]}" for r in TINY_LOG]  # "a1/0", ... in log order


def column(values_by_row: dict) -> list[float]:
    """A column in log order from {"a1/0": value, ...} (missing rows are 0)."""
    return [float(values_by_row.get(key, 0.0)) for key in ROWS]


RETURN_TO_GO = column(
    {"a1/0": 0.5, "a1/1": 1, "a2/0": 0.5, "a2/1": 1, "a2/2": 2, "b1/0": 1.5, "b1/1": 3, "b2/0": 1, "c1/0": 5}
)


def by_traj(values: dict) -> dict:
    """Broadcast per-trajectory values to the trajectory's rows."""
    return {key: values[key.split("/")[0]] for key in ROWS if key.split("/")[0] in values}


def test_grpo():
    """GRPO, norm std (its default): A_t = A^E(τ) = (R − mean) / (std + ε).

    group A: R = 1, 2, 0 → (0, +1, −1) / (1 + 1e-6)       = 0, ±0.999999000001
    group B: R = 3, 1    → (±1) / (√2 + 1e-6)             = ±0.7071062811869...
    group C: one trajectory                               = 0
    adv_step = 0; no step-group or GACA columns.
    """
    a = 1 / (1 + EPS)
    b = 1 / (math.sqrt(2) + EPS)
    adv_e = column(by_traj({"a1": 0, "a2": a, "a3": -a, "b1": b, "b2": -b, "c1": 0}))
    check("grpo", {"return_to_go": RETURN_TO_GO, "adv_episode": adv_e, "adv_step": [0.0] * 11, "advantage": adv_e})


# GiGPO default (mean normalisation): deviations only
ADV_E_MEAN = column(by_traj({"a1": 0, "a2": 1, "a3": -1, "b1": 1, "b2": -1, "c1": 0}))
ADV_S_MEAN = column({"a1/0": 1 / 6, "a2/0": 1 / 6, "a3/0": -1 / 3, "a2/2": 1, "a3/1": -1, "b1/0": 0.25, "b2/0": -0.25})
STEP_GROUPS = ["A/start", "A/door", "A/start", "A/key", "A/door", "A/start", "A/door", "B/x", "B/y", "B/x", "C/x"]
STEP_GROUP_SIZE = [3, 3, 3, 1, 3, 3, 3, 2, 1, 2, 1]


def test_gigpo():
    """GiGPO, its defaults: norm mean at both levels, ω = 1: A_t = A^E + A^S.

    A^E = R − mean: A: a1 0, a2 +1, a3 −1; B: b1 +1, b2 −1; C: 0.
    A^S = G − step-group mean: start +1/6, +1/6, −1/3; door 0, +1, −1; x +0.25, −0.25;
    key, y and C/x are singletons: 0.
        a1: 0 + 1/6 = 1/6,   0 + 0 = 0
        a2: 1 + 1/6 = 7/6,   1 + 0 = 1 (key),   1 + 1 = 2
        a3: −1 − 1/3 = −4/3, −1 − 1 = −2
        b1: 1 + 0.25 = 1.25, 1 + 0 = 1 (y)
        b2: −1 − 0.25 = −1.25
        c1: 0
    """
    advantage = column(
        {
            "a1/0": 1 / 6,
            "a2/0": 7 / 6,
            "a2/1": 1,
            "a2/2": 2,
            "a3/0": -4 / 3,
            "a3/1": -2,
            "b1/0": 1.25,
            "b1/1": 1,
            "b2/0": -1.25,
        }
    )
    check(
        "gigpo",
        {
            "return_to_go": RETURN_TO_GO,
            "adv_episode": ADV_E_MEAN,
            "adv_step": ADV_S_MEAN,
            "step_group_size": STEP_GROUP_SIZE,
            "advantage": advantage,
        },
    )


def test_gigpo_std():
    """GiGPO with --norm std --step-weight 0.5: A_t = A^E + 0.5·A^S, both levels (x − mean)/(std + ε).

    A^E: A: 0, ±1/(1 + ε) = ±0.999999000001; B: ±1/(√2 + ε) = ±0.70710628...; C: 0.
    A^S: start: std = 1/(2√3) = 0.288675..., so +1/6 → (1/6)/(0.288675 + ε) = 0.5773482...,
         −1/3 → −1.1546965...; door: 0, ±1/(1 + ε); x: std √2/4 = 0.353553...,
         ±0.25/(0.353553 + ε) = ±0.7071047...; singletons 0.
    Advantage, e.g. a2/0: 0.999999000001 + 0.5·0.5773482 = 1.2886731...;
                    b1/0: 0.7071062811869 + 0.5·0.7071047811922 = 1.0606586...
    """
    a = 1 / (1 + EPS)
    b = 1 / (math.sqrt(2) + EPS)
    s_start = math.sqrt(1 / 12)
    s_x = math.sqrt(2) / 4
    adv_e = column(by_traj({"a1": 0, "a2": a, "a3": -a, "b1": b, "b2": -b, "c1": 0}))
    adv_s = column(
        {
            "a1/0": (1 / 6) / (s_start + EPS),
            "a2/0": (1 / 6) / (s_start + EPS),
            "a3/0": (-1 / 3) / (s_start + EPS),
            "a2/2": a,
            "a3/1": -a,
            "b1/0": 0.25 / (s_x + EPS),
            "b2/0": -0.25 / (s_x + EPS),
        }
    )
    advantage = [e + 0.5 * s for e, s in zip(adv_e, adv_s)]
    assert math.isclose(advantage[2], 1.2886731346, rel_tol=1e-9)  # a2/0, as written above
    assert math.isclose(advantage[7], 1.0606586718, rel_tol=1e-9)  # b1/0
    check(
        "gigpo_std",
        {
            "return_to_go": RETURN_TO_GO,
            "adv_episode": adv_e,
            "adv_step": adv_s,
            "step_group_size": STEP_GROUP_SIZE,
            "advantage": advantage,
        },
    )


def test_gaca():
    """GACA with β = 0.25, ω = 1 (λ̄ = 1/2), norm mean, NLL standardised per trajectory.

    z (population std within the trajectory, null rows left out):
        a1: u = 1, 3            mean 2, std0 1        → z = −1, +1
        a2: u = 2, null, 4      mean 3, std0 1        → z = −1, 0 (null), +1
        a3: u = 1.5, 1.5        constant              → z = 0, 0
        b1: u = 0.5, 2.5        mean 1.5, std0 1      → z = −1, +1
        b2, c1: one step                              → z = 0
    λ = clip(1/2 + 0.25·z, 0, 1) = 0.25 (z = −1), 0.5 (z = 0), 0.75 (z = +1), but λ̄ = 0.5 on
    rows of singleton step groups (a2/1 key, b1/1 y, c1/0) whatever z is (b1/1 has z = +1).
    A = (1 + ω)·[(1 − λ)·A^E + λ·A^S] = 2·[(1 − λ)·A^E + λ·A^S], with A^E, A^S of test_gigpo:
        a1/0: 2·[0.75·0 + 0.25·(1/6)]      = 1/12
        a1/1: 2·[0.25·0 + 0.75·0]          = 0
        a2/0: 2·[0.75·1 + 0.25·(1/6)]      = 19/12
        a2/1: 2·[0.5·1 + 0.5·0]            = 1
        a2/2: 2·[0.25·1 + 0.75·1]          = 2
        a3/0: 2·[0.5·(−1) + 0.5·(−1/3)]    = −4/3
        a3/1: 2·[0.5·(−1) + 0.5·(−1)]      = −2
        b1/0: 2·[0.75·1 + 0.25·0.25]       = 1.625
        b1/1: 2·[0.5·1 + 0.5·0]            = 1
        b2/0: 2·[0.5·(−1) + 0.5·(−0.25)]   = −1.25
        c1/0: 0
    """
    z = column({"a1/0": -1, "a1/1": 1, "a2/0": -1, "a2/2": 1, "b1/0": -1, "b1/1": 1})
    lam = column(
        {
            "a1/0": 0.25,
            "a1/1": 0.75,
            "a2/0": 0.25,
            "a2/1": 0.5,
            "a2/2": 0.75,
            "a3/0": 0.5,
            "a3/1": 0.5,
            "b1/0": 0.25,
            "b1/1": 0.5,
            "b2/0": 0.5,
            "c1/0": 0.5,
        }
    )
    advantage = column(
        {
            "a1/0": 1 / 12,
            "a2/0": 19 / 12,
            "a2/1": 1,
            "a2/2": 2,
            "a3/0": -4 / 3,
            "a3/1": -2,
            "b1/0": 1.625,
            "b1/1": 1,
            "b2/0": -1.25,
        }
    )
    check(
        "gaca",
        {
            "return_to_go": RETURN_TO_GO,
            "adv_episode": ADV_E_MEAN,
            "adv_step": ADV_S_MEAN,
            "step_group_size": STEP_GROUP_SIZE,
            "nll_z": z,
            "gaca_weight": lam,
            "advantage": advantage,
        },
    )


# HGPO: the history groups of the tiny log (two or more steps, per episode group):
#   window 1 (the step groups): A/start, A/door, B/x as above
#   window 2: A/(start, door) {a1/1: 1, a3/1: 0}; (start, key), (key, door), B/(x, y) alone
#   window 3: A/(start, key, door) alone
HISTORY_GROUPS = [1, 2, 1, 0, 1, 1, 2, 1, 0, 1, 0]


def test_hgpo():
    """HGPO, its defaults: K = 2, α = 1 (window k weighs k + 1), norm std with the population
    std0, no base group: A_t = Σ w·a / (Σ w + ε) over the step's non-zero items.

    A/start: G = 0.5, 0.5, 0: mean 1/3, deviations +1/6, +1/6, −1/3, std0 = √(1/18) = 0.235702...
             items ±(1/6, 1/3)/(std0 + ε): +0.7071038, −1.4142076
    A/door:  G = 1, 2, 0: mean 1, deviations 0 (a1/1: left out), +1, −1, std0 = √(2/3)
             items ±1/(0.8164966 + ε) = ±1.2247434
    A/(start, door): G = 1, 0: deviations ±0.5, std0 0.5: ±0.5/(0.5 + ε) = ±0.999998
    B/x:     G = 1.5, 1: deviations ±0.25, std0 0.25: ±0.25/(0.25 + ε) = ±0.999996
        a1/0: 2·0.7071038/(2 + ε)                       = 0.7071034
        a1/1: 3·0.999998/(3 + ε)            (door: 0)   = 0.9999977
        a2/0: as a1/0; a2/1: no group: 0
        a2/2: 2·1.2247434/(2 + ε)                       = 1.2247428
        a3/0: 2·(−1.4142076)/(2 + ε)                    = −1.4142069
        a3/1: (2·(−1.2247434) + 3·(−0.999998))/(5 + ε)  = −1.0898959
        b1/0, b2/0: ±2·0.999996/(2 + ε)                 = ±0.9999955
        b1/1, c1/0: no group: 0
    """
    s_start, s_door = math.sqrt(1 / 18), math.sqrt(2 / 3)
    start, door, pair, x = (1 / 6) / (s_start + EPS), 1 / (s_door + EPS), 0.5 / (0.5 + EPS), 0.25 / (0.25 + EPS)
    advantage = column(
        {
            "a1/0": 2 * start / (2 + EPS),
            "a1/1": 3 * pair / (3 + EPS),
            "a2/0": 2 * start / (2 + EPS),
            "a2/2": 2 * door / (2 + EPS),
            "a3/0": -4 * start / (2 + EPS),
            "a3/1": -(2 * door + 3 * pair) / (5 + EPS),
            "b1/0": 2 * x / (2 + EPS),
            "b2/0": -2 * x / (2 + EPS),
        }
    )
    assert math.isclose(advantage[6], -1.0898959, rel_tol=1e-7)  # a3/1, as written above
    check("hgpo", {"return_to_go": RETURN_TO_GO, "history_groups": HISTORY_GROUPS, "advantage": advantage})


def test_hgpo_mean_base():
    """HGPO with --norm mean --base-group --history-length 1 --length-weight-alpha 2: items
    G − mean of windows 1 (weight 2² = 4) and 2 (weight 3² = 9), and A^E (weight 1, GiGPO's
    mean-normalised A^E of test_gigpo: a1 0, a2 +1, a3 −1, b1 +1, b2 −1, c1 0); items equal
    to 0 are left out.
        a1/0: A^E 0; start +1/6                 → 4·(1/6)/(4 + ε)              = (2/3)/(4 + ε)
        a1/1: A^E 0; door 0; (start, door) +0.5 → 9·0.5/(9 + ε)                = 4.5/(9 + ε)
        a2/0: A^E +1; start +1/6                → (1 + 4/6)/(5 + ε)            = (5/3)/(5 + ε)
        a2/1: A^E +1 alone                      → 1/(1 + ε)
        a2/2: A^E +1; door +1                   → (1 + 4)/(5 + ε)
        a3/0: A^E −1; start −1/3                → (−1 − 4/3)/(5 + ε)           = −(7/3)/(5 + ε)
        a3/1: A^E −1; door −1; (start, door) −0.5 → (−1 − 4 − 4.5)/(14 + ε)    = −9.5/(14 + ε)
        b1/0: A^E +1; x +0.25                   → (1 + 1)/(5 + ε);  b2/0: −2/(5 + ε)
        b1/1: A^E +1 alone                      → 1/(1 + ε)
        c1/0: nothing non-zero                  → 0
    """
    advantage = column(
        {
            "a1/0": (2 / 3) / (4 + EPS),
            "a1/1": 4.5 / (9 + EPS),
            "a2/0": (5 / 3) / (5 + EPS),
            "a2/1": 1 / (1 + EPS),
            "a2/2": 5 / (5 + EPS),
            "a3/0": -(7 / 3) / (5 + EPS),
            "a3/1": -9.5 / (14 + EPS),
            "b1/0": 2 / (5 + EPS),
            "b1/1": 1 / (1 + EPS),
            "b2/0": -2 / (5 + EPS),
        }
    )
    check(
        "hgpo_mean_base",
        {
            "return_to_go": RETURN_TO_GO,
            "adv_episode": ADV_E_MEAN,
            "history_groups": HISTORY_GROUPS,
            "advantage": advantage,
        },
    )


def check(case: str, by_hand: dict):
    """Code vs the hand-computed columns, and code vs the recorded golden file."""
    import tempfile
    from pathlib import Path

    params = CASES[case]
    with tempfile.TemporaryDirectory() as tmp:
        code = compute(params, Path(tmp))
    # (a) the hand arithmetic
    for name, expected in by_hand.items():
        np.testing.assert_allclose(
            np.asarray(code[name], dtype=np.float64),
            expected,
            rtol=1e-12,
            atol=1e-15,
            err_msg=f"{case}: {name} vs hand arithmetic",
        )
    method = params["method"]
    written = set(code)
    expected_columns = {"return_to_go", "adv_episode", "adv_step", "advantage", "adv_method"}
    if method in ("gigpo", "gaca"):
        expected_columns |= {"step_group_id", "step_group_size"}
        assert same_partition(code["step_group_id"], STEP_GROUPS)
    if method == "gaca":
        expected_columns |= {"nll_z", "gaca_weight"}
    if method == "hgpo":
        expected_columns = {"return_to_go", "history_groups", "advantage", "adv_method"}
        expected_columns |= {"adv_episode"} if params.get("base_group") else set()
    assert written == expected_columns
    assert code["adv_method"] == [method] * len(TINY_LOG)
    # (b) the recorded file
    golden = json.loads((GOLDEN_DIR / f"{case}.json").read_text())
    assert golden["params"] == params, "golden file recorded with other parameters: re-record"
    assert golden["log"] == [dict(zip(FIELDS, row)) for row in TINY_LOG], "golden file recorded on another log"
    assert set(golden["columns"]) == written
    for name, recorded in golden["columns"].items():
        if name == "adv_method":
            assert code[name] == recorded
        elif name in ("step_group_id", "step_group_size", "history_groups"):
            assert code[name] == recorded, name
        else:
            np.testing.assert_allclose(
                code[name], recorded, rtol=1e-12, atol=1e-15, err_msg=f"{case}: {name} vs golden file"
            )


@pytest.mark.parametrize("case", list(CASES))
def test_golden_files_cover_every_case(case):
    assert (GOLDEN_DIR / f"{case}.json").is_file(), "run `python -m tests.credit.record_golden`"


def test_cli_writes_the_golden_numbers(tmp_path):
    """The same gaca numbers through `gaca advantages` and a Parquet round trip."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from gaca_cli.cli import app
    from tests.credit.record_golden import tiny_table

    src, out = tmp_path / "tiny.parquet", tmp_path / "out.parquet"
    pq.write_table(tiny_table(), src)
    result = CliRunner().invoke(
        app, ["advantages", str(src), "--method", "gaca", "--gamma", "0.5", "--beta", "0.25", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    golden = json.loads((GOLDEN_DIR / "gaca.json").read_text())["columns"]
    table = pq.read_table(out)
    for name in ("advantage", "gaca_weight", "nll_z", "adv_step", "adv_episode"):
        np.testing.assert_allclose(table.column(name).to_numpy(), golden[name], rtol=1e-12, atol=1e-15)
    assert table.column_names[: len(FIELDS)] == list(FIELDS)  # input columns kept, in order
