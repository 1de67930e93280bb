"""What every command shares: error handling, consoles, output paths, common options, the summary."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from gaca_cli.errors import GacaError
from gaca_cli.interrupts import NOTHING_WRITTEN, is_interruption, report_interruption

MapOption = typer.Option(
    [],
    "--map",
    metavar="NEW=OLD",
    help="Read column OLD as NEW (repeatable), e.g. --map group_id=uid --map traj_id=traj_uid.",
)
JsonOption = typer.Option(False, "--json", help="Print the result as one JSON object on stdout.")


def err_console():
    """A rich console on stderr: colour only on a terminal, never with NO_COLOR."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


@contextmanager
def user_errors(interrupted: str = NOTHING_WRITTEN) -> Iterator[None]:
    """Turn data/model errors into one `Error:` line and exit status 1, and a Ctrl-C into one
    line saying what is kept (`interrupted`) and exit status 130. Any other exception is a
    bug and keeps its traceback."""
    try:
        yield
    except GacaError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    except (KeyboardInterrupt, Exception) as exc:
        if not is_interruption(exc):
            raise
        report_interruption(interrupted)


def column_map(items: Sequence[str]) -> dict[str, str]:
    from gaca_cli.log.reading import parse_column_map

    try:
        return parse_column_map(items)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--map'") from None


def output_path(inputs: Sequence[Path], output: Path | None, suffix: str, also_read: Sequence[Path] = ()) -> Path:
    """-o if given, else `<stem>.<suffix>.parquet` beside a single input file. Refuses to
    overwrite an input (or a file in `also_read`, which the command reads besides) or to write
    inside an input directory."""
    from gaca_cli.files import same_or_inside

    if output is None:
        if len(inputs) != 1 or Path(inputs[0]).is_dir() or any(c in str(inputs[0]) for c in "*?["):
            raise typer.BadParameter(
                "a directory, a glob or several inputs: give the output file with -o", param_hint="'-o'"
            )
        src = Path(inputs[0])
        output = src.with_name(f"{src.stem}.{suffix}.parquet")
    clash = same_or_inside(output, inputs)
    if clash is not None:
        raise typer.BadParameter(
            f"{output} would overwrite or fall inside the input {clash}; choose another -o", param_hint="'-o'"
        )
    clash = same_or_inside(output, also_read)
    if clash is not None:
        raise typer.BadParameter(
            f"{output} would overwrite {clash}, which is read with the input; choose another -o", param_hint="'-o'"
        )
    check_output(output)
    return output


def check_output(output: Path, directory: bool = False, flag: str = "-o") -> None:
    """Refuse, before any work, an output (given with `flag`) that cannot be written: one
    `Error:` line, exit 1."""
    from gaca_cli.files import unwritable_reason

    reason = unwritable_reason(output, directory)
    if reason is not None:
        typer.echo(f"Error: {flag} {output}: {reason}; choose another {flag}", err=True)
        raise typer.Exit(1)


def _finite(data: Any) -> Any:
    """`data` with every non-finite float (inf, NaN: not JSON) replaced by None (null)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def print_json(data: Any) -> None:
    """`data` as JSON on stdout; a value that overflowed to inf (or NaN) is written as null."""
    sys.stdout.write(json.dumps(_finite(data), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n")
    sys.stdout.flush()


def show_summary(summary: dict, render: Callable[[dict], Any], *, as_json: bool) -> None:
    """The end of every command that writes a file: with --json the summary is the data on
    stdout; otherwise `render(summary)` (a `gaca_cli.render` function) is drawn on stderr."""
    if as_json:
        print_json(summary)
    else:
        err_console().print(render(summary))
