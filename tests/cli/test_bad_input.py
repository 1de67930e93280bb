"""Bad input files for each command that reads a log, where other tests do not already cover
them: tests/log/test_checks.py runs missing, empty and non-Parquet files and every schema rule
through `advantages` and `validate`, tests/log/test_damaged.py damaged files through those
two, tests/cli/test_cli.py bad output locations for advantages, score and train-offline, and
tests/lm/ bad models and a few bad logs for score and train-offline. Here: truncated and
zero-byte files and polars' 128-bit integers (a file, a directory) for `advantages` and
`validate`; for `inspect`, `score` and `train-offline`, every kind of unreadable file
(missing, zero bytes, not Parquet, truncated, no rows, a page whose checksum fails, 128-bit
integers) and a broken rule of each kind (null, NaN, duplicate step, gap).

Each: exit 1, exactly one line on stderr, an `Error:` line naming the file (and the column
of a broken rule); nothing written. `score` and `train-offline` read the log before they
load a model, so a model path that does not exist is enough: the log's error comes first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
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


def _failed_checksum(tmp_path: Path) -> Path:
    """A log written with page checksums, one byte of its `reward` values changed."""
    p = tmp_path / "crc.parquet"
    pq.write_table(full_table(), p, write_page_checksum=True)
    meta = pq.read_metadata(p)
    leaf = [meta.schema.column(i).path for i in range(meta.num_columns)].index("reward")
    chunk = meta.row_group(0).column(leaf)
    data = bytearray(p.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data[start + chunk.total_compressed_size - 3] ^= 0x01  # in the last data page's values
    p.write_bytes(bytes(data))
    return p


def _int128(tmp_path: Path) -> Path:
    """polars' Int128, which pyarrow cannot read: found in one file and in a directory."""
    import polars as pl

    p = tmp_path / "int128.parquet"
    try:
        pl.from_arrow(full_table()).with_columns(pl.col("step_idx").cast(pl.Int128)).write_parquet(p)
    except (AttributeError, pl.exceptions.PolarsError) as exc:  # polars < 1.32 has no Int128 or cannot write it
        pytest.skip(f"this polars cannot write Int128 to Parquet ({type(exc).__name__})")
    return p


def _int128_dir(tmp_path: Path) -> Path:
    d = tmp_path / "int128-log"
    d.mkdir()
    _int128(d)
    return d


def full_table(rows: dict[str, list] | None = None) -> pa.Table:
    """The base log of tests/log/test_checks.py with an advantage column (train-offline's)."""
    rows = base_rows() if rows is None else rows
    return to_table(rows).append_column("advantage", pa.array([0.5] * len(rows["reward"])))


def _broken(column: str, row: int, value) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        rows = base_rows()
        rows[column][row] = value
        p = tmp_path / f"bad-{column}.parquet"
        pq.write_table(full_table(rows), p)
        return p

    return make


INPUTS = {
    "truncated": _truncated,
    "text": _text,
    "zero-bytes": _empty_file,
    "no-rows": _no_rows,
    "missing": _missing,
    "failed-checksum": _failed_checksum,
    "int128": _int128,
    "int128-dir": _int128_dir,
}
RULES = {  # a broken rule: how to break it, the column the Error names
    "null": (_broken("group_id", 3, None), "group_id"),
    "nan": (_broken("reward", 2, float("nan")), "reward"),
    "duplicate": (_broken("step_idx", 1, 0), "step_idx"),
    "gap": (_broken("step_idx", 2, 5), "step_idx"),
}
NO_MODEL = "/nonexistent/model"
COMMANDS = {
    "advantages": lambda log, out: ["advantages", str(log), "--method", "gaca", "-o", str(out)],
    "validate": lambda log, out: ["validate", str(log)],
    "inspect": lambda log, out: ["inspect", str(log), "--no-pager"],
    "score": lambda log, out: ["score", str(log), "--model", NO_MODEL, "-o", str(out)],
    "train-offline": lambda log, out: ["train-offline", str(log), "--model", NO_MODEL, "--loss", "pg", "-o", str(out)],
}
COVERED = {"advantages", "validate"}  # by tests/log/test_checks.py and test_damaged.py
CASES = [
    (c, i)
    for c in COMMANDS
    for i in INPUTS
    if c not in COVERED or i in ("truncated", "zero-bytes", "int128", "int128-dir")
]
RULE_CASES = [(c, r) for c in COMMANDS if c not in COVERED for r in RULES]


def assert_one_error_line(res, *fragments: str) -> None:
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), res.stderr
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    assert res.stdout == ""


@pytest.mark.parametrize("command,bad", CASES, ids=[f"{c}-{i}" for c, i in CASES])
def test_unreadable_input_is_one_error_line(tmp_path, command, bad):
    log = INPUTS[bad](tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    res = runner.invoke(app, COMMANDS[command](log, out_dir / "o.parquet"))
    assert_one_error_line(res, str(log), *(["column 'reward'"] if bad == "failed-checksum" else []))
    assert os.listdir(out_dir) == []


@pytest.mark.parametrize("command,rule", RULE_CASES, ids=[f"{c}-{r}" for c, r in RULE_CASES])
def test_a_broken_rule_is_one_error_line(tmp_path, command, rule):
    make, column = RULES[rule]
    log = make(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    res = runner.invoke(app, COMMANDS[command](log, out_dir / "o.parquet"))
    assert_one_error_line(res, str(log), f"column '{column}'", "(traj_id, step_idx)")
    assert os.listdir(out_dir) == []
