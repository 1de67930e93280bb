"""`gaca validate`: run every input check of the log schema."""

from __future__ import annotations

from pathlib import Path

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import JsonOption, MapOption, column_map, show_summary, user_errors


@app.command()
def validate(
    logs: list[Path] = typer.Argument(..., metavar="LOG...", help="Parquet files, globs or directories."),
    column_maps: list[str] = MapOption,
    command: str = typer.Option(
        "validate",
        "--for",
        help="Also check the columns a command needs: advantages:grpo, advantages:gigpo, advantages:gaca, "
        "score, train-offline, inspect.",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Check a log against the schema: print every broken rule and the warnings' counts.

    Exit 0 when the log is clean, 1 when a rule is broken.

    Example: gaca validate logs/ --map group_id=uid --for advantages:gaca
    """
    from gaca_cli.log.checks import inspect_log
    from gaca_cli.log.io import read_log
    from gaca_cli.log.schema import COMMAND_NEEDS
    from gaca_cli.render import validation_report

    if command not in COMMAND_NEEDS:
        raise typer.BadParameter(
            f"unknown command {command!r}; use one of {', '.join(COMMAND_NEEDS)}", param_hint="'--for'"
        )
    with user_errors():
        log = read_log(logs, column_map(column_maps))
        result = inspect_log(log, command)
    report = {
        "source": log.source,
        "rows": log.table.num_rows,
        "ok": not result.violations,
        "violations": [
            {"file": v.file, "column": v.column, "rule": v.rule, "rows": list(v.rows), "n_rows": v.n_rows}
            for v in result.violations
        ],
        "warnings": result.warnings,
    }
    show_summary(report, validation_report, as_json=as_json)
    if result.violations:
        raise typer.Exit(1)
