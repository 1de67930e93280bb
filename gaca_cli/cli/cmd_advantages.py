"""`gaca advantages`: GRPO / GiGPO / GACA advantages written as new columns."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import (
    JsonOption,
    MapOption,
    build_config,
    column_map,
    err_console,
    output_path,
    print_json,
    user_errors,
)
from gaca_cli.advantages.estimators import ESTIMATORS
from gaca_cli.advantages.config import EPISODE_STATS, NLL_REDUCES, NLL_SCOPES, NORMS, AdvantagesConfig

_D = AdvantagesConfig()


def _choice(allowed, value: str | None, flag: str) -> str | None:
    if value is not None and value not in allowed:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(allowed)}", param_hint=flag)
    return value


@app.command()
def advantages(
    logs: list[Path] = typer.Argument(..., metavar="LOG...", help="Parquet files, globs or directories."),
    method: str = typer.Option(_D.method, "--method", "-m", help=f"Estimator: {' | '.join(ESTIMATORS)}."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Output Parquet file (default: LOG.<method>.parquet beside LOG)."),
    gamma: float = typer.Option(_D.gamma, "--gamma", help="Discount γ of the return-to-go G_t."),
    norm: Optional[str] = typer.Option(None, "--norm", help="std | mean (default: std for grpo, mean for gigpo and gaca)."),
    step_weight: float = typer.Option(_D.step_weight, "--step-weight", help="ω: weight of the step-level signal."),
    episode_stats: str = typer.Option(_D.episode_stats, "--episode-stats", help="Episode statistics over: trajectories | steps."),
    anchor_similarity: Optional[float] = typer.Option(
        None, "--anchor-similarity", help="θ in (0, 1): merge anchors with 2·LCS/(|a|+|b|) ≥ θ (default: exact equality)."
    ),
    beta: float = typer.Option(_D.beta, "--beta", help="β: how strongly NLL moves λ away from ω/(1+ω) (gaca)."),
    nll_scope: str = typer.Option(_D.nll_scope, "--nll-scope", help="Standardise NLL within: trajectory | group | batch."),
    nll_reduce: str = typer.Option(_D.nll_reduce, "--nll-reduce", help="Criticality u_t: mean (nats/token) | sum (nats)."),
    lambda_min: float = typer.Option(_D.lambda_min, "--lambda-min", help="Lower clip of λ_t."),
    lambda_max: float = typer.Option(_D.lambda_max, "--lambda-max", help="Upper clip of λ_t."),
    column_maps: list[str] = MapOption,
    as_json: bool = JsonOption,
) -> None:
    """Compute per-step advantages and write them as new columns.

    Adds return_to_go, adv_episode, adv_step, advantage and adv_method (plus step_group_id,
    step_group_size for gigpo/gaca and nll_z, gaca_weight for gaca); every input column is
    kept. The formulas are in docs/estimators.md and the README.

    Example: gaca advantages scored.parquet --method gaca --beta 0.2 -o annotated.parquet
    """
    _choice(tuple(ESTIMATORS), method, "--method")
    _choice(NORMS, norm, "--norm")
    _choice(EPISODE_STATS, episode_stats, "--episode-stats")
    _choice(NLL_SCOPES, nll_scope, "--nll-scope")
    _choice(NLL_REDUCES, nll_reduce, "--nll-reduce")
    config = build_config(
        AdvantagesConfig,
        method=method,
        gamma=gamma,
        norm=norm,
        step_weight=step_weight,
        episode_stats=episode_stats,
        anchor_similarity=anchor_similarity,
        beta=beta,
        nll_scope=nll_scope,
        nll_reduce=nll_reduce,
        lambda_min=lambda_min,
        lambda_max=lambda_max,
    )
    out = output_path(logs, output, method)
    from gaca_cli.advantages.run import compute_advantages, gc_paused
    from gaca_cli.advantages.reading import read_for_advantages
    from gaca_cli.advantages.writing import write_annotated
    from gaca_cli.render import advantages_summary

    mapping = column_map(column_maps)
    with user_errors(), gc_paused():
        log = read_for_advantages(logs, mapping, config)
        run = compute_advantages(log, config)
        write_annotated(run, out, logs, mapping)
    summary = {"output": str(out), **run.summary}
    if as_json:
        print_json(summary)
    else:
        err_console().print(advantages_summary(summary))
