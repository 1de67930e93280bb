"""`gaca import`: the rollout logs of agent-RL frameworks, as a checked gaca log."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import JsonOption, output_path, show_summary, user_errors

#: the formats whose reward is a weighted sum of reward functions' columns
WEIGHTED_FORMATS = ("trl", "swift")
FromOption = typer.Option(None, "--from", metavar="FORMAT", help="The source's format (see `gaca import --list`).")
ForOption = typer.Option(
    "validate",
    "--for",
    help="Also check the columns a command needs: advantages:grpo, advantages:gigpo, advantages:gaca, "
    "advantages:hgpo, score, train-offline, inspect.",
)
FieldMapOption = typer.Option(
    [],
    "--map",
    metavar="FIELD=SOURCE",
    help="chat-jsonl: read the source's field SOURCE as FIELD (repeatable), e.g. --map reward=score.",
)
RewardWeightsOption = typer.Option(
    None,
    "--reward-weights",
    metavar="W1,W2,...",
    help="trl, swift: the run's reward_weights, one per reward function in the source's column order "
    "(default: swift's args.json beside the file, else all 1).",
)


def import_options(source_format: str, field_maps: list[str], reward_weights: str | None):
    """The format options, refused with a usage error that names the flag."""
    from gaca_cli.integrations.imports.base import ImportOptions
    from gaca_cli.log.reading import parse_column_map

    weights = None
    if reward_weights is not None:
        try:
            weights = tuple(float(w) for w in reward_weights.split(","))
        except ValueError:
            raise typer.BadParameter(
                f"{reward_weights!r} is not a comma-separated list of numbers; use e.g. 1,0.5",
                param_hint="'--reward-weights'",
            ) from None
        bad = next((text for text, w in zip(reward_weights.split(","), weights) if not math.isfinite(w)), None)
        if bad is not None:
            raise typer.BadParameter(
                f"{bad.strip()!r} in {reward_weights!r} is not a finite number; every weight must be finite",
                param_hint="'--reward-weights'",
            )
        if source_format not in WEIGHTED_FORMATS:
            raise typer.BadParameter(
                f"only --from {' and '.join(WEIGHTED_FORMATS)} have reward weights", param_hint="'--reward-weights'"
            )
    if field_maps and source_format != "chat-jsonl":
        raise typer.BadParameter(
            "only --from chat-jsonl reads fields under other names; the other formats' fields are fixed",
            param_hint="'--map'",
        )
    try:
        mapping = parse_column_map(field_maps)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--map'") from None
    return ImportOptions(reward_weights=weights, field_map=mapping)


def check_format(source_format: str | None) -> str:
    from gaca_cli.integrations.imports import FORMATS

    if source_format is None:
        raise typer.BadParameter("give the source's format; `gaca import --list` shows them", param_hint="'--from'")
    if source_format not in FORMATS:
        raise typer.BadParameter(
            f"unknown format {source_format!r}; use one of {', '.join(FORMATS)}", param_hint="'--from'"
        )
    return source_format


def check_command(command: str) -> str:
    from gaca_cli.log.schema import COMMAND_NEEDS

    if command not in COMMAND_NEEDS:
        raise typer.BadParameter(
            f"unknown command {command!r}; use one of {', '.join(COMMAND_NEEDS)}", param_hint="'--for'"
        )
    return command


@app.command("import")
def import_(
    sources: list[Path] = typer.Argument(None, metavar="SRC...", help="Files, globs or directories."),
    source_format: str | None = FromOption,
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Output Parquet file (default: STEM.gaca.parquet beside a single source file)."
    ),
    list_formats: bool = typer.Option(False, "--list", help="List the formats, one line each, and exit."),
    command: str = ForOption,
    field_maps: list[str] = FieldMapOption,
    reward_weights: str | None = RewardWeightsOption,
    as_json: bool = JsonOption,
) -> None:
    """Turn an agent-RL framework's rollout logs into a gaca log, checked like `gaca validate`.

    Prints what was mapped, what was derived, what was kept as it is and what is missing.
    Nothing is written when a record does not fit the format or the log breaks a rule.

    Example: gaca import --from trl completions/ -o logs.parquet
    """
    if list_formats:
        from gaca_cli.cli.common import print_json
        from gaca_cli.integrations.imports import FORMATS, format_module

        formats = [{"name": f.name, "summary": f.summary} for f in (format_module(n).INFO for n in FORMATS)]
        if as_json:
            print_json(formats)
        else:
            from rich.console import Console

            from gaca_cli.render import format_list

            Console(highlight=False).print(format_list(formats))
        return
    source_format = check_format(source_format)
    if not sources:
        raise typer.BadParameter("give the files, globs or directories to import", param_hint="'SRC...'")
    options = import_options(source_format, field_maps, reward_weights)
    check_command(command)
    from gaca_cli.integrations.imports import format_module
    from gaca_cli.integrations.imports.base import companion_files

    companions = companion_files(sources, format_module(source_format).INFO.companions)
    out = output_path(sources, output, "gaca", also_read=companions)
    from gaca_cli.api import run_import
    from gaca_cli.render import import_summary

    with user_errors():
        result = run_import(source_format, sources, out, options, command)
    show_summary(result.summary, import_summary, as_json=as_json)
