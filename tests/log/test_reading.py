"""Reading logs (one file, several, globs, directories, hive partitions, `--map`) and writing
outputs (every input column kept, tool columns replaced, metadata, refusals, atomic writes).

Most tests run `gaca advantages` on the bundled example log, re-laid out on disk, and compare
the advantages with those of the plain single-file run, matched on (traj_id, step_idx).
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli import __version__
from gaca_cli.cli import app
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.reading import read_log
from gaca_cli.log.writing import write_parquet_atomic
from tests.credit.conftest import record_fallbacks

runner = CliRunner()

PREVIOUS_OUTPUT = b"previous output, must survive\n"


def run_ok(*args: str) -> str:
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.stdout


def by_step(table: pa.Table, *names: str) -> dict[str, np.ndarray]:
    """Columns of `table`, rows sorted by (traj_id as text, step_idx)."""
    key = pc.cast(table[C.TRAJ_ID], pa.string()) if C.TRAJ_ID in table.column_names else None
    t = table.append_column("_key", key) if key is not None else table
    t = t.sort_by([("_key", "ascending"), (C.STEP_IDX, "ascending")])
    return {n: t[n].to_numpy() for n in names}


@pytest.fixture(scope="module")
def example_table(example_log) -> pa.Table:
    return pq.read_table(example_log)


@pytest.fixture(scope="module")
def reference(example_log, tmp_path_factory) -> dict[str, pa.Table]:
    """Each method on the single example file: the values every layout must reproduce."""
    d = tmp_path_factory.mktemp("reference")
    out = {}
    for method in ("grpo", "gigpo", "gaca"):
        path = d / f"{method}.parquet"
        run_ok("advantages", example_log, "--method", method, "-o", path)
        out[method] = pq.read_table(path)
    return out


def assert_same_advantages(table: pa.Table, ref: pa.Table, traj_col: str = C.TRAJ_ID) -> None:
    if traj_col != C.TRAJ_ID:
        table = table.rename_columns([C.TRAJ_ID if n == traj_col else n for n in table.column_names])
    got = by_step(table, C.ADVANTAGE, C.RETURN_TO_GO, C.STEP_IDX)
    want = by_step(ref, C.ADVANTAGE, C.RETURN_TO_GO, C.STEP_IDX)
    assert table.num_rows == ref.num_rows
    np.testing.assert_array_equal(got[C.STEP_IDX], want[C.STEP_IDX])
    np.testing.assert_array_equal(got[C.RETURN_TO_GO], want[C.RETURN_TO_GO])
    np.testing.assert_array_equal(got[C.ADVANTAGE], want[C.ADVANTAGE])


def split_by_group(table: pa.Table, n_parts: int) -> list[pa.Table]:
    groups = sorted(set(table[C.GROUP_ID].to_pylist()))
    parts = [groups[i::n_parts] for i in range(n_parts)]
    return [table.filter(pc.is_in(table[C.GROUP_ID], pa.array(p))) for p in parts]


# --------------------------------------------------------------------------- input layouts


def test_one_file(example_log, example_table):
    log = read_log([example_log])
    assert log.table.num_rows == example_table.num_rows
    assert log.files == (str(example_log),)


@pytest.mark.parametrize("method", ["grpo", "gaca"])
def test_several_files(tmp_path, example_table, reference, method):
    paths = []
    for i, part in enumerate(split_by_group(example_table, 3)):
        paths.append(tmp_path / f"part-{i}.parquet")
        pq.write_table(part, paths[-1])
    out = tmp_path / "out" / "adv.parquet"
    run_ok("advantages", *paths, "--method", method, "-o", out)
    assert_same_advantages(pq.read_table(out), reference[method])


def test_glob(tmp_path, example_table, reference):
    for i, part in enumerate(split_by_group(example_table, 4)):
        pq.write_table(part, tmp_path / f"run-{i}.parquet")
    pq.write_table(example_table.slice(0, 3), tmp_path / "other.parquet")  # not matched
    out = tmp_path / "adv.parquet"
    run_ok("advantages", str(tmp_path / "run-*.parquet"), "--method", "gigpo", "-o", out)
    assert_same_advantages(pq.read_table(out), reference["gigpo"])
    log = read_log([str(tmp_path / "run-*.parquet")])
    assert len(log.files) == 4


def test_directory(tmp_path, example_table, reference):
    logs = tmp_path / "logs"
    logs.mkdir()
    for i, part in enumerate(split_by_group(example_table, 3)):
        pq.write_table(part, logs / f"shard-{i}.parquet")
    out = tmp_path / "adv.parquet"
    run_ok("advantages", logs, "--method", "gaca", "-o", out)
    assert_same_advantages(pq.read_table(out), reference["gaca"])
    res = runner.invoke(app, ["validate", str(logs)])
    assert res.exit_code == 0, res.output


def test_hive_partitions(tmp_path, example_table, reference):
    """logs/group_id=<g>/part.parquet with group_id only in the directory names."""
    logs = tmp_path / "logs"
    for g in sorted(set(example_table[C.GROUP_ID].to_pylist())):
        part = example_table.filter(pc.equal(example_table[C.GROUP_ID], g)).drop_columns([C.GROUP_ID])
        (logs / f"group_id={g}").mkdir(parents=True)
        pq.write_table(part, logs / f"group_id={g}" / "part-0.parquet")
    log = read_log([logs])
    assert C.GROUP_ID in log.table.column_names
    assert sorted(set(log.table[C.GROUP_ID].to_pylist())) == sorted(set(example_table[C.GROUP_ID].to_pylist()))
    out = tmp_path / "adv.parquet"
    run_ok("advantages", logs, "--method", "gigpo", "-o", out)
    result = pq.read_table(out)
    assert_same_advantages(result, reference["gigpo"])
    # the partition key reaches the output with the right value on every row
    got = by_step(result.append_column("_g", pc.cast(result[C.GROUP_ID], pa.string())), "_g")["_g"]
    want = by_step(example_table, C.GROUP_ID)[C.GROUP_ID]
    assert list(got) == list(want)


# --------------------------------------------------------------------------- --map and ids


def test_map_renamed_columns(tmp_path, example_table, reference):
    """A log that calls group_id `uid`, traj_id `traj_uid` and anchor_obs `state`: with --map
    it gives the same advantages, and the output keeps the user's names."""
    renames = {C.GROUP_ID: "uid", C.TRAJ_ID: "traj_uid", C.ANCHOR_OBS: "state"}
    table = example_table.rename_columns([renames.get(n, n) for n in example_table.column_names])
    src = tmp_path / "renamed.parquet"
    pq.write_table(table, src)
    out = tmp_path / "adv.parquet"
    run_ok(
        "advantages",
        src,
        "--method",
        "gigpo",
        "-o",
        out,
        "--map",
        "group_id=uid",
        "--map",
        "traj_id=traj_uid",
        "--map",
        "anchor_obs=state",
    )
    result = pq.read_table(out)
    assert result.column_names[: table.num_columns] == table.column_names
    for name in renames:
        assert name not in result.column_names
    assert result.select(table.column_names).equals(pq.read_table(src))
    assert_same_advantages(result, reference["gigpo"], traj_col="traj_uid")
    res = runner.invoke(app, ["validate", str(src), "--map", "group_id=uid", "--map", "traj_id=traj_uid"])
    assert res.exit_code == 0, res.output


def _renamed_log(tmp_path, example_table) -> Path:
    src = tmp_path / "renamed.parquet"
    pq.write_table(
        example_table.rename_columns(["uid" if n == C.GROUP_ID else n for n in example_table.column_names]), src
    )
    return src


def test_map_unknown_old_column(tmp_path, example_table):
    src = _renamed_log(tmp_path, example_table)
    out = tmp_path / "adv.parquet"
    res = runner.invoke(app, ["advantages", str(src), "--map", "group_id=gid", "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "gid" in errors[0] and "--map" in errors[0]
    assert not out.exists()


def test_map_new_name_already_present(tmp_path, example_table):
    """--map traj_id=uid on a log that already has traj_id: refused, not silently shadowed."""
    src = _renamed_log(tmp_path, example_table)
    out = tmp_path / "adv.parquet"
    res = runner.invoke(app, ["advantages", str(src), "--map", "traj_id=uid", "-o", str(out)])
    assert res.exit_code == 1, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "traj_id" in errors[0] and "already" in errors[0]
    assert not out.exists()


def test_map_is_applied_at_once_in_any_order(tmp_path, example_table, reference):
    """The --map options rename all at once: two columns swap names, and renaming group_id
    away while another column takes its name works in either order; the output keeps the
    user's names."""
    # the file calls the episode group `episode` and keeps an unrelated text column `group_id`
    names = {C.GROUP_ID: "episode"}
    table = example_table.rename_columns([names.get(n, n) for n in example_table.column_names])
    table = table.append_column("group_id", pa.array(["note"] * table.num_rows))
    src = tmp_path / "swapped.parquet"
    pq.write_table(table, src)
    for maps in (["group_id=episode", "note=group_id"], ["note=group_id", "group_id=episode"]):
        out = tmp_path / "adv.parquet"
        run_ok("advantages", src, "--method", "gigpo", "-o", out, *[x for m in maps for x in ("--map", m)])
        result = pq.read_table(out)
        assert result.column_names[: table.num_columns] == table.column_names
        assert_same_advantages(result, reference["gigpo"])
    swap = {C.GROUP_ID: C.TRAJ_ID, C.TRAJ_ID: C.GROUP_ID}
    pq.write_table(example_table.rename_columns([swap.get(n, n) for n in example_table.column_names]), src)
    out = tmp_path / "swap.parquet"
    run_ok("advantages", src, "--method", "gigpo", "-o", out, "--map", "group_id=traj_id", "--map", "traj_id=group_id")
    result = pq.read_table(out)
    assert result.column_names[: example_table.num_columns] == [swap.get(n, n) for n in example_table.column_names]
    assert_same_advantages(result.rename_columns([swap.get(n, n) for n in result.column_names]), reference["gigpo"])


def test_map_one_column_under_two_names(tmp_path, example_table):
    src = _renamed_log(tmp_path, example_table)
    out = tmp_path / "adv.parquet"
    res = runner.invoke(app, ["advantages", str(src), "--map", "group_id=uid", "--map", "traj_id=uid", "-o", str(out)])
    assert res.exit_code == 1, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "both read column 'uid'" in errors[0], res.stderr
    assert not out.exists()


@pytest.mark.parametrize("item", ["group_id", "=uid", "group_id=", "group_id:uid"])
def test_map_malformed(tmp_path, example_log, item):
    out = tmp_path / "adv.parquet"
    res = runner.invoke(app, ["advantages", str(example_log), "--map", item, "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert "--map" in res.stderr and "NEW=OLD" in res.stderr
    assert not out.exists()


def test_map_same_new_twice(tmp_path, example_log):
    res = runner.invoke(
        app,
        [
            "advantages",
            str(example_log),
            "--map",
            "group_id=a",
            "--map",
            "group_id=b",
            "-o",
            str(tmp_path / "o.parquet"),
        ],
    )
    assert res.exit_code == 2
    assert "--map" in res.stderr


@pytest.mark.parametrize("id_type", [pa.int64(), pa.int32(), pa.uint16(), pa.large_string()])
def test_integer_and_string_ids(tmp_path, example_table, reference, id_type):
    """Ids recoded as integers (numeric order differs from the text order) or as another string
    type: the same advantage on every row, and the id columns come out with their own type."""

    def recode(col: pa.ChunkedArray, scale: int) -> pa.Array:
        codes = pc.dictionary_encode(col).combine_chunks().indices.to_numpy().astype(np.int64)
        values = 1000 - scale * codes  # reverses the order
        if pa.types.is_integer(id_type):
            return pa.array(values, type=id_type)
        return pa.array([f"id-{v}" for v in values], type=id_type)

    table = example_table
    table = table.set_column(table.schema.get_field_index(C.GROUP_ID), C.GROUP_ID, recode(table[C.GROUP_ID], 7))
    table = table.set_column(table.schema.get_field_index(C.TRAJ_ID), C.TRAJ_ID, recode(table[C.TRAJ_ID], 3))
    src = tmp_path / "ids.parquet"
    pq.write_table(table, src)
    out = tmp_path / "adv.parquet"
    run_ok("advantages", src, "--method", "gaca", "-o", out)
    result = pq.read_table(out)
    assert result.schema.field(C.TRAJ_ID).type == id_type
    assert result.schema.field(C.GROUP_ID).type == id_type
    # output rows are in input order, and the input is the example reordered by nothing
    np.testing.assert_array_equal(result[C.ADVANTAGE].to_numpy(), reference["gaca"][C.ADVANTAGE].to_numpy())


# --------------------------------------------------------------------------- the output


def _with_extra_columns(table: pa.Table) -> pa.Table:
    n = table.num_rows
    rng = np.random.default_rng(0)
    extra = {
        "seed_u16": pa.array(rng.integers(0, 60000, n), type=pa.uint16()),
        "when": pa.array(np.arange(n).astype("datetime64[ms]")),
        "env": pa.array(["alfworld", "webshop"] * (n // 2) + ["alfworld"] * (n % 2)).dictionary_encode(),
        "meta": pa.array([{"k": i, "v": [float(i)]} for i in range(n)]),
        "maybe": pa.array([None if i % 3 else 1.5 for i in range(n)], type=pa.float32()),
        "raw": pa.array([bytes([i % 256]) for i in range(n)], type=pa.binary()),
    }
    for name, arr in extra.items():
        table = table.append_column(name, arr)
    return table


@pytest.mark.parametrize("method", ["grpo", "gigpo", "gaca"])
def test_output_keeps_every_input_column(tmp_path, example_table, method):
    src = tmp_path / "in.parquet"
    pq.write_table(_with_extra_columns(example_table), src)
    before = src.read_bytes()
    original = pq.read_table(src)
    out = tmp_path / "out.parquet"
    run_ok("advantages", src, "--method", method, "-o", out)
    result = pq.read_table(out)
    assert result.column_names[: original.num_columns] == original.column_names
    kept = result.select(original.column_names)
    assert kept.schema.remove_metadata().equals(original.schema.remove_metadata()), (kept.schema, original.schema)
    assert kept.equals(original)
    assert src.read_bytes() == before  # the input is never modified


def test_rerun_replaces_tool_columns(tmp_path, example_log, example_table, reference):
    """grpo on a gaca-annotated file: gaca's own columns (nll_z, gaca_weight, step groups) go,
    the advantages are grpo's, and no column appears twice."""
    gaca_out = tmp_path / "gaca.parquet"
    run_ok("advantages", example_log, "--method", "gaca", "-o", gaca_out)
    assert C.NLL_Z in pq.read_table(gaca_out).column_names
    grpo_out = tmp_path / "grpo.parquet"
    run_ok("advantages", gaca_out, "--method", "grpo", "-o", grpo_out)
    result = pq.read_table(grpo_out)
    for gone in (C.NLL_Z, C.GACA_WEIGHT, C.STEP_GROUP_ID, C.STEP_GROUP_SIZE):
        assert gone not in result.column_names
    assert len(result.column_names) == len(set(result.column_names))
    assert result.column_names == reference["grpo"].column_names
    assert result.equals(reference["grpo"])
    meta = json.loads(pq.read_schema(grpo_out).metadata[C.META_ADVANTAGES.encode()])
    assert meta["method"] == "grpo"
    # and back again: gaca on the grpo output equals gaca on the raw log
    again = tmp_path / "gaca2.parquet"
    run_ok("advantages", grpo_out, "--method", "gaca", "-o", again)
    assert pq.read_table(again).equals(reference["gaca"])


def test_metadata_records_version_method_and_every_parameter(tmp_path, example_log):
    out = tmp_path / "adv.parquet"
    run_ok(
        "advantages",
        example_log,
        "--method",
        "gaca",
        "-o",
        out,
        "--gamma",
        "0.9",
        "--norm",
        "std",
        "--step-weight",
        "0.5",
        "--episode-stats",
        "steps",
        "--anchor-similarity",
        "0.8",
        "--beta",
        "0.25",
        "--nll-scope",
        "group",
        "--nll-reduce",
        "sum",
        "--lambda-min",
        "0.1",
        "--lambda-max",
        "0.9",
    )
    meta = pq.read_schema(out).metadata
    doc = json.loads(meta[C.META_ADVANTAGES.encode()])
    assert doc["version"] == __version__
    assert doc["method"] == "gaca"
    params = doc["params"]
    assert set(params) == {f.name for f in fields(AdvantagesConfig)}
    assert params == {
        "method": "gaca",
        "gamma": 0.9,
        "norm": "std",
        "step_weight": 0.5,
        "episode_stats": "steps",
        "anchor_similarity": 0.8,
        "beta": 0.25,
        "nll_scope": "group",
        "nll_reduce": "sum",
        "lambda_min": 0.1,
        "lambda_max": 0.9,
        "epsilon": 1e-06,
        "similarity_metric": "lcs",
        "similarity_order": "sorted",
        "singleton_groups": "zero",
        "history_length": 2,
        "length_weight_alpha": 1.0,
        "base_group": False,
    }


def test_metadata_defaults_are_explicit(tmp_path, example_log):
    """Defaults are written out too (norm resolved to the method's default)."""
    out = tmp_path / "adv.parquet"
    run_ok("advantages", example_log, "--method", "grpo", "-o", out)
    doc = json.loads(pq.read_schema(out).metadata[C.META_ADVANTAGES.encode()])
    defaults = AdvantagesConfig(method="grpo")
    assert doc["params"]["gamma"] == defaults.gamma
    assert doc["params"]["norm"] == "std"
    assert set(doc["params"]) == {f.name for f in fields(AdvantagesConfig)}


def test_metadata_keeps_score_metadata(tmp_path, example_table):
    score_meta = json.dumps({"model": "tiny-llama", "revision": "abc", "dtype": "float32", "temperature": 1.0})
    src = tmp_path / "scored.parquet"
    pq.write_table(example_table.replace_schema_metadata({C.META_SCORE: score_meta}), src)
    out = tmp_path / "adv.parquet"
    run_ok("advantages", src, "--method", "gaca", "-o", out)
    meta = pq.read_schema(out).metadata
    assert meta[C.META_SCORE.encode()].decode() == score_meta
    assert C.META_ADVANTAGES.encode() in meta


# --------------------------------------------------------------------------- refused outputs


def test_output_equal_to_input_refused(tmp_path, example_table, monkeypatch):
    """The same file however it is spelled: as given, with `./`, relative to the cwd."""
    src = tmp_path / "log.parquet"
    pq.write_table(example_table, src)
    before = src.read_bytes()
    monkeypatch.chdir(tmp_path)
    for target in (str(src), f"{tmp_path}/./log.parquet", "log.parquet"):
        res = runner.invoke(app, ["advantages", str(src), "--method", "grpo", "-o", str(target)])
        assert res.exit_code == 2, res.output
        assert "-o" in res.stderr and "input" in res.stderr
    assert src.read_bytes() == before
    assert os.listdir(tmp_path) == ["log.parquet"]


def test_output_inside_input_directory_refused(tmp_path, example_table):
    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(example_table, logs / "a.parquet")
    for target in (logs / "adv.parquet", logs / "sub" / "adv.parquet"):
        res = runner.invoke(app, ["advantages", str(logs), "--method", "grpo", "-o", str(target)])
        assert res.exit_code == 2, res.output
        assert "-o" in res.stderr
    assert sorted(os.listdir(logs)) == ["a.parquet"]


def test_output_matching_an_input_glob_refused(tmp_path, example_table):
    for i, part in enumerate(split_by_group(example_table, 2)):
        pq.write_table(part, tmp_path / f"run-{i}.parquet")
    before = (tmp_path / "run-1.parquet").read_bytes()
    res = runner.invoke(app, ["advantages", str(tmp_path / "run-*.parquet"), "-o", str(tmp_path / "run-1.parquet")])
    assert res.exit_code == 2, res.output
    assert (tmp_path / "run-1.parquet").read_bytes() == before


# --------------------------------------------------------------------------- atomic writes


class SimulatedFailure(RuntimeError):
    pass


def _failing_write(table, where, *args, **kwargs):
    """Write half a file, then fail, as a full disk would."""
    Path(where).write_bytes(b"PAR1 half a file")
    raise SimulatedFailure("disk full")


def _failing_copy(src, dst, offset, length, dst_offset):
    """Copy a few bytes of a column chunk into the output, then fail, as a full disk would."""
    os.pwrite(dst, b"half a chunk", dst_offset)
    raise SimulatedFailure("disk full")


def _fail_during(how: str, monkeypatch) -> None:
    """Make the next `gaca advantages` write fail midway: in the splice of the input's column
    chunks, or (with splicing refused, its warning recorded) in pyarrow's rewrite of the whole
    table."""
    import gaca_cli.log._splice as splice
    import gaca_cli.log._splice.writer as splice_writer

    if how == "splice":
        monkeypatch.setattr(splice_writer, "_copy", _failing_copy)
    else:

        def refuse(*args, **kwargs):
            raise splice.SpliceUnsupported("refused for the test")

        monkeypatch.setattr(splice, "splice_columns", refuse)
        record_fallbacks(monkeypatch)
        monkeypatch.setattr(pq, "write_table", _failing_write)


@pytest.mark.parametrize("how", ["splice", "rewrite"])
def test_write_failure_leaves_old_output(tmp_path, example_log, monkeypatch, how):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "adv.parquet"
    out.write_bytes(PREVIOUS_OUTPUT)
    _fail_during(how, monkeypatch)
    res = runner.invoke(app, ["advantages", str(example_log), "--method", "gaca", "-o", str(out)])
    assert res.exit_code != 0
    assert isinstance(res.exception, SimulatedFailure)  # a bug-class failure keeps its exception
    assert out.read_bytes() == PREVIOUS_OUTPUT
    assert os.listdir(out_dir) == ["adv.parquet"]  # no temporary or partial file left


@pytest.mark.parametrize("how", ["splice", "rewrite"])
def test_write_failure_creates_nothing(tmp_path, example_log, monkeypatch, how):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    _fail_during(how, monkeypatch)
    res = runner.invoke(app, ["advantages", str(example_log), "--method", "grpo", "-o", str(out_dir / "adv.parquet")])
    assert isinstance(res.exception, SimulatedFailure)
    assert os.listdir(out_dir) == []


def test_write_parquet_atomic_library(tmp_path, monkeypatch):
    out = tmp_path / "t.parquet"
    table = pa.table({"x": [1, 2, 3]})
    write_parquet_atomic(table, out, {"gaca.test": "{}"})
    first = out.read_bytes()
    assert pq.read_table(out).select(["x"]).equals(table)
    assert pq.read_schema(out).metadata[b"gaca.test"] == b"{}"
    monkeypatch.setattr(pq, "write_table", _failing_write)
    with pytest.raises(SimulatedFailure):
        write_parquet_atomic(pa.table({"x": [9]}), out, {})
    assert out.read_bytes() == first
    assert os.listdir(tmp_path) == ["t.parquet"]


def test_read_log_errors_are_gaca_errors(tmp_path):
    with pytest.raises(GacaError, match="no file matches"):
        read_log([str(tmp_path / "*.parquet")])
    with pytest.raises(GacaError, match="no such file"):
        read_log([tmp_path / "missing.parquet"])


# --------------------------------------------------------------------------- text widths and readers' corners


def _with_text_type(table: pa.Table, text: pa.DataType) -> pa.Table:
    """`table` with every string column of type `text` (string or large_string)."""
    fields = [
        f.with_type(text) if pa.types.is_string(f.type) or pa.types.is_large_string(f.type) else f for f in table.schema
    ]
    return table.cast(pa.schema(fields))


@pytest.mark.parametrize("layout", ["files", "directory"])
def test_string_and_large_string_files_are_read_as_large_string(tmp_path, example_table, layout):
    """One file with string columns, one with large_string: read as large_string (what every
    mainstream reader does), the footers' schema too; an int/float clash still is an error."""
    a, b = split_by_group(example_table, 2)
    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(_with_text_type(a, pa.string()), logs / "a.parquet")
    pq.write_table(_with_text_type(b, pa.large_string()), logs / "b.parquet")
    inputs = [str(logs)] if layout == "directory" else [str(logs / "a.parquet"), str(logs / "b.parquet")]
    log = read_log(inputs)
    assert log.table.schema.field(C.ANCHOR_OBS).type == pa.large_string()
    assert log.table[C.TRAJ_ID].to_pylist() == a[C.TRAJ_ID].to_pylist() + b[C.TRAJ_ID].to_pylist()
    partial = read_log(inputs, columns=[C.GROUP_ID, C.TRAJ_ID], dictionary=[C.TRAJ_ID] if layout == "files" else ())
    assert partial.file_schema.field(C.ANCHOR_OBS).type == pa.large_string()
    if layout == "files":  # ids read dictionary-encoded from both files: one dictionary column
        assert pa.types.is_dictionary(partial.table.schema.field(C.TRAJ_ID).type)
        assert partial.table[C.TRAJ_ID].to_pylist() == a[C.TRAJ_ID].to_pylist() + b[C.TRAJ_ID].to_pylist()
        column = partial.read_column(C.ANCHOR_OBS)  # read on its own, from each file
        assert column.type == pa.large_string()
        assert column.to_pylist() == a[C.ANCHOR_OBS].to_pylist() + b[C.ANCHOR_OBS].to_pylist()


@pytest.mark.parametrize("layout", ["files", "directory"])
def test_integer_and_float_widths_are_unified(tmp_path, example_table, layout):
    """step_idx int32 in one file and int64 in the other, reward float32 and float64 (pandas
    and polars write different widths): read as int64 and float64, and the advantages are
    those of one file holding the same values at the wide widths."""
    a, b = split_by_group(example_table, 2)

    def cast(t: pa.Table, step: pa.DataType, reward: pa.DataType) -> pa.Table:
        t = t.set_column(t.schema.get_field_index(C.STEP_IDX), C.STEP_IDX, t[C.STEP_IDX].cast(step))
        return t.set_column(t.schema.get_field_index(C.REWARD), C.REWARD, t[C.REWARD].cast(reward))

    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(cast(a, pa.int32(), pa.float32()), logs / "a.parquet")
    pq.write_table(cast(b, pa.int64(), pa.float64()), logs / "b.parquet")
    inputs = [logs] if layout == "directory" else [logs / "a.parquet", logs / "b.parquet"]
    log = read_log([str(p) for p in inputs])
    assert log.table.schema.field(C.STEP_IDX).type == pa.int64()
    assert log.table.schema.field(C.REWARD).type == pa.float64()
    out = tmp_path / "adv.parquet"
    run_ok("advantages", *inputs, "--method", "gigpo", "-o", out)
    wide = tmp_path / "wide.parquet"
    pq.write_table(
        pa.concat_tables(
            [cast(cast(a, pa.int64(), pa.float32()), pa.int64(), pa.float64()), cast(b, pa.int64(), pa.float64())]
        ),
        wide,
    )
    expected = tmp_path / "expected.parquet"
    run_ok("advantages", wide, "--method", "gigpo", "-o", expected)
    assert_same_advantages(pq.read_table(out), pq.read_table(expected))


def test_text_widths_do_not_unify_other_types(tmp_path, example_table):
    """Only widths are unified: a string id in one file and an integer one in the other stay
    a clean error."""
    a, b = split_by_group(example_table, 2)
    codes = {t: i for i, t in enumerate(sorted(set(b[C.TRAJ_ID].to_pylist())))}
    b = b.set_column(
        b.schema.get_field_index(C.TRAJ_ID), C.TRAJ_ID, pa.array([codes[t] for t in b[C.TRAJ_ID].to_pylist()])
    )
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet")
    with pytest.raises(GacaError, match="schemas do not agree"):
        read_log([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")])


def test_delta_encoded_ids_next_to_dictionary_ones(tmp_path, example_table):
    """Ids asked for dictionary-encoded: a file whose ids have DELTA_BYTE_ARRAY pages (which
    pyarrow cannot read into a dictionary) and one with dictionary pages give one dictionary
    column with the ids in order."""
    a, b = split_by_group(example_table, 2)
    pq.write_table(a, tmp_path / "a.parquet")
    delta = {C.GROUP_ID: "DELTA_BYTE_ARRAY", C.TRAJ_ID: "DELTA_LENGTH_BYTE_ARRAY"}
    pq.write_table(b, tmp_path / "b.parquet", use_dictionary=False, column_encoding=delta)
    paths = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    log = read_log(paths, columns=[C.GROUP_ID, C.TRAJ_ID, C.STEP_IDX], dictionary=[C.GROUP_ID, C.TRAJ_ID])
    for name in (C.GROUP_ID, C.TRAJ_ID):
        assert pa.types.is_dictionary(log.table.schema.field(name).type), name
        assert log.table[name].to_pylist() == a[name].to_pylist() + b[name].to_pylist()


def test_key_value_metadata_and_stored_schema_readers(tmp_path):
    """read_key_value_metadata: every entry but ARROW:schema, bytes that are not UTF-8 kept
    (write_parquet_atomic writes them back unchanged); stored_arrow_schema: the writer's own
    schema (here a time zone that pyarrow's reading of INT96 drops), None without one."""
    from gaca_cli.log.reading import read_key_value_metadata, stored_arrow_schema

    table = pa.table({"t": pa.array([0, 1], pa.timestamp("ns", tz="Europe/Paris"))})
    table = table.replace_schema_metadata({b"pandas": b"{}", b"raw": b"\xff\x00bytes"})
    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(table, src, use_deprecated_int96_timestamps=True)
    meta = read_key_value_metadata(str(src))
    assert set(meta) == {"pandas", "raw"}
    write_parquet_atomic(pa.table({"x": [1]}), out, meta)
    stored = dict(pq.read_metadata(out).metadata)
    assert stored[b"raw"] == b"\xff\x00bytes" and stored[b"pandas"] == b"{}"
    assert pq.read_schema(src).field("t").type == pa.timestamp("ns")
    assert stored_arrow_schema(str(src)).field("t").type == pa.timestamp("ns", tz="Europe/Paris")
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1]}), plain, store_schema=False)
    assert stored_arrow_schema(str(plain)) is None


def test_a_partition_value_of_another_type_than_the_files_column_is_a_clean_error(tmp_path):
    """A hive key that the files hold as an int64 column, and a directory value ('x') that a
    file without the column would need as an int64: one GacaError naming the directory and
    the column, no traceback."""
    logs = tmp_path / "logs"
    (logs / "shard=1").mkdir(parents=True)
    (logs / "shard=x").mkdir()
    pq.write_table(pa.table({"x": [1], "shard": pa.array([1], pa.int64())}), logs / "shard=1" / "a.parquet")
    pq.write_table(pa.table({"x": [2]}), logs / "shard=x" / "a.parquet")
    with pytest.raises(GacaError, match="shard.*not a readable Parquet dataset") as info:
        read_log([str(logs)])
    assert info.value.file == str(logs) and info.value.column == "shard"


@pytest.mark.parametrize("layout", ["file", "directory"])
@pytest.mark.parametrize("command", ["validate", "advantages"])
def test_a_file_with_two_columns_of_one_name(tmp_path, example_table, layout, command):
    """Two columns named `reward` in one file: one error naming the file and the column
    (pyarrow's 'Can't unify schema with duplicate field names' said neither)."""
    path = tmp_path / "logs" / "dup.parquet"
    path.parent.mkdir()
    pq.write_table(example_table.append_column(C.REWARD, example_table[C.REWARD]), path)
    given = path.parent if layout == "directory" else path
    out = tmp_path / "out.parquet"
    res = runner.invoke(app, [command, str(given), *(["-o", str(out)] if command == "advantages" else [])])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: column 'reward': the file has two columns")
    assert not out.exists()
