"""`Log.null_rows`: the not-null check of a column a command does not read, one row group at a
time (a nested chat column's footer statistics cannot count its nulls), with the same rows as
reading the whole column."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gaca_cli.log.checks import check_log
from gaca_cli.log.reading import read_log

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.large_string())])


def write(path, n: int, null_at: set[int], start: int = 0) -> None:
    messages = [None if i in null_at else [{"role": "user", "content": f"obs {i}"}] for i in range(n)]
    table = pa.table(
        {
            "group_id": ["g"] * n,
            "traj_id": [f"t{start + i}" for i in range(n)],
            "step_idx": pa.array([0] * n, pa.int64()),
            "reward": [0.0] * n,
            "messages": pa.array(messages, pa.list_(MESSAGE)),
            "action": ["a"] * n,
        }
    )
    pq.write_table(table, path, row_group_size=4)


def test_null_rows_across_row_groups_and_files(tmp_path):
    write(tmp_path / "a.parquet", 10, {1, 6, 9})
    write(tmp_path / "b.parquet", 7, {0, 5}, start=10)
    pq.write_table(pq.read_table(tmp_path / "b.parquet").drop_columns(["messages"]), tmp_path / "c.parquet")
    files = [tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "c.parquet"]
    log = read_log(files, columns=["group_id", "traj_id", "step_idx", "reward"])
    got = log.null_rows("messages")
    whole = pa.concat_arrays(
        [pq.read_table(f).column("messages").combine_chunks() for f in files[:2]] + [pa.nulls(7, pa.list_(MESSAGE))]
    )
    assert got.tolist() == np.flatnonzero(whole.is_null().to_numpy(zero_copy_only=False)).tolist()
    assert got.tolist() == [1, 6, 9, 10, 15, *range(17, 24)]


def test_the_check_names_the_rows_of_an_unread_nested_column(tmp_path):
    write(tmp_path / "a.parquet", 9, {5})
    log = read_log([tmp_path / "a.parquet"], columns=["group_id", "traj_id", "step_idx", "reward"])
    result = check_log(log, "score")
    (violation,) = result.violations
    assert violation.column == "messages" and violation.rows == ("(t5, 0)",)
