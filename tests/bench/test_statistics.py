"""Confidence intervals, paired differences and the power formulas on numbers checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.harness.statistics import (
    T_975,
    Z_80,
    Z_975,
    detectable_effect,
    mean_ci,
    paired_difference,
    seeds_needed,
    t_quantile_975,
)


def test_mean_ci_on_known_numbers():
    """x = 1, 2, 3, 4, 5: mean 3, s = √2.5 = 1.5811, t_{0.975, 4} = 2.7764,
    half-width = 2.7764 · 1.5811 / √5 = 1.9632."""
    ci = mean_ci([1, 2, 3, 4, 5])
    assert ci.mean == 3.0 and ci.n == 5
    assert ci.sd == pytest.approx(math.sqrt(2.5))
    assert ci.half_width == pytest.approx(1.9632, abs=1e-4)
    assert (ci.low, ci.high) == pytest.approx((3 - 1.9632, 3 + 1.9632), abs=1e-4)
    assert ci.excludes_zero


def test_mean_ci_of_one_value_has_no_width_and_constant_values_have_zero_width():
    one = mean_ci([0.4])
    assert one.mean == 0.4 and math.isnan(one.half_width)
    assert one.as_dict()["low"] is None
    flat = mean_ci([0.25, 0.25, 0.25])
    assert flat.half_width == 0.0 and flat.low == flat.high == 0.25


def test_mean_ci_rejects_empty_and_nan():
    with pytest.raises(ValueError):
        mean_ci([])
    with pytest.raises(ValueError):
        mean_ci([0.1, float("nan")])


def test_paired_difference_uses_the_pairs():
    """a − b = 0.1, 0.2, 0.0, 0.1: mean 0.1, s = 0.0816, t_{0.975, 3} = 3.1824,
    half-width = 3.1824 · 0.0816 / 2 = 0.1299; unpaired spreads (0.3 over a) do not enter."""
    a = [0.5, 0.8, 0.2, 0.6]
    b = [0.4, 0.6, 0.2, 0.5]
    d = paired_difference(a, b)
    assert d.mean == pytest.approx(0.1)
    assert d.half_width == pytest.approx(3.1824 * np.std([0.1, 0.2, 0.0, 0.1], ddof=1) / 2, abs=1e-9)
    assert not d.excludes_zero  # low = −0.0299
    with pytest.raises(ValueError):
        paired_difference([1, 2], [1, 2, 3])


def test_paired_difference_is_antisymmetric():
    rng = np.random.default_rng(0)
    a, b = rng.random(6), rng.random(6)
    ab, ba = paired_difference(a, b), paired_difference(b, a)
    assert ab.mean == pytest.approx(-ba.mean) and ab.half_width == pytest.approx(ba.half_width)


def test_t_quantiles_table_and_expansion():
    assert t_quantile_975(1) == 12.7062 and t_quantile_975(30) == 2.0423
    assert list(T_975) == sorted(T_975, reverse=True)  # decreasing in df
    # beyond the table: t_{0.975, 40} = 2.0211, t_{0.975, 120} = 1.9799 (standard tables)
    assert t_quantile_975(40) == pytest.approx(2.0211, abs=2e-4)
    assert t_quantile_975(120) == pytest.approx(1.9799, abs=2e-4)
    assert t_quantile_975(31) < t_quantile_975(30)
    with pytest.raises(ValueError):
        t_quantile_975(0)


def test_power_formulas():
    """sd 0.05, effect 0.05: n = (1.96 + 0.8416)² = 7.85 → 8; detectable effect of n = 8 is
    (t_{0.975,7} + z_{0.8}) · 0.05 / √8 = (2.3646 + 0.8416) · 0.0177 = 0.0567."""
    assert seeds_needed(0.05, 0.05) == 8
    assert seeds_needed(0.0, 0.05) == 2
    assert detectable_effect(0.05, 8) == pytest.approx((2.3646 + Z_80) * 0.05 / math.sqrt(8))
    assert detectable_effect(0.05, 8) == pytest.approx(0.0567, abs=1e-4)
    assert Z_975 == pytest.approx(1.959964, abs=1e-6)
    with pytest.raises(ValueError):
        seeds_needed(0.1, 0.0)
    with pytest.raises(ValueError):
        detectable_effect(0.1, 1)
