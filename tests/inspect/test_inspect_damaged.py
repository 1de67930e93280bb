"""`gaca inspect` refuses a damaged log as `validate` and `advantages` do.

inspect reads only the columns it summarises; the others (the anchor column it shows per step,
carried text) are read back page by page, checksums verified, as `advantages` reads back what it
copies. So for each damaged file of the corpus of tests/log/test_damaged.py, written as an
annotated log, inspect exits as validate does, with the same one `Error:` line naming the file
and the column.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from tests.log.test_checks import to_table
from tests.log.test_damaged import DAMAGES, WRITERS, assert_one_error, damage, rows

runner = CliRunner()


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    """The damaged corpus's log through `gaca advantages --method gaca`, written each way."""
    folder = tmp_path_factory.mktemp("annotated")
    pq.write_table(to_table(rows()), folder / "log.parquet")
    res = runner.invoke(
        app, ["advantages", str(folder / "log.parquet"), "--method", "gaca", "-o", str(folder / "a.parquet")]
    )
    assert res.exit_code == 0, res.output
    table = pq.read_table(folder / "a.parquet")
    out = {}
    for name in ("checksums-gzip", "delta-text", "no-statistics"):
        out[name] = folder / f"{name}.parquet"
        pq.write_table(table, out[name], **WRITERS[name])
    return out


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("column", ["anchor_obs", "prompt"])
@pytest.mark.parametrize("writer", ["checksums-gzip", "delta-text", "no-statistics"])
def test_inspect_refuses_what_validate_refuses(tmp_path, annotated, writer, column, how):
    damaged = damage(annotated[writer], tmp_path / "damaged.parquet", column, how)
    if damaged is None:
        pytest.skip(f"{column} of the {writer} file has no part to damage that way")
    validate = runner.invoke(app, ["validate", str(damaged)])
    inspect = runner.invoke(app, ["inspect", str(damaged), "--no-pager"])
    assert inspect.exit_code == validate.exit_code, (validate.output, inspect.output)
    if validate.exit_code == 1:
        assert_one_error(inspect.stderr, str(damaged))
        assert inspect.stderr == validate.stderr or f"column '{column}'" in inspect.stderr, (
            validate.stderr,
            inspect.stderr,
        )


def test_an_undamaged_annotated_log_is_shown(annotated):
    res = runner.invoke(app, ["inspect", str(annotated["checksums-gzip"]), "--no-pager"])
    assert res.exit_code == 0, res.output
