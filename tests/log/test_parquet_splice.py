"""splice_columns: the spliced file must read back as concat(inputs).drop(drop) + new columns
(pyarrow and polars), with the carried chunks, statistics and page indexes preserved; its Thrift
codec must re-encode pyarrow's footers byte for byte; unsafe inputs raise SpliceUnsupported
before `dest` exists; the new columns use the documented encodings (one-value dictionary
columns written once per row-group length), whatever the number of encoder threads."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import numpy as np
import polars as pl
import polars.testing
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaca_cli.log._splice import SpliceUnsupported, splice_columns
from gaca_cli.log._splice import footer as pf
from gaca_cli.log._splice import thrift as th
from gaca_cli.log._splice import writer as sw

KV = {"gaca.version": "1", "gaca.note": "spliced"}
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
INFO = pa.struct([("a", pa.int64()), ("b", pa.string())])


def rich_table(n: int, seed: int = 0, start: int = 0) -> pa.Table:
    """Every column kind the logs carry: string/int ids, large_string text, nulls, list<float32>,
    struct, list<struct<role, content>>, tz-aware timestamps, field metadata."""
    rng = np.random.default_rng(seed)
    ids = np.arange(start, start + n)
    text = [None if i % 7 == 3 else f"obs {i} " + "lorem " * int(rng.integers(0, 5)) for i in ids]
    return pa.table(
        {
            "group_id": pa.array([f"g{i // 4}" for i in ids]),
            "traj_id": pa.array(ids // 2, pa.int64()),
            "step": pa.array(ids % 9, pa.int32()),
            "reward": pa.array(rng.normal(size=n), mask=ids % 5 == 0),
            "text": pa.array(text, pa.large_string()),
            "emb": pa.array([[float(i), -1.5] if i % 6 else None for i in ids], pa.list_(pa.float32())),
            "info": pa.array([{"a": int(i), "b": f"b{i % 3}"} for i in ids], INFO),
            "messages": pa.array([[{"role": "user", "content": f"c{i}"}] * (i % 3) for i in ids], pa.list_(MESSAGE)),
            "ts": pa.array(ids * 1_000_000, pa.timestamp("us", tz="Europe/Paris")),
        }
    ).replace_schema_metadata({"gaca.schema": "v1"})


def new_table(n: int, seed: int = 1) -> pa.Table:
    """The kind of columns `gaca advantages` adds (one with field metadata, one dictionary-worthy)."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "advantage": pa.array(rng.normal(size=n)),
            "method": pa.array(["gaca", "grpo"] * (n // 2) + ["gaca"] * (n % 2)),
            "weight": pa.array(np.where(np.arange(n) % 11 == 0, None, rng.random(n)), pa.float64()),
        }
    ).cast(
        pa.schema(
            [
                pa.field("advantage", pa.float64(), metadata={"unit": "reward"}),
                pa.field("method", pa.string()),
                pa.field("weight", pa.float64()),
            ]
        )
    )


def write(path, table: pa.Table, **kwargs) -> str:
    kwargs.setdefault("row_group_size", 40)
    kwargs.setdefault("compression", "zstd")
    kwargs.setdefault("use_dictionary", ["group_id", "text"])
    pq.write_table(table, path, **kwargs)
    return str(path)


def expected(files, drop, new: pa.Table) -> pa.Table:
    table = pa.concat_tables([pq.read_table(f) for f in files])
    table = table.drop_columns([name for name in drop if name in table.column_names])
    for field, column in zip(new.schema, new.columns, strict=True):
        table = table.append_column(field, column)
    return table


def check_splice(files, drop, new, dest, **kwargs) -> pq.FileMetaData:
    """Splice, then check values, schema (types and field metadata), polars, row groups, metadata."""
    splice_columns(files, drop, new, dest, KV, **kwargs)
    got, want = pq.read_table(dest), expected(files, drop, new)
    assert got.schema.remove_metadata().equals(want.schema.remove_metadata(), check_metadata=True)
    assert got.equals(want)
    polars.testing.assert_frame_equal(pl.read_parquet(dest), pl.from_arrow(want))
    meta = pq.read_metadata(dest)
    assert meta.num_row_groups == sum(pq.read_metadata(f).num_row_groups for f in files)
    assert set(meta.metadata) == {k.encode() for k in KV} | {b"ARROW:schema"}
    assert all(meta.metadata[k.encode()] == v.encode() for k, v in KV.items())
    assert pq.read_schema(dest).metadata == {k.encode(): v.encode() for k, v in KV.items()}
    assert sorted(os.listdir(os.path.dirname(dest))) == sorted({os.path.basename(f) for f in files} | {"out.parquet"})
    return meta


def chunk_bytes(path, column: pq.ColumnChunkMetaData) -> bytes:
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(column.total_compressed_size)


def footer_bytes(path) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[-8:-4], "little")
    return data[-8 - n : -8]


def rewrite_footer(path, mutate) -> None:
    """Rewrite a file's FileMetaData through the codec (to build files pyarrow would not write)."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[-8:-4], "little")
    meta = th.decode_struct(data[-8 - n : -8])
    mutate(meta)
    footer = th.encode_struct(meta)
    with open(path, "wb") as f:
        f.write(data[: -8 - n] + footer + len(footer).to_bytes(4, "little") + b"PAR1")


def first_chunk(meta: th.Struct) -> th.Struct:
    return meta.get(pf.FMD_ROW_GROUPS).items[0].get(pf.RG_COLUMNS).items[0]


# ------------------------------------------------------------------------------- Thrift codec


@pytest.mark.parametrize("n", [0, -1, 1, 63, -64, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)])
def test_zigzag_varint_round_trip_on_edge_values(n):
    z = th.zigzag(n)
    assert z >= 0 and th.unzigzag(z) == n
    data = th.encode_struct(th.Struct([[1, th.CT_I64, n]]))
    assert th.decode_struct(data) == th.Struct([[1, th.CT_I64, n]])
    assert len(data) == 2 + max(1, -(-z.bit_length() // 7))  # header + LEB128 bytes + STOP


def test_zigzag_and_varint_known_bytes():
    assert [th.zigzag(n) for n in (0, -1, 1, -2, 2**63 - 1, -(2**63))] == [0, 1, 2, 3, 2**64 - 2, 2**64 - 1]
    assert th.encode_struct(th.Struct([[1, th.CT_I32, 300]])) == bytes([0x15, 0xD8, 0x04, 0x00])
    assert th.encode_struct(th.Struct([[1, th.CT_I64, -(2**63)]])) == bytes([0x16]) + b"\xff" * 9 + b"\x01\x00"


def test_codec_round_trips_every_compact_type():
    """Short and long field headers, bool fields and bool list items, byte, double, binary,
    short and long lists, set, map, nested structs."""
    value = th.Struct(
        [
            [1, th.CT_TRUE, True],
            [2, th.CT_TRUE, False],
            [3, th.CT_BYTE, -7],
            [4, th.CT_I16, -300],
            [20, th.CT_DOUBLE, -0.25],  # delta 17: long form
            [21, th.CT_BINARY, b"\x00\xffabc"],
            [22, th.CT_LIST, th.TList(th.CT_I32, list(range(-20, 20)))],  # 40 items: long size
            [23, th.CT_LIST, th.TList(th.CT_TRUE, [True, False, True])],
            [24, th.CT_SET, th.TList(th.CT_BINARY, [b"a", b"b"])],
            [25, th.CT_MAP, th.TMap(th.CT_BINARY, th.CT_STRUCT, [(b"k", th.Struct([[7, th.CT_I64, 5]]))])],
            [26, th.CT_MAP, th.TMap(0, 0, [])],
            [5, th.CT_STRUCT, th.Struct()],  # decreasing id: long form
            [32767, th.CT_LIST, th.TList(th.CT_STRUCT, [th.Struct([[1, th.CT_TRUE, False]])] * 3)],
        ]
    )
    data = th.encode_struct(value)
    assert th.decode_struct(data) == value
    assert th.encode_struct(th.decode_struct(data)) == data
    with pytest.raises(ValueError):
        th.decode_struct(data + b"\x00")
    with pytest.raises(IndexError):
        th.decode_struct(data[:-3])


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"write_page_index": True},
        {"sorting_columns": [pq.SortingColumn(1)], "write_statistics": ["traj_id"]},
        {"bloom_filter_options": {"group_id": {"ndv": 50, "fpp": 0.05}}, "compression": "snappy"},
        {"use_dictionary": False, "data_page_version": "2.0", "row_group_size": 500},
    ],
    ids=["plain", "page_index", "sorting_stats", "bloom", "v2_pages"],
)
def test_codec_reencodes_pyarrow_footers_and_page_indexes_identically(tmp_path, kwargs):
    path = write(tmp_path / "in.parquet", rich_table(120), **kwargs)
    footer = footer_bytes(path)
    assert th.encode_struct(th.decode_struct(footer)) == footer
    meta, raw = pq.read_metadata(path), Path(path).read_bytes()
    for fid_offset, fid_length in [(4, 5), (6, 7)]:  # OffsetIndex, ColumnIndex (with list<bool>)
        for rg in th.decode_struct(footer).get(pf.FMD_ROW_GROUPS).items:
            for chunk in rg.get(pf.RG_COLUMNS).items:
                if chunk.get(fid_offset) is not None:
                    blob = raw[chunk.get(fid_offset) : chunk.get(fid_offset) + chunk.get(fid_length)]
                    assert th.encode_struct(th.decode_struct(blob)) == blob
    assert meta.num_rows == 120


# ------------------------------------------------------------------------------------- splice


@pytest.mark.parametrize(
    "drop",
    [(), ("group_id",), ("reward", "text"), ("ts",), ("messages", "group_id", "emb"), ("info", "absent")],
    ids=["none", "first", "middle", "last", "nested_and_first", "struct_and_unknown_name"],
)
def test_splice_equals_concat_drop_append(tmp_path, drop):
    files = [
        write(tmp_path / "a.parquet", rich_table(100, seed=1), row_group_size=30),
        write(tmp_path / "b.parquet", rich_table(57, seed=2, start=100), row_group_size=50),
        write(tmp_path / "c.parquet", rich_table(1, seed=3, start=157)),
    ]
    check_splice(files, drop, new_table(158), str(tmp_path / "out.parquet"))


def test_splice_one_file_several_row_groups_keeps_created_by_and_options(tmp_path):
    files = [write(tmp_path / "a.parquet", rich_table(200))]
    dest = str(tmp_path / "out.parquet")
    meta = check_splice(
        files, ["reward"], new_table(200), dest, dictionary_columns=["method"], statistics_columns=["advantage"]
    )
    assert meta.created_by == pq.read_metadata(files[0]).created_by
    assert meta.num_row_groups == 5
    n_kept = meta.num_columns - 3
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        advantage, method, weight = (rg.column(n_kept + k) for k in range(3))
        assert advantage.is_stats_set and not weight.is_stats_set
        assert "RLE_DICTIONARY" in method.encodings and "RLE_DICTIONARY" not in advantage.encodings
        assert rg.total_byte_size == sum(rg.column(j).total_uncompressed_size for j in range(rg.num_columns))
    for rg in th.decode_struct(footer_bytes(dest)).get(pf.FMD_ROW_GROUPS).items:
        sizes = [c.get(pf.CC_META_DATA).get(pf.CMD_TOTAL_COMPRESSED_SIZE) for c in rg.get(pf.RG_COLUMNS).items]
        assert rg.get(pf.RG_TOTAL_COMPRESSED_SIZE) == sum(sizes)


def test_copied_chunks_are_byte_identical_and_keep_statistics(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(150))
    dest = str(tmp_path / "out.parquet")
    out = check_splice([src], ["traj_id"], new_table(150), dest)
    inp = pq.read_metadata(src)
    for i in range(inp.num_row_groups):
        columns = [inp.row_group(i).column(j) for j in range(inp.num_columns)]
        kept = [column for column in columns if column.path_in_schema != "traj_id"]
        for k, before in enumerate(kept):
            after = out.row_group(i).column(k)
            assert after.path_in_schema == before.path_in_schema
            assert chunk_bytes(dest, after) == chunk_bytes(src, before)
            assert (after.statistics is None) == (before.statistics is None)
            if before.statistics is not None:
                assert after.statistics.to_dict() == before.statistics.to_dict()
            assert after.encodings == before.encodings and after.num_values == before.num_values


def test_page_index_is_carried_and_written_for_new_columns(tmp_path):
    files = [
        write(tmp_path / "a.parquet", rich_table(90), write_page_index=True, data_page_size=256),
        write(tmp_path / "b.parquet", rich_table(30, start=90), write_page_index=True, data_page_size=256),
    ]
    dest = str(tmp_path / "out.parquet")
    meta = check_splice(files, ["info"], new_table(120), dest)
    for i in range(meta.num_row_groups):
        for j in range(meta.num_columns):
            column = meta.row_group(i).column(j)
            assert column.has_offset_index, (i, column.path_in_schema)
            assert column.has_column_index or column.physical_type == "BOOLEAN", (i, column.path_in_schema)
    want = expected(files, ["info"], new_table(120)).filter(pa.compute.field("traj_id") >= 40)
    got = pq.read_table(dest, filters=[("traj_id", ">=", 40)])
    assert got.equals(want)
    read_back = pq.ParquetFile(dest, page_checksum_verification=False)
    assert read_back.read_row_group(2).num_rows == meta.row_group(2).num_rows


def test_offset_index_points_at_the_moved_pages(tmp_path):
    """Each OffsetIndex's first page location is the chunk's first data page, in the output."""
    src = write(tmp_path / "a.parquet", rich_table(100), write_page_index=True, data_page_size=128)
    dest = str(tmp_path / "out.parquet")
    check_splice([src], ["group_id", "step"], new_table(100), dest)
    raw = Path(dest).read_bytes()
    meta = th.decode_struct(footer_bytes(dest))
    for rg in meta.get(pf.FMD_ROW_GROUPS).items:
        for chunk in rg.get(pf.RG_COLUMNS).items:
            start, length = chunk.get(pf.CC_OFFSET_INDEX_OFFSET), chunk.get(pf.CC_OFFSET_INDEX_LENGTH)
            locations = th.decode_struct(raw[start : start + length]).get(pf.OI_PAGE_LOCATIONS).items
            first_page = chunk.get(pf.CC_META_DATA).get(pf.CMD_DATA_PAGE_OFFSET)
            assert locations[0].get(pf.PL_OFFSET) == first_page


def column_indexes(path) -> list[list[bytes | None]]:
    """The raw ColumnIndex bytes of each row group's chunks (None where a chunk has none)."""
    raw, groups = Path(path).read_bytes(), []
    for rg in th.decode_struct(footer_bytes(path)).get(pf.FMD_ROW_GROUPS).items:
        chunks = rg.get(pf.RG_COLUMNS).items
        spans = [(c.get(pf.CC_COLUMN_INDEX_OFFSET), c.get(pf.CC_COLUMN_INDEX_LENGTH)) for c in chunks]
        groups.append([None if start is None else raw[start : start + n] for start, n in spans])
    return groups


def test_column_indexes_are_copied_verbatim(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(100), write_page_index=True, data_page_size=128)
    dest = str(tmp_path / "out.parquet")
    check_splice([src], ["traj_id"], new_table(100), dest)  # traj_id is leaf 1
    for before, after in zip(column_indexes(src), column_indexes(dest), strict=True):
        kept = before[:1] + before[2:]
        assert None not in kept and after[: len(kept)] == kept
        assert None not in after[len(kept) :]


def test_bloom_filters_are_copied(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(80), bloom_filter_options={"text": {"ndv": 100, "fpp": 0.05}})
    dest = str(tmp_path / "out.parquet")
    out = check_splice([src], ["group_id"], new_table(80), dest)
    inp = pq.read_metadata(src)
    for i in range(inp.num_row_groups):
        before, after = inp.row_group(i).column(4), out.row_group(i).column(3)
        assert after.path_in_schema == "text" and after.bloom_filter_length == before.bloom_filter_length > 0
        raw_in, raw_out = Path(src).read_bytes(), Path(dest).read_bytes()
        assert (
            raw_out[after.bloom_filter_offset : after.bloom_filter_offset + after.bloom_filter_length]
            == raw_in[before.bloom_filter_offset : before.bloom_filter_offset + before.bloom_filter_length]
        )


@pytest.mark.parametrize(("drop", "want"), [(["group_id"], [2]), (["traj_id"], [])])
def test_sorting_columns_are_remapped_or_left_out(tmp_path, drop, want):
    table = rich_table(100)
    sorting = [pq.SortingColumn(1), pq.SortingColumn(3, descending=True)]
    src = write(tmp_path / "a.parquet", table, sorting_columns=sorting)
    dest = str(tmp_path / "out.parquet")
    meta = check_splice([src], drop, new_table(100), dest)
    for i in range(meta.num_row_groups):
        got = meta.row_group(i).sorting_columns
        assert [s.column_index for s in got] == ([0, 2] if want else [])
        if want:
            assert [s.descending for s in got] == [False, True]


def test_key_value_metadata_arrow_schema_is_replaced(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(10))
    dest = str(tmp_path / "out.parquet")
    splice_columns([src], [], new_table(10), dest, {"ARROW:schema": "bogus", "k": "v"})
    assert set(pq.read_metadata(dest).metadata) == {b"k", b"ARROW:schema"}
    assert pq.read_schema(dest).names[-3:] == ["advantage", "method", "weight"]


# ----------------------------------------------------------------------------- refusals


def _refuse(files, new, dest, drop=(), match=""):
    with pytest.raises(SpliceUnsupported, match=match):
        splice_columns(files, drop, new, dest, KV)
    assert not os.path.exists(dest)
    assert sorted(os.listdir(os.path.dirname(dest))) == sorted(os.path.basename(f) for f in files)


def test_refuses_row_count_mismatch(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(20))
    _refuse([src], new_table(19), str(tmp_path / "out.parquet"), match="rows")


def test_refuses_name_clash(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(20))
    clash = new_table(20).append_column("reward", pa.array(np.zeros(20)))
    _refuse([src], clash, str(tmp_path / "out.parquet"), match="clash")
    # the clash disappears when the old column is dropped
    splice_columns([src], ["reward"], clash, tmp_path / "ok.parquet", KV)


@pytest.mark.parametrize("change", ["parquet_type", "arrow_type", "field_metadata", "created_by"])
def test_refuses_files_that_differ(tmp_path, change):
    a = write(tmp_path / "a.parquet", rich_table(20))
    other = rich_table(20)
    if change == "parquet_type":
        other = other.set_column(2, "step", other["step"].cast(pa.int64()))
    elif change == "arrow_type":  # same Parquet schema (BYTE_ARRAY String), different Arrow type
        other = other.set_column(4, "text", other["text"].cast(pa.string()))
    elif change == "field_metadata":
        other = other.cast(other.schema.set(1, other.schema.field(1).with_metadata({"x": "y"})))
    b = write(tmp_path / "b.parquet", other)
    if change == "created_by":
        rewrite_footer(b, lambda m: m.set(pf.FMD_CREATED_BY, th.CT_BINARY, b"parquet-mr version 1.2.0"))
    _refuse([a, b], new_table(40), str(tmp_path / "out.parquet"), match="differ")


def test_refuses_empty_row_group(tmp_path):
    table = rich_table(20)
    path = str(tmp_path / "a.parquet")
    with pq.ParquetWriter(path, table.schema) as writer:
        writer.write_table(table)
        writer.write_table(table.slice(0, 0))
    assert pq.read_metadata(path).num_row_groups == 2
    _refuse([path], new_table(20), str(tmp_path / "out.parquet"), match="0 rows")


def test_refuses_files_that_are_not_parquet(tmp_path):
    text = tmp_path / "a.parquet"
    text.write_text("step,reward\n1,0.5\n")
    _refuse([str(text)], new_table(1), str(tmp_path / "out.parquet"), match="not a Parquet file")
    missing = str(tmp_path / "missing.parquet")
    with pytest.raises(SpliceUnsupported):
        splice_columns([missing], [], new_table(1), tmp_path / "out.parquet", KV)


def test_refuses_encrypted_magic(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(20))
    data = Path(src).read_bytes()
    with open(src, "wb") as f:
        f.write(data[:-4] + b"PARE")
    _refuse([src], new_table(20), str(tmp_path / "out.parquet"), match="encrypted")


def _set_chunk(fid, ctype, value):
    return lambda meta: first_chunk(meta).set(fid, ctype, value)


def _set_chunk_meta(fid, ctype, value):
    return lambda meta: first_chunk(meta).get(pf.CC_META_DATA).set(fid, ctype, value)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda m: m.set(pf.FMD_ENCRYPTION_ALGORITHM, th.CT_STRUCT, th.Struct()), "encrypted"),
        (lambda m: m.set(pf.FMD_FOOTER_SIGNING_KEY, th.CT_BINARY, b"key"), "encrypted"),
        (_set_chunk(pf.CC_FILE_PATH, th.CT_BINARY, b"other.parquet"), "elsewhere"),
        (_set_chunk(pf.CC_CRYPTO_METADATA, th.CT_STRUCT, th.Struct()), "encrypted"),
        (_set_chunk(pf.CC_ENCRYPTED_COLUMN_METADATA, th.CT_BINARY, b"x"), "encrypted"),
        (lambda m: first_chunk(m).pop(pf.CC_META_DATA), "without meta_data"),
        (_set_chunk_meta(pf.CMD_TOTAL_COMPRESSED_SIZE, th.CT_I64, 10**9), "outside"),
        (_set_chunk_meta(pf.CMD_DATA_PAGE_OFFSET, th.CT_I64, 2), "outside"),
        (_set_chunk_meta(pf.CMD_BLOOM_FILTER_OFFSET, th.CT_I64, 4), "bloom filter"),
        (_set_chunk(pf.CC_OFFSET_INDEX_OFFSET, th.CT_I64, 10**9), "page index"),
        (_set_chunk(pf.CC_COLUMN_INDEX_LENGTH, th.CT_I32, 10), "page index"),
        (lambda m: m.get(pf.FMD_ROW_GROUPS).items[0].get(pf.RG_COLUMNS).items.pop(), "column count"),
        (lambda m: m.get(pf.FMD_SCHEMA).items[0].set(pf.SE_NUM_CHILDREN, th.CT_I32, 3), "schema"),
        (lambda m: m.get(pf.FMD_ROW_GROUPS).items[0].set(pf.RG_COLUMNS, th.CT_I32, 1), "unreadable|column count"),
    ],
    ids=[
        "encryption_algorithm",
        "footer_signing_key",
        "file_path",
        "crypto_metadata",
        "encrypted_column_metadata",
        "no_meta_data",
        "chunk_past_footer",
        "chunk_before_data",
        "bloom_without_length",
        "offset_index_outside",
        "column_index_length_only",
        "missing_chunk",
        "schema_tree",
        "malformed_columns",
    ],
)
def test_refuses_unsafe_footers(tmp_path, mutate, match):
    src = write(tmp_path / "a.parquet", rich_table(50))
    rewrite_footer(src, mutate)
    _refuse([src], new_table(50), str(tmp_path / "out.parquet"), match=match)


def test_new_columns_without_rows_or_columns(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(20))
    _refuse([src], pa.table({}), str(tmp_path / "out.parquet"), match="nothing")
    with pytest.raises(SpliceUnsupported, match="nothing"):
        splice_columns([], [], new_table(0), tmp_path / "out.parquet", KV)
    assert not (tmp_path / "out.parquet").exists()


def test_polars_reads_spliced_tz_timestamps(tmp_path):
    """Polars sees the same tz-aware timestamps and lists as pyarrow (values, not just dtypes)."""
    src = write(tmp_path / "a.parquet", rich_table(30))
    dest = str(tmp_path / "out.parquet")
    check_splice([src], ["text"], new_table(30), dest)
    df = pl.read_parquet(dest)
    assert df["ts"].dtype == pl.Datetime("us", "Europe/Paris")
    assert df["ts"][1] == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc)


def test_splice_of_a_polars_written_file(tmp_path):
    """Logs written by polars (large types, its own created_by) splice the same way."""
    src = str(tmp_path / "a.parquet")
    pl.from_arrow(rich_table(120)).write_parquet(src, row_group_size=50, compression="zstd")
    assert pq.read_metadata(src).created_by.startswith("Polars")
    footer = footer_bytes(src)
    assert th.encode_struct(th.decode_struct(footer)) == footer
    check_splice([src], ["emb"], new_table(120), str(tmp_path / "out.parquet"))


def test_temporary_file_is_removed_when_the_new_columns_fail(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(20))
    dest = str(tmp_path / "out.parquet")
    with pytest.raises((ValueError, pa.ArrowException)):
        splice_columns([src], [], new_table(20), dest, KV, compression="no-such-codec")
    assert sorted(os.listdir(tmp_path)) == ["a.parquet"]


# -------------------------------------------------------------------- new-column encodings


def advantages_like(n: int, seed: int = 4, method: str = "gaca") -> pa.Table:
    """The columns `gaca advantages` appends: floats, int64 ids and sizes, a one-value string."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "advantage": rng.normal(size=n),
            "step_group_id": np.arange(n, dtype=np.int64) // 3,
            "step_group_size": rng.integers(1, 5, n),
            "adv_method": pa.array([method] * n),
        }
    )


def schema_elements(path) -> list[bytes]:
    """The encoded SchemaElements of a file, in order."""
    return [th.encode_struct(e) for e in th.decode_struct(footer_bytes(path)).get(pf.FMD_SCHEMA).items]


def test_new_columns_use_the_documented_encodings(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(120))
    dest = str(tmp_path / "out.parquet")
    meta = check_splice([src], [], advantages_like(120), dest, dictionary_columns=["adv_method"])
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        advantage, group_id, group_size, method = (rg.column(rg.num_columns - 4 + k) for k in range(4))
        assert advantage.compression == "SNAPPY" and "PLAIN" in advantage.encodings
        assert "RLE_DICTIONARY" not in advantage.encodings
        for column in (group_id, group_size):
            assert column.compression == "UNCOMPRESSED" and "DELTA_BINARY_PACKED" in column.encodings
        assert method.compression == "SNAPPY" and "RLE_DICTIONARY" in method.encodings
        for column in (advantage, group_id, group_size, method):
            assert column.is_stats_set and column.statistics.null_count == 0
        assert (method.statistics.min, method.statistics.max) == ("gaca", "gaca")
    # the output's schema elements are those pyarrow writes for the same table
    plain = str(tmp_path / "plain.parquet")
    pq.write_table(expected([src], [], advantages_like(120)), plain)
    assert schema_elements(dest) == schema_elements(plain)
    os.remove(plain)


def test_a_compression_name_applies_to_every_new_column(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(60))
    dest = str(tmp_path / "out.parquet")
    meta = check_splice([src], [], advantages_like(60), dest, compression="zstd", dictionary_columns=["adv_method"])
    rg = meta.row_group(0)
    assert {rg.column(rg.num_columns - 1 - k).compression for k in range(4)} == {"ZSTD"}


def test_one_value_column_chunk_is_encoded_once_per_row_group_length(tmp_path):
    """100 rows in row groups of 30: three equal chunks for the one-value column, then one of 10."""
    src = write(tmp_path / "a.parquet", rich_table(100), row_group_size=30, write_page_index=True)
    dest = str(tmp_path / "out.parquet")
    meta = check_splice([src], ["text"], advantages_like(100), dest, dictionary_columns=["adv_method"])
    chunks = [chunk_bytes(dest, meta.row_group(i).column(meta.num_columns - 1)) for i in range(4)]
    assert chunks[0] == chunks[1] == chunks[2] != chunks[3]
    for i in range(4):
        column = meta.row_group(i).column(meta.num_columns - 1)
        assert column.has_offset_index and column.has_column_index
    got = pq.read_table(dest, filters=[("traj_id", ">=", 20)], columns=["traj_id", "adv_method"])
    assert got.column("adv_method").to_pylist() == ["gaca"] * got.num_rows > []
    assert got.schema.field("adv_method").type == pa.string()


@pytest.mark.parametrize(
    "values",
    [
        pa.array(["gaca"] * 30 + ["grpo"] * 60),  # two values in the first row group, one in the others
        pa.array([""] * 90),
        pa.array(["ab", "ab"] * 45, pa.large_string()),
        pa.array([b"\x00\xff"] * 90, pa.binary()),
        pa.array(["x"] * 89 + [None]),
        pa.chunked_array([pa.array(["same"] * 35), pa.array(["same"] * 55)]),
    ],
    ids=["mixed", "empty_string", "large_string", "binary", "null", "chunked"],
)
def test_dictionary_columns_of_one_or_more_values(tmp_path, values):
    src = write(tmp_path / "a.parquet", rich_table(90), row_group_size=40)
    new = pa.table({"advantage": np.linspace(0, 1, 90), "adv_method": values})
    dest = str(tmp_path / "out.parquet")
    meta = check_splice([src], [], new, dest, dictionary_columns=["adv_method"])
    for i in range(meta.num_row_groups):
        assert "RLE_DICTIONARY" in meta.row_group(i).column(meta.num_columns - 1).encodings
    assert pq.read_schema(dest).field("adv_method").type == new.schema.field("adv_method").type


@pytest.mark.parametrize(
    ("values", "want"),
    [
        (pa.array(["gaca"] * 5), b"gaca"),
        (pa.array(["gaca"] * 5).slice(2), b"gaca"),
        (pa.array(["a", "gaca", "gaca"]).slice(1), b"gaca"),
        (pa.chunked_array([pa.array(["ab"]), pa.array([], pa.string()), pa.array(["ab", "ab"])]), b"ab"),
        (pa.array(["", ""]), b""),
        (pa.array([b"\x01"] * 3, pa.large_binary()), b"\x01"),
        (pa.array(["aa", "a", "a"]), None),  # the same bytes, cut in other places
        (pa.array(["ab", "ba"]), None),
        (pa.array(["ab", "abab"]), None),
        (pa.array(["a", None]), None),
        (pa.array([], pa.string()), None),
        (pa.array([1, 1]), None),
        (pa.chunked_array([pa.array(["a"]), pa.array(["b"])]), None),
    ],
)
def test_one_value_reads_the_offsets_and_data(values, want):
    column = values if isinstance(values, pa.ChunkedArray) else pa.chunked_array([values])
    assert sw._one_value(column) == want


def test_nested_and_temporal_new_columns(tmp_path):
    """New columns with several leaves (list, struct) and timestamps keep their order and values."""
    n = 70
    new = pa.table(
        {
            "weights": pa.array(
                [[float(i), None] if i % 4 else None for i in range(n)], pa.list_(pa.field("element", pa.float64()))
            ),
            "detail": pa.array([{"a": i, "b": f"b{i % 2}"} for i in range(n)], INFO),
            "at": pa.array(np.arange(n) * 1000, pa.timestamp("ms", tz="UTC")),
            "method": pa.array(["gaca"] * n),
        }
    )
    files = [write(tmp_path / "a.parquet", rich_table(40)), write(tmp_path / "b.parquet", rich_table(30, start=40))]
    check_splice(files, ["emb"], new, str(tmp_path / "out.parquet"), dictionary_columns=["method"])


@pytest.mark.parametrize("workers", [1, 3])
def test_many_row_groups_in_flight(tmp_path, monkeypatch, workers):
    monkeypatch.setattr(sw, "_workers", lambda: workers)
    src = write(tmp_path / "a.parquet", rich_table(230), row_group_size=10, write_page_index=True)
    meta = check_splice([src], ["info"], advantages_like(230), str(tmp_path / "out.parquet"))
    assert meta.num_row_groups == 23


def test_a_failure_while_writing_removes_the_output(tmp_path, monkeypatch):
    src = write(tmp_path / "a.parquet", rich_table(200))
    dest = str(tmp_path / "out.parquet")
    calls = []

    def failing_copy(*args):
        calls.append(args)
        if len(calls) == 12:  # in the second row group
            raise OSError("disk full")
        return original(*args)

    original = sw._copy
    monkeypatch.setattr(sw, "_copy", failing_copy)
    with pytest.raises(OSError, match="disk full"):
        splice_columns([src], [], advantages_like(200), dest, KV)
    assert sorted(os.listdir(tmp_path)) == ["a.parquet"]


def test_field_ids_of_new_columns_are_kept(tmp_path):
    """A PARQUET:field_id on a new column (the one-value dictionary one too) reaches its SchemaElement."""
    src = write(tmp_path / "a.parquet", rich_table(50))
    new = advantages_like(50)
    new = new.cast(pa.schema([f.with_metadata({"PARQUET:field_id": str(10 + i)}) for i, f in enumerate(new.schema)]))
    dest = str(tmp_path / "out.parquet")
    check_splice([src], [], new, dest, dictionary_columns=["adv_method"])
    parquet_schema = str(pq.ParquetFile(dest).schema)
    for i, name in enumerate(new.column_names):
        assert f"field_id={10 + i} {name}" in parquet_schema


# ------------------------------------------------------------------- the input's Arrow schema


def stored_schema(path) -> pa.Schema:
    return pf.arrow_schema(pf.read_footer(str(path)))


def test_carried_columns_keep_the_stored_arrow_schema(tmp_path):
    """An INT96 timestamp with a time zone: pyarrow reads it without the zone, polars with it
    (from ARROW:schema). The spliced file stores the input's own schema, so polars still sees
    the zone and pyarrow reads what it read from the input."""
    table = rich_table(60)
    table = table.set_column(
        table.schema.get_field_index("ts"), "ts", table["ts"].cast(pa.timestamp("ns", "Asia/Tokyo"))
    )
    src = write(tmp_path / "a.parquet", table, use_deprecated_int96_timestamps=True)
    assert pq.read_schema(src).field("ts").type == pa.timestamp("ns")  # pyarrow's reading drops the zone
    dest = str(tmp_path / "out.parquet")
    splice_columns([src], ["text"], new_table(60), dest, KV)
    assert pq.read_table(dest).equals(expected([src], ["text"], new_table(60)))  # pyarrow: as from the input
    assert stored_schema(dest).field("ts").type == pa.timestamp("ns", "Asia/Tokyo")
    assert stored_schema(dest).names == [n for n in table.column_names if n != "text"] + new_table(1).column_names
    carried = pl.read_parquet(dest).drop(new_table(1).column_names)
    polars.testing.assert_frame_equal(carried, pl.read_parquet(src).drop("text"))  # polars: the zone kept
    assert carried.schema["ts"] == pl.Datetime("ns", "Asia/Tokyo")


def test_a_file_without_a_stored_schema_is_spliced_with_pyarrows_reading(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(50), store_schema=False)
    assert b"ARROW:schema" not in (pq.read_metadata(src).metadata or {})
    assert stored_schema(src).equals(pq.read_schema(src).remove_metadata())
    check_splice([src], [], new_table(50), str(tmp_path / "out.parquet"))


def test_a_stored_schema_that_names_other_columns_is_not_used(tmp_path):
    """A stored ARROW:schema that does not match the Parquet columns is ignored (as pyarrow
    ignores it): pyarrow's reading of the Parquet schema is used."""
    src = write(tmp_path / "a.parquet", rich_table(30))
    other = pq.read_metadata(write(tmp_path / "other.parquet", pa.table({"x": [1]}))).metadata[b"ARROW:schema"]

    def swap_schema(meta):
        for kv in meta.get(pf.FMD_KEY_VALUE_METADATA).items:
            if kv.get(pf.KV_KEY) == b"ARROW:schema":
                kv.set(pf.KV_VALUE, th.CT_BINARY, other)

    rewrite_footer(src, swap_schema)
    assert stored_schema(src).names == rich_table(1).column_names
    os.remove(tmp_path / "other.parquet")
    splice_columns([src], [], new_table(30), tmp_path / "out.parquet", KV)
    assert pq.read_table(tmp_path / "out.parquet").select(rich_table(1).column_names).equals(pq.read_table(src))


def test_refuses_an_unreadable_stored_schema(tmp_path):
    src = write(tmp_path / "a.parquet", rich_table(20))

    def garble(meta):
        for kv in meta.get(pf.FMD_KEY_VALUE_METADATA).items:
            if kv.get(pf.KV_KEY) == b"ARROW:schema":
                kv.set(pf.KV_VALUE, th.CT_BINARY, b"bm90IGFuIElQQyBtZXNzYWdl")  # base64 of 'not an IPC message'

    rewrite_footer(src, garble)
    _refuse([src], new_table(20), str(tmp_path / "out.parquet"), match="ARROW:schema")


def test_codec_reencodes_a_duckdb_footer_identically(tmp_path):
    import duckdb

    src = str(tmp_path / "a.parquet")
    con = duckdb.connect()
    con.register("t", rich_table(80).drop_columns(["ts"]))
    con.execute(f"COPY (SELECT * FROM t) TO '{src}' (FORMAT parquet, COMPRESSION zstd)")
    con.close()
    assert pq.read_metadata(src).created_by.startswith("DuckDB")
    footer = footer_bytes(src)
    assert th.encode_struct(th.decode_struct(footer)) == footer
    check_splice([src], ["emb"], new_table(80), str(tmp_path / "out.parquet"))
