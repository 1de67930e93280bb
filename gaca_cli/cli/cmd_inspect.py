"""`gaca inspect`: see where the credit went, in the terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import JsonOption, MapOption, build_config, column_map, print_json, user_errors


@app.command("inspect")
def inspect_command(
    logs: list[Path] = typer.Argument(..., metavar="ANNOTATED...", help="Log(s) written by `gaca advantages`."),
    traj: Optional[str] = typer.Option(None, "--traj", help="Show every step of this trajectory."),
    group: Optional[str] = typer.Option(None, "--group", help="Show every step of this episode group."),
    top: Optional[int] = typer.Option(
        None, "--top", metavar="K", help="Show the K most extreme steps (default 10 with --by)."
    ),
    by: Optional[str] = typer.Option(
        None, "--by", help="Key of --top: nll | weight | advantage | abs-advantage (default)."
    ),
    lowest: bool = typer.Option(False, "--lowest", help="With --top: the K smallest values instead of the largest."),
    compare: Optional[str] = typer.Option(
        None,
        "--compare",
        metavar="M1,M2,...",
        help="Recompute these methods with the file's parameters and compare them, e.g. grpo,gigpo,gaca.",
    ),
    wide: bool = typer.Option(False, "--wide", help="Show actions and anchors in full."),
    plot: Optional[Path] = typer.Option(
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
    from gaca_cli.inspect.data import InspectConfig, build_view, load_annotated, plot_data

    methods = tuple(m.strip() for m in compare.split(",") if m.strip()) if compare is not None else ()
    config = build_config(InspectConfig, traj=traj, group=group, top=top, by=by, lowest=lowest, compare=methods)
    mapping = column_map(column_maps)
    with user_errors():
        annotated = load_annotated([str(p) for p in logs], mapping)
        view = build_view(annotated, config)
        if plot is not None:
            from gaca_cli.inspect.plot import save_figure

            save_figure(plot_data(annotated, config), plot)
    if as_json:
        print_json(view)
    else:
        from gaca_cli.inspect.view import print_paged, render, stdout_console

        print_paged(stdout_console(), render(view, wide=wide), use_pager=pager)
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)
