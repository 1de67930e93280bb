"""The demo's TextWorld table tells the truth about its size: each rate with its 95 % Wilson
interval, and a line on what a table of that many rollouts can show."""

from __future__ import annotations

import pytest
from rich.console import Console

from gaca_cli.demo.run import wilson_interval
from gaca_cli.render import demo_report


@pytest.mark.parametrize(
    ("wins", "n", "low", "high"),
    [
        # Newcombe (1998), Statistics in Medicine 17:857, table I, method 3 (score, no continuity correction)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        # 10/24: p = 5/12, z² = 3.8415; centre 5/12 + z²/48 = 0.4967, half-width
        # z·√(p(1 − p)/24 + z²/2304) = 0.2129, divided by 1 + z²/24 = 1.1601
        (10, 24, 0.2447, 0.6117),
        (24, 24, 0.8620, 1.0),
    ],
)
def test_wilson_interval_matches_published_values(wins, n, low, high):
    got = wilson_interval(wins, n)
    assert got == pytest.approx((low, high), abs=5e-5)
    assert 0.0 <= got[0] <= wins / n <= got[1] <= 1.0


def test_demo_table_shows_each_rate_with_its_interval_and_what_the_size_allows():
    summary = {
        "out": "runs/demo",
        "success": {"grpo": [10 / 24, 0.5], "gaca": [10 / 24, 6 / 24]},
        "rollouts": 24,
        "quality": [{"label": "gaca β=0.1", "gradient_cosine_mean": 0.96, "gradient_cosine_std": 0.01}],
        "seconds": {"setup": 30.0},
    }
    console = Console(width=160, record=True, color_system=None)
    console.print(demo_report(summary))
    text = console.export_text()
    assert "of 24 rollouts each [95 % Wilson interval]" in text
    assert "0.417 [0.24, 0.61]" in text  # 10/24, as above
    assert "0.250 [0.12, 0.45]" in text  # 6/24
    assert "0.500 [0.31, 0.69]" in text  # 12/24
    # two rates of 24 near 0.5: the difference's 95 % half-width is z·√(2·0.25/24) = 0.28
    assert "closer than about 0.28 can differ by chance" in text
    assert "not which estimator is better" in text
