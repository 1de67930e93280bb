"""Bad input files for each command that reads a log, where tests/log/test_checks.py does not
already cover them (it runs missing, empty, non-Parquet files and every schema rule through
`advantages` and `validate`; tests/cli/test_cli.py covers bad output locations): truncated
files for those two, and every kind of unreadable file for `inspect`.

Each: exit 1, exactly one line on stderr, an `Error:` line naming the file; nothing written.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from tests.log.test_checks import base_rows, to_table

runner = CliRunner()


def _truncated(tmp_path: Path) -> Path:
    """A complete log cut before its footer (a copy interrupted midway)."""
    whole = tmp_path / "whole.parquet"
    pq.write_table(to_table(base_rows()), whole)
    cut = tmp_path / "cut.parquet"
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    return cut


def _text(tmp_path: Path) -> Path:
    p = tmp_path / "notes.parquet"
    p.write_text("group_id,traj_id\nnot parquet\n")
    return p


def _empty_file(tmp_path: Path) -> Path:
    p = tmp_path / "empty.parquet"
    p.write_bytes(b"")
    return p


def _no_rows(tmp_path: Path) -> Path:
    p = tmp_path / "norows.parquet"
    pq.write_table(to_table(base_rows()).slice(0, 0), p)
    return p


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "nope.parquet"


INPUTS = {"truncated": _truncated, "text": _text, "zero-bytes": _empty_file, "no-rows": _no_rows, "missing": _missing}
COMMANDS = {
    "advantages": lambda log, out: ["advantages", str(log), "--method", "gaca", "-o", str(out)],
    "validate": lambda log, out: ["validate", str(log)],
    "inspect": lambda log, out: ["inspect", str(log), "--no-pager"],
}
CASES = [(c, i) for c in COMMANDS for i in INPUTS if c == "inspect" or i in ("truncated", "zero-bytes")]


@pytest.mark.parametrize("command,bad", CASES, ids=[f"{c}-{i}" for c, i in CASES])
def test_unreadable_input_is_one_error_line(tmp_path, command, bad):
    log = INPUTS[bad](tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    res = runner.invoke(app, COMMANDS[command](log, out_dir / "o.parquet"))
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and str(log) in lines[0], res.stderr
    assert res.stdout == ""
    assert os.listdir(out_dir) == []
