"""`gaca inspect --plot`: what the figures show (`plot_data`, from the annotated log) and the
figures themselves as one PNG (matplotlib, an optional extra).

matplotlib is imported only here, and this module only by `--plot`; the figure is drawn on
a `matplotlib.figure.Figure` (no pyplot, no global state, no display needed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from gaca_cli.credit.config import METHODS
from gaca_cli.errors import GacaError
from gaca_cli.inspect.config import InspectConfig
from gaca_cli.inspect.data import AnnotatedLog, config_for, recompute, selected_trajs, traj_positions
from gaca_cli.log import columns as C


@dataclass(frozen=True)
class PlotData:
    """What `--plot` draws: λ against NLL, advantage histograms per method, and one
    trajectory's weight profile (float64 arrays, canonical order)."""

    source: str
    nll: np.ndarray | None
    nll_unit: str | None
    weight: np.ndarray | None
    weight_recomputed: bool  # λ from a gaca recomputation (the file's method is not gaca)
    lambda_bar: float | None
    critical: np.ndarray
    advantages: dict[str, np.ndarray]
    traj_id: str
    traj_steps: np.ndarray
    traj_positions: np.ndarray


def _profile_traj(a: AnnotatedLog, config: InspectConfig) -> int:
    if (trajs := selected_trajs(a, config.traj, config.group)) is not None:
        return trajs[0]
    lam = a.values.get(C.GACA_WEIGHT)
    if lam is None:
        return int(np.argmax(a.index.traj_len))
    spread = np.full(a.index.n_traj, -np.inf)
    np.maximum.at(spread, a.index.traj, lam)
    low = np.full(a.index.n_traj, np.inf)
    np.minimum.at(low, a.index.traj, lam)
    return int(np.argmax(spread - low))  # the trajectory where λ moves the most


def plot_data(a: AnnotatedLog, config: InspectConfig) -> PlotData:
    """The file's own advantage plus every other method that can be recomputed (the
    --compare methods when given; then recomputing them must succeed)."""
    methods = list(config.compare) or list(METHODS)
    advantages: dict[str, np.ndarray] = {}
    weight = a.values.get(C.GACA_WEIGHT)
    lambda_bar = a.lambda_bar
    weight_recomputed = False
    for m in methods:
        if m == a.method:
            advantages[m] = a.values[C.ADVANTAGE]
            continue
        try:
            result = recompute(a, m)
        except GacaError:
            if config.compare:
                raise
            continue
        advantages[m] = result.advantage
        if weight is None and result.gaca_weight is not None:
            weight, weight_recomputed = result.gaca_weight, True
            lambda_bar = config_for(a, m).lambda_bar
    if not advantages:
        advantages[a.method or "file"] = a.values[C.ADVANTAGE]
    t = _profile_traj(a, config)
    positions = traj_positions(a, t)
    return PlotData(
        source=a.log.source,
        nll=a.values.get("nll"),
        nll_unit=a.nll_unit,
        weight=weight,
        weight_recomputed=weight_recomputed,
        lambda_bar=lambda_bar,
        critical=a.critical,
        advantages=advantages,
        traj_id=a.traj_ids[t],
        traj_steps=a.index.step[positions],
        traj_positions=positions,
    )


METHOD_COLORS = {"grpo": "#7f7f7f", "gigpo": "#1f77b4", "gaca": "#d62728", "hgpo": "#2ca02c"}
ABOVE, BELOW, AT = "#e6a700", "#3b75c4", "#b0b0b0"  # λ above / below / at λ̄ (as in the terminal)


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise GacaError("--plot needs matplotlib; install it with: pip install 'gaca-cli[plot]'") from None
    return Figure


def figure_formats() -> list[str]:
    """The file suffixes (without the dot) matplotlib writes a figure to, sorted."""
    return sorted(_figure_class()().canvas.get_supported_filetypes())


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666666", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _lambda_vs_nll(ax, data: PlotData) -> None:
    ax.set_title("λ against NLL (every step" + ("; λ of gaca recomputed)" if data.weight_recomputed else ")"))
    if data.weight is None or data.nll is None:
        _note(ax, "λ exists only for --method gaca" if data.nll is not None else "no NLL column: run gaca score")
        return
    ok = np.isfinite(data.nll)
    crit = data.critical & ok
    ax.scatter(data.nll[ok & ~crit], data.weight[ok & ~crit], s=12, alpha=0.6, color=BELOW, label="steps")
    if crit.any():
        ax.scatter(data.nll[crit], data.weight[crit], s=36, marker="*", color=ABOVE, label="critical (z ≥ 1)")
    if data.lambda_bar is not None:
        ax.axhline(data.lambda_bar, color="#444444", linestyle="--", linewidth=1, label=f"λ̄ = {data.lambda_bar:.2f}")
    ax.set_xlabel(f"NLL ({data.nll_unit})")
    ax.set_ylabel("λ (share of the step-level signal)")
    ax.legend(loc="best", fontsize=8)


def _histograms(ax, data: PlotData) -> None:
    ax.set_title("advantage per method (every step)")
    values = np.concatenate(list(data.advantages.values()))
    lo, hi = float(values.min()), float(values.max())
    bins = np.linspace(lo, hi, 41) if hi > lo else 10
    for method, adv in data.advantages.items():
        ax.hist(adv, bins=bins, histtype="step", linewidth=1.6, color=METHOD_COLORS.get(method), label=method)
    ax.axvline(0.0, color="#444444", linewidth=0.8)
    ax.set_xlabel("advantage A")
    ax.set_ylabel("steps")
    ax.legend(loc="best", fontsize=8)


def _weight_profile(ax, data: PlotData) -> None:
    ax.set_title(
        f"trajectory {data.traj_id}: weight profile" + (" (gaca recomputed)" if data.weight_recomputed else "")
    )
    steps = data.traj_steps
    pos = data.traj_positions
    if data.weight is None:
        if data.nll is None:
            _note(ax, "no λ and no NLL in this file")
            return
        ax.bar(steps, data.nll[pos], color=BELOW)
        ax.set_ylabel(f"NLL ({data.nll_unit})")
    else:
        lam = data.weight[pos]
        bar = data.lambda_bar if data.lambda_bar is not None else 0.5
        colors = [ABOVE if x > bar + 1e-12 else BELOW if x < bar - 1e-12 else AT for x in lam]
        ax.bar(steps, lam, color=colors)
        ax.axhline(bar, color="#444444", linestyle="--", linewidth=1)
        ax.set_ylim(0, 1)
        ax.set_ylabel("λ_t (bars)")
        if data.nll is not None:
            twin = ax.twinx()
            twin.plot(steps, data.nll[pos], color="#333333", marker="o", linewidth=1.2)
            crit = data.critical[pos]
            if crit.any():
                twin.plot(steps[crit], data.nll[pos][crit], linestyle="none", marker="*", markersize=14, color=ABOVE)
            twin.set_ylim(bottom=0)
            twin.set_ylabel(f"NLL ({data.nll_unit}, line; ★ critical)")
    ax.set_xlabel("step")
    ax.set_xticks(steps)


def _trajectory_advantages(ax, data: PlotData) -> None:
    ax.set_title(f"trajectory {data.traj_id}: advantage per step")
    pos = data.traj_positions
    for method, adv in data.advantages.items():
        ax.plot(data.traj_steps, adv[pos], marker="o", color=METHOD_COLORS.get(method), label=method)
    ax.axhline(0.0, color="#444444", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("advantage A_t")
    ax.set_xticks(data.traj_steps)
    ax.legend(loc="best", fontsize=8)


def save_figure(data: PlotData, path: str | os.PathLike) -> None:
    """Draw the four panels and write them to `path` (format from its suffix, e.g. .png)."""
    Figure = _figure_class()
    fig = Figure(figsize=(12, 8.5), dpi=100, layout="constrained")
    axes = fig.subplots(2, 2)
    _lambda_vs_nll(axes[0, 0], data)
    _histograms(axes[0, 1], data)
    _weight_profile(axes[1, 0], data)
    _trajectory_advantages(axes[1, 1], data)
    fig.suptitle(f"gaca inspect  {data.source}", fontsize=11)
    try:
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise GacaError(f"--plot cannot write the figure ({exc})", file=str(path)) from None
