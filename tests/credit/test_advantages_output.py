"""The output of `gaca advantages` whichever way it is written, and what it reads.

`write_annotated` splices plain Parquet inputs (their column chunks copied byte for byte, only
the method's columns encoded) and rewrites everything else (directories, hive partitions,
files whose schemas differ). These tests check that the two paths give the same file, that
the spliced file keeps every input column exactly, that only the columns the method uses are
read (value rules apply to those; types are checked for every column from the footers) and
that the results do not depend on the order of rows in the file.

Atomicity of the spliced write is tested in tests/log/test_reading.py, the splicer itself in
tests/log/test_parquet_splice.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.reading import read_for_advantages
from gaca_cli.credit.run import compute_advantages
from gaca_cli.credit.writing import NO_SPLICE_ENV
from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.reading import read_log, read_metadata
from tests.credit.conftest import (
    METHOD_COLUMNS,
    METHODS,
    assert_outputs_bit_identical,
    assert_same_file_content,
    error_lines,
    invoke,
    kv_metadata,
    library_run,
    outputs_of,
    record_fallbacks,
    refuse_splice,
    renamed,
    rich_table,
    run_ok,
    shuffled,
)

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- 1. splice == rewrite


@pytest.mark.parametrize("method", METHODS)
def test_spliced_and_rewritten_outputs_are_the_same(tmp_path, rich_log, monkeypatch, method):
    spliced, rewritten = tmp_path / "spliced.parquet", tmp_path / "rewritten.parquet"
    fallbacks = record_fallbacks(monkeypatch)
    assert library_run([rich_log], method, spliced) == "spliced"
    assert fallbacks == []
    refuse_splice(monkeypatch)
    assert library_run([rich_log], method, rewritten) == "rewritten"
    assert fallbacks == [
        "could not splice the output (refused by the test); writing it with pyarrow instead (same content, slower)"
    ]
    assert_same_file_content(spliced, rewritten)
    assert kv_metadata(spliced)[b"user.note"] == b"kept?"  # every key/value entry of the input kept
    assert pq.read_schema(spliced).field("reward").metadata == {b"unit": b"points"}  # field metadata kept
    assert json.loads(read_metadata(str(spliced))[C.META_ADVANTAGES])["method"] == method
    assert read_metadata(str(spliced))[C.META_SCORE] == json.dumps({"model": "tiny"})


def test_spliced_and_rewritten_outputs_are_the_same_on_the_example_log(tmp_path, example_log, monkeypatch):
    spliced, rewritten = tmp_path / "spliced.parquet", tmp_path / "rewritten.parquet"
    fallbacks = record_fallbacks(monkeypatch)
    assert library_run([example_log], "gaca", spliced) == "spliced"
    refuse_splice(monkeypatch)
    assert library_run([example_log], "gaca", rewritten) == "rewritten"
    assert len(fallbacks) == 1
    assert_same_file_content(spliced, rewritten)


@pytest.mark.parametrize(
    ("value", "want"), [("1", "rewritten"), ("yes", "rewritten"), ("0", "spliced"), ("", "spliced")]
)
def test_no_splice_switch_forces_the_pyarrow_write(tmp_path, rich_log, monkeypatch, value, want):
    """GACA_NO_SPLICE set to anything but "" or "0" writes with pyarrow, without a warning
    (the user asked for it); the content is the spliced output's."""
    fallbacks = record_fallbacks(monkeypatch)
    reference, out = tmp_path / "reference.parquet", tmp_path / "out.parquet"
    assert library_run([rich_log], "gaca", reference) == "spliced"
    monkeypatch.setenv(NO_SPLICE_ENV, value)
    assert library_run([rich_log], "gaca", out) == want
    assert fallbacks == []
    assert_same_file_content(out, reference)


def test_a_refused_splice_warns_on_stderr(tmp_path, example_table):
    """In a process of its own (Python's default warning filters), the fallback is one
    warning on stderr that names the files and the reason; the output is written."""
    a, b = split_by_group(example_table, 2)
    paths = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    pq.write_table(a, paths[0])
    pq.write_table(b.select(list(reversed(b.column_names))), paths[1])  # another column order: refused
    out = tmp_path / "out.parquet"
    script = "import sys; from tests.credit.conftest import library_run; print(library_run(sys.argv[1:3], 'grpo', sys.argv[3]))"
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, paths), str(out)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "rewritten"
    assert proc.stderr.count("SpliceFallbackWarning: could not splice the output (") == 1, proc.stderr
    assert f"{paths[0]} and {paths[1]}: Parquet schema, version or created_by differ" in proc.stderr
    assert pq.read_table(out).num_rows == example_table.num_rows


# --------------------------------------------------------------------------- 2. every input column kept


@pytest.mark.parametrize("method", METHODS)
def test_spliced_output_keeps_every_input_column_exactly(tmp_path, rich_log, write_paths, method):
    original = pq.read_table(rich_log)
    # the types the file round-trips (pyarrow restores them from ARROW:schema)
    assert original.schema.field("prompt").type == pa.large_string()
    assert original.schema.field("step_idx").type == pa.int32()
    assert original.schema.field("behavior_logprobs").type == pa.list_(pa.float32())
    assert pa.types.is_struct(original.schema.field("info").type)
    assert pa.types.is_dictionary(original.schema.field("tag").type)
    assert original.schema.field("reward").metadata == {b"unit": b"points"}
    out = tmp_path / "out.parquet"
    run_ok("advantages", rich_log, "--method", method, "-o", out)
    assert write_paths == ["spliced"]
    result = pq.read_table(out)
    assert result.column_names == original.column_names + outputs_of(method)
    kept = result.select(original.column_names)
    for got, want in zip(kept.schema, original.schema):
        assert got.equals(want, check_metadata=True), (got, want)
    assert kept.equals(original)  # values, row order
    for name in outputs_of(method):
        assert result[name].null_count == 0, name
    assert result.schema.field(C.ADVANTAGE).type == pa.float64()
    assert set(result[C.ADV_METHOD].to_pylist()) == {method}


# --------------------------------------------------------------------------- 3. re-running


@pytest.mark.parametrize(("first", "second"), [("gaca", "grpo"), ("grpo", "gaca"), ("gigpo", "gigpo")])
def test_rerun_on_spliced_output_replaces_the_tool_columns(tmp_path, rich_log, write_paths, first, second):
    annotated = tmp_path / f"{first}.parquet"
    run_ok("advantages", rich_log, "--method", first, "-o", annotated)
    again = tmp_path / f"{first}-{second}.parquet"
    run_ok("advantages", annotated, "--method", second, "-o", again)
    reference = tmp_path / f"{second}.parquet"
    run_ok("advantages", rich_log, "--method", second, "-o", reference)
    assert write_paths == ["spliced"] * 3
    result = pq.read_table(again)
    assert len(result.column_names) == len(set(result.column_names))
    for name in C.ADVANTAGES_OUTPUTS:
        assert result.column_names.count(name) == (name in METHOD_COLUMNS[second]), name
    assert_same_file_content(again, reference)


# --------------------------------------------------------------------------- 4. --map


def test_map_keeps_the_file_names_and_equals_the_canonical_run(tmp_path, rich_log, write_paths):
    table = pq.read_table(rich_log)
    renames = {C.GROUP_ID: "uid", C.TRAJ_ID: "traj_uid", C.ANCHOR_OBS: "obs_text"}  # the scanned anchor too
    mapped = tmp_path / "mapped.parquet"
    pq.write_table(renamed(table, renames), mapped, row_group_size=14)
    out_mapped, out_plain = tmp_path / "out-mapped.parquet", tmp_path / "out-plain.parquet"
    maps = ["--map", "group_id=uid", "--map", "traj_id=traj_uid", "--map", "anchor_obs=obs_text"]
    run_ok("advantages", mapped, "--method", "gigpo", *maps, "-o", out_mapped)
    run_ok("advantages", rich_log, "--method", "gigpo", "-o", out_plain)
    assert write_paths == ["spliced", "spliced"]
    result = pq.read_table(out_mapped)
    assert "uid" in result.column_names and "traj_uid" in result.column_names
    assert C.GROUP_ID not in result.column_names and C.TRAJ_ID not in result.column_names
    inverse = {v: k for k, v in renames.items()}
    restored = renamed(result, inverse)
    plain = pq.read_table(out_plain)
    assert restored.schema.equals(plain.schema), (restored.schema, plain.schema)
    assert restored.equals(plain, check_metadata=True)
    assert kv_metadata(out_mapped) == kv_metadata(out_plain)


def test_map_through_the_rewrite_path_too(tmp_path, rich_log, monkeypatch):
    table = pq.read_table(rich_log)
    mapped = tmp_path / "mapped.parquet"
    pq.write_table(renamed(table, {C.GROUP_ID: "uid"}), mapped)
    spliced, rewritten = tmp_path / "spliced.parquet", tmp_path / "rewritten.parquet"
    cmap = {C.GROUP_ID: "uid"}
    fallbacks = record_fallbacks(monkeypatch)
    assert library_run([mapped], "gaca", spliced, cmap) == "spliced"
    refuse_splice(monkeypatch)
    assert library_run([mapped], "gaca", rewritten, cmap) == "rewritten"
    assert len(fallbacks) == 1
    assert_same_file_content(spliced, rewritten)
    assert "uid" in pq.read_schema(spliced).names


# --------------------------------------------------------------------------- 5. several files


def split_by_group(table: pa.Table, n_parts: int) -> list[pa.Table]:
    groups = sorted(set(table[C.GROUP_ID].to_pylist()))
    return [table.filter(pc.is_in(table[C.GROUP_ID], pa.array(groups[i::n_parts]))) for i in range(n_parts)]


@pytest.mark.parametrize("as_glob", [False, True], ids=["files", "glob"])
def test_several_files_with_one_schema_are_spliced(tmp_path, example_log, example_table, write_paths, as_glob):
    parts = split_by_group(example_table, 2)
    paths = []
    for i, part in enumerate(parts):
        paths.append(tmp_path / f"run-{i}.parquet")
        pq.write_table(part, paths[-1])
    out, reference = tmp_path / "out.parquet", tmp_path / "ref.parquet"
    args = [str(tmp_path / "run-*.parquet")] if as_glob else paths
    run_ok("advantages", *args, "--method", "gaca", "-o", out)
    run_ok("advantages", example_log, "--method", "gaca", "-o", reference)
    assert write_paths == ["spliced", "spliced"]
    result = pq.read_table(out)
    # the files' rows, one file after the other, every column kept
    assert result.select(example_table.column_names).equals(pa.concat_tables(parts))
    assert_outputs_bit_identical(result, pq.read_table(reference), outputs_of("gaca"))


def test_files_with_an_extra_column_are_rewritten(tmp_path, example_log, example_table, write_paths, monkeypatch):
    fallbacks = record_fallbacks(monkeypatch)
    a, b = split_by_group(example_table, 2)
    b = b.append_column("note", pa.array([f"n{i}" for i in range(b.num_rows)]))
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet")
    out, reference = tmp_path / "out.parquet", tmp_path / "ref.parquet"
    run_ok("advantages", tmp_path / "a.parquet", tmp_path / "b.parquet", "--method", "gigpo", "-o", out)
    run_ok("advantages", example_log, "--method", "gigpo", "-o", reference)
    assert write_paths == ["rewritten", "spliced"]
    assert (
        len(fallbacks) == 1
        and "a.parquet and " in fallbacks[0]
        and "schema, version or created_by differ" in fallbacks[0]
    )
    result = pq.read_table(out)
    assert result["note"].to_pylist() == [None] * a.num_rows + b["note"].to_pylist()
    assert result.select(example_table.column_names).equals(pa.concat_tables([a, b.drop_columns(["note"])]))
    assert_outputs_bit_identical(result, pq.read_table(reference), outputs_of("gigpo"))


def test_files_with_int_and_float_rewards_are_a_clean_error(tmp_path, example_table, write_paths):
    """int64 `reward` in one file, double in the other: the schemas cannot be unified
    (pyarrow's default promotion), so one `Error:` line, exit 1, no output, no traceback."""
    a, b = split_by_group(example_table, 2)
    b = b.set_column(b.schema.get_field_index(C.REWARD), C.REWARD, pc.cast(pc.round(b[C.REWARD]), pa.int64()))
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet")
    out = tmp_path / "out.parquet"
    res = invoke("advantages", tmp_path / "a.parquet", tmp_path / "b.parquet", "--method", "grpo", "-o", out)
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = error_lines(res)
    assert len(lines) == 1, res.stderr
    assert "schemas do not agree" in lines[0]
    assert not out.exists()
    assert write_paths == []


def test_files_with_different_column_order_are_rewritten(
    tmp_path, example_log, example_table, write_paths, monkeypatch
):
    """Same columns and types, another order in the second file: splice refuses, the rewrite
    takes the first file's order."""
    fallbacks = record_fallbacks(monkeypatch)
    a, b = split_by_group(example_table, 2)
    b = b.select(list(reversed(b.column_names)))
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet")
    out, reference = tmp_path / "out.parquet", tmp_path / "ref.parquet"
    run_ok("advantages", tmp_path / "a.parquet", tmp_path / "b.parquet", "--method", "grpo", "-o", out)
    run_ok("advantages", example_log, "--method", "grpo", "-o", reference)
    assert write_paths == ["rewritten", "spliced"]
    assert len(fallbacks) == 1 and "created_by differ" in fallbacks[0]
    result = pq.read_table(out)
    assert result.column_names == example_table.column_names + outputs_of("grpo")
    assert result.select(example_table.column_names).equals(pa.concat_tables([a, b.select(a.column_names)]))
    assert_outputs_bit_identical(result, pq.read_table(reference), outputs_of("grpo"))


# --------------------------------------------------------------------------- 6. hive partitions


def test_hive_partitions_are_rewritten_with_the_partition_column(
    tmp_path, example_log, example_table, write_paths, monkeypatch
):
    """A directory is always rewritten (its path, not a fallback: no warning)."""
    fallbacks = record_fallbacks(monkeypatch)
    logs = tmp_path / "logs"
    parts = split_by_group(example_table, 2)
    for i, part in enumerate(parts, start=1):
        (logs / f"part={i}").mkdir(parents=True)
        pq.write_table(part, logs / f"part={i}" / "x.parquet")
    out, reference = tmp_path / "out.parquet", tmp_path / "ref.parquet"
    run_ok("advantages", logs, "--method", "gigpo", "-o", out)
    run_ok("advantages", example_log, "--method", "gigpo", "-o", reference)
    assert write_paths == ["rewritten", "spliced"]
    assert fallbacks == []
    result = pq.read_table(out)
    as_read = read_log([logs]).table
    assert "part" in result.column_names
    assert result.schema.field("part").type == as_read.schema.field("part").type
    assert result["part"].to_pylist() == as_read["part"].to_pylist()
    # each row carries the number of the directory it came from
    want = {t: i for i, part in enumerate(parts, start=1) for t in part[C.TRAJ_ID].to_pylist()}
    assert [int(p) for p in result["part"].to_pylist()] == [want[t] for t in result[C.TRAJ_ID].to_pylist()]
    assert_outputs_bit_identical(result, pq.read_table(reference), outputs_of("gigpo"))


# --------------------------------------------------------------------------- 9. row order


SHUFFLE_CASES = [
    ("grpo",),
    ("gigpo", "--anchor-similarity", "0.8"),
    ("gaca",),
    ("gaca", "--nll-scope", "batch", "--anchor-similarity", "0.6", "--nll-reduce", "sum", "--episode-stats", "steps"),
]


@pytest.mark.parametrize("case", SHUFFLE_CASES, ids=lambda c: " ".join(c))
def test_shuffled_log_gives_bit_identical_outputs_and_summary(tmp_path, example_log, example_table, write_paths, case):
    method, *options = case
    src = tmp_path / "shuffled.parquet"
    pq.write_table(shuffled(example_table, seed=7), src, row_group_size=100)
    out_a, out_b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    summary_a = json.loads(run_ok("advantages", example_log, "--method", method, *options, "-o", out_a, "--json"))
    summary_b = json.loads(run_ok("advantages", src, "--method", method, *options, "-o", out_b, "--json"))
    assert write_paths == ["spliced", "spliced"]
    assert summary_a.pop("output") == str(out_a) and summary_b.pop("output") == str(out_b)
    assert summary_a == summary_b
    a, b = pq.read_table(out_a), pq.read_table(out_b)
    assert b.select(example_table.column_names).equals(pq.read_table(src))  # the file's row order kept
    assert_outputs_bit_identical(b, a, outputs_of(method))


def test_shuffled_rich_log_matches_its_canonical_order(tmp_path, rich_log, write_paths):
    """The rich fixture is stored shuffled; the same rows in canonical order give the same
    values and summary (integer-valued rewards, struct and dictionary columns along)."""
    canonical = tmp_path / "canonical.parquet"
    pq.write_table(rich_table(), canonical)
    for method in METHODS:
        out_a, out_b = tmp_path / f"{method}-a.parquet", tmp_path / f"{method}-b.parquet"
        sa = json.loads(run_ok("advantages", canonical, "--method", method, "-o", out_a, "--json"))
        sb = json.loads(run_ok("advantages", rich_log, "--method", method, "-o", out_b, "--json"))
        sa.pop("output"), sb.pop("output")
        assert sa == sb, method
        assert_outputs_bit_identical(pq.read_table(out_b), pq.read_table(out_a), outputs_of(method))
        if method != "grpo":  # the warnings are counted (and the same) in both orders
            assert sb["warnings"]["empty_anchors"] == 1 and sb["warnings"]["differing_initial_anchors"] == 1, sb
        if method == "gaca":
            assert sb["criticality_column"] == C.NLL_MEAN
            assert sb["lambda"]["corr_with_nll"] is not None


def test_library_errors_are_gaca_errors_for_unreadable_input(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(GacaError):
        library_run([bad], "grpo", tmp_path / "out.parquet")


def test_files_in_another_order_give_the_same_values_and_summary(tmp_path, example_table, write_paths):
    parts = split_by_group(example_table, 3)
    paths = []
    for i, part in enumerate(parts):
        paths.append(tmp_path / f"run-{i}.parquet")
        pq.write_table(part, paths[-1])
    out_a, out_b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    sa = json.loads(run_ok("advantages", *paths, "--method", "gaca", "-o", out_a, "--json"))
    sb = json.loads(run_ok("advantages", *reversed(paths), "--method", "gaca", "-o", out_b, "--json"))
    assert write_paths == ["spliced", "spliced"]
    sa.pop("output"), sb.pop("output")
    assert sa == sb
    assert_outputs_bit_identical(pq.read_table(out_b), pq.read_table(out_a), outputs_of("gaca"))


def test_an_empty_file_among_the_inputs_is_rewritten(tmp_path, example_log, example_table, write_paths, monkeypatch):
    """A file with no rows (one empty row group) cannot be spliced; the rewrite, after a
    warning that names the file, gives the same values as the single file."""
    fallbacks = record_fallbacks(monkeypatch)
    a, b = split_by_group(example_table, 2)
    paths = [tmp_path / "a.parquet", tmp_path / "empty.parquet", tmp_path / "b.parquet"]
    for table, path in zip((a, example_table.slice(0, 0), b), paths):
        pq.write_table(table, path)
    out, reference = tmp_path / "out.parquet", tmp_path / "ref.parquet"
    run_ok("advantages", *paths, "--method", "gigpo", "-o", out)
    run_ok("advantages", example_log, "--method", "gigpo", "-o", reference)
    assert write_paths == ["rewritten", "spliced"]
    assert len(fallbacks) == 1 and "empty.parquet: row group with 0 rows" in fallbacks[0]
    result = pq.read_table(out)
    assert result.select(example_table.column_names).equals(pa.concat_tables([a, b]))
    assert_outputs_bit_identical(result, pq.read_table(reference), outputs_of("gigpo"))


def test_directory_whose_second_file_has_an_extra_column_keeps_it(tmp_path, example_table, write_paths):
    """Two plain files keep a column only one of them has (test_files_with_an_extra_column_are_rewritten);
    the same two files in a directory must too, not lose it silently (pyarrow's dataset takes
    its schema from the first file alone; reading._dataset unifies every file's)."""
    a, b = split_by_group(example_table, 2)
    b = b.append_column("note", pa.array([f"n{i}" for i in range(b.num_rows)]))
    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(a, logs / "a.parquet")
    pq.write_table(b, logs / "b.parquet")
    out = tmp_path / "out.parquet"
    run_ok("advantages", logs, "--method", "grpo", "-o", out)
    assert write_paths == ["rewritten"]
    result = pq.read_table(out)
    assert "note" in result.column_names
    assert result["note"].to_pylist() == [None] * a.num_rows + b["note"].to_pylist()


def test_anchor_key_wins_and_anchor_obs_is_not_read(tmp_path, example_table, write_paths):
    """With anchor_key present, gigpo reads it and not anchor_obs (whose nulls are still
    checked, from the footer)."""
    codes = pc.cast(pc.binary_length(example_table[C.ANCHOR_OBS]), pa.int64())  # any stable key
    anchors = example_table[C.ANCHOR_OBS].to_pylist()
    table = example_table.append_column(C.ANCHOR_KEY, codes)
    src, out = tmp_path / "keyed.parquet", tmp_path / "out.parquet"
    pq.write_table(table, src)
    log = read_for_advantages([str(src)], {}, AdvantagesConfig(method="gigpo"))
    assert C.ANCHOR_KEY in log.table.column_names and C.ANCHOR_OBS not in log.table.column_names
    run_ok("advantages", src, "--method", "gigpo", "-o", out)
    assert write_paths == ["spliced"]
    result = pq.read_table(out)
    assert result[C.ANCHOR_OBS].to_pylist() == anchors
    # step groups follow the key: rows with equal (group_id, key) share a step group
    pairs = set(zip(*(result[n].to_pylist() for n in (C.GROUP_ID, C.ANCHOR_KEY, C.STEP_GROUP_ID))))
    assert len(pairs) == len({(g, k) for g, k, _ in pairs}) == len({s for _, _, s in pairs})


def random_log(seed: int) -> pa.Table:
    """A seeded random log: 1-5 groups of 1-4 rollouts of 1-5 steps, trajectory ids in an
    order unrelated to the groups, anchors made of a few repeated words (exact and near
    matches), rewards with ties, nll_mean with some nulls."""
    rng = np.random.default_rng(seed)
    words = ["hall", "kitchen", "garden", "key", "door", "lamp"]
    rows: dict[str, list] = {k: [] for k in (C.GROUP_ID, C.TRAJ_ID, C.STEP_IDX, C.ANCHOR_OBS, C.REWARD, C.NLL_MEAN)}
    for g in range(int(rng.integers(1, 6))):
        for r in range(int(rng.integers(1, 5))):
            traj = f"{rng.integers(0, 10**6)}-{g}-{r}"
            for t in range(int(rng.integers(1, 6))):
                rows[C.GROUP_ID].append(f"g{g}")
                rows[C.TRAJ_ID].append(traj)
                rows[C.STEP_IDX].append(t)
                rows[C.ANCHOR_OBS].append(" ".join(rng.choice(words, size=int(rng.integers(1, 4)))))
                rows[C.REWARD].append(float(rng.choice([0.0, 1.0, -0.1, 0.5])))
                rows[C.NLL_MEAN].append(None if rng.random() < 0.1 else float(rng.random() * 3))
    return pa.table(rows)


RANDOM_CONFIGS = [
    {"method": "grpo"},
    {"method": "gigpo", "anchor_similarity": 0.6},
    {"method": "gaca", "anchor_similarity": 0.5, "nll_scope": "group"},
    {"method": "gaca", "nll_scope": "batch", "episode_stats": "steps"},
]


@pytest.mark.parametrize("seed", range(4))
def test_row_order_invariance_on_random_logs(tmp_path, seed):
    """Library level (no writing): the method's columns, matched by (traj_id, step_idx), and
    the summary are bit-identical for a log and a shuffled copy in small row groups."""
    table = random_log(seed)
    perm = np.random.default_rng(seed + 1000).permutation(table.num_rows)
    canonical, permuted = tmp_path / "canonical.parquet", tmp_path / "shuffled.parquet"
    pq.write_table(table, canonical)
    pq.write_table(table.take(pa.array(perm)), permuted, row_group_size=7)
    for params in RANDOM_CONFIGS:
        config = AdvantagesConfig(**params)
        a = compute_advantages(read_for_advantages([str(canonical)], {}, config), config)
        b = compute_advantages(read_for_advantages([str(permuted)], {}, config), config)
        assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True), params
        assert a.new_columns.column_names == b.new_columns.column_names == outputs_of(params["method"])
        for name in outputs_of(params["method"]):
            if name == C.ADV_METHOD:
                continue
            want = a.new_columns[name].to_numpy().astype(np.float64)[perm]  # canonical rows in shuffled order
            got = b.new_columns[name].to_numpy().astype(np.float64)
            assert np.array_equal(got, want, equal_nan=True), (params, name)


@pytest.mark.parametrize("first", ["int", "float"])
def test_directory_with_int_and_float_rewards_is_a_clean_error(tmp_path, example_table, first):
    """As for separate files: a reward column that is int64 in one file of a directory and
    double in the other is one Error line, whichever file comes first."""
    a, b = split_by_group(example_table, 2)

    def as_int(t: pa.Table) -> pa.Table:
        return t.set_column(t.schema.get_field_index(C.REWARD), C.REWARD, pc.cast(pc.round(t[C.REWARD]), pa.int64()))

    a, b = (as_int(a), b) if first == "int" else (a, as_int(b))
    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(a, logs / "a.parquet")
    pq.write_table(b, logs / "b.parquet")
    res = invoke("advantages", logs, "--method", "grpo", "-o", tmp_path / "out.parquet")
    assert res.exit_code == 1, res.output
    assert len(error_lines(res)) == 1 and "schemas do not agree" in res.output
    assert not (tmp_path / "out.parquet").exists()


def test_mapping_an_output_name_as_input_is_a_clean_error(tmp_path, example_table, monkeypatch):
    """`--map reward=advantage` reads the log's `advantage` column as the reward; the output
    would then hold two `advantage` columns: one Error line naming it, no output file, and no
    splice attempted first (so no fallback warning before the error)."""
    fallbacks = record_fallbacks(monkeypatch)
    table = example_table.rename_columns([C.ADVANTAGE if n == C.REWARD else n for n in example_table.column_names])
    src, out = tmp_path / "renamed.parquet", tmp_path / "out.parquet"
    pq.write_table(table, src)
    res = invoke("advantages", src, "--method", "grpo", "--map", f"{C.REWARD}={C.ADVANTAGE}", "-o", out)
    assert res.exit_code == 1, res.output
    assert len(error_lines(res)) == 1 and f"'{C.ADVANTAGE}'" in res.output
    assert not out.exists()
    assert fallbacks == []


def test_a_column_type_polars_lacks_falls_back_to_pyarrow(tmp_path, example_table, write_paths):
    """The anchor is read by polars, which parses every column's type: a file with a type it
    lacks (here a list_view column) is read by pyarrow instead, and spliced as usual."""
    table = example_table.append_column(
        "lv", pa.array([[1, 2]] * example_table.num_rows, type=pa.list_view(pa.int64()))
    )
    src, out = tmp_path / "lv.parquet", tmp_path / "out.parquet"
    pq.write_table(table, src)
    run_ok("advantages", src, "--method", "gigpo", "-o", out)
    assert write_paths == ["spliced"]
    result = pq.read_table(out)
    assert result.select(table.column_names).equals(table)
