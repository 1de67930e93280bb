"""`gaca advantages`: GRPO / GiGPO / GACA / HGPO advantages written as new columns."""

from __future__ import annotations

from pathlib import Path

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import JsonOption, MapOption, column_map, output_path, show_summary, user_errors
from gaca_cli.cli.options import ConfigOptions, config_options
from gaca_cli.credit.config import AdvantagesConfig


@app.command()
@config_options(AdvantagesConfig)
def advantages(
    logs: list[Path] = typer.Argument(..., metavar="LOG...", help="Parquet files, globs or directories."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Output Parquet file (default: LOG.<method>.parquet beside LOG)."
    ),
    *,
    options: ConfigOptions[AdvantagesConfig],
    column_maps: list[str] = MapOption,
    as_json: bool = JsonOption,
) -> None:
    """Compute per-step advantages and write them as new columns.

    Adds return_to_go, adv_episode, adv_step, advantage and adv_method (plus step_group_id,
    step_group_size for gigpo/gaca and nll_z, gaca_weight for gaca; hgpo writes
    return_to_go, history_groups, advantage, adv_method, and adv_episode with --base-group);
    every input column is kept. The formulas are in docs/estimators.md and the README.

    Example: gaca advantages scored.parquet --method gaca --beta 0.2 -o annotated.parquet
    """
    config = options.build()
    out = output_path(logs, output, config.method)
    mapping = column_map(column_maps)
    from gaca_cli.api import run_advantages
    from gaca_cli.credit.run import gc_paused
    from gaca_cli.credit.writing import write_annotated
    from gaca_cli.render import advantages_summary

    with user_errors(), gc_paused():
        run = run_advantages(logs, "paths", config, mapping)
        write_annotated(run, out, logs, mapping)
    show_summary({"output": str(out), **run.summary}, advantages_summary, as_json=as_json)
