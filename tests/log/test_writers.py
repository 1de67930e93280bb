"""Both output paths of `gaca advantages` on files from the writers logs come from.

The corpus: one small log written by pyarrow (data pages v1 and v2, each codec it has), by
polars (one file, and hive partitions that keep the partition column inside each file) and
by duckdb; and the layouts of issue 17: ids stored with DELTA_LENGTH_BYTE_ARRAY or
DELTA_BYTE_ARRAY pages, a glob mixing a pyarrow file (string) with a polars one
(large_string), INT96 timestamps with a time zone, pandas' index metadata.

For each input, `write_annotated` runs twice: spliced (plain files; a directory is always
rewritten) and with GACA_NO_SPLICE=1 (the plain pyarrow write). pyarrow, polars and duckdb
each read both outputs: what each reader gets must be bit for bit the same from the two
outputs (types, nulls, every float's bits), and the carried columns must be what that reader
gets from the input itself.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path

import duckdb
import fastparquet
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from gaca_cli.credit.writing import NO_SPLICE_ENV
from gaca_cli.log import columns as C
from gaca_cli.log.reading import read_log, stored_arrow_schema
from tests.credit.conftest import library_run, outputs_of, record_fallbacks

CODECS = ("snappy", "gzip", "brotli", "zstd", "lz4", "none")
INFO = pa.struct([("turn", pa.int64()), ("note", pa.string())])


def corpus_log() -> pa.Table:
    """3 groups x 4 rollouts of 3-5 steps: the columns gaca reads (string ids, a repeated anchor
    text, an nll_mean with a null) and carried ones of other kinds (unicode text with nulls, a
    list, a struct, a time-zone-aware timestamp)."""
    rng = np.random.default_rng(7)
    rows: dict[str, list] = {k: [] for k in (
        "group_id", "traj_id", "step_idx", "reward", "done", "anchor_obs", "action", "nll_mean",
        "note", "tags", "info", "logged_at",
    )}  # fmt: skip
    start = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    for g in range(3):
        for r in range(4):
            n_steps = int(rng.integers(3, 6))
            for t in range(n_steps):
                last = t == n_steps - 1
                rows["group_id"].append(f"task-{g}")
                rows["traj_id"].append(f"task-{g}/r{r}")
                rows["step_idx"].append(t)
                rows["reward"].append(float(rng.integers(0, 2)) if last else 0.0)
                rows["done"].append(last)
                rows["anchor_obs"].append(f"room {g}-{min(t, int(rng.integers(0, 3)))} ✓")
                rows["action"].append(f"go {['north', 'south', 'east'][int(rng.integers(0, 3))]}")
                rows["nll_mean"].append(None if (g, r, t) == (1, 2, 1) else float(rng.gamma(2.0, 0.3)))
                rows["note"].append(None if t == 1 else f"étape {t} — rollout {r}")
                rows["tags"].append([f"t{k}" for k in range(t % 3)])
                rows["info"].append({"turn": t, "note": f"g{g}"})
                rows["logged_at"].append(start + dt.timedelta(seconds=g * 100 + r * 10 + t))
    schema = pa.schema(
        [
            ("group_id", pa.string()),
            ("traj_id", pa.string()),
            ("step_idx", pa.int64()),
            ("reward", pa.float64()),
            ("done", pa.bool_()),
            ("anchor_obs", pa.string()),
            ("action", pa.string()),
            ("nll_mean", pa.float64()),
            ("note", pa.string()),
            ("tags", pa.list_(pa.string())),
            ("info", INFO),
            ("logged_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    return pa.table(rows, schema=schema)


# --------------------------------------------------------------------------- writers


def write_pyarrow(table: pa.Table, dest: Path, *, version: str, codec: str) -> Path:
    path = dest / "log.parquet"
    pq.write_table(table, path, compression=codec, data_page_version=version, row_group_size=16)
    return path


def write_polars(table: pa.Table, dest: Path) -> Path:
    path = dest / "log.parquet"
    pl.from_arrow(table).write_parquet(path, row_group_size=16)
    return path


def write_polars_hive(table: pa.Table, dest: Path) -> Path:
    path = dest / "log"
    pl.from_arrow(table).write_parquet(path, partition_by=C.GROUP_ID)
    return path


def write_duckdb(table: pa.Table, dest: Path) -> Path:
    path = dest / "log.parquet"
    con = duckdb.connect()
    con.register("log_table", table)
    con.execute(f"COPY (SELECT * FROM log_table) TO '{path}' (FORMAT parquet, COMPRESSION zstd)")
    con.close()
    return path


def write_fastparquet(table: pa.Table, dest: Path) -> Path:
    """fastparquet (dask's writer, with its own encoders) from pandas. It writes no lists or
    structs, so those two carried columns go as JSON text (UTF8: with its JSON type instead,
    polars reads the input as binary but gaca's output, which stores the Arrow schema, as text)."""
    path = dest / "log.parquet"
    frame = table.to_pandas()
    frame["tags"] = frame["tags"].map(lambda v: json.dumps(list(v)))
    frame["info"] = frame["info"].map(json.dumps)
    fastparquet.write(str(path), frame, row_group_offsets=16, compression="SNAPPY", object_encoding="utf8")
    return path


WRITERS: dict[str, Callable[[pa.Table, Path], Path]] = {
    **{
        f"pyarrow-v{version[0]}-{codec}": (lambda t, d, v=version, c=codec: write_pyarrow(t, d, version=v, codec=c))
        for version in ("1.0", "2.0")
        for codec in CODECS
    },
    "polars": write_polars,
    "polars-hive": write_polars_hive,
    "duckdb": write_duckdb,
    "fastparquet": write_fastparquet,
}


# --------------------------------------------------------------------------- readers


def _duckdb_source(path: Path) -> str:
    if path.is_dir():
        return f"read_parquet('{path}/**/*.parquet', hive_partitioning = true)"
    return f"read_parquet('{path}')"


READERS: dict[str, Callable[[Path], pa.Table]] = {
    "pyarrow": lambda path: read_log([str(path)]).table if path.is_dir() else pq.read_table(path),
    "polars": lambda path: pl.read_parquet(path, hive_partitioning=path.is_dir()).to_arrow(),
    "duckdb": lambda path: duckdb.sql(f"SELECT * FROM {_duckdb_source(path)}").to_arrow_table(),
}


def _values(column: pa.ChunkedArray) -> pa.Array:
    """One array of the column's values (dictionaries decoded: their layout may differ)."""
    array = column.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def assert_bit_identical(got: pa.Table, want: pa.Table, what: str) -> None:
    """Same names and types; per column the same nulls and, for floats, the same bits (NaN
    included); other values equal."""
    assert got.schema.equals(want.schema), (what, got.schema, want.schema)
    for name in want.column_names:
        x, y = _values(got.column(name)), _values(want.column(name))
        assert x.is_valid().equals(y.is_valid()), (what, name)
        if pa.types.is_floating(x.type):
            bits = np.dtype(f"u{x.type.bit_width // 8}")
            xs = np.asarray(x.fill_null(0).to_numpy(zero_copy_only=False)).view(bits)
            ys = np.asarray(y.fill_null(0).to_numpy(zero_copy_only=False)).view(bits)
            assert np.array_equal(xs, ys), (what, name)
        else:
            assert x.equals(y), (what, name)


def by_step(table: pa.Table) -> pa.Table:
    """Rows sorted by (traj_id, step_idx) (a directory's rows come partition by partition)."""
    key = pc.cast(table[C.TRAJ_ID], pa.string())
    order = table.append_column("_k", key).sort_by([("_k", "ascending"), (C.STEP_IDX, "ascending")])
    return order.drop_columns(["_k"])


def both_paths(inputs: list[Path], tmp_path: Path, monkeypatch, expect_splice: bool) -> tuple[Path, Path]:
    """Spliced (or, for a directory, rewritten) output and the GACA_NO_SPLICE=1 one; a splice
    that is expected must not fall back (a fallback returns "rewritten")."""
    first, plain = tmp_path / "first.parquet", tmp_path / "plain.parquet"
    assert library_run(inputs, "gaca", first) == ("spliced" if expect_splice else "rewritten")
    monkeypatch.setenv(NO_SPLICE_ENV, "1")
    assert library_run(inputs, "gaca", plain) == "rewritten"
    monkeypatch.delenv(NO_SPLICE_ENV)
    return first, plain


def check_outputs(first: Path, plain: Path, inputs: list[Path], sort: bool = False) -> None:
    """Each reader gets the same from both outputs, and from their carried columns what it gets
    from the input(s); both files store the same Arrow schema and key/value metadata."""
    stored = [stored_arrow_schema(str(p)) for p in (first, plain)]
    assert stored[0].names == stored[1].names and stored[0].metadata == stored[1].metadata
    for x, y in zip(*stored):
        assert x.type == y.type and x.metadata == y.metadata, (x, y)  # (a list's item name may differ)
    kv = [dict(pq.read_metadata(p).metadata) for p in (first, plain)]
    for meta in kv:
        meta.pop(b"ARROW:schema")
    assert kv[0] == kv[1]
    for name, read in READERS.items():
        a, b = read(first), read(plain)
        assert a.column_names[-len(outputs_of("gaca")) :] == outputs_of("gaca"), name
        assert_bit_identical(a, b, f"{name}: spliced vs plain")
        source = pa.concat_tables([read(p) for p in inputs]) if len(inputs) > 1 else read(inputs[0])
        carried = a.select(source.column_names)
        if sort:
            carried, source = by_step(carried), by_step(source)
        assert_bit_identical(carried, source, f"{name}: carried vs input")


# --------------------------------------------------------------------------- the corpus


@pytest.mark.parametrize("writer", list(WRITERS))
def test_both_paths_on_files_from_every_writer(tmp_path, monkeypatch, writer):
    (tmp_path / "in").mkdir()
    source = WRITERS[writer](corpus_log(), tmp_path / "in")
    first, plain = both_paths([source], tmp_path, monkeypatch, expect_splice=not source.is_dir())
    check_outputs(first, plain, [source], sort=source.is_dir())


def test_the_corpus_holds_what_it_claims(tmp_path):
    """The writers really wrote what the tests above are about: each codec, both page
    versions, polars' and duckdb's own files, the partition column inside polars' partitions."""
    (tmp_path / "in").mkdir()
    for writer, write in WRITERS.items():
        out = tmp_path / writer
        out.mkdir()
        path = write(corpus_log(), out)
        files = sorted(path.glob("*/*.parquet")) if path.is_dir() else [path]
        meta = pq.read_metadata(files[0])
        if writer.startswith("pyarrow"):
            codec = writer.split("-")[2]
            assert _codecs(files[0]) == {CODEC_IDS[codec]}, writer
            assert meta.num_row_groups > 1
            kinds = {_page_kinds(files[0])}
            assert kinds == {"DATA_PAGE_V2" if "-v2-" in writer else "DATA_PAGE"}, writer
        elif writer.startswith("polars"):
            assert meta.created_by.startswith("Polars"), meta.created_by
        elif writer == "fastparquet":
            assert meta.created_by.startswith("fastparquet"), meta.created_by
            assert meta.num_row_groups > 1
        else:
            assert meta.created_by.startswith("DuckDB"), meta.created_by
    hive = sorted((tmp_path / "polars-hive" / "log").glob("group_id=*/*.parquet"))
    assert len(hive) == 3 and all(C.GROUP_ID in pq.read_schema(f).names for f in hive)


CODEC_IDS = {"none": 0, "snappy": 1, "gzip": 2, "brotli": 4, "zstd": 6, "lz4": 7}  # parquet.thrift; 7: LZ4_RAW


def _codecs(path: Path) -> set[int]:
    """The CompressionCodec ids of the file's column chunks, from its footer."""
    from gaca_cli.log._splice import footer as pf

    meta = pf.read_footer(str(path)).meta
    return {
        c.get(pf.CC_META_DATA).get(4) for rg in meta.get(pf.FMD_ROW_GROUPS).items for c in rg.get(pf.RG_COLUMNS).items
    }


def _page_kinds(path: Path) -> str:
    """The data page type of the file's first column chunk, read from its first page header."""
    from gaca_cli.log._splice import footer as pf
    from gaca_cli.log._splice import thrift as th

    raw = path.read_bytes()
    meta = pf.read_footer(str(path))
    chunk = pf.chunk_piece(meta, meta.meta.get(pf.FMD_ROW_GROUPS).items[0].get(pf.RG_COLUMNS).items[0])
    decoder = th.ThriftDecoder(raw, chunk.start)
    header = decoder.read_struct()
    if header.get(1) == 2:  # a dictionary page first: the data page follows it
        th_next = th.ThriftDecoder(raw, decoder.pos + header.get(3))
        header = th_next.read_struct()
    return {0: "DATA_PAGE", 3: "DATA_PAGE_V2"}[header.get(1)]


# --------------------------------------------------------------------------- issue 17


@pytest.mark.parametrize("encoding", ["DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY"])
def test_ids_stored_with_delta_pages_are_read(tmp_path, monkeypatch, encoding):
    """pyarrow cannot read DELTA pages into a dictionary (how gaca reads ids): they are read
    plain and encoded after; every reader reads them, and so does gaca."""
    source = tmp_path / "delta.parquet"
    encodings = {C.GROUP_ID: encoding, C.TRAJ_ID: encoding}
    pq.write_table(corpus_log(), source, use_dictionary=False, column_encoding=encodings, row_group_size=16)
    assert encoding in pq.read_metadata(source).row_group(0).column(0).encodings
    first, plain = both_paths([source], tmp_path, monkeypatch, expect_splice=True)
    check_outputs(first, plain, [source])


@pytest.mark.parametrize("key", [C.GROUP_ID, "shard"])
def test_polars_hive_partitions_keep_their_column_and_values(tmp_path, key):
    """polars keeps the partition column in each file (large_string; int64 for `shard`) while
    the directory names make it a key of another type (string; int32): it is read as the
    files' column, no type clash, once, in its place."""
    table = corpus_log()
    table = table.append_column("shard", pa.array(np.arange(table.num_rows) % 2, pa.int64()))
    path = tmp_path / "log"
    pl.from_arrow(table).write_parquet(path, partition_by=key)
    log = read_log([str(path)])
    want = {C.GROUP_ID: pa.large_string(), "shard": pa.int64()}[key]
    assert log.table.schema.field(key).type == want
    assert log.table.column_names == table.column_names  # no second column for the key, same order
    assert_bit_identical(
        by_step(log.table).select(["traj_id", key]),
        by_step(pl.from_arrow(table).to_arrow()).select(["traj_id", key]),
        key,
    )


def test_glob_of_a_pyarrow_and_a_polars_file_unifies_text_widths(tmp_path, monkeypatch):
    """string in one file, large_string in the other (ids, text, list items): read as
    large_string, as polars and duckdb read them; the splice refuses two writers' files, so
    the output is rewritten, with a warning."""
    table = corpus_log()
    a, b = tmp_path / "part-0.parquet", tmp_path / "part-1.parquet"
    pq.write_table(table.slice(0, 20), a)
    pl.from_arrow(table.slice(20)).write_parquet(b)
    assert pq.read_schema(a).field(C.TRAJ_ID).type == pa.string()
    assert pq.read_schema(b).field(C.TRAJ_ID).type == pa.large_string()
    log = read_log([str(tmp_path / "part-*.parquet")])
    assert log.table.schema.field(C.TRAJ_ID).type == pa.large_string()
    assert log.table.schema.field("tags").type == pa.large_list(pa.large_string())
    assert log.table[C.TRAJ_ID].to_pylist() == table[C.TRAJ_ID].to_pylist()
    out = tmp_path / "out" / "adv.parquet"
    fallbacks = record_fallbacks(monkeypatch)
    assert library_run([tmp_path / "part-*.parquet"], "gaca", out) == "rewritten"
    assert len(fallbacks) == 1 and "created_by differ" in fallbacks[0]
    result = pq.read_table(out)
    assert result[C.TRAJ_ID].to_pylist() == table[C.TRAJ_ID].to_pylist()
    assert result["tags"].to_pylist() == table["tags"].to_pylist()


def _categorical_part(table: pa.Table, path: Path) -> None:
    """pandas with its ids and prompts as categoricals: dictionary columns in the file."""
    frame = table.to_pandas()
    for name in (C.GROUP_ID, C.TRAJ_ID, "anchor_obs"):
        frame[name] = frame[name].astype("category")
    frame.to_parquet(path)


def _string_view_part(table: pa.Table, path: Path) -> None:
    """Every text column as string_view (what polars hands pyarrow), written by pyarrow."""
    views = [
        pa.string_view() if pa.types.is_string(t) or pa.types.is_large_string(t) else t for t in table.schema.types
    ]
    pq.write_table(table.cast(pa.schema([f.with_type(t) for f, t in zip(table.schema, views)])), path)


@pytest.mark.parametrize("second", ["categorical", "string_view"])
@pytest.mark.parametrize("layout", ["glob", "directory"])
def test_a_text_column_encoded_differently_in_two_files_is_read_as_text(tmp_path, layout, second):
    """A log of two files whose ids are plain text in one and a dictionary (a pandas
    categorical) or string_view in the other is one log, for every method, with the same
    advantages as the whole log in one file."""
    table = corpus_log()
    whole = tmp_path / "whole.parquet"
    pq.write_table(table, whole)
    parts = tmp_path / "parts"
    parts.mkdir()
    pq.write_table(table.slice(0, 20), parts / "part-0.parquet")
    {"categorical": _categorical_part, "string_view": _string_view_part}[second](
        table.slice(20), parts / "part-1.parquet"
    )
    kinds = {str(pq.read_schema(p).field(C.GROUP_ID).type) for p in parts.iterdir()}
    assert len(kinds) == 2, kinds
    source = parts / "part-*.parquet" if layout == "glob" else parts
    for method in ("grpo", "gigpo", "gaca"):
        library_run([whole], method, tmp_path / f"want-{method}.parquet")
        library_run([source], method, tmp_path / f"got-{method}.parquet")
        want, got = (
            pq.read_table(tmp_path / f"want-{method}.parquet"),
            pq.read_table(tmp_path / f"got-{method}.parquet"),
        )
        for name in outputs_of(method):
            assert got[name].equals(want[name]), (method, name)
        assert got[C.GROUP_ID].to_pylist() == table[C.GROUP_ID].to_pylist()


def test_int96_timestamps_keep_their_time_zone(tmp_path, monkeypatch):
    """pyarrow reads an INT96 timestamp without the zone its stored schema records (polars
    keeps it): both outputs store the input's own Arrow schema and INT96 again, so every reader
    types the column as it typed the input's."""
    source = tmp_path / "int96.parquet"
    table = corpus_log()
    table = table.set_column(
        table.schema.get_field_index("logged_at"), "logged_at", table["logged_at"].cast(pa.timestamp("ns", "UTC"))
    )
    table = table.append_column("local_at", table["logged_at"].cast(pa.timestamp("ns", "Asia/Tokyo")))
    pq.write_table(table, source, use_deprecated_int96_timestamps=True, row_group_size=16)
    assert pq.read_schema(source).field("local_at").type == pa.timestamp("ns")  # pyarrow drops the zone
    assert pl.read_parquet(source).schema["local_at"] == pl.Datetime("ns", "Asia/Tokyo")  # polars keeps it
    first, plain = both_paths([source], tmp_path, monkeypatch, expect_splice=True)
    check_outputs(first, plain, [source])
    for out in (first, plain):
        assert stored_arrow_schema(str(out)).field("local_at").type == pa.timestamp("ns", "Asia/Tokyo")
        assert pl.read_parquet(out).schema["local_at"] == pl.Datetime("ns", "Asia/Tokyo")


def test_pandas_index_and_metadata_survive(tmp_path, monkeypatch):
    """pandas stores its index as a column plus a `pandas` metadata entry: both outputs keep
    every key/value entry of the input (gaca's added), so pandas gets its index back."""
    frame = corpus_log().select(["group_id", "traj_id", "step_idx", "reward", "done", "anchor_obs", "nll_mean"])
    frame = frame.to_pandas()
    frame.index = pd.Index(np.arange(100, 100 + len(frame)), name="row_id")
    source = tmp_path / "pandas.parquet"
    frame.to_parquet(source)
    first, plain = both_paths([source], tmp_path, monkeypatch, expect_splice=True)
    check_outputs(first, plain, [source])
    want = dict(pq.read_metadata(source).metadata)
    for out in (first, plain):
        meta = pq.read_metadata(out).metadata
        assert meta[b"pandas"] == want[b"pandas"]
        assert C.META_ADVANTAGES.encode() in meta
        back = pd.read_parquet(out)
        assert back.index.name == "row_id" and list(back.index) == list(frame.index)
        assert list(back.columns) == list(frame.columns) + outputs_of("gaca")
