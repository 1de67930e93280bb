"""Confidence intervals over seeds, paired differences and a quick power estimate.

Seeds are the experimental units: each seed's number (a success rate over hundreds of
rollouts) is one observation, and methods are compared seed by seed (paired design: within
a seed every method starts from the same model and sees the same games and sampling seeds).

* `mean_ci(x)`: mean ± t_{0.975, n−1} · s / √n, with s the sample standard deviation
  (ddof = 1); the two-sided 95 % Student-t interval. NaN half-width for n < 2.
* `paired_difference(a, b)`: `mean_ci(a − b)`, element by element (seed by seed).
* `seeds_needed(sd, effect)`: the normal-approximation sample size of a two-sided paired
  test at level 0.05 with power 0.8, n = ⌈((z_{0.975} + z_{0.8}) · sd / effect)²⌉.
* `detectable_effect(sd, n)`: the inverse, the smallest mean difference that n seeds detect
  with power 0.8, (t_{0.975, n−1} + z_{0.8}) · sd / √n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z_975 = 1.959963984540054  # the 0.975 quantile of the standard normal
Z_80 = 0.8416212335729143  # the 0.8 quantile of the standard normal

#: t_{0.975, df} for df = 1..30 (standard tables); larger df use a Cornish-Fisher expansion
T_975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (df ≥ 1).

    Exact to 4 decimals from the table for df ≤ 30; beyond, z + (z³ + z)/(4·df) +
    (5z⁵ + 16z³ + 3z)/(96·df²) with z = z_{0.975} (error < 1e-4 there)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Interval:
    """A mean with its 95 % confidence interval [low, high] = mean ∓ half_width, over n values."""

    mean: float
    half_width: float
    n: int
    sd: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def excludes_zero(self) -> bool:
        """The interval lies strictly on one side of 0 (a difference at the 5 % level)."""
        return bool(self.low > 0.0 or self.high < 0.0)

    def as_dict(self) -> dict:
        finite = lambda x: x if math.isfinite(x) else None  # noqa: E731
        return {
            "mean": finite(self.mean),
            "low": finite(self.low),
            "high": finite(self.high),
            "half_width": finite(self.half_width),
            "sd": finite(self.sd),
            "n": self.n,
        }


def mean_ci(values: Sequence[float] | np.ndarray) -> Interval:
    """Mean and two-sided 95 % Student-t interval of `values` (NaN entries are an error)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"mean_ci needs a non-empty 1-D sequence, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("mean_ci got a NaN or infinite value")
    n = int(x.size)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, math.nan, n, math.nan)
    sd = float(x.std(ddof=1))
    return Interval(mean, t_quantile_975(n - 1) * sd / math.sqrt(n), n, sd)


def paired_difference(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> Interval:
    """`mean_ci(a − b)` for two equally long sequences paired element by element."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"paired_difference needs equal shapes, got {x.shape} and {y.shape}")
    return mean_ci(x - y)


def seeds_needed(sd: float, effect: float) -> int:
    """Paired units needed to detect a mean difference `effect` when the differences have
    standard deviation `sd` (two-sided 5 % level, power 0.8, normal approximation)."""
    if not (effect > 0 and sd >= 0):
        raise ValueError(f"seeds_needed needs effect > 0 and sd >= 0, got effect={effect}, sd={sd}")
    return max(2, math.ceil(((Z_975 + Z_80) * sd / effect) ** 2))


def detectable_effect(sd: float, n: int) -> float:
    """The smallest mean difference that `n` paired units detect with power 0.8 (two-sided
    5 % level; t quantile for the level, normal for the power)."""
    if n < 2:
        raise ValueError(f"detectable_effect needs n >= 2, got {n}")
    return (t_quantile_975(n - 1) + Z_80) * sd / math.sqrt(n)
