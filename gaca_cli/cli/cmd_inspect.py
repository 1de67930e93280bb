"""`gaca inspect`: see where the credit went, in the terminal."""

from __future__ import annotations

from pathlib import Path

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import JsonOption, MapOption, column_map, print_json, user_errors
from gaca_cli.cli.options import ConfigOptions, config_options
from gaca_cli.inspect.config import InspectConfig


@app.command("inspect")
@config_options(InspectConfig)
def inspect_command(
    logs: list[Path] = typer.Argument(..., metavar="ANNOTATED...", help="Log(s) written by `gaca advantages`."),
    *,
    options: ConfigOptions[InspectConfig],
    wide: bool = typer.Option(False, "--wide", help="Show actions and anchors in full."),
    plot: Path | None = typer.Option(
        None, "--plot", metavar="FILE.png", help="Also save figures (needs matplotlib: pip install 'gaca-cli[plot]')."
    ),
    pager: bool = typer.Option(True, "--pager/--no-pager", help="Page long output on a terminal."),
    column_maps: list[str] = MapOption,
    as_json: bool = JsonOption,
) -> None:
    """Show what the estimator did: overview, one trajectory or group, top steps, or a comparison.

    Without options: counts, method and parameters, and the distributions of the advantage,
    λ and step-group sizes. --traj/--group: one line per step (NLL, z, λ, A^E, A^S, A), the
    critical steps (NLL z ≥ 1) marked ★. Output is data on stdout; --json prints it as JSON.

    Example: gaca inspect annotated.parquet --traj task-03/r5 --compare grpo,gigpo,gaca
    """
    config = options.build()
    mapping = column_map(column_maps)
    if plot is not None:
        from gaca_cli.inspect.plot import figure_formats

        with user_errors():
            formats = figure_formats()
        if not plot.suffix:  # as matplotlib does: PNG, with its suffix
            plot = plot.with_name(plot.name + ".png")
        if plot.suffix.lstrip(".").lower() not in formats:
            raise typer.BadParameter(
                f"{str(plot)!r} does not end in a figure format; use FILE.png (or "
                f"{', '.join('.' + f for f in formats if f != 'png')})",
                param_hint="'--plot'",
            )
    from gaca_cli.inspect.data import load_annotated
    from gaca_cli.inspect.views import build_view

    with user_errors():
        annotated = load_annotated([str(p) for p in logs], mapping)
        view = build_view(annotated, config)
        if plot is not None:
            from gaca_cli.inspect.plot import plot_data, save_figure

            save_figure(plot_data(annotated, config), plot)
    if as_json:
        print_json(view)
    else:
        from gaca_cli.inspect.terminal import print_paged, render, stdout_console

        print_paged(stdout_console(), render(view, wide=wide), use_pager=pager)
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)
