"""`gaca inspect` reads the text of the rows it shows from the file itself: a damaged page there
(caught by the page checksum) is one Error line naming the file and the column, never a
different text on screen."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from gaca_cli.cli import app
from tests.conftest import EXAMPLE_LOG


def test_a_damaged_action_page_is_one_error_line(tmp_path):
    table = pq.read_table(EXAMPLE_LOG)
    actions = table.column("action").to_pylist()
    actions[0] = "MARKER-" + actions[0]
    table = table.set_column(table.schema.get_field_index("action"), "action", pa.array(actions, pa.large_string()))
    src = tmp_path / "checksummed.parquet"
    pq.write_table(table, src, write_page_checksum=True, compression="none", use_dictionary=False)
    out = tmp_path / "annotated.parquet"
    runner = CliRunner()
    assert runner.invoke(app, ["advantages", str(src), "--method", "grpo", "-o", str(out)]).exit_code == 0
    traj = table.column("traj_id")[0].as_py()
    res = runner.invoke(app, ["inspect", str(out), "--traj", str(traj), "--wide", "--no-pager"])
    assert res.exit_code == 0 and "MARKER-" in res.stdout, res.output
    data = bytearray(out.read_bytes())
    at = -1
    while (at := data.find(b"MARKER-", at + 1)) >= 0:  # the value, and its copies in the statistics
        data[at] ^= 0x01
    out.write_bytes(bytes(data))
    res = runner.invoke(app, ["inspect", str(out), "--traj", str(traj), "--wide", "--no-pager"])
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {out}: column 'action'"), res.stderr
    assert "LARKER-" not in res.stdout
