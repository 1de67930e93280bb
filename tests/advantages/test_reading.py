"""What `gaca advantages` reads: only the columns the method uses (type and null rules still apply
to every column, from the footers), and the anchor column, grouped exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.log import columns as C
from gaca_cli.advantages.run import compute_advantages
from gaca_cli.advantages.reading import read_for_advantages
from gaca_cli.log.anchors import ScannedAnchors
from gaca_cli.advantages.config import AdvantagesConfig

runner = CliRunner()
from tests.advantages.conftest import (
    invoke, run_ok, error_lines, library_run, assert_same_file_content, METHODS,
)


# --------------------------------------------------------------------------- 7. unused columns


@pytest.mark.parametrize("method", METHODS)
def test_columns_read_by_each_method(rich_log, method):
    log = read_for_advantages([str(rich_log)], {}, AdvantagesConfig(method=method))
    names = set(log.table.column_names)
    assert {C.GROUP_ID, C.TRAJ_ID, C.STEP_IDX, C.REWARD, C.DONE, C.BEHAVIOR_LOGPROBS} <= names
    assert not names & {C.PROMPT, C.ACTION, "info", "tag"}
    # the anchor text stays on disk: its hashes come from a streaming pass over the pages
    # (gigpo/gaca group by it; every method reports its warnings)
    assert C.ANCHOR_OBS not in names
    assert isinstance(log.cache[("anchors", C.ANCHOR_OBS)], ScannedAnchors)
    assert set(log.file_schema.names) == set(pq.read_schema(rich_log).names)  # every column's type known


def no_scan(monkeypatch) -> None:
    """Make the anchor scan decline, as it does for layouts it does not know."""
    import gaca_cli.log._anchor_scan as anchor_scan

    monkeypatch.setattr(anchor_scan, "scan_anchors", lambda files, column: None)


def run_of(path: Path, config: AdvantagesConfig):
    """What `gaca advantages` computes for one file (no output written)."""
    return compute_advantages(read_for_advantages([str(path)], {}, config), config)


def scanned_then_read(path: Path, config: AdvantagesConfig, anchor: str, monkeypatch):
    """The run with the anchor column streamed (checked to be), and the run with it read."""
    log = read_for_advantages([str(path)], {}, config)
    assert isinstance(log.cache[("anchors", anchor)], ScannedAnchors)
    scanned = compute_advantages(log, config)
    with monkeypatch.context() as m:
        no_scan(m)
        log = read_for_advantages([str(path)], {}, config)
        assert anchor in log.table.column_names
        read = compute_advantages(log, config)
    return scanned, read


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("similarity", [None, 0.5])
@pytest.mark.parametrize("layout", ["plain", "dictionary", "pages"])
def test_scanned_anchors_give_the_outputs_of_read_anchors(tmp_path, rich_log, monkeypatch, method, similarity, layout):
    """The streamed anchors (hashes and exact comparisons from the pages) and the anchors read
    into memory by polars (what the scan falls back to) give the same file, summary included,
    whatever the anchor column's encoding."""
    table = pq.read_table(rich_log)
    path = tmp_path / "log.parquet"
    options = {"plain": {"use_dictionary": False}, "dictionary": {"use_dictionary": True},
               "pages": {"use_dictionary": False, "data_page_size": 64, "data_page_version": "2.0"}}[layout]
    pq.write_table(table, path, row_group_size=9, **options)
    params = {} if similarity is None else {"anchor_similarity": similarity}
    config = AdvantagesConfig(method=method, **params)
    scanned, read = scanned_then_read(path, config, C.ANCHOR_OBS, monkeypatch)
    assert scanned.new_columns.equals(read.new_columns)
    assert scanned.summary == read.summary
    assert scanned.summary["warnings"]["empty_anchors"] == 1
    assert scanned.summary["warnings"]["differing_initial_anchors"] == 1


@pytest.mark.parametrize("method", ["gigpo", "gaca"])
def test_scanned_anchor_key_wins_and_matches_the_read_key(tmp_path, rich_log, monkeypatch, method):
    """A string `anchor_key` (coarser than the text here) is the column scanned, and gives
    what reading it gives."""
    table = pq.read_table(rich_log)
    key = pa.array([f"k{len(t)}" for t in table[C.ANCHOR_OBS].to_pylist()], pa.string())
    path = tmp_path / "keyed.parquet"
    pq.write_table(table.append_column(C.ANCHOR_KEY, key), path, row_group_size=9)
    config = AdvantagesConfig(method=method)
    scanned, read = scanned_then_read(path, config, C.ANCHOR_KEY, monkeypatch)
    assert scanned.new_columns.equals(read.new_columns)
    assert scanned.summary == read.summary
    groups = scanned.new_columns.column(C.STEP_GROUP_ID).to_numpy()
    plain = run_of(rich_log, config)
    assert len(np.unique(groups)) < len(np.unique(plain.new_columns.column(C.STEP_GROUP_ID).to_numpy()))


@pytest.mark.parametrize("method", ["grpo", "gigpo", "gaca"])
def test_scanned_anchors_with_colliding_hashes(tmp_path, rich_log, monkeypatch, method):
    """Hashes of the streamed anchors folded into 3 values (collisions everywhere, inside and
    across row groups): the exact comparisons from the pages split them again, and outputs
    and warnings are those of the honest hashes."""
    config = AdvantagesConfig(method=method)
    honest = run_of(rich_log, config)
    monkeypatch.setattr(ScannedAnchors, "file_hashes", lambda self: self.scan.hashes % np.uint64(3))
    log = read_for_advantages([str(rich_log)], {}, config)
    assert isinstance(log.cache[("anchors", C.ANCHOR_OBS)], ScannedAnchors)
    folded = compute_advantages(log, config)
    assert folded.new_columns.equals(honest.new_columns)
    assert folded.summary == honest.summary


def test_scan_declined_reads_the_anchor_and_writes_the_same_file(tmp_path, rich_log, monkeypatch):
    """When the scan declines, the anchor column is read after the others (only it), and the
    output file is the same."""
    scanned_out, read_out = tmp_path / "scanned.parquet", tmp_path / "read.parquet"
    assert library_run([rich_log], "gaca", scanned_out) == "spliced"
    no_scan(monkeypatch)
    assert library_run([rich_log], "gaca", read_out) == "spliced"
    assert_same_file_content(scanned_out, read_out)


@pytest.mark.parametrize("statistics", [True, False])
def test_null_prompt_is_an_error_without_reading_the_prompts(tmp_path, example_table, write_paths, statistics, monkeypatch):
    """advantages does not read the prompts, yet runs the same null check as validate: from
    the footer's null counts when the file has statistics (the column is then never read),
    else by reading that column alone. One Error line naming the rows, no output."""
    prompts = example_table[C.PROMPT].to_pylist()
    prompts[3] = prompts[10] = None
    table = example_table.set_column(
        example_table.schema.get_field_index(C.PROMPT), C.PROMPT, pa.array(prompts, pa.large_string())
    )
    src = tmp_path / "nulls.parquet"
    pq.write_table(table, src, write_statistics=statistics)
    clean = tmp_path / "clean.parquet"
    pq.write_table(example_table, clean, write_statistics=statistics)
    for method in METHODS:
        out = tmp_path / f"{method}.parquet"
        res = invoke("advantages", src, "--method", method, "-o", out)
        assert res.exit_code == 1, res.output
        lines = error_lines(res)
        assert len(lines) == 1 and "'prompt'" in lines[0] and "null" in lines[0], res.stderr
        assert not out.exists()
    res = invoke("validate", src)
    assert res.exit_code == 1, res.output
    assert "prompt" in res.output and "null" in res.output
    # with statistics a clean log's prompts are never read
    from gaca_cli.log.io import Log

    reads = []
    original = Log.read_column
    monkeypatch.setattr(Log, "read_column", lambda self, column: reads.append(column) or original(self, column))
    run_ok("advantages", clean, "--method", "gaca", "-o", tmp_path / "clean-out.parquet")
    assert (C.PROMPT in reads) == (not statistics)


@pytest.mark.parametrize("method", METHODS)
def test_prompt_of_unusable_type_is_an_error(tmp_path, example_table, write_paths, method):
    table = example_table.set_column(
        example_table.schema.get_field_index(C.PROMPT), C.PROMPT, pa.array(np.arange(example_table.num_rows))
    )
    src, out = tmp_path / "int-prompt.parquet", tmp_path / "out.parquet"
    pq.write_table(table, src)
    res = invoke("advantages", src, "--method", method, "-o", out)
    assert res.exit_code == 1, res.output
    lines = error_lines(res)
    assert len(lines) == 1, res.stderr
    assert "'prompt'" in lines[0] and "int64" in lines[0], lines[0]
    assert not out.exists()
    assert write_paths == []


# --------------------------------------------------------------------------- 8. anchors


def test_grpo_needs_no_anchor(tmp_path, example_table, write_paths):
    src, out = tmp_path / "no-anchor.parquet", tmp_path / "out.parquet"
    pq.write_table(example_table.drop_columns([C.ANCHOR_OBS]), src)
    run_ok("advantages", src, "--method", "grpo", "-o", out)
    assert write_paths == ["spliced"]
    assert C.ANCHOR_OBS not in pq.read_table(out).column_names
    res = invoke("advantages", src, "--method", "gigpo", "-o", tmp_path / "gigpo.parquet")
    assert res.exit_code == 1, res.output
    assert len(error_lines(res)) == 1 and "anchor" in error_lines(res)[0], res.stderr


def test_null_anchor_is_an_error_for_every_method(tmp_path, example_table, write_paths):
    anchors = example_table[C.ANCHOR_OBS].to_pylist()
    anchors[5] = None
    table = example_table.set_column(
        example_table.schema.get_field_index(C.ANCHOR_OBS), C.ANCHOR_OBS, pa.array(anchors, pa.large_string())
    )
    src = tmp_path / "null-anchor.parquet"
    pq.write_table(table, src)
    for method in METHODS:
        bad_out = tmp_path / f"{method}.parquet"
        res = invoke("advantages", src, "--method", method, "-o", bad_out)
        assert res.exit_code == 1, res.output
        lines = error_lines(res)
        assert len(lines) == 1 and "'anchor_obs'" in lines[0], res.stderr
        assert not bad_out.exists()
    assert write_paths == []


