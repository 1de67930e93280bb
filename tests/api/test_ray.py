"""gaca_cli.ray.advantages on a local Ray instance: the rows of `gaca advantages`, bit for bit.

Every golden case (with buckets of a few rows, so that episode groups land in several calls)
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
    got = pa.concat_tables(ray.get(dataset.to_arrow_refs()))
    assert sorted(got.column_names) == sorted(want.column_names)
    got = got.select(want.column_names).sort_by(KEY).cast(want.schema.remove_metadata())
    want = want.sort_by(KEY)
    for name in want.column_names:
        assert got.column(name).equals(want.column(name)), name


def test_every_golden_case(local_ray, tmp_path):
    pq.write_table(tiny_table(), tmp_path / "tiny.parquet")
    for case, params in CASES.items():
        want = command(tmp_path / "tiny.parquet", tmp_path / f"{case}.parquet", params)
        options = {k: v for k, v in params.items() if k != "method"}
        dataset = ray.data.from_arrow(tiny_table())
        assert_same_rows(gaca_ray.advantages(dataset, method=params["method"], rows_per_call=3, **options), want)


def synthetic(local_ray, tmp_path, rows: int) -> None:
    from synth import generate

    generate(rows, tmp_path / "log.parquet")
    params = {"method": "gaca", "beta": 0.3, "nll_scope": "group"}
    want = command(tmp_path / "log.parquet", tmp_path / "out.parquet", params)
    dataset = ray.data.read_parquet(str(tmp_path / "log.parquet"))
    got = gaca_ray.advantages(dataset, method="gaca", beta=0.3, nll_scope="group", rows_per_call=rows // 5)
    assert_same_rows(got, want)


def test_a_synthetic_log(local_ray, tmp_path):
    synthetic(local_ray, tmp_path, 60_000)


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
