"""Benchmark: how well GRPO, GiGPO, GACA and HGPO advantages match the true advantage Q − V.

The environment is `gaca_cli.demo.quality`'s forked corridors: long corridors of routine cells where
the behaviour policy goes forward with probability 0.97 (rare, cheap slips: wait / back), and
a few forks where it is near 50/50 and the wrong branch leads to a dead end. The behaviour
policy's exact Q and V come from a linear solve, so every logged step carries its true
advantage. For each seed the program samples a grouped log (every group = one start state,
N rollouts), runs `compute_advantages` for each estimator and scores it; the table gives
mean ± standard deviation over seeds. HGPO's rows use the recipe's defaults (K = 2, α = 1,
std normalisation unless --norm is given), without and with the base group.

Columns: Spearman ρ and sign agreement with the true advantage over all steps, over the
fork steps and over slips (routine steps with a rare action), and the cosine between the
policy-gradient updates the estimate and the truth would make ("grad cos"); the last column
is grad cos minus GiGPO's, paired seed by seed (same logs). The reference row "A^S only"
scores GiGPO's step signal alone (not a method of the tool).

    python bench/estimator_quality.py --quick              # a few seconds
    python bench/estimator_quality.py                       # 10 seeds, 32 groups × 8 rollouts
    python bench/estimator_quality.py --gamma 1 --rollouts 4 --betas 0.1,0.3,1,3
    python bench/estimator_quality.py --bonus-forks 2       # returns with several causes
    python bench/estimator_quality.py --json > quality.json
    python bench/estimator_quality.py --regime-map          # where GACA, HGPO beat GiGPO (15-80 s)

--regime-map sweeps one factor at a time around the default (group size N at a fixed budget
of rollouts, slip rate, horizon, γ, β) and prints, per setting, the paired difference
Δ grad cos = GACA − GiGPO with its 95 % interval over seeds (bench/harness/regimes.py), then
HGPO − GiGPO and HGPO − GACA for HGPO at the recipe's defaults (std normalisation) and with
mean normalisation, without and with the base group; it writes bench/results/regime_map.json
and, with matplotlib, regime_map.png.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gaca_cli.demo.quality import (  # noqa: E402
    CorridorConfig,
    QualityConfig,
    describe_environment,
    estimator_quality,
    quality_markdown,
)


def _betas(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--betas expects comma-separated numbers, e.g. 0.1,0.3,1; got {text!r}"
        ) from None


def _finite(x):
    """NaN (an undefined score) as JSON null."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def build_config(args: argparse.Namespace) -> QualityConfig:
    seeds, groups, rollouts = args.seeds, args.groups, args.rollouts
    if args.quick:
        seeds, groups, rollouts = 3, 8, 8
    env = replace(CorridorConfig(), gamma=args.gamma, n_tasks=args.tasks, bonus_forks_per_task=args.bonus_forks)
    return QualityConfig(
        seeds=tuple(range(args.first_seed, args.first_seed + seeds)),
        groups=groups,
        rollouts=rollouts,
        betas=args.betas,
        step_weight=args.step_weight,
        norm=args.norm,
        env=env,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="number of seeds (logs) to average over (default 10)")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed, first-seed+1, …")
    parser.add_argument("--groups", type=int, default=32, help="episode groups per log (default 32)")
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per group (default 8)")
    parser.add_argument("--tasks", type=int, default=4, help="distinct corridors (start states) (default 4)")
    parser.add_argument(
        "--bonus-forks",
        type=int,
        default=0,
        help="forks per corridor whose branches both go on, one paying +0.5 (default 0)",
    )
    parser.add_argument(
        "--gamma", type=float, default=0.95, help="discount of the truth and the estimators (default 0.95)"
    )
    parser.add_argument("--betas", type=_betas, default=(0.1, 0.3, 1.0), help="GACA β values (default 0.1,0.3,1)")
    parser.add_argument("--step-weight", type=float, default=1.0, help="ω for gigpo and gaca (default 1)")
    parser.add_argument(
        "--norm",
        choices=("mean", "std"),
        default=None,
        help="normalisation of gigpo, gaca and hgpo (default: each one's, mean, mean, std); grpo keeps std",
    )
    parser.add_argument("--quick", action="store_true", help="3 seeds, 8 groups × 8 rollouts")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    parser.add_argument(
        "--regime-map", action="store_true", help="sweep N, slip rate, horizon, γ and β (GACA − GiGPO) instead"
    )
    args = parser.parse_args()
    if args.regime_map:
        return regime_main(args)
    try:
        config = build_config(args)
    except ValueError as exc:
        parser.error(str(exc))

    start = time.perf_counter()
    rows = estimator_quality(config, on_seed=lambda s: print(f"seed {s} done", file=sys.stderr))
    elapsed = time.perf_counter() - start
    env = describe_environment(config.env)
    if args.json:
        print(
            json.dumps(
                {
                    "config": {
                        "seeds": list(config.seeds),
                        "groups": config.groups,
                        "rollouts": config.rollouts,
                        "betas": list(config.betas),
                        "step_weight": config.step_weight,
                        "norm": config.norm,
                        "environment": env,
                    },
                    "rows": [{k: _finite(v) for k, v in r.items()} for r in rows],
                },
                indent=2,
            )
        )
        return 0

    success = ", ".join(f"{p:.2f}" for p in env["success_probability"])
    print(
        f"# forked corridors: {env['tasks']} tasks, {env['states']} states, {env['forks']} forks, "
        f"γ = {env['gamma']:g}; success probability per task: {success}"
    )
    print(
        f"# mean |A| at forks {env['mean_abs_advantage_fork']:.3f}, at routine `forward` "
        f"{env['mean_abs_advantage_routine_forward']:.4f}"
    )
    print(
        f"# {len(config.seeds)} seeds × {config.groups} groups × {config.rollouts} rollouts; "
        f"ω = {config.step_weight:g}; norm = {config.norm or 'default'}; mean ± std over seeds; {elapsed:.1f} s"
    )
    print()
    print(quality_markdown(rows))
    return 0


def regime_main(args: argparse.Namespace) -> int:
    from bench.harness.regimes import RegimeConfig, hgpo_markdown, regime_map, regime_markdown

    config = RegimeConfig(seeds=(0, 1, 2) if args.quick else tuple(range(args.first_seed, args.first_seed + 8)))
    if args.quick:
        config = replace(config, budget=64)
    start = time.perf_counter()
    cells = regime_map(config, on_cell=lambda f, v: print(f"{f} = {v:g} done", file=sys.stderr))
    elapsed = time.perf_counter() - start
    doc = {
        "config": {
            "seeds": list(config.seeds),
            "rollouts_per_log": config.budget,
            "default": {
                "group_size": config.rollouts,
                "slip_rate": round(1.0 - config.env.p_forward, 6),
                "horizon": config.env.corridor_length,
                "gamma": config.env.gamma,
                "beta": config.beta,
            },
        },
        "cells": cells,
        "seconds": elapsed,
    }
    out = ROOT / "bench" / "results" / ("regime_map_quick.json" if args.quick else "regime_map.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    d = doc["config"]["default"]
    print(
        f"# regime map: Δ = GACA − GiGPO, paired over {len(config.seeds)} seeds, {config.budget} rollouts per log; "
        f"default N = {d['group_size']}, slip {d['slip_rate']:g}, horizon {d['horizon']}, γ = {d['gamma']:g}, "
        f"β = {d['beta']:g}; * = 95 % CI excludes 0; {elapsed:.0f} s"
    )
    print()
    print(regime_markdown(cells))
    for variants in (("hgpo", "hgpo mean"), ("hgpo +base", "hgpo +base mean")):
        print(f"\n# {' and '.join(variants)}: HGPO − GiGPO and HGPO − GACA on the same logs")
        print()
        print(hgpo_markdown(cells, variants))
    if heat_map(cells, out.with_suffix(".png")):
        print(f"\n# heat map: {out.with_suffix('.png')}")
    return 0


PANELS = (
    ("GACA − GiGPO", lambda c: c["delta_grad_cos"]),
    ("HGPO − GiGPO (recipe defaults: std)", lambda c: c["hgpo"]["hgpo"]["vs_gigpo_grad_cos"]),
    ("HGPO (mean norm) − GiGPO", lambda c: c["hgpo"]["hgpo mean"]["vs_gigpo_grad_cos"]),
    ("HGPO (mean norm) − GACA", lambda c: c["hgpo"]["hgpo mean"]["vs_gaca_grad_cos"]),
)


def heat_map(cells: list[dict], path: Path) -> bool:
    """One panel per paired difference of PANELS; in each, one row per factor, one column per
    swept value (in order), colour = Δ grad cos (each panel its own symmetric scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return False
    factors = list(dict.fromkeys(c["factor"] for c in cells))
    width = max(sum(c["factor"] == f for c in cells) for f in factors)
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(1.6 * width + 2, len(PANELS) * (0.7 * len(factors) + 1.2)))
    for ax, (title, delta) in zip(axes, PANELS):
        grid = np.full((len(factors), width), np.nan)
        for i, f in enumerate(factors):
            row = [c for c in cells if c["factor"] == f]
            for j, c in enumerate(row):
                d = delta(c)
                grid[i, j] = d["mean"] if d and d["mean"] is not None else np.nan
                star = "*" if d and d["low"] is not None and (d["low"] > 0 or d["high"] < 0) else ""
                ax.text(j, i, f"{c['value']:g}\n{grid[i, j]:+.3f}{star}", ha="center", va="center", fontsize=8)
        bound = float(np.nanmax(np.abs(grid))) or 1.0
        for text in ax.texts:  # white on the darkest cells
            x, y = text.get_position()
            if abs(grid[int(y), int(x)]) > 0.6 * bound:
                text.set_color("white")
        image = ax.imshow(grid, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
        ax.set_yticks(range(len(factors)), factors)
        ax.set_xticks([])
        ax.set_title(f"Δ grad cos = {title} (cell: value, Δ; * = 95 % CI excludes 0)", fontsize=10)
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


if __name__ == "__main__":
    raise SystemExit(main())
