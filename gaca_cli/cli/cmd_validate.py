"""`gaca validate`: run every input check of the log schema."""

from __future__ import annotations

from pathlib import Path

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.cmd_import import ForOption, FromOption, RewardWeightsOption, check_command
from gaca_cli.cli.common import JsonOption, MapOption, column_map, show_summary, user_errors


@app.command()
def validate(
    logs: list[Path] = typer.Argument(
        ..., metavar="LOG...", help="Parquet files, globs or directories (with --from: the framework's own files)."
    ),
    column_maps: list[str] = MapOption,
    source_format: str | None = FromOption,
    reward_weights: str | None = RewardWeightsOption,
    command: str = ForOption,
    as_json: bool = JsonOption,
) -> None:
    """Check a log against the schema: print every broken rule and the warnings' counts.

    Exit 0 when the log is clean, 1 when a rule is broken. With --from FORMAT the source is
    a framework's own log (as for `gaca import`): it is imported and checked, nothing is
    written, and --map reads a source field under gaca's name (chat-jsonl only).

    Example: gaca validate logs/ --map group_id=uid --for advantages:gaca
    """
    from gaca_cli.api import check

    check_command(command)
    if source_format is not None:
        _validate_source(logs, source_format, column_maps, reward_weights, command, as_json)
        return
    if reward_weights is not None:
        raise typer.BadParameter("reward weights need --from trl or --from swift", param_hint="'--reward-weights'")
    with user_errors():
        log, result = check(logs, command, column_map(column_maps))
    report = {
        "source": log.source,
        "rows": log.table.num_rows,
        "ok": not result.violations,
        "violations": _violations(result.violations),
        "warnings": result.warnings,
    }
    _report(report, as_json)


def _violations(errors: list) -> list[dict]:
    """The broken rules as the report's JSON records."""
    return [
        {"file": v.file, "column": v.column, "rule": v.rule, "rows": list(v.rows), "n_rows": v.n_rows} for v in errors
    ]


def _report(report: dict, as_json: bool) -> None:
    from gaca_cli.render import validation_report

    show_summary(report, validation_report, as_json=as_json)
    if not report["ok"]:
        raise typer.Exit(1)


def _validate_source(
    sources: list[Path],
    source_format: str,
    field_maps: list[str],
    reward_weights: str | None,
    command: str,
    as_json: bool,
) -> None:
    """`validate --from`: import into a temporary file, check, delete."""
    from gaca_cli.api import run_import
    from gaca_cli.cli.cmd_import import check_format, import_options

    source_format = check_format(source_format)
    options = import_options(source_format, field_maps, reward_weights)
    with user_errors():
        result = run_import(source_format, sources, None, options, command)
    s = result.summary
    report = {
        "source": f"{', '.join(map(str, sources))} (--from {source_format})",
        "rows": s["rows"],
        "ok": not result.violations,
        "violations": _violations(result.violations),
        "warnings": s["warnings"],
        "missing": s["missing"],
    }
    _report(report, as_json)
