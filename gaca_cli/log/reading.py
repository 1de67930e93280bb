"""Reading logs: Parquet files, globs, directories and hive partitions into one table (`read_log`,
`Log`), their columns renamed by `--map`, one type per column (`widening`), page checksums
verified, and the files' key/value metadata."""

from __future__ import annotations

import base64
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pyarrow.dataset as ds
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from gaca_cli.errors import GacaError
from gaca_cli.files import glob_matches
from gaca_cli.log.decoding import refuse_encrypted
from gaca_cli.log.widening import cast_columns, null_types, text_width_types, typed_nulls, with_text_widths


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
                raise not_readable(path, exc, name) from None
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
    return not_readable(path, exc, column)


def not_readable(path: str, exc: BaseException, column: str | None = None) -> GacaError:
    """The error for `path`, which a reader failed to read: the first line of its reason."""
    return GacaError(f"not a readable Parquet file ({_first_line(exc)})", file=path, column=column)


PYARROW_WRITER = "parquet-cpp-arrow"  # pyarrow's created_by: pyarrow reads what it writes, so a failure is damage


def read_failed(path: str, exc: BaseException, names: Sequence[str] | None) -> pa.Table:
    """The columns `names` of `path` (None: all) after pyarrow's read of them failed with `exc`:
    the columns pyarrow cannot decode read by polars and cast to the type pyarrow gives them,
    so that the table is the one pyarrow would read. Only for a file another writer made, and
    not past a page checksum that fails: a failure in a file pyarrow wrote is damage. Otherwise,
    or where polars cannot read them either, one GacaError naming the column (and the writer)."""
    import polars as pl

    reason = _first_line(exc)
    try:
        with open_parquet(path) as f:
            writer, schema = f.metadata.created_by or "an unnamed writer", f.schema_arrow
        if writer.startswith(PYARROW_WRITER) or "crc" in reason.lower() or "checksum" in reason.lower():
            raise unreadable(path, exc, names)
        wanted = [n for n in (schema.names if names is None else names) if n in schema.names]
        failed = [n for n in wanted if damaged_column(path, [n]) is not None]
    except READ_ERRORS:
        raise unreadable(path, exc, names) from None
    if not failed:
        raise unreadable(path, exc, names)
    try:
        decoded = pl.read_parquet(path, columns=failed, use_pyarrow=False).to_arrow()
        decoded = decoded.cast(pa.schema([schema.field(n) for n in failed]))
    except BaseException as err:  # polars' own errors, and PanicException on a page it rejects
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        rule = f"not a readable Parquet file ({reason}); written by {writer}, which neither pyarrow nor polars decodes"
        raise GacaError(rule, file=path, column=failed[0]) from None
    rest = _read_parquet(path, columns=[n for n in wanted if n not in failed])
    columns = [decoded.column(n) if n in failed else rest.column(n) for n in wanted]
    return pa.Table.from_arrays(columns, schema=pa.schema([schema.field(n) for n in wanted]))


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
                            raise not_readable(path, exc, name) from None
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
                    raise not_readable(path, exc, name) from None
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
        return dataclasses.replace(self, table=typed_nulls(table), cache={})

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
    stats = [meta.row_group(g).column(leaves[0]).statistics for g in range(meta.num_row_groups)]
    if any(s is None or not s.has_null_count for s in stats):
        return None
    return sum(s.null_count for s in stats)


def expand_inputs(paths: Sequence[str | os.PathLike]) -> list[tuple[str, bool]]:
    """Resolve the LOG arguments to (path, is_directory) pairs, globs expanded and sorted."""
    resolved: list[tuple[str, bool]] = []
    for raw in paths:
        text = str(raw)
        if (matches := glob_matches(text)) is not None:
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
        table = read_failed(path, exc, names)
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
    """A directory of Parquet files (hive partitions allowed) whose schema is every file's
    columns together (pyarrow would take the first file's alone), text widths unified
    (`text_width_types`), then the partition keys the files do not hold. A key the files
    also hold as a column (polars' `write_parquet(partition_by=...)` keeps it) takes the
    files' type, and its values are read from the files."""
    import pyarrow.dataset as ds  # imported on use: only directories need it (it loads pandas where installed)

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
        refuse_encrypted([frag.path for frag in fragments])
        schemas = [frag.physical_schema.remove_metadata() for frag in fragments]
    except READ_ERRORS as exc:
        raise GacaError(f"not a readable Parquet dataset ({_first_line(exc)})", file=path) from None
    for frag, frag_schema in zip(fragments, schemas):
        _unique_names(frag_schema.names, frag.path)
    try:
        schema = pa.unify_schemas(with_text_widths(schemas) or [pa.schema([])], promote_options="default")
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
    unified (`text_width_types`); any other type clash is one GacaError naming `source`."""
    targets = text_width_types([t.schema for t in tables])
    if targets:
        tables = [cast_columns(t, targets) for t in tables]
    try:
        return pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise GacaError(f"the files' schemas do not agree ({_first_line(exc)})", file=source) from None


def _unique_names(names: Sequence[str], path: str) -> None:
    """A file with two columns of the same name cannot be read by name: one clear error."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise GacaError("the file has two columns of this name; give each its own", file=path, column=name)
        seen.add(name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def read_metadata(path: str) -> dict[str, str]:
    """The gaca.* key/value metadata of one Parquet file."""
    return _gaca_metadata(pq.read_schema(path).metadata)


def _gaca_metadata(metadata: Mapping[bytes, bytes] | None) -> dict[str, str]:
    """The gaca.* entries of a schema's key/value metadata (bytes that are not UTF-8 replaced)."""
    meta = {k.decode("utf-8", "replace"): v for k, v in (metadata or {}).items()}
    return {k: v.decode("utf-8", "replace") for k, v in meta.items() if k.startswith("gaca.")}


def memory_log(table: pa.Table, column_map: Mapping[str, str] | None, name: str) -> Log:
    """A log held in memory (no file, `name` in messages): the table with `column_map`
    (NEW -> OLD) applied, as `read_log` gives a file's."""
    if table.num_rows == 0:
        raise GacaError("the log has no rows", file=name)
    mapped, renamed = apply_column_map(table.replace_schema_metadata(None), dict(column_map or {}), name)
    meta = _gaca_metadata(table.schema.metadata)
    rows = np.array([table.num_rows], dtype=np.int64)
    return Log(table=typed_nulls(mapped), files=(name,), file_row_ends=rows, metadata=meta, renamed=renamed)


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
    refuse_encrypted([path for path, is_dir in inputs if not is_dir])
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
        schema = null_types(mapped.schema)
        table = table.rename_columns(_mapped_names(table.column_names, column_map))
    metadata = read_metadata(files[0])
    table = typed_nulls(table.replace_schema_metadata(None))
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
                raise not_readable(path, exc) from None
        _unique_names(schema.names, path)
        schemas.append(schema.remove_metadata())
    try:
        return pa.unify_schemas(with_text_widths(schemas), promote_options="default")
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
