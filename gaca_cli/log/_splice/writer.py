"""Write a Parquet file whose carried columns are copied byte for byte from the input files.

`gaca advantages` keeps every input column and appends a few numeric ones. Re-encoding and
re-compressing the carried text is the slow part of writing, so `splice_columns` copies the
inputs' compressed column chunks unchanged (os.copy_file_range), encodes only the new columns
and writes the footer itself (footer.py, thrift.py). Inputs it cannot splice safely raise
`SpliceUnsupported` before `dest` is created; the caller then writes the table the ordinary way.

The new columns are encoded by pyarrow, one row group at a time, into an in-memory Parquet
file per row group (worker threads, one per CPU up to 4, a few row groups ahead), whose chunk
bytes are written straight to their final place in `dest` while the next row groups encode:
no temporary file, each byte written once. Encodings of the new columns (`compression=None`):

    float and other types   PLAIN + snappy       zstd makes them ~20% smaller for ~2x the CPU;
                                                 snappy gives up at once on incompressible data
    integer, timestamp      DELTA_BINARY_PACKED  ids and small counts pack well; a codec on top
                            uncompressed         buys little
    dictionary_columns      dictionary + snappy  a slice holding one value (adv_method) is written
                                                 as a one-entry dictionary, once per row-group
                                                 length, and its chunk reused

(zstd would make the 10M-row output 9 % smaller for twice the CPU: docs/performance.md;
`compression="zstd"` applies it to every new column.) Statistics (`statistics_columns`) and,
when any input has one, the page index are written for the new columns as pyarrow writes them.

The carried columns keep the Arrow schema their input stored (footer.arrow_schema), so every
reader types them as it typed the input's.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gaca_cli.log._splice.footer import (
    CC_COLUMN_INDEX_LENGTH,
    CC_COLUMN_INDEX_OFFSET,
    CC_FILE_OFFSET,
    CC_META_DATA,
    CC_OFFSET_INDEX_LENGTH,
    CC_OFFSET_INDEX_OFFSET,
    CMD_BLOOM_FILTER_LENGTH,
    CMD_BLOOM_FILTER_OFFSET,
    CMD_DATA_PAGE_OFFSET,
    CMD_DICTIONARY_PAGE_OFFSET,
    CMD_INDEX_PAGE_OFFSET,
    CMD_PATH_IN_SCHEMA,
    CMD_TOTAL_UNCOMPRESSED_SIZE,
    FMD_COLUMN_ORDERS,
    FMD_CREATED_BY,
    FMD_KEY_VALUE_METADATA,
    FMD_NUM_ROWS,
    FMD_ROW_GROUPS,
    FMD_SCHEMA,
    FMD_VERSION,
    KV_KEY,
    KV_VALUE,
    MAGIC,
    OI_PAGE_LOCATIONS,
    PL_OFFSET,
    RG_COLUMNS,
    RG_FILE_OFFSET,
    RG_NUM_ROWS,
    RG_ORDINAL,
    RG_SORTING_COLUMNS,
    RG_TOTAL_BYTE_SIZE,
    RG_TOTAL_COMPRESSED_SIZE,
    SC_COLUMN_IDX,
    SE_NUM_CHILDREN,
    Chunk,
    Footer,
    SpliceUnsupported,
    arrow_schema,
    chunk_piece,
    encode_field,
    memory_footer,
    read_footer,
    top_level_fields,
)
from gaca_cli.log._splice.thrift import (
    CT_BINARY,
    CT_I16,
    CT_I32,
    CT_I64,
    CT_LIST,
    CT_STRUCT,
    DECODE_ERRORS,
    Struct,
    TList,
    encode_struct,
)

_BLOCK = 16 << 20  # buffered-copy block size, when os.copy_file_range is unavailable


def splice_columns(
    files: Sequence[str | os.PathLike],
    drop: Collection[str],
    new_columns: pa.Table,
    dest: str | os.PathLike,
    key_value_metadata: Mapping[str, str],
    *,
    compression: str | None = None,
    dictionary_columns: Collection[str] = (),
    statistics_columns: Collection[str] | None = None,
) -> None:
    """Write `dest` = the concatenated `files` minus the `drop` columns, plus `new_columns`.

    The kept column chunks are copied byte for byte (no decoding); only `new_columns` is encoded,
    one row group per input row group with the same row counts (`compression` None: the
    module's choice per column, see the module docstring; a codec name: that codec for every
    new column). Raises SpliceUnsupported, before `dest` exists, when the inputs cannot be
    spliced safely; `dest` is removed again when it was created and the write fails. A `drop`
    name that no file has is ignored; an `ARROW:schema` key in `key_value_metadata` is
    replaced by the output's schema.
    """
    paths = [os.fspath(f) for f in files]
    if not paths or new_columns.num_columns == 0:
        raise SpliceUnsupported("nothing to splice (no input file or no new column)")
    inputs = [read_footer(p) for p in paths]
    top, arrow_in = _check_same_files(inputs)
    kept = [name not in drop for name, _, _ in top]
    _check_new_columns(new_columns, [name for (name, _, _), k in zip(top, kept, strict=True) if k], inputs)
    leaf_map, plan = _plan(inputs, top, kept)
    counts = [rg.get(RG_NUM_ROWS) for rg, _ in plan]
    page_index = any(p.offset_index is not None for _, pieces in plan for p in pieces)
    arrow_schema = pa.schema([f for f in arrow_in if f.name not in drop] + list(new_columns.schema))
    encoder = _NewColumns(new_columns, compression, dictionary_columns, statistics_columns, page_index)
    starts = [0, *itertools.accumulate(counts)]  # the first row of each row group
    workers = _workers()
    with ThreadPoolExecutor(max_workers=workers) as pool:  # pyarrow encodes without the GIL
        pending: deque[Future[_Encoded]] = deque()

        def encoded_row_groups():
            """Each row group's new chunks, in order, keeping `2 * workers` row groups in flight."""
            ahead, schema = 0, None
            for i in range(len(counts)):
                while ahead < len(counts) and ahead < i + 2 * workers:
                    pending.append(pool.submit(encoder.encode, starts[ahead], counts[ahead]))
                    ahead += 1
                encoded = pending.popleft().result()
                if schema is None:
                    schema = encode_field(encoded.meta, FMD_SCHEMA)
                elif encode_field(encoded.meta, FMD_SCHEMA) != schema:
                    raise SpliceUnsupported("pyarrow wrote the new columns with another schema in one row group")
                yield encoded

        try:
            row_groups = encoded_row_groups()
            first = next(row_groups)  # encoding errors surface before `dest` is created
            meta = _output_metadata(inputs[0].meta, [first.meta], top, kept, leaf_map, sum(counts))
            _set_key_value_metadata(meta, key_value_metadata, arrow_schema)
            _write(os.fspath(dest), plan, meta, itertools.chain([first], row_groups))
        finally:
            for future in pending:
                future.cancel()


def _workers() -> int:
    """Encoder threads: the CPUs this process may use (at least 1, at most 4)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 4))


@dataclass
class _Encoded:
    """One row group's new columns encoded in memory: the little file's FileMetaData and its chunks."""

    meta: Struct
    pieces: list[Chunk]


class _NewColumns:
    """Encodes row-group slices of the new columns into in-memory Parquet files (thread-safe).

    Encodings (see the module docstring): floats PLAIN + snappy; integers DELTA_BINARY_PACKED,
    uncompressed; `dictionary_columns` dictionary-encoded + snappy; other types pyarrow's
    default encoding + snappy. A `compression` name replaces every codec. A dictionary column
    whose slice holds one value and no null (checked without hashing) is written apart, as a
    one-entry dictionary, and its chunk is reused by every row group of the same length.
    """

    def __init__(self, table, compression, dictionary_columns, statistics_columns, page_index):
        self.table = table.replace_schema_metadata(None)
        self.schema = self.table.schema
        self.dictionary = [n for n in table.column_names if n in set(dictionary_columns)]
        self.codecs, self.encodings = {}, {}
        for f in self.schema:
            if f.name not in self.dictionary and (pa.types.is_integer(f.type) or pa.types.is_timestamp(f.type)):
                self.codecs[f.name], self.encodings[f.name] = "none", "DELTA_BINARY_PACKED"
            else:
                self.codecs[f.name] = "snappy"
        self.compression = compression
        self.statistics = None if statistics_columns is None else set(statistics_columns)
        self.page_index = page_index
        self.constant_chunks: dict[tuple, pa.Buffer] = {}
        self.lock = threading.Lock()

    def encode(self, start: int, n: int) -> _Encoded:
        """The new columns' rows [start, start + n) as one row group."""
        table = self.table.slice(start, n)
        values = {name: _one_value(table.column(name)) for name in self.dictionary}
        constants = {name: value for name, value in values.items() if value is not None}
        files = []
        if len(constants) < table.num_columns:
            files.append(memory_footer(self._write(table.drop_columns(list(constants)))))
        for name, value in constants.items():
            key = (name, value, n)
            with self.lock:
                if key not in self.constant_chunks:
                    field = self.schema.field(name)  # its metadata too (a PARQUET:field_id)
                    column = pa.DictionaryArray.from_arrays(
                        pa.array(np.zeros(n, dtype=np.int32)), pa.array([value], field.type)
                    )
                    self.constant_chunks[key] = self._write(
                        pa.table([column], schema=pa.schema([field.with_type(column.type)]))
                    )
            files.append(memory_footer(self.constant_chunks[key]))  # fresh Structs: they get moved
        return _combine(files, n, self.schema.names)

    def _write(self, table: pa.Table) -> pa.Buffer:
        """`table` (some of the new columns) as an in-memory Parquet file of one row group."""
        names = table.column_names
        stats = True if self.statistics is None else ([n for n in names if n in self.statistics] or False)
        encodings = {n: e for n, e in self.encodings.items() if n in names}
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(
            sink,
            table.schema,
            compression={n: self.codecs[n] for n in names} if self.compression is None else self.compression,
            use_dictionary=[n for n in names if n in self.dictionary] or False,
            column_encoding=encodings or None,
            write_statistics=stats,
            write_page_index=self.page_index,
        ) as writer:
            writer.write_table(table, row_group_size=max(table.num_rows, 1))
        return sink.getvalue()


def _combine(files: list[Footer], n: int, names: list[str]) -> _Encoded:
    """One row group's new chunks, from the little files that hold them, in the order of
    `names`, with a FileMetaData holding their schema elements and column orders in that order."""
    elements: dict[str, list[Struct]] = {}
    orders: dict[str, list[Struct] | None] = {}
    pieces: dict[str, list[Chunk]] = {}
    for inp in files:
        row_groups = inp.meta.get(FMD_ROW_GROUPS).items
        if len(row_groups) != 1 or row_groups[0].get(RG_NUM_ROWS) != n:
            raise SpliceUnsupported("pyarrow did not write the new columns as one row group")
        schema = inp.meta.get(FMD_SCHEMA).items
        file_orders = inp.meta.get(FMD_COLUMN_ORDERS)
        chunks = iter(row_groups[0].get(RG_COLUMNS).items)
        i = leaf = 1
        for name, n_elements, leaves in top_level_fields(schema):
            elements[name] = schema[i : i + n_elements]
            orders[name] = None if file_orders is None else file_orders.items[leaf - 1 : leaf - 1 + leaves]
            pieces[name] = [_memory_piece(inp, next(chunks)) for _ in range(leaves)]
            i, leaf = i + n_elements, leaf + leaves
    root = Struct([list(entry) for entry in files[0].meta.get(FMD_SCHEMA).items[0].fields])
    root.set(SE_NUM_CHILDREN, CT_I32, len(names))
    meta = Struct([[FMD_SCHEMA, CT_LIST, TList(CT_STRUCT, [root] + [e for n in names for e in elements[n]])]])
    kept_orders = [orders[n] for n in names]
    if all(o is not None for o in kept_orders):
        meta.set(FMD_COLUMN_ORDERS, CT_LIST, TList(CT_STRUCT, [x for o in kept_orders for x in o or ()]))
    return _Encoded(meta, [p for n in names for p in pieces[n]])


def _memory_piece(inp: Footer, chunk: Struct) -> Chunk:
    """A chunk of an in-memory file, with its bytes and those of its bloom filter and column index."""
    p = chunk_piece(inp, chunk)
    assert inp.data is not None, "an in-memory file holds its bytes"
    p.data = inp.data[p.start : p.start + p.length]
    md, spans = chunk.get(CC_META_DATA), []
    if md.get(CMD_BLOOM_FILTER_OFFSET) is not None:
        spans.append((md.get(CMD_BLOOM_FILTER_OFFSET), md.get(CMD_BLOOM_FILTER_LENGTH)))
    if chunk.get(CC_COLUMN_INDEX_OFFSET) is not None:
        spans.append((chunk.get(CC_COLUMN_INDEX_OFFSET), chunk.get(CC_COLUMN_INDEX_LENGTH)))
    p.extras = {offset: bytes(inp.data[offset : offset + length]) for offset, length in spans}
    return p


def _one_value(column: pa.ChunkedArray) -> bytes | None:
    """The value of a string or binary column that holds one value and no null, else None;
    read from the offsets and data buffers (no hashing, no per-row Python)."""
    kind = column.type
    large = pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)
    if not (large or pa.types.is_string(kind) or pa.types.is_binary(kind)) or len(column) == 0 or column.null_count:
        return None
    value, width = None, np.dtype(np.int64 if large else np.int32)
    for chunk in column.chunks:
        if len(chunk) == 0:
            continue
        _, offsets_buffer, data_buffer = chunk.buffers()
        offsets = np.frombuffer(offsets_buffer, width, len(chunk) + 1, chunk.offset * width.itemsize)
        length = int(offsets[1] - offsets[0])
        data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
        first = data[offsets[0] : offsets[0] + length].tobytes()
        value = first if value is None else value
        if first != value or np.any(np.diff(offsets) != length):
            return None
        data = data[offsets[0] : offsets[-1]]
        if length and not np.array_equal(data[length:], data[:-length]):  # period `length`: all equal `first`
            return None
    return value


def _plan(inputs: list[Footer], top: list, kept: list[bool]) -> tuple[dict, list]:
    """The map input leaf index -> output leaf index, and each input row group with its kept
    chunks (validated)."""
    leaf_owner = [i for i, (_, _, leaves) in enumerate(top) for _ in range(leaves)]
    kept_leaves = [leaf for leaf, owner in enumerate(leaf_owner) if kept[owner]]
    leaf_map = {leaf: i for i, leaf in enumerate(kept_leaves)}
    plan = []
    try:
        for inp in inputs:
            row_groups = inp.meta.get(FMD_ROW_GROUPS).items
            if sum(rg.get(RG_NUM_ROWS) for rg in row_groups) != inp.meta.get(FMD_NUM_ROWS):
                raise SpliceUnsupported(f"{inp.path}: row groups do not add up to the file's num_rows")
            plan += [(rg, _kept_pieces(inp, rg, top, leaf_owner, leaf_map)) for rg in row_groups]
    except DECODE_ERRORS as exc:
        raise SpliceUnsupported(f"malformed Parquet footer ({exc!r})") from None
    return leaf_map, plan


def _check_same_files(inputs: list[Footer]) -> tuple[list[tuple[str, int, int]], pa.Schema]:
    """The inputs' top-level fields and Arrow schema (footer.arrow_schema); refuse files whose
    Parquet or Arrow schemas, format version or writer differ (the copied chunks are read under
    the first file's created_by)."""
    first = inputs[0]
    for inp in inputs[1:]:
        for fid in (FMD_SCHEMA, FMD_VERSION, FMD_CREATED_BY):
            if encode_field(inp.meta, fid) != encode_field(first.meta, fid):
                raise SpliceUnsupported(f"{first.path} and {inp.path}: Parquet schema, version or created_by differ")
    try:
        top = top_level_fields(first.meta.get(FMD_SCHEMA).items)
    except DECODE_ERRORS as exc:
        raise SpliceUnsupported(f"{first.path}: malformed Parquet schema ({exc})") from None
    arrow = [arrow_schema(inp) for inp in inputs]
    for inp, schema in zip(inputs[1:], arrow[1:]):
        if not schema.equals(arrow[0], check_metadata=True):
            raise SpliceUnsupported(f"{first.path} and {inp.path}: the files' Arrow schemas differ")
    return top, arrow[0]


def _check_new_columns(new_columns: pa.Table, kept_names: list[str], inputs: list[Footer]) -> None:
    """Refuse a row-count mismatch or a name clash between kept and new columns."""
    num_rows = sum(inp.meta.get(FMD_NUM_ROWS, -1) for inp in inputs)
    if new_columns.num_rows != num_rows:
        raise SpliceUnsupported(f"new columns have {new_columns.num_rows} rows, the files {num_rows}")
    names = kept_names + new_columns.column_names
    if len(set(names)) != len(names):
        raise SpliceUnsupported("a new column's name clashes with another column")


def _kept_pieces(inp: Footer, rg: Struct, top: list, leaf_owner: list[int], leaf_map: dict) -> list[Chunk]:
    """Validate one input row group; return its kept chunks. Remaps sorting_columns in place."""
    columns = rg.get(RG_COLUMNS)
    num_rows = rg.get(RG_NUM_ROWS)
    if not isinstance(columns, TList) or len(columns.items) != len(leaf_owner):
        raise SpliceUnsupported(f"{inp.path}: a row group's column count does not match the schema")
    if not isinstance(num_rows, int) or num_rows <= 0:
        raise SpliceUnsupported(f"{inp.path}: row group with {num_rows} rows")
    for leaf, chunk in enumerate(columns.items):
        md = chunk.get(CC_META_DATA)
        path = md.get(CMD_PATH_IN_SCHEMA) if isinstance(md, Struct) else None
        if not isinstance(path, TList) or path.items[:1] != [top[leaf_owner[leaf]][0].encode()]:
            raise SpliceUnsupported(f"{inp.path}: column chunk {leaf} without meta_data or not in the schema")
    pieces = [chunk_piece(inp, chunk) for leaf, chunk in enumerate(columns.items) if leaf in leaf_map]
    sorting = rg.get(RG_SORTING_COLUMNS)
    if sorting is not None:
        if all(s.get(SC_COLUMN_IDX) in leaf_map for s in sorting.items):
            for s in sorting.items:
                s.set(SC_COLUMN_IDX, CT_I32, leaf_map[s.get(SC_COLUMN_IDX)])
        else:
            rg.pop(RG_SORTING_COLUMNS)
    return pieces


def _arrow_schema_bytes(schema: pa.Schema) -> bytes:
    """The ARROW:schema value pyarrow stores for `schema` (taken from an empty file's footer)."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    return pq.read_metadata(pa.BufferReader(sink.getvalue())).metadata[b"ARROW:schema"]


def _output_metadata(
    meta: Struct, new_metas: list[Struct], top: list, kept: list, leaf_map: dict, num_rows: int
) -> Struct:
    """The output FileMetaData, row groups left to `_write`: the input's fields (version,
    created_by, unknown ones) with schema, num_rows and column_orders replaced; the new
    columns' schema elements and column orders come from `new_metas`, in order."""
    schema, i = meta.get(FMD_SCHEMA).items, 1
    root = Struct([list(entry) for entry in schema[0].fields])
    elements = [root]
    for (_, n_elements, _), keep in zip(top, kept, strict=True):
        elements += schema[i : i + n_elements] if keep else []
        i += n_elements
    n_children = sum(kept)
    for new_meta in new_metas:
        new_schema = new_meta.get(FMD_SCHEMA).items
        elements += new_schema[1:]
        n_children += new_schema[0].get(SE_NUM_CHILDREN, 0)
    root.set(SE_NUM_CHILDREN, CT_I32, n_children)
    out = Struct([list(entry) for entry in meta.fields])
    out.set(FMD_SCHEMA, CT_LIST, TList(CT_STRUCT, elements))
    out.set(FMD_NUM_ROWS, CT_I64, num_rows)
    orders = meta.get(FMD_COLUMN_ORDERS)
    if orders is not None:
        new_orders = [new_meta.get(FMD_COLUMN_ORDERS) for new_meta in new_metas]
        if any(o is None for o in new_orders) or len(orders.items) != sum(n for _, _, n in top):
            raise SpliceUnsupported("column_orders missing or not one per leaf column")
        kept_orders = [order for leaf, order in enumerate(orders.items) if leaf in leaf_map]
        out.set(FMD_COLUMN_ORDERS, CT_LIST, TList(CT_STRUCT, kept_orders + [x for o in new_orders for x in o.items]))
    return out


def _set_key_value_metadata(meta: Struct, key_value_metadata: Mapping[str, str], arrow_schema: pa.Schema) -> None:
    """Exactly the caller's keys, then ARROW:schema. Like pq.write_table, the Arrow schema
    carries the same keys as its schema-level metadata: readers take it from there."""
    pairs = {k.encode(): v.encode() for k, v in key_value_metadata.items() if k != "ARROW:schema"}
    pairs[b"ARROW:schema"] = _arrow_schema_bytes(arrow_schema.with_metadata(dict(pairs)))
    items = [Struct([[KV_KEY, CT_BINARY, k], [KV_VALUE, CT_BINARY, v]]) for k, v in pairs.items()]
    meta.set(FMD_KEY_VALUE_METADATA, CT_LIST, TList(CT_STRUCT, items))


def _write(dest: str, plan: list[tuple[Struct, list[Chunk]]], meta: Struct, new: Iterator[_Encoded]) -> None:
    """Write the file: magic, chunks row group by row group (the input's kept chunks, then the
    new ones from memory), page indexes, footer. Removes `dest` on failure when it created it."""
    sources: dict[str, int] = {}
    created = not os.path.exists(dest)
    # no O_TRUNC on the (usually empty, freshly made) file: on ext4, truncating to zero marks
    # the file for a forced block allocation of everything written when it is closed (~0.3 s
    # for 500 MB); a file that has content is truncated explicitly
    out = os.open(dest, os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        if os.fstat(out).st_size:
            os.ftruncate(out, 0)
        for path in {p.path for _, pieces in plan for p in pieces}:
            sources[path] = os.open(path, os.O_RDONLY)
        pos = _pwrite_all(out, MAGIC, 0)
        for ordinal, ((rg, pieces), encoded) in enumerate(zip(plan, new, strict=True)):
            rg_start = pos
            for p in pieces + encoded.pieces:
                if p.data is None:  # an input's chunk
                    _copy(sources[p.path], out, p.start, p.length, pos)
                else:  # a new chunk, written once from memory
                    _pwrite_all(out, p.data, pos)
                    p.data = None  # lets the row group's buffer go
                p.delta = pos - p.start
                _shift_chunk(p.chunk, p.delta)
                pos += p.length
            pieces += encoded.pieces
            _finish_row_group(rg, pieces, ordinal, rg_start)
        pos = _write_indexes(out, sources, [p for _, pieces in plan for p in pieces], pos)
        meta.set(FMD_ROW_GROUPS, CT_LIST, TList(CT_STRUCT, [rg for rg, _ in plan]))
        footer = encode_struct(meta)
        _pwrite_all(out, footer + len(footer).to_bytes(4, "little") + MAGIC, pos)
    except BaseException:
        os.close(out)
        out = -1  # closed
        if created:
            os.unlink(dest)
        raise
    finally:
        for fd in [out, *sources.values()]:
            if fd >= 0:
                os.close(fd)


def _shift_chunk(chunk: Struct, delta: int) -> None:
    """Move a ColumnChunk's page offsets by `delta` (0 or absent offsets mean 'none': kept)."""
    md = chunk.get(CC_META_DATA)
    page_offsets = (CMD_DATA_PAGE_OFFSET, CMD_INDEX_PAGE_OFFSET, CMD_DICTIONARY_PAGE_OFFSET)
    for owner, fid in [(chunk, CC_FILE_OFFSET)] + [(md, fid) for fid in page_offsets]:
        value = owner.get(fid)
        if isinstance(value, int) and value > 0:
            owner.set(fid, CT_I64, value + delta)


def _finish_row_group(rg: Struct, pieces: list[Chunk], ordinal: int, file_offset: int) -> None:
    """Point a RowGroup at its copied chunks and recompute its sizes."""
    mds = [p.chunk.get(CC_META_DATA) for p in pieces]
    rg.set(RG_COLUMNS, CT_LIST, TList(CT_STRUCT, [p.chunk for p in pieces]))
    rg.set(RG_TOTAL_BYTE_SIZE, CT_I64, sum(md.get(CMD_TOTAL_UNCOMPRESSED_SIZE, 0) for md in mds))
    rg.set(RG_FILE_OFFSET, CT_I64, file_offset)
    rg.set(RG_TOTAL_COMPRESSED_SIZE, CT_I64, sum(p.length for p in pieces))
    if ordinal < 2**15:
        rg.set(RG_ORDINAL, CT_I16, ordinal)
    else:
        rg.pop(RG_ORDINAL)


def _write_indexes(out: int, sources: dict[str, int], pieces: list[Chunk], pos: int) -> int:
    """Copy bloom filters and column indexes, rewrite offset indexes (page offsets moved by the
    chunk's delta), point the chunks at the new places; return the next free position."""
    for p in pieces:
        md = p.chunk.get(CC_META_DATA)
        if md.get(CMD_BLOOM_FILTER_OFFSET) is not None:
            length = md.get(CMD_BLOOM_FILTER_LENGTH)
            _copy_range(p, sources, out, md.get(CMD_BLOOM_FILTER_OFFSET), length, pos)
            md.set(CMD_BLOOM_FILTER_OFFSET, CT_I64, pos)
            pos += length
    for p in pieces:
        if p.chunk.get(CC_COLUMN_INDEX_OFFSET) is not None:
            length = p.chunk.get(CC_COLUMN_INDEX_LENGTH)
            _copy_range(p, sources, out, p.chunk.get(CC_COLUMN_INDEX_OFFSET), length, pos)
            p.chunk.set(CC_COLUMN_INDEX_OFFSET, CT_I64, pos)
            pos += length
    for p in pieces:
        if p.offset_index is not None:
            for location in p.offset_index.get(OI_PAGE_LOCATIONS).items:
                location.set(PL_OFFSET, CT_I64, location.get(PL_OFFSET) + p.delta)
            data = encode_struct(p.offset_index)
            p.chunk.set(CC_OFFSET_INDEX_OFFSET, CT_I64, pos)
            p.chunk.set(CC_OFFSET_INDEX_LENGTH, CT_I32, len(data))
            pos += _pwrite_all(out, data, pos)
    return pos


def _copy_range(p: Chunk, sources: dict[str, int], out: int, offset: int, length: int, pos: int) -> None:
    """Copy a bloom filter or column index of `p` to `pos` of `out`: from its file, or from the
    bytes kept when it was encoded in memory."""
    if p.extras is not None:
        _pwrite_all(out, p.extras[offset], pos)
    else:
        _copy(sources[p.path], out, offset, length, pos)


def _copy(src: int, dst: int, offset: int, length: int, dst_offset: int) -> None:
    """Copy `length` bytes at `offset` of file descriptor `src` to `dst_offset` of `dst`, in the
    kernel (os.copy_file_range) when it can, else through a buffer."""
    fast = hasattr(os, "copy_file_range")
    while length > 0:
        n = 0
        if fast:
            try:
                n = os.copy_file_range(src, dst, length, offset, dst_offset)
            except OSError:
                fast = False
        if not n:
            block = os.pread(src, min(length, _BLOCK), offset)
            if not block:
                raise OSError(f"unexpected end of file at byte {offset}")
            n = _pwrite_all(dst, block, dst_offset)
        offset, dst_offset, length = offset + n, dst_offset + n, length - n


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> int:
    """Write all of `data` at `offset`; return its length."""
    view, done = memoryview(data), 0
    while done < len(data):
        done += os.pwrite(fd, view[done:], offset + done)
    return len(data)
