"""Reading logs (files, globs, directories, hive partitions) and writing Parquet atomically."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import glob
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pyarrow.dataset as ds
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from gaca_cli.errors import GacaError
from gaca_cli.log import decoding

_GLOB_CHARS = set("*?[")


def _read_parquet(path: str, columns=None, read_dictionary=None) -> pa.Table:
    """One Parquet file as a table: `pq.ParquetFile.read`, which reads the same table as
    `pq.read_table` without loading pyarrow.dataset (and with it pandas, ~0.2 s of start-up).
    Page checksums are verified where the file has them (`open_parquet`), and dictionary
    columns are checked for indices outside their dictionary, which pyarrow does not check
    when it keeps a file's dictionary pages."""
    with open_parquet(path, read_dictionary=read_dictionary) as f:
        table = f.read(columns=columns)
        expected = f.metadata.num_rows
    if table.num_rows != expected:  # a damaged page header can make a lone column read short
        raise pa.ArrowInvalid(f"read {table.num_rows} rows of {expected}")
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_dictionary(column.type):
            try:
                for chunk in column.chunks:
                    chunk.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise GacaError(f"not a readable Parquet file ({_first_line(exc)})", file=path, column=name) from None
    return table


def open_parquet(path: str, **options) -> pq.ParquetFile:
    """`pq.ParquetFile` that verifies the CRC of every page that has one (pyarrow's
    `write_page_checksum=True`, parquet-mr's page CRCs): a damaged page is an error, not
    different values. Files without checksums cost nothing more."""
    return pq.ParquetFile(path, page_checksum_verification=True, **options)


#: what pyarrow raises on a damaged or unreadable Parquet file
READ_ERRORS = (pa.ArrowInvalid, pa.ArrowIOError, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError)


def damaged_column(path: str, columns: Sequence[str]) -> str | None:
    """The first of `columns` (names in the file) that pyarrow cannot read from `path`, row
    group by row group (page checksums verified); None when every one reads. Used where a
    read failed, to name the column in the message."""
    with open_parquet(path) as f:
        in_file = set(f.schema_arrow.names)
        for name in [c for c in columns if c in in_file]:
            try:
                for g in range(f.num_row_groups):
                    if f.read_row_group(g, columns=[name]).num_rows != f.metadata.row_group(g).num_rows:
                        return name  # a damaged page header can make a lone column read short
            except READ_ERRORS:
                return name
    return None


def unreadable(path: str, exc: BaseException, columns: Sequence[str] | None = None) -> GacaError:
    """The error for a file pyarrow could not read: the file, the damaged column when one of
    `columns` (default: all of the file's) is found to be the culprit, and pyarrow's reason."""
    try:
        names = list(columns) if columns is not None else pq.read_schema(path).names
        column = damaged_column(path, names)
    except READ_ERRORS:  # the footer itself is damaged: no column to name
        column = None
    return GacaError(f"not a readable Parquet file ({_first_line(exc)})", file=path, column=column)


@dataclass(frozen=True)
class Log:
    """A trajectory log in memory, with the names the user's files gave its columns mapped
    to the canonical ones (`--map NEW=OLD`)."""

    table: pa.Table
    files: tuple[str, ...]
    file_row_ends: np.ndarray  # int64 [n_files], cumulative row count after each file
    metadata: dict[str, str] = field(default_factory=dict)  # the inputs' gaca.* key/value metadata
    renamed: dict[str, str] = field(default_factory=dict)  # canonical name -> name in the file
    schema: pa.Schema | None = None  # every column of the files (canonical names), also those not read
    plain_files: bool = False  # every input is a Parquet file (no directory, no partitions)
    partial: bool = False  # only some columns were read
    cache: dict = field(default_factory=dict, compare=False, repr=False)  # values derived from the table

    def null_count(self, column: str) -> int | None:
        """Nulls in a column of the files, from their footers' statistics without reading it;
        None when a file or row group does not record it (or the log is a directory)."""
        if not self.plain_files:
            return None
        name = self.original_name(column)
        total = 0
        for path in self.files:
            count = statistics_null_count(path, name)
            if count is None:
                return None
            total += count
        return total

    def files_lacking(self, column: str) -> list[str]:
        """The files of the log whose footer has no such column (its rows read as nulls);
        empty when no file has it either (a column missing from the whole log)."""
        name = self.original_name(column)
        lacking = []
        for path in self.files:
            try:
                if name not in pq.read_schema(path).names:
                    lacking.append(path)
            except READ_ERRORS:
                continue  # a file that cannot be read is reported where it is read
        return lacking if len(lacking) < len(self.files) else []

    def null_rows(self, column: str) -> np.ndarray:
        """int64 row indices (in log order) where a column of the files is null, read one row
        group at a time, so memory stays bounded by a row group however large the column (a
        chat history, say); a file without the column is null in every row."""
        name = self.original_name(column)
        found: list[np.ndarray] = []
        offset = 0
        for path in self.files:
            with open_parquet(path) as f:
                rows = f.metadata.num_rows
                if name not in f.schema_arrow.names:
                    found.append(np.arange(offset, offset + rows, dtype=np.int64))
                else:
                    start = offset
                    for g in range(f.num_row_groups):
                        try:
                            part = f.read_row_group(g, columns=[name]).column(0)
                        except READ_ERRORS as exc:
                            raise GacaError(
                                f"not a readable Parquet file ({_first_line(exc)})", file=path, column=name
                            ) from None
                        if part.length() != f.metadata.row_group(g).num_rows:
                            raise GacaError(
                                f"not a readable Parquet file (read {part.length()} rows of "
                                f"{f.metadata.row_group(g).num_rows} in row group {g})",
                                file=path,
                                column=name,
                            )
                        if part.null_count:
                            found.append(start + np.flatnonzero(part.is_null().to_numpy(zero_copy_only=False)))
                        start += part.length()
            offset += rows
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def read_column(self, column: str) -> pa.ChunkedArray:
        """One column of the log, in row order, read on its own (nulls for files without it)."""
        name = self.original_name(column)
        want = self.file_schema.field(column).type
        chunks = []
        for path in self.files:
            schema = pq.read_schema(path)
            if name in schema.names:
                try:
                    chunks += _read_parquet(path, columns=[name]).column(0).chunks
                except READ_ERRORS as exc:
                    raise GacaError(
                        f"not a readable Parquet file ({_first_line(exc)})", file=path, column=name
                    ) from None
            else:
                chunks.append(pa.nulls(pq.read_metadata(path).num_rows, want))
        if any(chunk.type != want for chunk in chunks):  # files differing in text width: the unified type
            chunks = [chunk.cast(want) for chunk in chunks]
        return pa.chunked_array(chunks, type=chunks[0].type if chunks else None)

    def with_columns(self, columns: Sequence[str], via_polars: Sequence[str] = ()) -> Log:
        """The same log with more of its files' columns read into `table` (canonical names;
        plain files only; `via_polars` as in `read_log`)."""
        assert self.plain_files, "only a log of plain Parquet files can read more columns"
        names = [self.original_name(c) for c in columns]
        fast = [self.original_name(c) for c in via_polars]
        extra = _concat([_read_file(path, names, (), fast) for path in self.files], self.source)
        if extra.num_rows != self.table.num_rows:
            raise GacaError("the input changed while it was being read; run again", file=self.source)
        table = self.table
        for column, name in zip(columns, names):
            if name in extra.column_names:
                table = table.append_column(column, extra.column(name))
        return dataclasses.replace(self, table=_typed_nulls(table), cache={})

    def cached(self, key: object, make: Callable[[], object]) -> object:
        """`make()`, computed once per log (e.g. a column converted for polars)."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    @property
    def file_schema(self) -> pa.Schema:
        """The columns of the files, including any that were not read into `table`."""
        return self.table.schema if self.schema is None else self.schema

    @property
    def source(self) -> str:
        """How messages name the input: the file, or the list of files."""
        return self.files[0] if len(self.files) == 1 else f"{len(self.files)} files ({self.files[0]}, …)"

    def files_of_rows(self, rows: np.ndarray) -> str:
        """The file(s) holding the given original row indices, for error messages."""
        if len(self.files) == 1 or len(rows) == 0:
            return self.source
        idx = np.searchsorted(self.file_row_ends, np.asarray(rows), side="right")
        names = list(dict.fromkeys(self.files[i] for i in idx))
        return ", ".join(names)

    def original_name(self, column: str) -> str:
        return self.renamed.get(column, column)


def statistics_null_count(path: str, name: str) -> int | None:
    """Nulls in the top-level column `name` of one file, from its footer's statistics (all
    its rows when the file lacks the column); None when a row group does not record it or
    the column is nested (its leaves' counts are not the column's nulls)."""
    meta = pq.read_metadata(path)
    if name not in meta.schema.to_arrow_schema().names:
        return meta.num_rows  # missing in this file: null in all its rows
    leaves = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == name]
    if len(leaves) != 1:
        return None
    total = 0
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(leaves[0]).statistics
        if stats is None or not stats.has_null_count:
            return None
        total += stats.null_count
    return total


def expand_inputs(paths: Sequence[str | os.PathLike]) -> list[tuple[str, bool]]:
    """Resolve the LOG arguments to (path, is_directory) pairs, globs expanded and sorted."""
    resolved: list[tuple[str, bool]] = []
    for raw in paths:
        text = str(raw)
        if any(ch in _GLOB_CHARS for ch in text) and not os.path.exists(text):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise GacaError("no file matches this pattern", file=text)
            resolved.extend((m, os.path.isdir(m)) for m in matches)
        elif os.path.isdir(text):
            resolved.append((text, True))
        elif os.path.exists(text):
            resolved.append((text, False))
        else:
            raise GacaError("no such file or directory", file=text)
    return resolved


def _is_plain_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _read_file(
    path: str, columns: Sequence[str] | None, dictionary: Sequence[str] = (), via_polars: Sequence[str] = ()
) -> pa.Table:
    """One Parquet file, or the given columns of it (missing ones are skipped), read by
    pyarrow with page checksums verified (`open_parquet`).

    Text columns named in `dictionary` come back dictionary-encoded: pyarrow keeps the file's
    own dictionary pages, so no string is copied (ids with few distinct values); a column
    stored with DELTA_LENGTH_BYTE_ARRAY or DELTA_BYTE_ARRAY pages, which pyarrow cannot read
    into a dictionary, is read plain and dictionary-encoded after. Text columns named in
    `via_polars` are for polars code and come back as large_string, which `pl.from_arrow`
    takes in about 0.03 s per million rows. (Polars' own reader is no faster on such columns
    and does not verify what it reads: on a damaged page it can panic or abort the process.)"""
    names = None
    try:
        if columns is None and not dictionary and not via_polars:
            return _read_parquet(path)
        schema = pq.read_schema(path)
        names = schema.names if columns is None else [c for c in schema.names if c in set(columns)]
        dict_cols = [c for c in dictionary if c in names and _is_plain_text(schema.field(c).type)]
        encode_after = _delta_encoded(path, dict_cols)
        read_dictionary = [c for c in dict_cols if c not in encode_after] or None
        table = _read_parquet(path, columns=names, read_dictionary=read_dictionary)
    except READ_ERRORS as exc:  # a column pyarrow cannot decode: polars reads it, or one error
        table = decoding.read_failed(path, exc, names)
        encode_after = [c for c in dictionary if c in table.column_names and _is_plain_text(table.schema.field(c).type)]
    for name in encode_after:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, pc.dictionary_encode(table.column(i)))
    for name in via_polars:
        i = table.schema.get_field_index(name)
        if i >= 0 and pa.types.is_string(table.schema.field(i).type):
            table = table.set_column(
                i, table.schema.field(i).with_type(pa.large_string()), table.column(i).cast(pa.large_string())
            )
    return table


_DELTA_TEXT_ENCODINGS = {"DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY"}


def _delta_encoded(path: str, names: Sequence[str]) -> list[str]:
    """Those of the top-level columns `names` that have a chunk with DELTA_LENGTH_BYTE_ARRAY or
    DELTA_BYTE_ARRAY pages (from the footer: no data is read)."""
    if not names:
        return []
    meta = pq.read_metadata(path)
    leaf_of = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
    found = []
    for name in names:
        j = leaf_of.get(name)
        if j is not None and any(
            _DELTA_TEXT_ENCODINGS.intersection(meta.row_group(g).column(j).encodings)
            for g in range(meta.num_row_groups)
        ):
            found.append(name)
    return found


def _polars_reads(t: pa.DataType) -> bool:
    """Types polars' Parquet reader knows (it parses all of a file's types, even of columns it
    does not read); anything else (list views, unions, run-end encoding, extensions) is left
    to pyarrow."""
    if isinstance(t, pa.ExtensionType):
        return False
    if pa.types.is_dictionary(t):
        return _polars_reads(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _polars_reads(t.value_type)
    if pa.types.is_map(t):
        return _polars_reads(t.key_type) and _polars_reads(t.item_type)
    if pa.types.is_struct(t):
        return all(_polars_reads(t.field(i).type) for i in range(t.num_fields))
    return any(
        check(t)
        for check in (
            pa.types.is_null,
            pa.types.is_boolean,
            pa.types.is_integer,
            pa.types.is_floating,
            pa.types.is_decimal,
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_string_view,
            pa.types.is_binary,
            pa.types.is_large_binary,
            pa.types.is_binary_view,
            pa.types.is_fixed_size_binary,
            pa.types.is_date,
            pa.types.is_timestamp,
            pa.types.is_time,
            pa.types.is_duration,
        )
    )


def _verifying_format() -> ds.ParquetFileFormat:
    """pyarrow.dataset's Parquet format, verifying page checksums as `open_parquet` does."""
    import pyarrow.dataset as ds

    options = ds.ParquetFragmentScanOptions(page_checksum_verification=True)
    return ds.ParquetFileFormat(default_fragment_scan_options=options)


def _dataset(path: str) -> ds.Dataset:
    import pyarrow.dataset as ds  # imported on use: only directories need it (it loads pandas where installed)

    """A directory of Parquet files (hive partitions allowed) whose schema is every file's
    columns together (pyarrow would take the first file's alone), text widths unified
    (`_text_width_types`), then the partition keys the files do not hold. A key the files
    also hold as a column (polars' `write_parquet(partition_by=...)` keeps it) takes the
    files' type, and its values are read from the files."""
    try:
        options = ds.FileSystemFactoryOptions(
            partition_base_dir=os.path.abspath(path), exclude_invalid_files=False, selector_ignore_prefixes=[".", "_"]
        )
        options.partitioning_factory = ds.HivePartitioning.discover()
        selector = pafs.FileSelector(os.path.abspath(path), recursive=True)
        factory = ds.FileSystemDatasetFactory(pafs.LocalFileSystem(), selector, _verifying_format(), options)
        keys = factory.inspect_schemas()[-1]  # the first file's schema, then the partition keys'
        files = factory.finish(keys)  # no schema merged yet: each file's is read below
        fragments = list(files.get_fragments())
        decoding.refuse_encrypted([frag.path for frag in fragments])
        schemas = [frag.physical_schema.remove_metadata() for frag in fragments]
    except READ_ERRORS as exc:
        raise GacaError(f"not a readable Parquet dataset ({_first_line(exc)})", file=path) from None
    for frag, frag_schema in zip(fragments, schemas):
        _unique_names(frag_schema.names, frag.path)
    try:
        schema = pa.unify_schemas(_with_text_widths(schemas) or [pa.schema([])], promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise GacaError(f"the files' schemas do not agree ({_first_line(exc)})", file=path) from None
    in_files = [key.name for key in keys if key.name in schema.names]
    schema = pa.schema(list(schema) + [key for key in keys if key.name not in schema.names])
    try:
        return ds.dataset(
            path, schema=schema, format=_verifying_format(), partitioning="hive", exclude_invalid_files=False
        )
    except READ_ERRORS as exc:  # a key value of another type
        column = in_files[0] if len(in_files) == 1 else None
        raise GacaError(f"not a readable Parquet dataset ({_first_line(exc)})", file=path, column=column) from None


def _read_directory(path: str, columns: Sequence[str] | None) -> list[tuple[str, pa.Table]]:
    dataset = _dataset(path)
    cols = None if columns is None else [c for c in columns if c in dataset.schema.names]
    parts = []
    for frag in dataset.get_fragments():
        try:
            parts.append((frag.path, frag.to_table(schema=dataset.schema, columns=cols)))
        except READ_ERRORS as exc:
            raise unreadable(frag.path, exc, cols) from None
    if not parts:
        raise GacaError("directory holds no Parquet file", file=path)
    return parts


def _concat(tables: list[pa.Table], source: str) -> pa.Table:
    """The files' tables one after the other, columns a file lacks as nulls, text widths
    unified (`_text_width_types`); any other type clash is one GacaError naming `source`."""
    targets = _text_width_types([t.schema for t in tables])
    if targets:
        tables = [_cast_columns(t, targets) for t in tables]
    try:
        return pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise GacaError(f"the files' schemas do not agree ({_first_line(exc)})", file=source) from None


def widest_type(t: pa.DataType) -> pa.DataType:
    """`t` with its text, binary and list types at their widest (string and string_view ->
    large_string, binary and binary_view -> large_binary, list -> large_list), also inside
    lists, structs and maps, and dictionaries decoded (a pandas categorical or a column read
    as a dictionary in one file is plain text in another). List views are left as they are:
    pyarrow 26 casts a list view to a list wrongly where its offsets do not increase."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.large_binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(widest_type(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(widest_type(t.value_type)), t.list_size)
    if pa.types.is_map(t):
        key, item = t.key_field, t.item_field
        return pa.map_(key.with_type(widest_type(key.type)), item.with_type(widest_type(item.type)), t.keys_sorted)
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(widest_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_dictionary(t):
        return widest_type(t.value_type)
    return t


def _unique_names(names: Sequence[str], path: str) -> None:
    """A file with two columns of the same name cannot be read by name: one clear error."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise GacaError("the file has two columns of this name; give each its own", file=path, column=name)
        seen.add(name)


def _text_width_types(schemas: Sequence[pa.Schema]) -> dict[str, pa.DataType]:
    """For each column whose type differs between `schemas` only in a width or an encoding:
    of its text, binary or list offsets (string in a file from pyarrow, large_string in one from
    polars), a dictionary in one file and not in another (pandas categoricals),
    or of its integers (int32 and int64 step indices: int64) or floats (float32 and float64:
    float64), the type every file's column is read as: the wide one, as polars, duckdb and
    pyarrow's permissive promotion unify them. Null-typed columns are left to the default
    promotion; any other difference (an integer in one file, a float or text in another) is
    not unified (the caller reports it)."""
    seen: dict[str, set[pa.DataType]] = {}
    for schema in schemas:
        for f in schema:
            if not pa.types.is_null(f.type):
                seen.setdefault(f.name, set()).add(f.type)
    targets = {}
    for name, types in seen.items():
        if len(types) < 2:
            continue
        wide = {widest_type(t) for t in types}
        if len(wide) == 1:
            targets[name] = wide.pop()
        elif all(pa.types.is_integer(t) for t in types) and pa.uint64() not in types:
            targets[name] = pa.int64()  # every value of the narrower ones fits
        elif all(pa.types.is_floating(t) for t in types):
            targets[name] = pa.float64()
    return targets


def _with_text_widths(schemas: list[pa.Schema]) -> list[pa.Schema]:
    """`schemas` with the columns `_text_width_types` unifies given their wide type."""
    targets = _text_width_types(schemas)
    out = []
    for schema in schemas:
        for i, f in enumerate(schema):
            if f.name in targets and not pa.types.is_null(f.type):
                schema = schema.set(i, f.with_type(targets[f.name]))
        out.append(schema)
    return out


def _cast_columns(table: pa.Table, targets: Mapping[str, pa.DataType]) -> pa.Table:
    """`table` with the columns named in `targets` cast to their type (null columns left alone)."""
    for i, f in enumerate(table.schema):
        want = targets.get(f.name)
        if want is not None and f.type != want and not pa.types.is_null(f.type):
            table = table.set_column(i, f.with_type(want), table.column(i).cast(want))
    return table


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def read_metadata(path: str) -> dict[str, str]:
    """The gaca.* key/value metadata of one Parquet file."""
    meta = pq.read_schema(path).metadata or {}
    out = {}
    for k, v in meta.items():
        key = k.decode("utf-8", "replace")
        if key.startswith("gaca."):
            out[key] = v.decode("utf-8", "replace")
    return out


def read_key_value_metadata(path: str) -> dict[str, str]:
    """Every key/value metadata entry of one Parquet file but its ARROW:schema (pandas' index
    description, a writer's own notes, gaca.*), in the file's order. Bytes that are not UTF-8
    are kept as surrogate escapes, so that `write_parquet_atomic` writes them back unchanged."""
    meta = pq.read_metadata(path).metadata or {}
    return {
        k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape")
        for k, v in meta.items()
        if k != b"ARROW:schema"
    }


def stored_arrow_schema(path: str) -> pa.Schema | None:
    """The Arrow schema the file's writer stored (its ARROW:schema entry, a base64 Arrow IPC
    message), or None when it has none or it cannot be read."""
    value = (pq.read_metadata(path).metadata or {}).get(b"ARROW:schema")
    if not value:
        return None
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value)))
    except (pa.ArrowException, ValueError):
        return None


def read_log(
    paths: Sequence[str | os.PathLike],
    column_map: Mapping[str, str] | None = None,
    columns: Sequence[str] | Callable[[list[str]], Sequence[str]] | None = None,
    dictionary: Sequence[str] = (),
    via_polars: Sequence[str] = (),
) -> Log:
    """Read one or more Parquet files, globs or directories into one table.

    `column_map` maps canonical names to the names in the files (`--map NEW=OLD`).
    `columns`, when given, limits reading to those canonical columns (missing ones are fine),
    or chooses them from the canonical names of every column of the files (a callable);
    `dictionary` and `via_polars` (canonical names) choose the Arrow types of text columns of
    plain files for the code that uses them (see `_read_file`); values are the same either way.
    Every page checksum a file has is verified; a damaged file is a GacaError naming it.
    """
    column_map = dict(column_map or {})

    def in_file(names: Sequence[str]) -> list[str]:
        return [column_map.get(c, c) for c in names]

    inputs = expand_inputs(paths)
    decoding.refuse_encrypted([path for path, is_dir in inputs if not is_dir])
    full_schema = None if columns is None else _file_schema(inputs)  # every column, from the footers
    if callable(columns):
        assert full_schema is not None
        columns = columns(_mapped_names(full_schema.names, column_map))
    file_columns = None if columns is None else in_file(columns)
    parts: list[tuple[str, pa.Table]] = []
    for path, is_dir in inputs:
        if is_dir:
            parts.extend(_read_directory(path, file_columns))
        else:
            parts.append((path, _read_file(path, file_columns, in_file(dictionary), in_file(via_polars))))
    for path, part in parts:
        _unique_names(part.column_names, path)
    files = tuple(p for p, _ in parts)
    table = _concat([t for _, t in parts], ", ".join(files))
    ends = np.cumsum([t.num_rows for _, t in parts], dtype=np.int64)
    source = files[0] if len(files) == 1 else ", ".join(files)
    if table.num_rows == 0:
        raise GacaError("the log has no rows", file=source)
    schema = None
    if full_schema is None:
        table, renamed = apply_column_map(table, column_map, source)
    else:
        # check --map against every column of the files, apply it to the columns read
        mapped, renamed = apply_column_map(pa.Table.from_batches([], schema=full_schema), column_map, source)
        schema = _null_types(mapped.schema)
        table = table.rename_columns(_mapped_names(table.column_names, column_map))
    metadata = read_metadata(files[0])
    table = _typed_nulls(table.replace_schema_metadata(None))
    return Log(
        table=table,
        files=files,
        file_row_ends=ends,
        metadata=metadata,
        renamed=renamed,
        schema=schema,
        plain_files=not any(is_dir for _, is_dir in inputs),
        partial=columns is not None,
    )


def _null_types(schema: pa.Schema) -> pa.Schema:
    """`schema` with each nullable column of the log schema that has Arrow type null (all
    nulls, as pandas and polars write a column of None) given its usual type: float64 for
    nll_sum and nll_mean, bool for done, lists for token ids and log-probs."""
    from gaca_cli.log.schema import INPUT_BY_NAME

    usual = {
        "float": pa.float64(),
        "bool": pa.bool_(),
        "token_ids": pa.list_(pa.int32()),
        "logprobs": pa.list_(pa.float32()),
    }
    fields = []
    for f in schema:
        spec = INPUT_BY_NAME.get(f.name)
        if pa.types.is_null(f.type) and spec is not None and spec.nullable and spec.kind in usual:
            f = f.with_type(usual[spec.kind])
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


def _typed_nulls(table: pa.Table) -> pa.Table:
    """`table` with its columns of Arrow type null cast as `_null_types` says."""
    typed = _null_types(table.schema)
    return table if typed.equals(table.schema) else table.cast(typed)


def _file_schema(inputs: Sequence[tuple[str, bool]]) -> pa.Schema:
    """Every column of the inputs (file names), from their footers; no data is read."""
    schemas = []
    for path, is_dir in inputs:
        if is_dir:
            schema = _dataset(path).schema
        else:
            try:
                schema = pq.read_schema(path)
            except READ_ERRORS as exc:
                raise GacaError(f"not a readable Parquet file ({_first_line(exc)})", file=path) from None
        _unique_names(schema.names, path)
        schemas.append(schema.remove_metadata())
    try:
        return pa.unify_schemas(_with_text_widths(schemas), promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise GacaError(f"the files' schemas do not agree ({_first_line(exc)})", file=inputs[0][0]) from None


def _mapped_names(names: Sequence[str], column_map: Mapping[str, str]) -> list[str]:
    """The canonical names of the file columns `names` under `--map NEW=OLD`."""
    inverse = {old: new for new, old in column_map.items()}
    return [inverse.get(n, n) for n in names]


def apply_column_map(table: pa.Table, column_map: Mapping[str, str], source: str) -> tuple[pa.Table, dict[str, str]]:
    """Rename OLD -> NEW for each `--map NEW=OLD`, all at once (so the order of the --map
    options does not matter and two columns can swap names). Each OLD must be a column of
    the log, read under one name only, and no NEW may clash with a column left as it is."""
    names = list(table.column_names)
    reader: dict[str, str] = {}  # OLD -> NEW
    for new, old in column_map.items():
        if old not in names:
            raise GacaError(f"--map {new}={old} names a column the log does not have", file=source, column=old)
        if old in reader:
            raise GacaError(
                f"--map {reader[old]}={old} and --map {new}={old} both read column '{old}'; a column is read "
                "under one name",
                file=source,
                column=old,
            )
        reader[old] = new
    result = [reader.get(n, n) for n in names]
    for old, new in reader.items():
        if result.count(new) > 1:
            raise GacaError(
                f"--map {new}={old}: the log already has a column '{new}'; map it away too or drop it",
                file=source,
                column=new,
            )
    renamed = {new: old for old, new in reader.items() if new != old}
    return table.rename_columns(result), renamed


def restore_column_names(table: pa.Table, renamed: Mapping[str, str]) -> pa.Table:
    """Give mapped input columns back the names they had in the user's file."""
    if not renamed:
        return table
    return table.rename_columns([renamed.get(n, n) for n in table.column_names])


def parse_column_map(items: Sequence[str]) -> dict[str, str]:
    """Parse repeated `NEW=OLD` strings; raises ValueError with a usable message."""
    out: dict[str, str] = {}
    for item in items:
        new, sep, old = item.partition("=")
        new, old = new.strip(), old.strip()
        if not sep or not new or not old:
            raise ValueError(f"--map expects NEW=OLD (e.g. group_id=uid), got {item!r}")
        if new in out:
            raise ValueError(f"--map gives '{new}' twice")
        out[new] = old
    return out


def json_metadata(key: str, value: Mapping) -> dict[str, str]:
    return {key: json.dumps(value, sort_keys=True, default=str)}


@contextlib.contextmanager
def atomic_path(out: str | os.PathLike) -> Iterator[str]:
    """A temporary path in the directory of `out`; renamed to `out` when the block succeeds,
    deleted when it fails, so `out` either keeps its old content or holds the complete file.

    The temporary file is named `.OUT.PID.XXXXXXXX.tmp` after the process writing it, so
    that a temporary file left by a process that died without cleaning up (kill -9, power
    loss, a Ctrl-C in the instant it was created) is removed by the next run writing the same
    `out` (`remove_stale_temporaries`); one whose process still runs is left alone."""
    out = Path(out)
    if out.exists() and not out.is_file():  # a directory, a device (/dev/null), a pipe: never replaced
        raise GacaError(f"{out} exists and is not a regular file, so it is not replaced")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(out)
    except OSError as exc:
        raise GacaError(f"cannot write {out}: {exc.strerror or exc}") from None
    tmp = None
    try:
        try:
            fd, tmp = tempfile.mkstemp(prefix=f"{_temporary_prefix(out)}{os.getpid()}.", suffix=".tmp", dir=out.parent)
        except OSError as exc:
            raise GacaError(f"cannot write {out}: {exc.strerror or exc}") from None
        os.close(fd)
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual mode
        os.replace(tmp, out)
    except BaseException:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise


def temporary_dir(out: str | os.PathLike) -> Path:
    """A scratch directory beside `out`, named as `atomic_path` names its temporary files
    (`.OUT.PID.XXXXXXXX.tmp`), so that one left by a killed run is removed by the next run
    writing `out`. The caller removes it."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(out)
        return Path(tempfile.mkdtemp(prefix=f"{_temporary_prefix(out)}{os.getpid()}.", suffix=".tmp", dir=out.parent))
    except OSError as exc:
        raise GacaError(f"cannot write {out}: {exc.strerror or exc}") from None


def missing_dirs(path: str | os.PathLike) -> list[Path]:
    """The folders on the way to `path` (itself included) that do not exist yet, deepest
    first: what a run that creates them and then fails removes again (`remove_empty`)."""
    missing = []
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def remove_empty(dirs: Sequence[Path]) -> None:
    """Remove the folders `dirs` (deepest first) while they are empty."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            return


def discard_dir(path: str | os.PathLike, out: str | os.PathLike) -> None:
    """Remove the directory `path` (a work directory beside `out`) so that a kill midway
    leaves nothing half-removed under its name: it is renamed at once to a temporary name of
    `out` (`.OUT.PID.XXXXXXXX.tmp`), which the next run writing `out` removes if this one
    dies while deleting it."""
    path, out = Path(path), Path(out)
    if not path.exists():
        return
    doomed = out.parent / f"{_temporary_prefix(out)}{os.getpid()}.{secrets.token_hex(4)}.tmp"
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


@contextlib.contextmanager
def ctrl_c_ignored() -> Iterator[None]:
    """Ctrl-C is ignored inside the block (in the main thread; elsewhere it cannot arrive):
    for the clean-up after the output is complete, which an interruption could only leave
    half done, and whose command has succeeded."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


#: PID.XXXXXXXX between `.OUT.` and `.tmp` (mkstemp's 8 random characters)
_TEMPORARY_MIDDLE = re.compile(r"(\d+)\.[a-z0-9_]{8}")


def _temporary_prefix(out: Path) -> str:
    return f".{out.name}."


def remove_stale_temporaries(out: str | os.PathLike) -> list[str]:
    """Remove the temporary files `atomic_path` and directories `temporary_dir` made for `out`
    whose writing process has ended (named `.OUT.PID.XXXXXXXX.tmp`); return their paths.
    Those of running processes and files named otherwise are kept."""
    out = Path(out)
    prefix = _temporary_prefix(out)
    removed: list[str] = []
    try:
        names = os.listdir(out.parent)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        match = _TEMPORARY_MIDDLE.fullmatch(name[len(prefix) : -len(".tmp")])
        if match is None or _process_alive(int(match.group(1))):
            continue
        path = out.parent / name
        with contextlib.suppress(FileNotFoundError):  # another run removed it first
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(str(path))
    return removed


def _process_alive(pid: int) -> bool:
    """Whether a process with this id exists (on this machine; one that reuses a dead
    writer's id keeps that writer's temporary file, which is the safe side)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return True
    return True


def write_parquet_atomic(
    table: pa.Table,
    out: str | os.PathLike,
    metadata: Mapping[str, str],
    dictionary_columns: Sequence[str] = (),
    *,
    int96_timestamps: bool = False,
) -> None:
    """Write `table` to `out` through a temporary file in the same directory and a rename, so
    that `out` either keeps its old content or holds the complete new file.

    Dictionary encoding is used only for `dictionary_columns` and columns that are already
    dictionary-typed: on high-cardinality text (prompts, observations) it costs most of the
    write time and saves nothing. `int96_timestamps` stores timestamps as INT96 (as an input
    that had them did)."""
    meta = dict(table.schema.metadata or {})
    meta.update(
        {k.encode("utf-8", "surrogateescape"): v.encode("utf-8", "surrogateescape") for k, v in metadata.items()}
    )
    table = table.replace_schema_metadata(meta)
    dictionary = [
        name
        for name, col in zip(table.column_names, table.columns)
        if name in dictionary_columns or pa.types.is_dictionary(col.type)
    ]
    # statistics on every column: min/max help readers skip row groups, and their null
    # counts let the next command check a column it does not read without reading it
    with atomic_path(out) as tmp:
        pq.write_table(
            table,
            tmp,
            compression="zstd",
            use_dictionary=dictionary or False,
            use_deprecated_int96_timestamps=int96_timestamps,
        )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def same_or_inside(out: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> str | None:
    """The input that `out` would overwrite or fall inside of, if any."""
    out_path = Path(out).resolve()
    for raw in inputs:
        text = str(raw)
        candidates = glob.glob(text) if any(ch in _GLOB_CHARS for ch in text) else [text]
        for cand in candidates:
            p = Path(cand).resolve()
            if out_path == p or (p.is_dir() and p in out_path.parents):
                return cand
    return None


def unwritable_reason(out: str | os.PathLike, directory: bool = False) -> str | None:
    """Why `out` (a file, or with `directory` a directory) cannot be written, checked before
    any work: it names an existing directory (or file), something on its path is a regular
    file, or the nearest existing folder is not writable. None when it can be written."""
    path = Path(out).absolute()
    if path.exists():
        if directory and not path.is_dir():
            return f"{out} is a file, not a directory"
        if not directory and path.is_dir():
            return f"{out} is a directory, not a file"
        if not directory and not path.is_file():
            return f"{out} is not a regular file (a device or a pipe is never replaced)"
    ancestor = path if (directory and path.is_dir()) else path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, so nothing can be created under it"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable"
    return None
