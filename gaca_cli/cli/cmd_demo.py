"""`gaca demo`: the whole pipeline, small, on CPU, ending with inspect and the quality table."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import JsonOption, check_output, err_console, print_json, user_errors
from gaca_cli.cli.options import ConfigOptions, config_options
from gaca_cli.demo.run import DemoConfig


@app.command()
@config_options(DemoConfig)
def demo(
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Keep every intermediate file here (default: a temporary directory)."
    ),
    *,
    options: ConfigOptions[DemoConfig],
    as_json: bool = JsonOption,
) -> None:
    """Run the whole pipeline on TextWorld in a few minutes on CPU.

    Generates TextWorld games locally, fits a tiny Llama to their walkthroughs, then for each
    method runs collect → gaca score → gaca advantages → gaca train-offline → collect, and
    reports the success rates with their 95 % intervals (at the default 24 rollouts they show
    the loop running, not which method is better); then scores the estimators against exact advantages on a
    tabular environment; ends with `gaca inspect` of the GACA-annotated log and the quality
    table. Needs the textworld extra (pip install 'gaca-cli[textworld]').

    Example: gaca demo -o runs/demo
    """
    config = options.build(out=output or Path("."))  # validated before a directory is made
    if output is not None:
        check_output(output, directory=True)
    if output is None:
        import tempfile

        config = replace(config, out=Path(tempfile.mkdtemp(prefix="gaca-demo-")))
    from gaca_cli.cli.progress import ProgressBar
    from gaca_cli.demo.run import run_demo

    with (
        user_errors(f"the files written so far are in {config.out}"),
        ProgressBar(err_console(), echo_when_hidden=True) as bar,
    ):
        result = run_demo(config, bar.update)
    summary = {"out": str(config.out), **asdict(result)}  # print_json writes the annotated log's path as text
    if as_json:
        print_json(summary)
        return
    from gaca_cli.inspect.config import InspectConfig
    from gaca_cli.inspect.data import load_annotated
    from gaca_cli.inspect.terminal import render, stdout_console
    from gaca_cli.inspect.views import build_view
    from gaca_cli.render import demo_report

    screen = stdout_console()
    with user_errors():
        view = build_view(load_annotated([str(result.annotated)]), InspectConfig())
    screen.print(render(view, wide=False))
    screen.print(demo_report(summary))
