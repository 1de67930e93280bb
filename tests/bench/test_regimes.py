"""The regime map: one cell per swept value, paired differences that vanish as β → 0."""

from __future__ import annotations

import pytest

from bench.harness.regimes import FACTORS, HGPO_VARIANTS, RegimeConfig, hgpo_markdown, regime_map, regime_markdown

SMALL = RegimeConfig(
    seeds=(0, 1),
    budget=32,
    rollouts=4,
    group_sizes=(4,),
    slip_rates=(0.1,),
    horizons=(12,),
    gammas=(1.0,),
    betas=(1e-9, 1.0),
)


def test_one_cell_per_value_in_factor_order():
    seen = []
    cells = regime_map(SMALL, on_cell=lambda f, v: seen.append((f, v)))
    assert [(c["factor"], c["value"]) for c in cells] == seen
    assert [c["factor"] for c in cells] == list(FACTORS[:4]) + ["beta", "beta"]
    for c in cells:
        assert c["n_seeds"] == 2
        d = c["delta_grad_cos"]
        assert d["low"] <= d["mean"] <= d["high"]
        assert d["mean"] == pytest.approx(c["gaca_grad_cos"] - c["gigpo_grad_cos"])
    table = regime_markdown(cells)
    assert table.count("\n") == len(cells) + 1 and "| slip rate | 0.1 |" in table


def test_gaca_with_beta_near_zero_is_gigpo():
    """β → 0 makes GACA's λ_t = ω/(1+ω) on every step, GiGPO's mix: Δ = 0 on the same logs."""
    cells = regime_map(SMALL)
    tiny = next(c for c in cells if c["factor"] == "beta" and c["value"] == 1e-9)
    assert tiny["delta_grad_cos"]["mean"] == pytest.approx(0.0, abs=1e-6)
    # ranks are not continuous: the 1e-9 term splits GiGPO's ties, which moves average ranks a little
    assert tiny["delta_spearman_forks"]["mean"] == pytest.approx(0.0, abs=0.01)


def test_hgpo_cells_pair_with_gigpo_and_gaca_on_the_same_logs():
    cells = regime_map(SMALL)
    for c in cells:
        assert set(c["hgpo"]) == set(HGPO_VARIANTS)
        for v, h in c["hgpo"].items():
            for key in ("grad_cos", "spearman_forks"):
                for other in ("gigpo", "gaca"):
                    d = h[f"vs_{other}_{key}"]
                    assert d["n"] == 2 and d["low"] <= d["mean"] <= d["high"]
                    assert d["mean"] == pytest.approx(h[key] - c[f"{other}_{key}"]), (v, key, other)
            # paired on the same logs: (HGPO − GiGPO) − (HGPO − GACA) = GACA − GiGPO, seed by seed
            gap = h["vs_gigpo_grad_cos"]["mean"] - h["vs_gaca_grad_cos"]["mean"]
            assert gap == pytest.approx(c["delta_grad_cos"]["mean"])
        assert c["hgpo"]["hgpo"]["grad_cos"] != pytest.approx(c["hgpo"]["hgpo mean"]["grad_cos"])  # the norm matters
    # the β cells and the N = 4 cell share their setting and logs; HGPO has no β
    for c in cells[-2:]:
        for v in HGPO_VARIANTS:
            assert c["hgpo"][v]["grad_cos"] == cells[0]["hgpo"][v]["grad_cos"]
            assert c["hgpo"][v]["vs_gigpo_grad_cos"] == cells[0]["hgpo"][v]["vs_gigpo_grad_cos"]
    table = hgpo_markdown(cells)
    assert table.count("\n") == len(cells) + 1 and "Δ hgpo mean − gaca" in table.splitlines()[0]


def test_config_validation():
    with pytest.raises(ValueError, match="group size"):
        RegimeConfig(budget=30, group_sizes=(4,))
    with pytest.raises(ValueError, match="slip rate"):
        RegimeConfig(slip_rates=(1.0,))
