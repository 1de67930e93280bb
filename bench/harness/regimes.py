"""A regime map: where GACA's and HGPO's advantage over GiGPO (against the true advantages) grows or vanishes.

One-factor-at-a-time sweeps around the default forked-corridor setting of `gaca_cli.demo.quality`:
each factor takes a few values while the others stay at their defaults, and for each
setting the same logs are scored by GiGPO and by GACA at β (β = 0 is GiGPO exactly). The
cell is the paired per-seed difference

    Δ = grad cos(GACA β) − grad cos(GiGPO)

with its 95 % Student-t interval over seeds (`statistics.mean_ci`), where grad cos is the
cosine between the policy-gradient updates of the estimate and of the truth (`gaca_cli.demo.quality`);
Δ > 0 means GACA's update points closer to the true one. Alongside, the same paired
difference for Spearman ρ at the forks (the decisive steps). The same logs are also scored by
HGPO (`HGPO_VARIANTS`: the recipe's defaults K = 2, α = 1, std normalisation; with the base
group; both with mean normalisation), each with its paired differences HGPO − GiGPO and
HGPO − GACA.

Factors (`FACTORS`, default value first in the docs, the sweep values here):
* group size N (rollouts per group), at a fixed budget of `budget` rollouts per log;
* slip rate 1 − p_forward (routine mistakes; p_wait : p_back kept at 2 : 1);
* horizon (corridor length, cells between the start and the goal);
* γ (of the truth and of the estimators);
* β (GACA's NLL sensitivity).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from bench.harness.statistics import mean_ci
from gaca_cli.demo.quality import CorridorConfig, QualityConfig, as_log, build_corridors, evaluate_log, sample_log


@dataclass(frozen=True)
class RegimeConfig:
    """The sweep: seeds per cell, rollouts per log (split into groups of N), the default β
    and the values of each factor."""

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    budget: int = 128  # rollouts per log
    rollouts: int = 8  # default group size N
    beta: float = 0.1
    group_sizes: tuple[int, ...] = (2, 4, 8, 16)
    slip_rates: tuple[float, ...] = (0.01, 0.03, 0.1, 0.2)
    horizons: tuple[int, ...] = (8, 16, 24, 48)
    gammas: tuple[float, ...] = (0.9, 0.95, 0.99, 1.0)
    betas: tuple[float, ...] = (0.03, 0.1, 0.3, 1.0, 3.0)
    env: CorridorConfig = CorridorConfig()

    def __post_init__(self) -> None:
        for n in self.group_sizes:
            if n < 2 or self.budget % n:
                raise ValueError(f"group size {n} must be ≥ 2 and divide budget = {self.budget}")
        for s in self.slip_rates:
            if not 0.0 < s < 1.0:
                raise ValueError(f"slip rate {s} must be in (0, 1)")


FACTORS = ("group size N", "slip rate", "horizon", "gamma", "beta")


def _settings(config: RegimeConfig) -> list[tuple[str, float, QualityConfig]]:
    """(factor, value, QualityConfig) of every cell, defaults elsewhere."""
    env = config.env

    def quality(env: CorridorConfig = env, rollouts: int = config.rollouts, beta: float = config.beta) -> QualityConfig:
        return QualityConfig(
            seeds=config.seeds,
            groups=config.budget // rollouts,
            rollouts=rollouts,
            betas=(beta,),
            include_step_only=False,
            env=env,
        )

    out: list[tuple[str, float, QualityConfig]] = []
    out += [("group size N", n, quality(rollouts=n)) for n in config.group_sizes]
    out += [
        ("slip rate", s, quality(env=replace(env, p_forward=1.0 - s, p_wait=2.0 * s / 3.0))) for s in config.slip_rates
    ]
    out += [("horizon", h, quality(env=replace(env, corridor_length=h))) for h in config.horizons]
    out += [("gamma", g, quality(env=replace(env, gamma=g))) for g in config.gammas]
    out += [("beta", b, quality(beta=b)) for b in config.betas]
    return out


HGPO_VARIANTS = ("hgpo", "hgpo +base", "hgpo mean", "hgpo +base mean")
"""HGPO rows of each cell: the recipe's defaults (K = 2, α = 1, std normalisation), with the
base group, and both with mean normalisation (GiGPO's and GACA's default)."""
PAIRED = (("gradient_cosine", "grad_cos"), ("spearman_pivotal", "spearman_forks"))


def _paired(a: np.ndarray, b: np.ndarray) -> dict | None:
    """mean_ci of a − b over the seeds where both are defined, as a dict (None if none)."""
    keep = np.isfinite(a) & np.isfinite(b)
    return mean_ci(a[keep] - b[keep]).as_dict() if keep.any() else None


def _mean(a: np.ndarray) -> float | None:
    keep = np.isfinite(a)
    return float(a[keep].mean()) if keep.any() else None


def regime_map(
    config: RegimeConfig = RegimeConfig(), on_cell: Callable[[str, float], None] | None = None
) -> list[dict]:
    """One dict per cell: factor, value, the paired Δ grad cos and Δ ρ forks (GACA − GiGPO)
    as mean / low / high over seeds, both methods' mean grad cos and ρ forks, and under "hgpo"
    one entry per HGPO_VARIANTS: its mean grad cos and ρ forks and the paired differences
    vs_gigpo_* (HGPO − GiGPO) and vs_gaca_* (HGPO − GACA) on the same logs."""
    cells = []
    for factor, value, quality in _settings(config):
        env = build_corridors(quality.env)
        per_seed = []
        for seed in quality.seeds:
            log = as_log(sample_log(env, quality.groups, quality.rollouts, np.random.default_rng(seed)))
            scored = evaluate_log(log, env, quality)
            rows = {r["label"] if r["method"] == "hgpo" else r["method"]: r for r in scored}
            mean_norm = replace(quality, norm="mean", betas=())  # gigpo and gaca: mean is their default
            rows |= {f"{r['label']} mean": r for r in evaluate_log(log, env, mean_norm) if r["method"] == "hgpo"}
            per_seed.append(rows)
        cell: dict = {"factor": factor, "value": value, "n_seeds": len(per_seed)}
        hgpo: dict = {v: {} for v in HGPO_VARIANTS}
        for score, key in PAIRED:
            col = {name: np.array([r[name][score] for r in per_seed]) for name in ("gigpo", "gaca", *HGPO_VARIANTS)}
            keep = np.isfinite(col["gaca"]) & np.isfinite(col["gigpo"])
            cell[f"gigpo_{key}"] = _mean(col["gigpo"][keep])
            cell[f"gaca_{key}"] = _mean(col["gaca"][keep])
            cell[f"delta_{key}"] = _paired(col["gaca"], col["gigpo"])
            for v in HGPO_VARIANTS:
                hgpo[v][key] = _mean(col[v])
                hgpo[v][f"vs_gigpo_{key}"] = _paired(col[v], col["gigpo"])
                hgpo[v][f"vs_gaca_{key}"] = _paired(col[v], col["gaca"])
        cell["hgpo"] = hgpo
        cells.append(cell)
        if on_cell is not None:
            on_cell(factor, value)
    return cells


def _fmt(d: dict | None) -> str:
    """A paired difference as `mean [low, high]`, * when the interval excludes 0."""
    if d is None or d["mean"] is None:
        return "n/a"
    if d["low"] is None:
        return f"{d['mean']:+.3f}"
    star = "*" if d["low"] > 0 or d["high"] < 0 else ""
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]{star}"


def regime_markdown(cells: list[dict]) -> str:
    """The map as a Markdown table: one row per cell, Δ with its 95 % interval (* when the
    interval excludes 0)."""

    lines = [
        "| factor | value | grad cos gigpo | grad cos gaca | Δ grad cos (95 % CI) | Δ ρ forks (95 % CI) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        lines.append(
            f"| {c['factor']} | {c['value']:g} | {c['gigpo_grad_cos']:.3f} | {c['gaca_grad_cos']:.3f} | "
            f"{_fmt(c['delta_grad_cos'])} | {_fmt(c['delta_spearman_forks'])} |"
        )
    return "\n".join(lines)


def hgpo_markdown(cells: list[dict], variants: tuple[str, ...] = ("hgpo", "hgpo mean"), key: str = "grad_cos") -> str:
    """HGPO's part of the map as a Markdown table: per cell and variant, its mean score and
    the paired differences HGPO − GiGPO and HGPO − GACA with their 95 % intervals."""
    name = {"grad_cos": "grad cos", "spearman_forks": "ρ forks"}[key]
    head = ["factor", "value"]
    for v in variants:
        head += [f"{name} {v}", f"Δ {v} − gigpo", f"Δ {v} − gaca"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for c in cells:
        row = [c["factor"], f"{c['value']:g}"]
        for v in variants:
            h = c["hgpo"][v]
            row += ["n/a" if h[key] is None else f"{h[key]:.3f}", _fmt(h[f"vs_gigpo_{key}"]), _fmt(h[f"vs_gaca_{key}"])]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
