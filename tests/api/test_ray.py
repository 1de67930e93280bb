"""gaca_cli.ray.advantages on a local Ray instance: the rows of `gaca advantages`, bit for bit.

Every golden case (in one block, and in blocks of a few rows that split episode groups, which
then go through the shuffle in buckets of a few rows)
and a synthetic log (bench/synth.py: 8 rollouts per group, shared anchors, null NLLs) of 60k
rows by default, 1M rows in the slow set. Rows come back grouped by bucket: both sides are
sorted by (traj_id, step_idx) before they are compared.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

import gaca_cli.ray as gaca_ray  # noqa: E402
from gaca_cli.errors import GacaError  # noqa: E402
from tests.api.test_api import cli_advantages  # noqa: E402
from tests.credit.record_golden import CASES, tiny_table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
KEY = [("traj_id", "ascending"), ("step_idx", "ascending")]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    yield
    ray.shutdown()


def command(src: Path, out: Path, params: dict) -> pa.Table:
    return cli_advantages(src, out, params)


def assert_same_rows(dataset, want: pa.Table) -> None:
    blocks = ray.get(dataset.to_arrow_refs())  # less the empty ones (no schema), as Ray's filter leaves
    got = pa.concat_tables([block for block in blocks if block.num_rows])
    assert sorted(got.column_names) == sorted(want.column_names)
    got = got.select(want.column_names).sort_by(KEY).cast(want.schema.remove_metadata())
    want = want.sort_by(KEY)
    for name in want.column_names:
        assert got.column(name).equals(want.column(name)), name


@pytest.mark.parametrize("block_rows", [None, 4])
def test_every_golden_case(local_ray, tmp_path, block_rows):
    """One block: every episode group computed in place; blocks of 4 rows: groups A and B split
    across blocks (shuffled into buckets), C whole in its block (in place)."""
    table = tiny_table()
    pq.write_table(table, tmp_path / "tiny.parquet")
    blocks = [table] if block_rows is None else [table.slice(i, block_rows) for i in range(0, len(table), block_rows)]
    for case, params in CASES.items():
        want = command(tmp_path / "tiny.parquet", tmp_path / f"{case}.parquet", params)
        options = {k: v for k, v in params.items() if k != "method"}
        dataset = ray.data.from_arrow(blocks)
        assert_same_rows(gaca_ray.advantages(dataset, method=params["method"], rows_per_call=3, **options), want)


def synthetic(local_ray, tmp_path, rows: int, blocks: int = 1) -> None:
    from synth import generate

    generate(rows, tmp_path / "log.parquet")
    params = {"method": "gaca", "beta": 0.3, "nll_scope": "group"}
    want = command(tmp_path / "log.parquet", tmp_path / "out.parquet", params)
    dataset = ray.data.read_parquet(str(tmp_path / "log.parquet"))
    if blocks > 1:  # rows interleaved by step: blocks of a file split most episode groups
        table = pq.read_table(tmp_path / "log.parquet")
        dataset = ray.data.from_arrow([table.slice(i, rows // blocks) for i in range(0, rows, rows // blocks)])
    got = gaca_ray.advantages(dataset, method="gaca", beta=0.3, nll_scope="group", rows_per_call=rows // 5)
    assert_same_rows(got, want)


def test_a_synthetic_log(local_ray, tmp_path):
    synthetic(local_ray, tmp_path, 60_000)


def test_a_synthetic_log_in_blocks_that_split_episode_groups(local_ray, tmp_path):
    synthetic(local_ray, tmp_path, 60_000, blocks=7)


@pytest.mark.slow
def test_a_synthetic_log_of_a_million_rows(local_ray, tmp_path):
    synthetic(local_ray, tmp_path, 1_000_000)


def test_what_spans_episode_groups_is_refused():
    dataset = None  # refused before the dataset is touched
    with pytest.raises(ValueError, match='nll_scope="batch"'):
        gaca_ray.advantages(dataset, method="gaca", nll_scope="batch")
    with pytest.raises(ValueError, match='similarity_order="rows"'):
        gaca_ray.advantages(dataset, method="gigpo", anchor_similarity=0.8, similarity_order="rows")
    with pytest.raises(TypeError, match="'betta'"):
        gaca_ray.advantages(dataset, method="gaca", betta=1)


@pytest.mark.parametrize("block_rows", [None, 4])
def test_a_broken_rule_is_the_commands_error(local_ray, block_rows):
    """A gap in a trajectory's steps stops the run with the command's message, whether the
    trajectory lies in one block or is cut by the blocks' edges (then its group is shuffled)."""
    table = tiny_table()
    steps = table.column("step_idx").to_pylist()
    steps[-1] += 1  # the last trajectory skips a step
    table = table.set_column(table.column_names.index("step_idx"), "step_idx", pa.array(steps, pa.int64()))
    blocks = [table] if block_rows is None else [table.slice(i, block_rows) for i in range(0, len(table), block_rows)]
    with pytest.raises(GacaError, match="steps of a trajectory must be 0..T-1"):
        gaca_ray.advantages(ray.data.from_arrow(blocks), method="grpo").materialize()
