"""Running `gaca import` / `gaca validate --from` in-process, as the importers' tests do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from gaca_cli.cli import app


def gaca(*args: str | Path) -> Any:
    """`gaca ARGS...` in this process: the click Result (exit_code, stdout, stderr)."""
    return CliRunner().invoke(app, [str(a) for a in args])


def import_json(fmt: str, *sources: str | Path, out: Path, more: tuple[str, ...] = ()) -> dict:
    """`gaca import --from FMT SOURCES -o OUT --json`, which must succeed: its summary."""
    res = gaca("import", "--from", fmt, *sources, "-o", out, "--json", *more)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def error_line(res: Any) -> str:
    """The one `Error:` line of a failed command (asserting there is exactly one line)."""
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    return lines[0]
