"""`gaca demo`: the whole pipeline, small, on CPU, ending with inspect and the quality table."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import JsonOption, build_config, err_console, print_json, user_errors


@app.command()
def demo(
    out: Optional[Path] = typer.Option(None, "--out", help="Keep every intermediate file here (default: a temporary directory)."),
    games: int = typer.Option(3, "--games", help="TextWorld games (episode groups)."),
    rollouts: int = typer.Option(8, "--rollouts", help="Rollouts per game and iteration."),
    iterations: int = typer.Option(1, "--iterations", help="Offline updates per method."),
    methods: str = typer.Option("grpo,gigpo,gaca", "--methods", help="Comma-separated estimators to compare."),
    seed: int = typer.Option(0, "--seed", help="Seed of the warm start, the collections and the updates."),
    bc_steps: int = typer.Option(120, "--bc-steps", help="Behaviour-cloning steps of the start model."),
    as_json: bool = JsonOption,
) -> None:
    """Run the whole pipeline on TextWorld in a few minutes on CPU.

    Generates TextWorld games locally, fits a tiny Llama to their walkthroughs, then for each
    method runs collect → gaca score → gaca advantages → gaca train-offline → collect, and
    reports the success rates; then scores the estimators against exact advantages on a
    tabular environment; ends with `gaca inspect` of the GACA-annotated log and the quality
    table. Needs the textworld extra (pip install 'gaca-cli[textworld]').

    Example: gaca demo --out runs/demo
    """
    from gaca_cli.demo.run import DemoConfig, run_demo

    names = tuple(m.strip() for m in methods.split(",") if m.strip())
    workdir = out if out is not None else Path(tempfile.mkdtemp(prefix="gaca-demo-"))
    config = build_config(DemoConfig, out=workdir, games=games, rollouts=rollouts, iterations=iterations,
                          methods=names, seed=seed, bc_steps=bc_steps)
    console = err_console()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with user_errors():
        with Progress(
            TextColumn("[bold]{task.fields[stage]:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=console,
            transient=False,
            disable=not console.is_terminal,
        ) as bar:
            tasks: dict[str, int] = {}

            def progress(stage: str, done: int, total: int, message: str) -> None:
                if stage not in tasks:
                    tasks[stage] = bar.add_task(message, total=total, stage=stage)
                bar.update(tasks[stage], completed=done, total=total, description=message)
                if not console.is_terminal:
                    console.print(f"{stage}: {message}")

            result = run_demo(config, progress)
    if as_json:
        print_json({"out": str(workdir), "success": result.success, "annotated": str(result.annotated),
                    "quality": result.quality, "seconds": result.seconds})
        return
    from gaca_cli.inspect.view import render, stdout_console
    from gaca_cli.inspect.data import InspectConfig, build_view, load_annotated
    from gaca_cli.render import demo_report

    screen = stdout_console()
    with user_errors():
        view = build_view(load_annotated([str(result.annotated)]), InspectConfig())
    screen.print(render(view, wide=False))
    screen.print(demo_report(result.success, result.quality, str(workdir), result.seconds))
